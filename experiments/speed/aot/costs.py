"""A cost model of the decode programs: analytic FLOP and byte counts of each program. The roofline step times on
published GPU peaks are `roofline.py`; XLA's own counts of the compiled programs, `xla_counts.py`.

What it follows:
  * The counts of `experiments/speed/decode_bench.py` (`weight_bytes`, `kv_bytes`, `forward_flops`): FLOPs are 2 x the
    matmul parameters a token passes through (the tied output head included) plus attention (QK^T and PV over the
    keys each query sees), bytes are the weights a program touches plus the KV cache it reads. For a mixture of
    experts, `tokens` routed tokens reach an expected fraction 1 - (1 - k/E)^tokens of each layer's experts.

Where it deliberately differs from `decode_bench.py`:
  * Only matrices count as matmul parameters (norm scales, the router and expert scales do not), and the
    self-conditioner counts only in the canvas step, the one program that runs it.
  * Attention keys are counted exactly per query (the sliding window of local layers, causal or bidirectional
    blocks), and a K = V global layer's cache holds one tensor, not two.
  * A canvas step also pays for the sampler's self-conditioning signal, sqrt(d) * softmax(logits) @ E: one more
    (vocab x embed) matmul per token and one more read of the embedding table. Its float32 logits are written once
    and read once.
  * Two counts per program: `ideal_counts` (what the step must do: what a GPU kernel that reads only the valid cache
    and only the experts the tokens were routed to would do; the roofline uses these) and `compiled_counts` (what the
    toolbox's program computes as XLA:CPU compiles it: attention over every cache slot of every layer, the logits of
    every position, the expert rows of the MoE dispatch; the check against XLA uses these).

MoE dispatch as XLA:CPU compiles it (`dispatch_rows`): "sorted" runs E x C capacity slots (C = ceil(1.25 T k / E),
at least 1, so one token costs 128 slots instead of 8), "dense" runs every expert on every token (E x T), and
"ragged" (`lax.ragged_dot`, the GPU path) is lowered by XLA:CPU to a dense dot of every routed row with every
expert (T x k x E rows, E times the dropless work). All three read every expert's weights.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.moe import expert_capacity
from hackable_diffusion.models.param_count import EXPERT_LEAVES, abstract_params

WEIGHT_BITS: dict[str, float] = {"bf16": 16.0, "fp8": 8.0, "nvfp4": 4.5}
"""Stored bits per matmul weight, for the weights' memory (`weight_memory`): NVFP4 is a 4-bit E2M1 code plus an 8-bit
e4m3 scale per block of 16 (4 + 8 / 16); its float32 scale per tensor and FP8's per-channel scales are left out (well
under 0.1% of the bytes). NVFP4 is not a `WEIGHT_FORMATS` entry: the roofline has no FP4 peak (the toolbox's NVFP4 is
weight-only, dequantized to the compute dtype)."""

KV_BYTES = 2  # bf16 KV cache in both weight formats
LOGITS_BYTES = 4  # the model returns float32 logits


# ---------------------------------------------------------------------------------------------------------------------
# Parameter sizes and the programs.


MATMUL_SUFFIXES = ("einsum", "linear", "router_logits", "input_embedding")


@dataclasses.dataclass(frozen=True)
class ParamSizes:
    """Element counts of the parameter tree by role (every layer summed)."""

    layer_matmul: int  # attention projections, dense FFN, router of all layers
    layer_other: int  # norm scales, router and expert scales, skip scales, the final norm
    experts: int  # every expert's gating + linear weights of all layers
    embed: int  # the tied embedding table (vocab x embed)
    sc_matmul: int  # the self-conditioner's FFN (canvas steps only)
    sc_other: int

    @property
    def total(self) -> int:
        return self.layer_matmul + self.layer_other + self.experts + self.embed + self.sc_matmul + self.sc_other


def param_sizes(cfg: TransformerConfig, params: Any | None = None) -> ParamSizes:
    """Sizes by role of `params` (default: the abstract tree of `cfg`; nothing is allocated)."""
    params = abstract_params(cfg) if params is None else params
    sizes = collections.Counter()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", k)) for k in path]
        size = math.prod(leaf.shape)
        matmul = names[-1].endswith(MATMUL_SUFFIXES)
        if "embedder" in names:
            sizes["embed"] += size
        elif "self_conditioner" in names:
            sizes["sc_matmul" if matmul else "sc_other"] += size
        elif "moe" in names and names[-1] in EXPERT_LEAVES:
            sizes["experts"] += size
        else:
            sizes["layer_matmul" if matmul else "layer_other"] += size
    return ParamSizes(**{f.name: int(sizes[f.name]) for f in dataclasses.fields(ParamSizes)})


def weight_memory(cfg: TransformerConfig, weights: str, sizes: ParamSizes | None = None) -> float:
    """Bytes of the model's weights stored as `weights` (a `WEIGHT_BITS` key): every matmul weight (attention, dense
    FFN, router, experts, the tied embedding, the self-conditioner) at its bits, the rest (norm, router and expert
    scales) in bf16."""
    if weights not in WEIGHT_BITS:
        raise ValueError(f"weights {weights!r} is not one of {sorted(WEIGHT_BITS)}.")
    sizes = param_sizes(cfg) if sizes is None else sizes
    matmul = sizes.layer_matmul + sizes.experts + sizes.embed + sizes.sc_matmul
    return matmul * WEIGHT_BITS[weights] / 8 + (sizes.layer_other + sizes.sc_other) * 2


MODES = ("canvas", "append")


@dataclasses.dataclass(frozen=True)
class Program:
    """One decode program: `batch` rows of `tokens` new tokens each against `context` valid cached tokens per row.

    mode: "canvas" (decoder mode: the block attends bidirectionally to itself and to the cache, reads it without
      writing, through the self-conditioner) or "append" (causal, writes its keys and values into the cache: the
      prefill, a canvas's commit, one AR step).
    logits: positions per row whose logits the step needs (all of a canvas, the last one of a prefill or an AR step,
      none of a commit); the compiled programs compute every position's.
    """

    name: str
    mode: str
    batch: int
    tokens: int
    context: int
    logits: int

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {MODES}.")
        if min(self.batch, self.tokens) < 1 or min(self.context, self.logits) < 0 or self.logits > self.tokens:
            raise ValueError(f"bad program sizes: {self}.")


@dataclasses.dataclass(frozen=True)
class Counts:
    """FLOPs and bytes of one program, with their parts (the totals are the sums of the parts)."""

    flops_parts: Mapping[str, float]
    bytes_parts: Mapping[str, float]

    @property
    def flops(self) -> float:
        return float(sum(self.flops_parts.values()))

    @property
    def bytes(self) -> float:
        return float(sum(self.bytes_parts.values()))


def expert_fraction(cfg: TransformerConfig, routed_tokens: int) -> float:
    """Expected fraction of a layer's experts that `routed_tokens` tokens reach, 1 - (1 - k/E)^tokens (uniform,
    independent routing; 1.0 without MoE)."""
    if cfg.moe is None:
        return 1.0
    return 1.0 - (1.0 - cfg.moe.top_k / cfg.moe.num_experts) ** routed_tokens


def _kv_token_bytes(cfg: TransformerConfig, layer_type: str, k_eq_v_once: bool) -> int:
    """Bytes one token's keys and values take in one layer's cache (bf16)."""
    if layer_type == "global":
        tensors = 1 if (cfg.k_eq_v_global and k_eq_v_once) else 2
        return tensors * cfg.global_kv_heads * cfg.global_attn_head_dim * KV_BYTES
    return 2 * cfg.num_kv_heads * cfg.head_dim * KV_BYTES


def attention_keys(cfg: TransformerConfig, layer_type: str, program: Program) -> int:
    """Keys summed over the queries of one row in one layer: the valid cached tokens plus the block's own tokens that
    each query sees (local layers: |pos_q - pos_k| < window, symmetric, on positions; canvas: bidirectional block;
    append: causal block)."""
    ctx, l = program.context, program.tokens
    window = cfg.sliding_window if layer_type == "local" else None
    total = 0
    for i in range(l):
        query = ctx + i
        if window is None:
            cached = ctx
            own = l if program.mode == "canvas" else i + 1
        else:
            cached = max(0, ctx - max(0, query - window + 1))
            own = (min(l, i + window) - max(0, i - window + 1)) if program.mode == "canvas" else min(i + 1, window)
        total += cached + own
    return total


def _head_dim(cfg: TransformerConfig, layer_type: str) -> int:
    return cfg.global_attn_head_dim if layer_type == "global" else cfg.head_dim


def ideal_counts(
    cfg: TransformerConfig,
    sizes: ParamSizes,
    program: Program,
    weight_bytes: int = 2,
    kv_bytes: int = KV_BYTES,
    sampler: bool = True,
) -> Counts:
    """What the step must compute and read: the routed experts only, the valid cache only (the local layers' window),
    the logits it needs (written once, and read once by the sampler); a canvas step runs the self-conditioner, and
    with `sampler` its step also computes the self-conditioning signal (`sampler=False`: the model call alone, the
    program `compiled_counts` describes)."""
    b, l = program.batch, program.tokens
    tokens = b * l
    canvas = program.mode == "canvas"
    k_over_e = cfg.moe.top_k / cfg.moe.num_experts if cfg.moe else 0.0
    layers_of = collections.Counter(cfg.layer_types())
    attention = sum(
        n * 4 * cfg.num_heads * _head_dim(cfg, t) * attention_keys(cfg, t, program) * b for t, n in layers_of.items()
    )
    flops = {
        "layers": 2.0 * tokens * sizes.layer_matmul,
        "experts": 2.0 * tokens * sizes.experts * k_over_e,
        "attention": float(attention),
        "head": 2.0 * b * program.logits * sizes.embed,
    }
    if canvas:
        flops["self_conditioner"] = 2.0 * tokens * sizes.sc_matmul
        if sampler:
            flops["sc_signal"] = 2.0 * tokens * sizes.embed  # softmax(logits) @ E, in the sampler
    fraction = expert_fraction(cfg, tokens)
    kv_read = 0
    for t in cfg.layer_types():
        reach = program.context if t == "global" else min(program.context, cfg.sliding_window - 1)
        kv_read += b * reach * _kv_token_bytes(cfg, t, k_eq_v_once=True) // KV_BYTES * kv_bytes
    nbytes = {
        "weights": float(weight_bytes * (sizes.layer_matmul + sizes.layer_other + sizes.embed)),
        "experts": float(weight_bytes * sizes.experts * fraction),
        "kv_read": float(kv_read),
        "logits": (1.0 + sampler) * b * program.logits * cfg.vocab_size * LOGITS_BYTES,  # written, read
    }
    if canvas:
        nbytes["weights"] += weight_bytes * (sizes.sc_matmul + sizes.sc_other)
        if sampler:
            nbytes["sc_signal"] = float(weight_bytes * sizes.embed)  # the embedding table read again
    else:
        kv_write = sum(b * l * _kv_token_bytes(cfg, t, k_eq_v_once=True) for t in cfg.layer_types())
        nbytes["kv_write"] = float(kv_write // KV_BYTES * kv_bytes)
    return Counts(flops_parts=flops, bytes_parts=nbytes)


def dispatch_rows(cfg: TransformerConfig, routed_tokens: int) -> int:
    """Expert rows (token x expert pairs) one MoE layer computes as XLA:CPU compiles the dispatch of `cfg`."""
    moe = cfg.moe
    if moe is None:
        return 0
    if moe.dispatch == "sorted":
        return moe.num_experts * expert_capacity(routed_tokens, moe.top_k, moe.num_experts, moe.capacity_factor)
    if moe.dispatch == "dense":
        return moe.num_experts * routed_tokens
    if moe.dispatch == "ragged":  # XLA:CPU: every routed row times every expert (a masked dense dot)
        return moe.num_experts * moe.top_k * routed_tokens
    raise ValueError(f"unknown dispatch {moe.dispatch!r}.")


def compiled_counts(cfg: TransformerConfig, sizes: ParamSizes, program: Program, cache_slots: int) -> Counts:
    """What the toolbox's program computes and reads as compiled here: attention of every layer over every one of the
    `cache_slots` cache slots plus the block, every position's logits, the dispatch's expert rows (`dispatch_rows`);
    bytes are the lower bound of reading every argument once (all weights, the whole cache: K and V stored for
    every layer) and writing the outputs once (float32 logits, the appended keys and values)."""
    b, l = program.batch, program.tokens
    tokens = b * l
    canvas = program.mode == "canvas"
    itemsize = jnp.dtype(cfg.param_dtype).itemsize
    per_expert = sizes.experts / cfg.moe.num_experts if cfg.moe else 0.0
    attention = sum(4 * cfg.num_heads * _head_dim(cfg, t) * (cache_slots + l) * l * b for t in cfg.layer_types())
    flops = {
        "layers": 2.0 * tokens * sizes.layer_matmul,
        "experts": 2.0 * per_expert * dispatch_rows(cfg, tokens),
        "attention": float(attention),
        "head": 2.0 * tokens * sizes.embed,
    }
    if canvas:
        flops["self_conditioner"] = 2.0 * tokens * sizes.sc_matmul
    cache_token = sum(_kv_token_bytes(cfg, t, k_eq_v_once=False) for t in cfg.layer_types())
    read = sizes.total if canvas else sizes.total - sizes.sc_matmul - sizes.sc_other  # append never runs the SC
    nbytes = {
        "params": float(itemsize * read),
        "cache": float(b * cache_slots * cache_token),
        "logits": float(tokens * cfg.vocab_size * LOGITS_BYTES),
    }
    if not canvas:
        nbytes["kv_write"] = float(tokens * cache_token)
    return Counts(flops_parts=flops, bytes_parts=nbytes)
