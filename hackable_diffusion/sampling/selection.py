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
  * `ReMDMCap`, `ReMDMRescale` -- ReMDM (Wang et al. 2025): a decided token is re-masked with probability sigma_t
    and a masked one is unmasked with probability (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t), with
    sigma <= sigma_max = min(1, (1 - alpha_s) / alpha_t); cap: sigma = min(eta, sigma_max) (eta 0.008), rescale:
    sigma = eta sigma_max (eta 0.015). The 'conf' and 'loop' variants are not implemented. Masking process only.

Counts are rounded to the nearest integer, clipped to at least one position while any is undecided (so every step
makes progress: with more steps than positions a masking canvas finishes early), and equal to every remaining
position at the last step (so nothing is left masked). Dream floors the count and may accept none at a step.

All randomness is float32 (LLaDA notes that low-precision Gumbel noise hurts; it uses float64) and drawn per batch
row from that row's own key, so a row's choices do not depend on the other rows of the batch.

A rule reads the logits only through `entropy`, `Confidence`, `Margin` and `NegEntropy`, so it also accepts a
`LogitSummary` in their place: the per-position maximum, second maximum, normaliser, entropy and candidate logit that
`DiffusionSampler.vocab_chunk` computes over the vocabulary in chunks (`vocab_chunks.py`), without a [b, c, v] copy
of the logits. `SelectionRule.chunkable()` says whether a rule does (a rule of one's own that reads the full
distribution says False, and the sampler refuses it with `vocab_chunk` set).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.diffusion.schedules import Schedule

# A large finite negative logit: exp() underflows to exactly 0 and 0 * it stays 0 (no NaN in entropies).
NEG_LOGIT = -1e30


# ---------------------------------------------------------------------------------------------------------------------
# Per-step information and shared helpers.
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """Where a denoising step sits: step i of `num_steps` goes from noise level t = 1 - i/S to s = 1 - (i+1)/S.

    free: positions the sampler may change (not fixed). persistent: True when decided tokens stay (a masking process,
    or a uniform one with `DiffusionSampler.commit`), False for the reference uniform sampler (everything free is
    re-decided each step).
    """

    step: Int[Array, ""]
    num_steps: int
    t: Float[Array, ""]
    s: Float[Array, ""]
    alpha_t: Float[Array, ""]
    alpha_s: Float[Array, ""]
    free: Bool[Array, "b c"]
    persistent: bool

    @classmethod
    def at(
        cls, step: int | Int[Array, ""], num_steps: int, schedule: Schedule, free: Bool[Array, "b c"], persistent: bool
    ) -> StepInfo:
        step = jnp.asarray(step, jnp.int32)
        t = 1.0 - step.astype(jnp.float32) / num_steps
        s = 1.0 - (step + 1).astype(jnp.float32) / num_steps
        return cls(
            step=step,
            num_steps=num_steps,
            t=t,
            s=s,
            alpha_t=jnp.asarray(schedule.alpha(t), jnp.float32),
            alpha_s=jnp.asarray(schedule.alpha(s), jnp.float32),
            free=jnp.asarray(free, bool),
            persistent=persistent,
        )

    @property
    def is_last(self) -> Bool[Array, ""]:
        return self.step >= self.num_steps - 1

    @property
    def num_free(self) -> Int[Array, "b"]:
        return jnp.sum(self.free, axis=-1).astype(jnp.int32)


def row_uniform(keys: Array, shape: tuple[int, ...]) -> Float[Array, "b ..."]:
    """float32 U[0, 1) of `shape` per row, each row from its own key."""
    return jax.vmap(lambda k: jax.random.uniform(k, shape, jnp.float32))(keys)


def row_gumbel(keys: Array, shape: tuple[int, ...]) -> Float[Array, "b ..."]:
    """float32 standard Gumbel noise of `shape` per row, each row from its own key."""
    return jax.vmap(lambda k: jax.random.gumbel(k, shape, jnp.float32))(keys)


@flax.struct.dataclass
class LogitSummary:
    """What the rules and early stopping read of one step's float32 logits x over the vocabulary, per position.

    max: max_v x_v; argmax: its first index; second: the second-largest logit (the largest again where it occurs
    twice; -inf for a vocabulary of one); sumexp: sum_v exp(x_v - max), so that softmax(x)_v = exp(x_v - max) / sumexp;
    entropy: of softmax(x), nats; at_candidate: x at the step's candidate token. Computed in chunks of the vocabulary by
    `vocab_chunks.summarise`; every field equals what the full logits give up to float32 summation order (argmax and
    max exactly).
    """

    max: Float[Array, "b c"]
    argmax: Int[Array, "b c"]
    second: Float[Array, "b c"]
    sumexp: Float[Array, "b c"]
    entropy: Float[Array, "b c"]
    at_candidate: Float[Array, "b c"]


