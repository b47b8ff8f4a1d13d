"""A cost model of the decode programs: analytic FLOP and byte counts, XLA's cost analysis of the compiled programs,
and roofline step times on published GPU peaks.

What it follows:
  * The counts of `experiments/decode_bench.py` (`weight_bytes`, `kv_bytes`, `forward_flops`): FLOPs are 2 x the
    matmul parameters a token passes through (the tied output head included) plus attention (QK^T and PV over the
    keys each query sees), bytes are the weights a program touches plus the KV cache it reads. For a mixture of
    experts, `tokens` routed tokens reach an expected fraction 1 - (1 - k/E)^tokens of each layer's experts.
  * The roofline model (Williams, Waterman and Patterson, CACM 2009): a program takes at least
    max(FLOPs / peak FLOP/s, bytes / memory bandwidth). It is a lower bound on time, with no kernel efficiency,
    launch overhead or communication in it.
  * XLA's `compiled.cost_analysis()` (HloCostAnalysis): "flops" counts every HLO instruction (elementwise ops and
    converts too), "bytes accessed" sums, over every instruction left after fusion, the bytes of all its operands and
    of its output, as if each one went through memory. It counts the body of a while loop once whatever the trip
    count, so the programs are compiled with the layer scan unrolled (`scan_unroll = num_groups`: the same
    parameters and the same math, a static slice of the stacked weights per layer).

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

The published peaks are data with their sources (`HARDWARE`): dense (no 2:4 sparsity) tensor-core FLOP/s in bf16
and FP8 and HBM bandwidth. FP8 weights halve the weight bytes (every weight, the embedding table too) and run the
matmuls at the FP8 peak; the KV cache stays bf16 and the logits float32.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.moe import expert_capacity
from hackable_diffusion.models.param_count import EXPERT_LEAVES, abstract_params

# ---------------------------------------------------------------------------------------------------------------------
# Published hardware peaks.


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One GPU's published peaks: dense tensor-core TFLOP/s in bf16 and FP8, HBM bandwidth, and where they come from."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_tb_per_s: float
    memory_gb: float
    source: str

    def flops_per_s(self, weights: str) -> float:
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights {weights!r} is not one of {sorted(WEIGHT_FORMATS)}.")
        return 1e12 * (self.fp8_tflops if weights == "fp8" else self.bf16_tflops)

    @property
    def bytes_per_s(self) -> float:
        return 1e12 * self.hbm_tb_per_s


HARDWARE: dict[str, Hardware] = {
    hw.name: hw
    for hw in (
        Hardware(
            name="H100 SXM",
            bf16_tflops=989.4,
            fp8_tflops=1978.9,
            hbm_tb_per_s=3.35,
            memory_gb=80,
            source="NVIDIA H100 Tensor Core GPU datasheet and product page (nvidia.com/en-us/data-center/h100/), "
            "SXM column: BF16 1,979 and FP8 3,958 TFLOPS 'with sparsity', halved for dense (989.4 and 1,978.9 in "
            "the NVIDIA H100 Tensor Core GPU Architecture whitepaper); 80 GB HBM3 at 3.35 TB/s.",
        ),
        Hardware(
            name="H200 SXM",
            bf16_tflops=989.4,
            fp8_tflops=1978.9,
            hbm_tb_per_s=4.8,
            memory_gb=141,
            source="NVIDIA H200 Tensor Core GPU datasheet and product page (nvidia.com/en-us/data-center/h200/), "
            "SXM column: BF16 1,979 and FP8 3,958 TFLOPS with sparsity, halved for dense (the H100's compute); "
            "141 GB HBM3e at 4.8 TB/s.",
        ),
        Hardware(
            name="B200 (HGX)",
            bf16_tflops=2250.0,
            fp8_tflops=4500.0,
            hbm_tb_per_s=7.7,
            memory_gb=180,
            source="NVIDIA HGX platform specifications (nvidia.com/en-us/data-center/hgx/), per-GPU HGX B200 "
            "column: FP16/BF16 4.5 and FP8 9 PFLOPS with sparsity, halved for dense; 180 GB HBM3e at 7.7 TB/s "
            "(the DGX B200 datasheet gives 64 TB/s for 8 GPUs, 8 TB/s each).",
        ),
    )
}
"""Name -> published peaks (dense tensor-core figures: NVIDIA quotes 2:4-sparse figures, twice the dense ones)."""

WEIGHT_FORMATS: dict[str, int] = {"bf16": 2, "fp8": 1}
"""Weight format -> bytes per weight."""

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


# ---------------------------------------------------------------------------------------------------------------------
# Roofline.


@dataclasses.dataclass(frozen=True)
class Roofline:
    """max(compute time, memory time): a lower bound on the step time."""

    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def roofline(counts: Counts, hardware: Hardware, weights: str) -> Roofline:
    """The roofline time of `counts` on `hardware` with `weights` ("bf16" or "fp8": the FLOP peak used)."""
    return Roofline(
        compute_s=counts.flops / hardware.flops_per_s(weights), memory_s=counts.bytes / hardware.bytes_per_s
    )


def canvas_tokens_per_s(batch: int, canvas: int, steps: int, step_s: float) -> float:
    """Block-diffusion throughput from the step time: batch x canvas / ((steps + 1) x step), the +1 the commit."""
    return batch * canvas / ((steps + 1) * step_s)


# ---------------------------------------------------------------------------------------------------------------------
# XLA's counts of a compiled program.

_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
}
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\w+\[[\d,]*\]\S*) ([\w\-]+)\((.*?)\)(.*)$")


def _shape_bytes(shape: str) -> int:
    return sum(
        math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES[dtype]
        for dtype, dims in _SHAPE.findall(shape)
        if dtype in _DTYPE_BYTES
    )


def _dims(shape: str) -> list[int]:
    match = _SHAPE.search(shape)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


@dataclasses.dataclass(frozen=True)
class HloCosts:
    """Counts read from an optimized HLO module's text.

    dot_flops: 2 x output elements x contracted size, summed over every dot of every computation (times the number of
      places that call it). bytes_by_kind: operand + output bytes of the entry computation's instructions (what
      "bytes accessed" sums), by kind: "matmul" (dots and fusions holding one), "argument_copies" (instructions
      computed from the program's arguments alone, no matmul upstream: XLA:CPU's converts, slices and layout copies
      of the stacked weights and of the cache, the embedding lookup) and "other" (the activations' traffic).
      while_loops: loops left in the module, whose bodies XLA's cost analysis counts once.
    """

    dot_flops: float
    bytes_by_kind: Mapping[str, float]
    while_loops: int


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
        elif current is not None and line.startswith(" "):
            computations[current].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text.")
    return computations, entry


def hlo_costs(hlo_text: str) -> HloCosts:
    """Parses `compiled.as_text()` (see `HloCosts`)."""
    computations, entry = _computations(hlo_text)
    calls = collections.Counter(re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", hlo_text))
    has_dot = {name: any(" dot(" in line for line in lines) for name, lines in computations.items()}
    dot_flops, by_kind, loops = 0.0, collections.Counter(), 0
    for name, lines in computations.items():
        shapes: dict[str, str] = {}
        arguments: set[str] = set()
        times = 1 if name == entry else calls.get(name, 0)
        for line in lines:
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            result, shape, op, operands, attributes = match.groups()
            shapes[result] = shape
            names = [o.strip().split(" ")[-1].lstrip("%") for o in operands.split(",") if o.strip()]
            if op == "while":
                loops += times
            elif op == "dot":
                contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attributes)
                lhs = _dims(shapes.get(names[0], "")) if names else []
                size = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d) if contracting else 1
                dot_flops += times * 2.0 * math.prod(_dims(shape)) * size
            if name != entry:
                continue
            called = re.search(r"calls=%?([\w.\-]+)", attributes)
            matmul = op == "dot" or (op == "fusion" and called is not None and has_dot.get(called.group(1), False))
            if op in ("parameter", "constant") or (not matmul and all(o in arguments for o in names)):
                arguments.add(result)  # computed from the arguments alone
            if op in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
                continue
            kind = "matmul" if matmul else "argument_copies" if result in arguments else "other"
            by_kind[kind] += _shape_bytes(shape) + sum(_shape_bytes(shapes.get(o, "")) for o in names)
    return HloCosts(dot_flops=dot_flops, bytes_by_kind=dict(by_kind), while_loops=loops)


def xla_costs(compiled: Any) -> dict[str, Any]:
    """XLA's cost analysis of a compiled program (flops, bytes accessed, transcendentals) and the HLO's own counts."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, Sequence):  # older jax: one dict per device program
        analysis = analysis[0]
    hlo = hlo_costs(compiled.as_text())
    return {
        "flops": float(analysis.get("flops", 0.0)),
        "bytes_accessed": float(analysis.get("bytes accessed", 0.0)),
        "transcendentals": float(analysis.get("transcendentals", 0.0)),
        "dot_flops": hlo.dot_flops,
        "bytes_by_kind": hlo.bytes_by_kind,
        "while_loops": hlo.while_loops,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Compiling the decode programs on one device.

ONE_DEVICE = {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}


def compile_decode_program(
    model: Mapping[str, Any],
    program: Program,
    cache_slots: int,
    compiler_options: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], Any]:
    """Compiles `program` for the model dictionary `model` on one device, with the layer scan unrolled and nothing
    allocated (`aot.programs`: canvas mode = `canvas_denoise`, append mode = `transformer.append` into a cache of
    `cache_slots` slots); returns (the AOT report, the compiled program)."""
    from hackable_diffusion.aot import layout, programs
    from hackable_diffusion.training import sharding

    cfg = TransformerConfig.from_dict(model)
    unrolled = dict(model, scan_unroll=cfg.num_groups)
    options = dict(layout.NO_LICM) if compiler_options is None else dict(compiler_options)
    settings = layout.AotSettings(
        model=unrolled,
        mesh=ONE_DEVICE,
        decode_batch=program.batch,
        canvas=program.tokens,
        cache_len=cache_slots,
        append_len=program.tokens,
        compiler_options=options,
    )
    mesh = sharding.make_mesh(ONE_DEVICE, devices=jax.devices()[:1])
    start = time.perf_counter()
    if program.mode == "canvas":
        report, compiled = programs.canvas_denoise_program(settings, mesh)
    else:
        report, compiled = programs.append_program(settings, mesh, program.tokens)
    report["wall_s"] = round(time.perf_counter() - start, 2)
    return report, compiled
