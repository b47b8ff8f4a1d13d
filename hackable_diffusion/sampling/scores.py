"""What a selection rule reads of one step's logits: entropies, the scores that rank positions, and `LogitSummary`.

The scores (higher = more certain) rank the undecided positions for the top-k and threshold rules of `selection.py`:
`Confidence` (probability of the sampled token: MaskGIT, Chang et al. 2022; LLaDA's 'low_confidence'; or the top
probability: Dream's 'maskgit_plus', Kim et al. 2025), `Margin` (top-1 minus top-2 probability: Kim et al. 2025,
Dream 'topk_margin'), `NegEntropy` (Dream 'entropy'), and two model-free orders: `DilatedOrder` (the Dilated
Unmasking Scheduler, DUS; Luxembourg et al. 2025) and `LeftToRight` (LLaDA's semi-autoregressive decoding, Nie et
al. 2025, with blocks of one position).

A rule reads the logits only through `entropy`, `Confidence`, `Margin` and `NegEntropy`, so it also accepts a
`LogitSummary` in their place: the per-position maximum, second maximum, normaliser, entropy and candidate logit that
`DiffusionSampler.vocab_chunk` computes over the vocabulary in chunks (`vocab_chunks.py`), without a [b, c, v] copy
of the logits.
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

# A large finite negative logit: exp() underflows to exactly 0 and 0 * it stays 0 (no NaN in entropies).
NEG_LOGIT = -1e30


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