def probabilities(logits: Float[Array, "b c v"]) -> Float[Array, "b c v"]:
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def entropy(logits: Float[Array, "b c v"] | LogitSummary) -> Float[Array, "b c"]:
    """Per-position entropy (nats) of softmax(logits), in float32 (a `LogitSummary` holds it already)."""
    if isinstance(logits, LogitSummary):
        return logits.entropy
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    p = jnp.exp(logp)
    return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


def top_index(logits: Float[Array, "b c v"] | LogitSummary) -> Int[Array, "b c"]:
    """Per-position argmax of the logits (the first of equal maxima)."""
    if isinstance(logits, LogitSummary):
        return logits.argmax
    return jnp.argmax(logits, axis=-1)


def _ranks(sort_key: Float[Array, "b c"]) -> Int[Array, "b c"]:
    """Rank of every position when sorted ascending by `sort_key` (stable: ties go to the lower index)."""
    order = jnp.argsort(sort_key, axis=-1, stable=True)
    return jnp.argsort(order, axis=-1, stable=True)


def top_k_mask(scores: Float[Array, "b c"], eligible: Bool[Array, "b c"], k: Int[Array, "b"]) -> Bool[Array, "b c"]:
    """The k eligible positions with the highest score in each row (ties: lower index first)."""
    ranks = _ranks(jnp.where(eligible, -scores.astype(jnp.float32), jnp.inf))
    return eligible & (ranks < k[:, None])


