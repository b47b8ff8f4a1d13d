"""The canvas step's per-position quantities computed over the vocabulary in chunks (`DiffusionSampler.vocab_chunk`).

A denoising step of DiffusionGemma's canvas (256 positions x 262,144 vocabulary) reads the model's float32 logits
several times: the temperature-shaped logits, the Gumbel noise of the candidate draw, the softmax of the selection
score, the entropy of early stopping and the softmax that self-conditioning multiplies with the embedding table. Written
as whole-vocabulary array expressions, as the reference sampler (gemma `gemma/diffusion/_sampler.py`) and the default
path of `canvas.py` write them, each can be a [batch, canvas, vocabulary] float32 (or, for the random bits, uint32)
temporary of 256 MiB per sequence: XLA:CPU keeps six at once for the 26B-A4B shape (docs/scaling.md, "Memory at
batch"). Here one `lax.scan` walks the vocabulary in chunks of N ids and keeps, per position and per logits view (the
shaped logits, and the score / self-conditioning temperatures' views where they differ), running statistics:

    max, argmax, second max            exact (a max is the same in any order; ties keep the first index)
    sumexp = sum_v exp(x_v - max)      rescaled by exp(old max - new max) when the max grows (online softmax,
    plogp  = sum_v exp(x_v - max)(x_v - max)   Milakov & Gimelshein 2018), entropy = log sumexp - plogp / sumexp
    Gumbel-max argmax of x + g         the same candidate as `jax.random.categorical` for the same key (below)
    sum_v exp(x_v - max) E_v           the self-conditioning signal, sqrt(d) sum / sumexp at the end

so that no float32 [b, c, v] array other than the model's logits exists (a task's constraint, if any, is one bool
[b, c, v] mask); the chunk's own [b, c, N] arrays (about a dozen live at once) set the memory the scan adds. The
selection rules and early stopping read the result as a `selection.LogitSummary`.

The Gumbel noise is the reference stream: `jax.random.categorical(key, x)` over a (c, v) row adds
`jax.random.gumbel(key, (c, v))`, whose bits under JAX's default threefry2x32 PRNG with partitionable counters are
threefry(key, flat index) for every element; `gumbel_columns` evaluates that hash for the chunk's indices only and turns
the bits into Gumbel noise with `jax.random.uniform`'s and `gumbel`'s own float32 arithmetic, so the noise of a
chunk equals the full noise restricted to it bit for bit and the candidates equal the unchunked draw's. Other PRNG
implementations, `jax_threefry_partitionable=False` or the high-dynamic-range Gumbel mode are refused with a clear
error. `BlockedInverseCdf` is chunked in two passes (the block masses need the global maximum first) and draws the
same tokens as the unchunked draw for the same keys when its block divides the chunk.

Differences from the unchunked step: sums run in another order, so normalisers, entropies, confidences, margins and
the self-conditioning signal agree to float32 rounding (tested to 1e-5), not bit for bit, and the self-conditioning
matmul casts the unnormalised weights exp(x - max) to the compute dtype where the unchunked one casts probabilities; a
rank or threshold that falls within that rounding may then differ. Not in the reference, which materialises the full
arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.random import threefry2x32_p
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.models import quantize as Q
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling.draws import _first_above
from hackable_diffusion.sampling.scores import NEG_LOGIT, LogitSummary

# ---------------------------------------------------------------------------------------------------------------------
# The reference Gumbel stream, chunk by chunk.
# ---------------------------------------------------------------------------------------------------------------------


def check_reproducible_gumbel(keys: Array) -> None:
    """Raises ValueError unless `gumbel_columns` reproduces `jax.random.gumbel` for these keys (at trace time)."""
    impl = str(jax.random.key_impl(keys))
    if impl != "threefry2x32":
        raise ValueError(
            f"DiffusionSampler.vocab_chunk with the GumbelMax draw reproduces JAX's threefry2x32 Gumbel stream chunk "
            f"by chunk; these keys use {impl!r}. Use threefry2x32 keys or vocab_chunk=0."
        )
    if not jax.config.jax_threefry_partitionable:
        raise ValueError(
            "DiffusionSampler.vocab_chunk with the GumbelMax draw needs jax_threefry_partitionable=True (JAX's "
            "default), whose random bits depend on each element's index only."
        )
    if jax.config.jax_high_dynamic_range_gumbel:
        raise ValueError(
            "DiffusionSampler.vocab_chunk with the GumbelMax draw reproduces the default ('low') Gumbel mode; "
            "jax_high_dynamic_range_gumbel is set."
        )


def gumbel_columns(keys: Array, ids: Int[Array, "n"], rows: int, vocab: int) -> Float[Array, "b rows n"]:
    """`jax.random.gumbel(key, (rows, vocab))[:, ids]` for every row key, without drawing the other columns.

    Bit for bit under threefry2x32 with partitionable counters (`check_reproducible_gumbel`): element (i, j) of the
    full draw hashes the counter i * vocab + j; the float conversion is `jax.random.uniform(minval=tiny, maxval=1)`'s,
    then -log(-log(u)).
    """
    if rows * vocab >= 2**32:
        raise ValueError(f"gumbel_columns: {rows} x {vocab} counters do not fit 32 bits.")
    counters = jnp.arange(rows, dtype=jnp.uint32)[:, None] * jnp.uint32(vocab) + ids.astype(jnp.uint32)[None, :]
    key_data = jax.random.key_data(keys)  # (b, 2): each row's key hashes the same counters
    shape = (key_data.shape[0], *counters.shape)
    bits1, bits2 = threefry2x32_p.bind(
        jnp.broadcast_to(key_data[:, 0, None, None], shape),
        jnp.broadcast_to(key_data[:, 1, None, None], shape),
        jnp.zeros(shape, jnp.uint32),
        jnp.broadcast_to(counters, shape),
    )
    bits = bits1 ^ bits2
    tiny = jnp.float32(jnp.finfo(jnp.float32).tiny)
    one = jnp.float32(1.0)
    mantissa = lax.shift_right_logical(bits, jnp.uint32(32 - 23)) | jnp.uint32(0x3F800000)
    floats = lax.bitcast_convert_type(mantissa, jnp.float32) - one
    u = lax.max(tiny, floats * (one - tiny) + tiny)
    return -jnp.log(-jnp.log(u))


# ---------------------------------------------------------------------------------------------------------------------
# The logits as the step sees them, read a chunk at a time.
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BiasedLogits:
    """The step's logits with the sampler's bias and the task's exclusions, read lazily: `chunk(start, size)` and
    `at(ids)` give `where(excluded, -1e30, logits.astype(f32) + bias)` for those ids only (what `canvas.py`'s
    unchunked step calls `biased`, element for element)."""

    logits: Float[Array, "b c v"]
    bias: Float[Array, "v"]
    excluded: Bool[Array, "b c v"] | None = None

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[-1]

    def chunk(self, start: int | Int[Array, ""], size: int) -> Float[Array, "b c n"]:
        x = lax.dynamic_slice_in_dim(self.logits, start, size, axis=2).astype(jnp.float32)
        x = x + lax.dynamic_slice_in_dim(self.bias, start, size, axis=0)
        if self.excluded is not None:
            x = jnp.where(lax.dynamic_slice_in_dim(self.excluded, start, size, axis=2), NEG_LOGIT, x)
        return x

    def at(self, ids: Int[Array, "b c k"]) -> Float[Array, "b c k"]:
        """The biased logits at `ids` (ids past the vocabulary are clipped to its last id; mask them yourself)."""
        ids = jnp.clip(ids, 0, self.vocab_size - 1)
        x = jnp.take_along_axis(self.logits, ids, axis=-1).astype(jnp.float32) + jnp.take(self.bias, ids)
        if self.excluded is not None:
            x = jnp.where(jnp.take_along_axis(self.excluded, ids, axis=-1), NEG_LOGIT, x)
        return x


def fold_chunks(stats: Callable[[Any, int], Any], merge: Callable[[Any, Any], Any], vocab: int, chunk: int) -> Any:
    """merge(...merge(stats(0, n), stats(n, n))..., stats(k n, tail)): whole chunks of n = min(chunk, vocab) ids by
    a `lax.scan`, the remainder (vocab mod n ids) as one smaller chunk after it, so no chunk reads past the end."""
    size = min(chunk, vocab)
    whole, tail = divmod(vocab, size)
    carry = stats(0, size)
    if whole > 1:
        carry, _ = lax.scan(lambda c, k: (merge(c, stats(k * size, size)), None), carry, jnp.arange(1, whole))
    if tail:
        carry = merge(carry, stats(whole * size, tail))
    return carry


# ---------------------------------------------------------------------------------------------------------------------
# Running statistics.
# ---------------------------------------------------------------------------------------------------------------------


def _view_stats(x: Float[Array, "b c n"], start) -> dict[str, Array]:
    top = jnp.max(x, axis=-1)
    local = jnp.argmax(x, axis=-1)
    second = jnp.max(jnp.where(jnp.arange(x.shape[-1]) == local[..., None], -jnp.inf, x), axis=-1)
    shifted = x - top[..., None]
    e = jnp.exp(shifted)
    return dict(
        max=top,
        argmax=(local + start).astype(jnp.int32),
        second=second,
        sumexp=jnp.sum(e, axis=-1),
        plogp=jnp.sum(jnp.where(e > 0, e * shifted, 0.0), axis=-1),
    )


def _rescale(factor: Array, value: Array) -> Array:
    """factor * value, 0 where the factor is 0 (a part whose max is far below, or -inf)."""
    return jnp.where(factor > 0, factor * value, 0.0)


def _merge_view(a: dict[str, Array], b: dict[str, Array]) -> tuple[dict[str, Array], Array, Array]:
    top = jnp.maximum(a["max"], b["max"])
    fa, fb = jnp.exp(a["max"] - top), jnp.exp(b["max"] - top)
    merged = dict(
        max=top,
        argmax=jnp.where(b["max"] > a["max"], b["argmax"], a["argmax"]),  # ties: the earlier chunk's, the first index
        second=jnp.maximum(jnp.minimum(a["max"], b["max"]), jnp.maximum(a["second"], b["second"])),
        sumexp=_rescale(fa, a["sumexp"]) + _rescale(fb, b["sumexp"]),
        plogp=_rescale(fa, a["plogp"] + (a["max"] - top) * a["sumexp"])
        + _rescale(fb, b["plogp"] + (b["max"] - top) * b["sumexp"]),
    )
    return merged, fa, fb


@flax.struct.dataclass
class VocabScan:
    """The result of `summarise`: one `LogitSummary` per view (its `at_candidate` still 0: `with_candidates`), the
    Gumbel-max candidates of view 0 (None without keys) and sum_v softmax(view sc)_v E_v in float32 (None without an
    embedding table)."""

    summaries: tuple[LogitSummary, ...]
    candidates: Int[Array, "b c"] | None
    expected_embedding: Float[Array, "b c d"] | None


def summarise(
    biased: BiasedLogits,
    divisors: tuple[Any, ...],
    chunk: int,
    *,
    gumbel_keys: Array | None = None,
    embedding: Float[Array, "v d"] | None = None,
    sc_view: int = 0,
    matmul_dtype: Any = jnp.float32,
) -> VocabScan:
    """One pass over the vocabulary in chunks of `chunk` ids; view i is `biased / divisors[i]`.

    gumbel_keys: (b,) row keys: also the Gumbel-max draw of view 0, the candidates `GumbelMax()(keys, view 0)` gives.
    embedding: the (v, d) embedding table: also sum_v softmax(view `sc_view`)_v E_v (the products in `matmul_dtype`
      with float32 accumulation, as `Embedder.encode_probs`).
    """
    _, c, v = biased.logits.shape
    if gumbel_keys is not None:
        check_reproducible_gumbel(gumbel_keys)

    def stats(start, size):
        x = biased.chunk(start, size)
        views = [x / d for d in divisors]
        out: dict[str, Any] = {"views": [_view_stats(view, start) for view in views]}
        if gumbel_keys is not None:
            ids = start + jnp.arange(size)
            noisy = views[0] + gumbel_columns(gumbel_keys, ids, c, v)
            out["gumbel_max"] = jnp.max(noisy, axis=-1)
            out["gumbel_arg"] = (jnp.argmax(noisy, axis=-1) + start).astype(jnp.int32)
        if embedding is not None:
            weights = jnp.exp(views[sc_view] - out["views"][sc_view]["max"][..., None])
            table = lax.dynamic_slice_in_dim(embedding, start, size, axis=0)
            out["embedding"] = jnp.einsum(
                "bcn,nd->bcd",
                weights.astype(matmul_dtype),
                table.astype(matmul_dtype),
                preferred_element_type=jnp.float32,
            )
        return out

    def merge(a, b):
        merged_views, factors = [], []
        for va, vb in zip(a["views"], b["views"]):
            merged, fa, fb = _merge_view(va, vb)
            merged_views.append(merged)
            factors.append((fa, fb))
        out: dict[str, Any] = {"views": merged_views}
        if "gumbel_max" in a:
            later = b["gumbel_max"] > a["gumbel_max"]
            out["gumbel_max"] = jnp.maximum(a["gumbel_max"], b["gumbel_max"])
            out["gumbel_arg"] = jnp.where(later, b["gumbel_arg"], a["gumbel_arg"])
        if "embedding" in a:
            fa, fb = factors[sc_view]
            out["embedding"] = _rescale(fa[..., None], a["embedding"]) + _rescale(fb[..., None], b["embedding"])
        return out

    folded = fold_chunks(stats, merge, v, chunk)
    summaries = tuple(
        LogitSummary(
            max=s["max"],
            argmax=s["argmax"],
            second=s["second"],
            sumexp=s["sumexp"],
            entropy=jnp.log(s["sumexp"]) - s["plogp"] / s["sumexp"],
            at_candidate=jnp.zeros_like(s["max"]),
        )
        for s in folded["views"]
    )
    expected = None
    if embedding is not None:
        expected = folded["embedding"] / summaries[sc_view].sumexp[..., None]
    return VocabScan(
        summaries=summaries,
        candidates=folded.get("gumbel_arg"),
        expected_embedding=expected,
    )


def with_candidates(
    summary: LogitSummary, biased: BiasedLogits, divisor: Any, candidates: Int[Array, "b c"]
) -> LogitSummary:
    """The summary with `at_candidate` = the view's logit at each position's candidate (a (b, c) gather)."""
    return summary.replace(at_candidate=biased.at(candidates[..., None])[..., 0] / divisor)


def blocked_inverse_cdf(
    keys: Array, biased: BiasedLogits, divisor: Any, top: Float[Array, "b c"], chunk: int, block: int
) -> Int[Array, "b c"]:
    """`BlockedInverseCdf(block)(keys, biased / divisor)` in chunks, given the view's maximum `top`: a second pass
    sums each block's weights exp(x - top), then the chosen block's `block` logits are gathered. The same tokens as the
    unchunked draw when `block` divides `chunk` (or the chunk covers the vocabulary)."""
    b, c, v = biased.logits.shape
    g = min(block, v)
    size = min(chunk, v)
    if size < v and size % g:
        raise ValueError(f"vocab_chunk {chunk} must be a multiple of BlockedInverseCdf.block {block}.")

    def masses(start, n):
        w = jnp.exp(biased.chunk(start, n) / divisor - top[..., None])
        padded = -(-n // g) * g
        if padded != n:  # a last block past the vocabulary: weightless ids, as the unchunked draw's -inf padding
            w = jnp.pad(w, ((0, 0), (0, 0), (0, padded - n)))
        return w.reshape(b, c, padded // g, g).sum(axis=-1)

    whole, tail = divmod(v, size)
    parts = [masses(0, size)[None]]
    if whole > 1:
        parts.append(lax.map(lambda k: masses(k * size, size), jnp.arange(1, whole)))
    block_mass = jnp.moveaxis(jnp.concatenate(parts, axis=0), 0, 2).reshape(b, c, -1)
    if tail:
        block_mass = jnp.concatenate([block_mass, masses(whole * size, tail)], axis=-1)
    u = jax.vmap(lambda k: jax.random.uniform(k, (c, 2)))(keys)
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    chosen = _first_above(block_cdf, u[..., 0] * block_cdf[..., -1], block_mass)
    ids = chosen[..., None] * g + jnp.arange(g)
    inside = jnp.where(ids < v, jnp.exp(biased.at(ids) / divisor - top[..., None]), 0.0)
    inside_cdf = jnp.cumsum(inside, axis=-1)
    offset = _first_above(inside_cdf, u[..., 1] * inside_cdf[..., -1], inside)
    return (chosen * g + offset).astype(jnp.int32)


def embedding_table(model: T.Transformer, params: Any) -> Float[Array, "v d"]:
    """The model's (tied) embedding table E as its calls see it (dequantized FP8 weights included)."""
    return model.apply(
        {"params": Q.for_compute(params, model.cfg.param_dtype)}, method=lambda m: m.embedder.input_embedding
    )


def sc_signal(expected: Float[Array, "b c d"], embed_dim: int, dtype: Any) -> Float[Array, "b c d"]:
    """sqrt(d) E[E_v] in `dtype`, what `Transformer.sc_signal` returns for the same distribution."""
    return (expected * embed_dim**0.5).astype(dtype)
