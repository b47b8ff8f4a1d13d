"""Selection rules: which canvas positions take the model's sample at one denoising step.

Every rule sees the scored float32 logits of one step (the temperature-shaped sampling logits, or logits /
`DiffusionSampler.score_temperature` when set), the candidate tokens already sampled from the sampling logits,
and the set of *undecided* positions it may fill, and returns two boolean masks over the canvas:

    accept: undecided positions that take their candidate this step;
    remask: decided positions that go back to noise (only ReMDM; all False otherwise).

What the canvas loop (`canvas.py`) does with them depends on the noise process:

  * masking process (MD4/MDLM/LLaDA): undecided = still-masked free positions. Accepted positions are committed
    and stay committed; the others stay MASK (except ReMDM's `remask`).
  * uniform process (DiffusionGemma): there is no persistent commit. Undecided = every free position, the accepted
    ones take their candidate, and every other free position gets a fresh uniform random token, each step. This is
    the reference behaviour (`SampleFromPredictions`, docs/reference.md §2.6): a token accepted at one step
    may be re-randomised at the next. With `DiffusionSampler.commit` a uniform sampler keeps its accepted tokens
    instead, and undecided = the free positions not yet accepted, as with masking.

Fixed positions (prompt givens, puzzle clues, an infill context) are never undecided and never remasked.

Rules and their references:
  * `EntropyBound` -- DiffusionGemma `SampleFromPredictions(entropy_bound=0.1)` and EB-Sampler (Ben-Hamu et al.
    2025): sort undecided positions by entropy (ascending) and accept while the exclusive running sum of entropies is
    <= gamma. The exclusive sum is EB-Sampler's sum_{i<=k} H_i - max_{i<=k} H_i, so at least one position is always
    accepted. Difference: with a masking process or fixed positions only undecided positions enter the sum (the
    reference sorts all canvas positions; the two agree on an unconstrained uniform canvas). Optional `min_count`
    (a count rule below) accepts at least that many lowest-entropy positions per step, so a step budget smaller than
    the canvas is spread over the steps instead of being left to the last one (not in the reference).
  * `Ancestral` -- MD4 (Shi et al. 2024): each masked position is unmasked with probability
    (alpha_s - alpha_t) / (1 - alpha_t) (Dream's `alg='origin'` with the linear schedule). The last step unmasks
    everything (MD4 instead ends at t = eps). With the uniform process the analogue is "predict x0, then re-noise to
    level s": each free position keeps its candidate with probability alpha(s) (the exact uniform posterior is
    `process.posterior_probs` and is not used here).
  * `TopK` -- accept the k undecided positions with the highest score. Scores: `Confidence` (probability of the
    sampled token: MaskGIT, Chang et al. 2022; LLaDA's 'low_confidence'; or the top probability: Dream's
    'maskgit_plus', Kim et al. 2025), `Margin` (top-1 minus top-2 probability: Kim et al. 2025, Dream 'topk_margin'),
    `NegEntropy` (Dream 'entropy'). Counts: `ScheduleCount` (k = #masked (alpha_s - alpha_t)/(1 - alpha_t), the
    vanilla expectation, Kim et al. / Dream), `CosineCount` (MaskGIT's cosine number of tokens still masked) and
    `EvenCount` (LLaDA's `get_num_transfer_tokens`). Optional Gumbel noise on the scores (`gumbel_scale`, float32):
    Kim et al. use 0.5 on puzzles; Gumbel-top-k with scale tau samples positions without replacement from
    softmax(score / tau), which is Dream's `alg_temp`. Optional `also_above`: every undecided position whose score
    reaches it is accepted too (a threshold on top of the count; not in Kim et al.).
  * `dilated` -- the Dilated Unmasking Scheduler (DUS; Luxembourg et al. 2025): `TopK` with the model-free
    `DilatedOrder` score and `EvenCount`, so each step decides positions far apart and later steps fill the gaps
    between decided ones.
  * `ConfidenceThreshold` -- Fast-dLLM (Wu et al. 2025): accept every undecided position with confidence >= tau
    (default 0.9) and always the most confident one, so every step makes progress.
  * `ReMDMCap`, `ReMDMRescale` -- ReMDM (Wang et al. 2025): decided tokens may go back to MASK while masked ones
    are unmasked (`remasking.py`, with its formulas). Masking process only.

The count rules are in `counts.py` (rounded, at least one position while any is undecided, all that is left at
the last step); the scores and `LogitSummary` in `scores.py`; `StepInfo`, the per-row draws and the
`SelectionRule` interface in `selection_base.py`.

A rule reads the logits only through `entropy`, `Confidence`, `Margin` and `NegEntropy` (`scores.py`), so it also
accepts a `LogitSummary` in their place (`DiffusionSampler.vocab_chunk`, `vocab_chunks.py`), without a [b, c, v] copy
of the logits. `SelectionRule.chunkable()` says whether a rule does (a rule of one's own that reads the full
distribution says False, and the sampler refuses it with `vocab_chunk` set).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.sampling.counts import CosineCount, EvenCount, ScheduleCount, make_count
from hackable_diffusion.sampling.remasking import ReMDMCap, ReMDMRescale
from hackable_diffusion.sampling.scores import (
    SUMMARY_SCORES,
    Confidence,
    DilatedOrder,
    LeftToRight,
    Margin,
    NegEntropy,
    entropy,
)
from hackable_diffusion.sampling.selection_base import SelectionRule, row_gumbel, row_uniform


def _ranks(sort_key: Float[Array, "b c"]) -> Int[Array, "b c"]:
    """Rank of every position when sorted ascending by `sort_key` (stable: ties go to the lower index)."""
    order = jnp.argsort(sort_key, axis=-1, stable=True)
    return jnp.argsort(order, axis=-1, stable=True)


def top_k_mask(scores: Float[Array, "b c"], eligible: Bool[Array, "b c"], k: Int[Array, "b"]) -> Bool[Array, "b c"]:
    """The k eligible positions with the highest score in each row (ties: lower index first)."""
    ranks = _ranks(jnp.where(eligible, -scores.astype(jnp.float32), jnp.inf))
    return eligible & (ranks < k[:, None])


def _empty(shape) -> Bool[Array, "b c"]:
    return jnp.zeros(shape, bool)


# ---------------------------------------------------------------------------------------------------------------------
# Selection rules.
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EntropyBound(SelectionRule):
    """DiffusionGemma / EB-Sampler: accept the lowest-entropy positions while the exclusive entropy sum <= gamma.

    min_count: optional count rule (`"even"`, `"cosine"`, ...; `make_count`) giving a floor: at least that many
    lowest-entropy positions are accepted at each step. Without it a step budget smaller than the canvas is spent
    one position at a time by an uncertain model and the last step decides all that is left at once; with
    `min_count="even"` the parallel decisions the budget forces are spread evenly over its steps (not in the
    reference, whose uniform canvas has no persistent decisions to run out of).
    """

    gamma: float = 0.1
    min_count: Any = None

    def __post_init__(self):
        if not self.gamma >= 0:
            raise ValueError(f"EntropyBound: gamma must be >= 0, got {self.gamma} (DiffusionGemma uses 0.1).")

    def chunkable(self) -> bool:
        return True

    def __call__(self, keys, logits, candidates, undecided, info):
        del keys, candidates
        h = entropy(logits)
        order = jnp.argsort(jnp.where(undecided, h, jnp.inf), axis=-1, stable=True)
        sorted_h = jnp.take_along_axis(jnp.where(undecided, h, 0.0), order, axis=-1)
        exclusive = jnp.cumsum(sorted_h, axis=-1) - sorted_h
        within_bound = exclusive <= self.gamma
        if self.min_count is not None:
            floor = self.min_count(jnp.sum(undecided, axis=-1).astype(jnp.int32), info)
            within_bound = within_bound | (jnp.arange(h.shape[-1])[None, :] < floor[:, None])
        accept_sorted = within_bound & jnp.take_along_axis(undecided, order, axis=-1)
        accept = jnp.take_along_axis(accept_sorted, jnp.argsort(order, axis=-1), axis=-1)
        return accept, _empty(undecided.shape)


@dataclasses.dataclass(frozen=True)
class Ancestral(SelectionRule):
    """MD4: unmask each masked position with probability (alpha_s - alpha_t)/(1 - alpha_t); uniform: alpha_s."""

    def chunkable(self) -> bool:
        return True

    def __call__(self, keys, logits, candidates, undecided, info):
        del logits, candidates
        if info.persistent:
            prob = (info.alpha_s - info.alpha_t) / (1.0 - info.alpha_t)
        else:
            prob = info.alpha_s
        prob = jnp.where(info.is_last, 1.0, prob)
        accept = undecided & (row_uniform(keys, undecided.shape[1:]) < prob)
        return accept, _empty(undecided.shape)


@dataclasses.dataclass(frozen=True)
class TopK(SelectionRule):
    """Accept the `count` undecided positions with the highest `score` (+ gumbel_scale * Gumbel noise).

    also_above: if set, also accept every undecided position whose (noise-free) score is >= it, a Fast-dLLM-style
    threshold on top of the count: what the model is sure of costs no step of its own, and since the count rules
    recount the undecided positions each step, the budget left goes to the uncertain ones.
    """

    score: Any = Confidence()
    count: Any = ScheduleCount()
    gumbel_scale: float = 0.0
    also_above: float | None = None

    def __post_init__(self):
        if not self.gumbel_scale >= 0:
            raise ValueError(f"TopK: gumbel_scale must be >= 0, got {self.gumbel_scale}.")
        if self.also_above is not None and not 0.0 < self.also_above <= 1.0:
            raise ValueError(f"TopK: also_above must lie in (0, 1] (or be None), got {self.also_above}.")

    def chunkable(self) -> bool:
        return isinstance(self.score, SUMMARY_SCORES)

    def __call__(self, keys, logits, candidates, undecided, info):
        scores = self.score(logits, candidates).astype(jnp.float32)
        sure = undecided & (scores >= self.also_above) if self.also_above is not None else _empty(undecided.shape)
        if self.gumbel_scale > 0:
            scores = scores + self.gumbel_scale * row_gumbel(keys, undecided.shape[1:])
        k = self.count(jnp.sum(undecided, axis=-1).astype(jnp.int32), info)
        return top_k_mask(scores, undecided, k) | sure, _empty(undecided.shape)


@dataclasses.dataclass(frozen=True)
class ConfidenceThreshold(SelectionRule):
    """Fast-dLLM: accept every undecided position with score >= tau, and always the highest-scoring one."""

    tau: float = 0.9
    score: Any = Confidence()

    def __post_init__(self):
        if not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"ConfidenceThreshold: tau must lie in [0, 1], got {self.tau} (Fast-dLLM uses 0.9).")

    def chunkable(self) -> bool:
        return isinstance(self.score, SUMMARY_SCORES)

    def __call__(self, keys, logits, candidates, undecided, info):
        del keys, info
        scores = self.score(logits, candidates).astype(jnp.float32)
        best = top_k_mask(scores, undecided, jnp.ones(undecided.shape[:1], jnp.int32))
        return undecided & ((scores >= self.tau) | best), _empty(undecided.shape)


SELECTION_RULES: dict[str, Any] = {
    "entropy_bound": EntropyBound,
    "ancestral": Ancestral,
    "top_k_confidence": lambda **kw: TopK(score=Confidence(), **kw),
    "top_k_top_probability": lambda **kw: TopK(score=Confidence(of_top=True), **kw),
    "top_k_margin": lambda **kw: TopK(score=Margin(), **kw),
    "top_k_entropy": lambda **kw: TopK(score=NegEntropy(), **kw),
    "maskgit": lambda **kw: TopK(score=Confidence(), count=CosineCount(), **kw),
    "llada": lambda **kw: TopK(score=Confidence(), count=EvenCount(), **kw),
    "dilated": lambda **kw: TopK(score=DilatedOrder(), **{"count": EvenCount(), **kw}),
    "left_to_right": lambda **kw: TopK(score=LeftToRight(), **{"count": EvenCount(), **kw}),
    "threshold": ConfidenceThreshold,
    "remdm_cap": ReMDMCap,
    "remdm_rescale": ReMDMRescale,
}


def make_selection(
    rule: str, *, count: str | None = None, count_exponent: float | None = None, **kwargs
) -> SelectionRule:
    """Builds a selection rule by name with its arguments, e.g. `make_selection("top_k_margin", gumbel_scale=0.5)`.

    Top-k rules take `count` ("schedule", "cosine", "even", "power" with `count_exponent`: `make_count`) for how many
    positions each step decides; `entropy_bound` takes `min_count` (a count rule name) for a floor on it. Arguments a
    rule does not take are refused with the rule's name.
    """
    if rule not in SELECTION_RULES:
        raise ValueError(f"unknown selection rule {rule!r}; choose one of {sorted(SELECTION_RULES)}.")
    if count is not None:
        kwargs["count"] = make_count(count, count_exponent)
    elif count_exponent is not None:
        raise ValueError("count_exponent needs count='power'.")
    if isinstance(kwargs.get("min_count"), str):
        kwargs["min_count"] = make_count(kwargs["min_count"])
    try:
        return SELECTION_RULES[rule](**kwargs)
    except TypeError as error:
        raise ValueError(f"selection rule {rule!r} does not take {sorted(kwargs)}: {error}") from None