def _finalise_count(k: Array, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
    k = jnp.where(info.is_last, num_undecided, k.astype(jnp.int32))
    return jnp.clip(k, jnp.minimum(1, num_undecided), num_undecided)


def _empty(shape) -> Bool[Array, "b c"]:
    return jnp.zeros(shape, bool)


# ---------------------------------------------------------------------------------------------------------------------
# Scores for top-k and threshold rules (higher = more certain).
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Confidence:
    """Probability of the sampled candidate (MaskGIT, LLaDA, Fast-dLLM); `of_top=True`: the top probability."""

    of_top: bool = False

    def __call__(
        self, logits: Float[Array, "b c v"] | LogitSummary, candidates: Int[Array, "b c"]
    ) -> Float[Array, "b c"]:
        if isinstance(logits, LogitSummary):  # the summary's candidate logit is that of `candidates`
            top = jnp.zeros_like(logits.max) if self.of_top else logits.at_candidate - logits.max
            return jnp.exp(top) / logits.sumexp
        p = probabilities(logits)
        if self.of_top:
            return jnp.max(p, axis=-1)
        return jnp.take_along_axis(p, candidates[..., None], axis=-1)[..., 0]


@dataclasses.dataclass(frozen=True)
class Margin:
    """Top-1 minus top-2 probability (Kim et al. 2025 'top probability margin'; Dream 'topk_margin')."""

    def __call__(
        self, logits: Float[Array, "b c v"] | LogitSummary, candidates: Int[Array, "b c"]
    ) -> Float[Array, "b c"]:
        del candidates
        if isinstance(logits, LogitSummary):
            return 1.0 / logits.sumexp - jnp.exp(logits.second - logits.max) / logits.sumexp
        top2 = jax.lax.top_k(probabilities(logits), 2)[0]
        return top2[..., 0] - top2[..., 1]


@dataclasses.dataclass(frozen=True)
class NegEntropy:
    """Negative entropy of the prediction (Dream 'entropy')."""

    def __call__(
        self, logits: Float[Array, "b c v"] | LogitSummary, candidates: Int[Array, "b c"]
    ) -> Float[Array, "b c"]:
        del candidates
        return -entropy(logits)


def dilated_rank(length: int) -> np.ndarray:
    """Each canvas position's place in the dilated order, coarse to fine: positions ordered by the power of two that
    divides them (0 first, then 16, 8, 24, then 4, 12, 20, 28, ... for 32), then by index; all odd positions last.
    Taken a few at a time, the positions of one step are far apart and those of later steps fall between positions
    already decided."""
    index = np.arange(length)
    level = np.array([(i & -i).bit_length() - 1 if i else length.bit_length() for i in range(length)])
    order = np.lexsort((index, -level))  # by level (descending), then index
    rank = np.empty(length, np.int64)
    rank[order] = index
    return rank


@dataclasses.dataclass(frozen=True)
class DilatedOrder:
    """A fixed, model-free score: earlier in the dilated order scores higher (Dilated Unmasking Scheduler, DUS;
    Luxembourg et al. 2025: positions decided together are non-adjacent, so under a first-order Markov view of the
    text their joint entropy is the sum of their own). Difference: DUS partitions a block into log2(B) dilation
    groups, one per step; here the order is fixed and the count rule says how many of it each step takes."""

    def __call__(
        self, logits: Float[Array, "b c v"] | LogitSummary, candidates: Int[Array, "b c"]
    ) -> Float[Array, "b c"]:
        del logits
        rank = jnp.asarray(dilated_rank(candidates.shape[-1]), jnp.float32)
        return jnp.broadcast_to(-rank, candidates.shape)


@dataclasses.dataclass(frozen=True)
class LeftToRight:
    """A fixed, model-free score: the leftmost undecided position scores highest, so a top-k rule decodes the canvas
    in reading order, k positions a step (one per step: autoregressive order run on a bidirectional model, the
    semi-autoregressive decoding of LLaDA, Nie et al. 2025, with blocks of one position). Useful where the answer is
    a left-to-right derivation (Countdown) and to tell a model's errors from its decoding order's."""

    def __call__(
        self, logits: Float[Array, "b c v"] | LogitSummary, candidates: Int[Array, "b c"]
    ) -> Float[Array, "b c"]:
        del logits
        return jnp.broadcast_to(-jnp.arange(candidates.shape[-1], dtype=jnp.float32), candidates.shape)


# the scores that also read a `LogitSummary`
SUMMARY_SCORES = (Confidence, Margin, NegEntropy, DilatedOrder, LeftToRight)


# ---------------------------------------------------------------------------------------------------------------------
# How many positions a top-k rule accepts.
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScheduleCount:
    """The vanilla expectation under the process schedule: #masked (alpha_s - alpha_t) / (1 - alpha_t); with the
    uniform process, #free alpha_s (the expected number of clean tokens at level s)."""

    def __call__(self, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
        n = num_undecided.astype(jnp.float32)
        if info.persistent:
            expected = n * (info.alpha_s - info.alpha_t) / (1.0 - info.alpha_t)
        else:
            expected = n * info.alpha_s
        return _finalise_count(jnp.round(expected), num_undecided, info)


@dataclasses.dataclass(frozen=True)
class CosineCount:
    """MaskGIT: after step i, floor(#free cos(pi/2 (i+1)/S)) positions are still masked."""

    def __call__(self, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
        progress = (info.step + 1).astype(jnp.float32) / info.num_steps
        still_masked = jnp.floor(info.num_free * jnp.cos(0.5 * math.pi * progress)).astype(jnp.int32)
        decided_target = info.num_free - still_masked
        decided_now = info.num_free - num_undecided if info.persistent else 0
        return _finalise_count(decided_target - decided_now, num_undecided, info)


@dataclasses.dataclass(frozen=True)
class EvenCount:
    """LLaDA: #free // S positions per step, the remainder one each to the first steps."""

    def __call__(self, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
        done_steps = info.step + 1
        base, remainder = info.num_free // info.num_steps, info.num_free % info.num_steps
        decided_target = done_steps * base + jnp.minimum(done_steps, remainder)
        decided_now = info.num_free - num_undecided if info.persistent else 0
        return _finalise_count(decided_target - decided_now, num_undecided, info)


@dataclasses.dataclass(frozen=True)
class PowerCount:
    """round(#free ((i+1)/S)^exponent) positions decided after step i: exponent 1 is LLaDA's even split (rounded),
    exponent > 1 decides few positions early, while most are still masked, and many late, when the context has
    pinned them down (in a puzzle: cells become forced as the grid fills)."""

    exponent: float = 2.0

    def __post_init__(self):
        if not self.exponent > 0:
            raise ValueError(f"PowerCount exponent must be > 0, got {self.exponent}.")

    def __call__(self, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
        progress = (info.step + 1).astype(jnp.float32) / info.num_steps
        decided_target = jnp.round(info.num_free.astype(jnp.float32) * progress**self.exponent).astype(jnp.int32)
        decided_now = info.num_free - num_undecided if info.persistent else 0
        return _finalise_count(decided_target - decided_now, num_undecided, info)


COUNT_RULES: dict[str, Any] = {"schedule": ScheduleCount, "cosine": CosineCount, "even": EvenCount, "power": PowerCount}


def make_count(name: str, exponent: float | None = None) -> Any:
    """A count rule by name: "schedule", "cosine", "even", or "power" with its `exponent` (`PowerCount`)."""
    if name not in COUNT_RULES:
        raise ValueError(f"unknown count rule {name!r}; choose one of {sorted(COUNT_RULES)}.")
    if name == "power":
        return PowerCount() if exponent is None else PowerCount(float(exponent))
    if exponent is not None:
        raise ValueError(f"count rule {name!r} takes no exponent (only 'power' does), got {exponent}.")
    return COUNT_RULES[name]()


# ---------------------------------------------------------------------------------------------------------------------
# Selection rules.
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SelectionRule(abc.ABC):
    """Base class: `rule(keys, logits, candidates, undecided, info) -> (accept, remask)`.

    keys: one PRNG key per batch row; logits: the scored logits, float32 (the sampling logits unless the sampler sets
    score_temperature), or their `LogitSummary` when the sampler scans the vocabulary in chunks (`chunkable`);
    candidates: the tokens sampled from the sampling logits.
    """

    remasks: ClassVar[bool] = False  # True when the rule may send decided tokens back to MASK

    def chunkable(self) -> bool:
        """True when the rule reads the logits only through `entropy` and the scores above, so that it also takes a
        `LogitSummary` (the sampler's `vocab_chunk`); False for a rule that may read the whole distribution."""
        return False

    @abc.abstractmethod
    def __call__(
        self,
        keys: Array,
        logits: Float[Array, "b c v"] | LogitSummary,
        candidates: Int[Array, "b c"],
        undecided: Bool[Array, "b c"],
        info: StepInfo,
    ) -> tuple[Bool[Array, "b c"], Bool[Array, "b c"]]:
        """Returns (accept, remask) masks over the canvas."""


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


@dataclasses.dataclass(frozen=True)
class _ReMDM(SelectionRule):
    """ReMDM posterior with remasking rate sigma (see the module docstring); subclasses choose sigma."""

    remasks: ClassVar[bool] = True
    eta: float = 0.0

    def __post_init__(self):
        if not self.eta >= 0:
            raise ValueError(f"{type(self).__name__}: eta must be >= 0, got {self.eta}.")

    def chunkable(self) -> bool:
        return True

    @abc.abstractmethod
    def sigma(self, sigma_max: Float[Array, ""]) -> Float[Array, ""]:
        """The remasking rate sigma_t given its upper bound sigma_max."""

    def __call__(self, keys, logits, candidates, undecided, info):
        del logits, candidates
        if not info.persistent:
            raise ValueError(f"{type(self).__name__} re-masks tokens and needs a masking process.")
        alpha_s, alpha_t = info.alpha_s, info.alpha_t
        sigma_max = jnp.minimum(1.0, (1.0 - alpha_s) / alpha_t)
        sigma = jnp.where(info.is_last, 0.0, self.sigma(sigma_max))
        unmask_prob = jnp.where(info.is_last, 1.0, (alpha_s - (1.0 - sigma) * alpha_t) / (1.0 - alpha_t))
        u = row_uniform(keys, undecided.shape[1:])
        accept = undecided & (u < unmask_prob)
        remask = info.free & ~undecided & (u < sigma)
        return accept, remask


@dataclasses.dataclass(frozen=True)
class ReMDMCap(_ReMDM):
    """ReMDM 'cap': sigma_t = min(eta, sigma_max), eta = 0.008."""

    eta: float = 0.008

    def sigma(self, sigma_max):
        return jnp.minimum(self.eta, sigma_max)


@dataclasses.dataclass(frozen=True)
class ReMDMRescale(_ReMDM):
    """ReMDM 'rescale': sigma_t = eta * sigma_max, eta = 0.015."""

    eta: float = 0.015

    def __post_init__(self):
        super().__post_init__()
        if self.eta > 1:
            raise ValueError(f"ReMDMRescale: eta must lie in [0, 1], got {self.eta}.")

    def sigma(self, sigma_max):
        return self.eta * sigma_max


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
