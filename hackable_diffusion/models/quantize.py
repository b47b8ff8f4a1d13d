"""FP8 weight-only quantization: matmul weights stored as float8_e4m3fn with one scale per output channel, computed
in the model's compute dtype after dequantization.

Follows the weight-only FP8 serving of large MoE models (DiffusionGemma's FP8 checkpoints under vLLM): each weight
matrix w is stored as q = round_fp8(w / s) with s = max |w| over the contraction (input) axes / 448 (e4m3's largest
finite value), so every output channel uses the whole FP8 range; activations stay in the compute dtype. What is
quantized is named by the parameter's leaf name, with the axes its einsum contracts:

  q_einsum / k_einsum / kv_einsum  (.., D, H)       contract D
  attn_vec_einsum                  (.., N, H, D)    contract N, H
  gating_einsum                    (.., 2, F, D)    contract D (dense FFN, experts, self-conditioner)
  linear                           (.., F, D)       contract F
  input_embedding                  (V, D)           contract D (the tied output head; the lookup reads rows)

Norm scales, the router, per-expert scales, skip scales and grid tables stay as they are (small, and the router is
fp32 in the reference). Where this differs from a fused FP8 kernel: `dequantize` turns the weights back into the
compute dtype inside the jitted program, so on a CPU it saves storage, not time; on a GPU, XLA fuses the convert and
scale into the consumer where it can.

`QuantizedParams` (values + scales) is what a quantized run's params are: every model call in `transformer.py`
dequantizes it inside its jitted program (`for_compute`), so the samplers, scorers and evaluations take it wherever
they take params. `checkpoints.quantized_runs` stores it with orbax (the FP8 bytes as uint8, the scales of the
quantized leaves only); `python -m hackable_diffusion.quantize` makes a quantized run from a trained one once.

NVFP4 (`quantize_nvfp4`, `NVFP4Params`; `python -m hackable_diffusion.quantize --format nvfp4`) follows NVIDIA's
NVFP4 as ModelOpt exports it (docs/checkpoints.md, "Quantized Hugging Face checkpoints", lists the facts and their
sources): E2M1 values (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, code 8
being -0), one float8_e4m3fn scale per block of 16 consecutive elements along a contracted (input) axis, and one
float32 scale per tensor, amax / (6 * 448), so that a block's scale amax_block / 6 / global fits e4m3; a value is
code_value * block_scale * global_scale, and two codes share a byte along the blocked axis, the even element in the
low nibble. Where it differs from ModelOpt: the blocks run along the leaf's last contracted axis (for
attn_vec_einsum the head dimension H, not the flattened N*H; the same blocks whenever H is a multiple of 16), the
global scale covers the whole stacked leaf (every layer of a scanned group, every expert) rather than one linear layer,
rounding is to nearest with ties to the even code, and a leaf whose blocked axis is not a multiple of 16 stays as it
was (as transformers' NVFP4Config leaves such layers).
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, UInt8

FP8 = jnp.float8_e4m3fn
FP8_MAX = float(jnp.finfo(FP8).max)  # 448
CONTRACTED_AXES = {  # leaf name -> the axes (from the end) its einsum contracts
    "q_einsum": (-2,),
    "k_einsum": (-2,),
    "kv_einsum": (-2,),
    "attn_vec_einsum": (-3, -2),
    "gating_einsum": (-1,),
    "linear": (-2,),
    "input_embedding": (-1,),
}


def _leaf_name(path) -> str:
    return str(getattr(path[-1], "key", path[-1]))


def quantizable(path, leaf) -> bool:
    return _leaf_name(path) in CONTRACTED_AXES and getattr(leaf, "ndim", 0) >= 2


def quantize_leaf(w: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """(q, scale): q in float8_e4m3fn, scale (float32, keepdims over `axes`) with w ~= q * scale."""
    w32 = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w32), axis=axes, keepdims=True)
    scale = jnp.where(amax > 0, amax / FP8_MAX, 1.0)
    return (w32 / scale).astype(FP8), scale


def quantize_fp8(params: Any) -> tuple[Any, Any]:
    """(values, scales): `values` is `params` with every matmul weight in float8_e4m3fn, `scales` the same tree with
    their per-output-channel float32 scales and None for the leaves kept as they were."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    values, scales = [], []
    for path, leaf in flat:
        if quantizable(path, leaf):
            q, s = quantize_leaf(leaf, CONTRACTED_AXES[_leaf_name(path)])
            values.append(q)
            scales.append(s)
        else:
            values.append(leaf)
            scales.append(None)
    return treedef.unflatten(values), treedef.unflatten(scales)


def dequantize(values: Any, scales: Any, dtype: Any = jnp.bfloat16) -> Any:
    """The parameters back in `dtype` (quantized leaves: q * scale; the others cast to `dtype` only if they were FP8)."""
    flat_v, treedef = jax.tree_util.tree_flatten(values)
    flat_s = treedef.flatten_up_to(scales)
    out = [v if s is None else (v.astype(jnp.float32) * s).astype(dtype) for v, s in zip(flat_v, flat_s, strict=True)]
    return treedef.unflatten(out)


def nbytes(tree: Any) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype")))


@flax.struct.dataclass
class QuantizedParams:
    """A params tree stored as FP8 `values` with `scales` (the same tree; None where a leaf is kept as it was)."""

    values: Any
    scales: Any

    def dequantize(self, dtype: Any) -> Any:
        return dequantize(self.values, self.scales, dtype)


def quantize_params(params: Any) -> QuantizedParams:
    return QuantizedParams(*quantize_fp8(params))


def for_compute(params: Any, dtype: Any) -> Any:
    """The params a model call applies: `params` itself, or a `QuantizedParams` / `NVFP4Params` dequantized to
    `dtype` (called inside the jitted model functions, so the dequantization is part of the compiled program)."""
    return params.dequantize(dtype) if isinstance(params, (QuantizedParams, NVFP4Params)) else params


# ----------------------------------------------------------------------------------------------------------------
# NVFP4: E2M1 values, an e4m3 scale per block of 16 along the contracted axis, a float32 scale per tensor.

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0-7; code | 8 is the negative (code 8 is -0.0)
E2M1_TABLE = E2M1_VALUES + tuple(-v for v in E2M1_VALUES)  # value of each 4-bit code
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
# The midpoint between the magnitudes of code k and k + 1, and whether a value exactly there goes up to k + 1 (ties
# go to the even code, as IEEE round-to-nearest-even does).
_E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_codes(x: Float[Array, "*shape"]) -> UInt8[Array, "*shape"]:
    """The 4-bit E2M1 code (in a uint8) nearest each value of `x` (ties to even; |x| > 6 saturates to 6; the sign
    bit is kept for -0.0)."""
    magnitude = jnp.abs(x)
    code = sum(((magnitude >= t) if up else (magnitude > t)).astype(jnp.uint8) for t, up in _E2M1_MIDPOINTS)
    return code | (jnp.signbit(x).astype(jnp.uint8) << 3)


def pack_nibbles(codes: UInt8[Array, "*shape"], axis: int) -> jax.Array:
    """Two 4-bit codes per byte along `axis` (even length): element 2i in the low nibble, 2i + 1 in the high."""
    moved = jnp.moveaxis(codes, axis, -1)
    return jnp.moveaxis(moved[..., 0::2] | (moved[..., 1::2] << 4), -1, axis)


def unpack_nibbles(packed: UInt8[Array, "*shape"], axis: int) -> jax.Array:
    """The inverse of `pack_nibbles`: `axis` twice as long."""
    moved = jnp.moveaxis(packed, axis, -1)
    codes = jnp.stack([moved & 0xF, moved >> 4], axis=-1).reshape(*moved.shape[:-1], 2 * moved.shape[-1])
    return jnp.moveaxis(codes, -1, axis)


def quantize_nvfp4_leaf(w: jax.Array, axis: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(packed uint8, block scales float8_e4m3fn, global scale float32 ()) with w ~= e2m1 * block * global; the
    blocks of 16 run along `axis`, whose length must be a multiple of 16; `packed` and the block scales have `axis`
    1/2 and 1/16 as long."""
    w32 = jnp.moveaxis(w.astype(jnp.float32), axis, -1)
    if w32.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 blocks of {NVFP4_BLOCK} need an axis length divisible by it, got {w32.shape[-1]}.")
    amax = jnp.max(jnp.abs(w32))
    global_scale = jnp.where(amax > 0, amax / (E2M1_MAX * FP8_MAX), 1.0).astype(jnp.float32)
    blocks = w32.reshape(*w32.shape[:-1], -1, NVFP4_BLOCK)
    block_scale = (jnp.max(jnp.abs(blocks), axis=-1) / E2M1_MAX / global_scale).astype(FP8)
    step = block_scale.astype(jnp.float32)[..., None] * global_scale
    scaled = jnp.where(step > 0, blocks / jnp.where(step > 0, step, 1.0), 0.0)
    codes = e2m1_codes(jnp.clip(scaled, -E2M1_MAX, E2M1_MAX)).reshape(w32.shape)
    return jnp.moveaxis(pack_nibbles(codes, -1), -1, axis), jnp.moveaxis(block_scale, -1, axis), global_scale


def dequantize_nvfp4_leaf(packed: jax.Array, block_scale: jax.Array, global_scale: jax.Array, axis: int, dtype: Any):
    """e2m1(code) * block scale * global scale, in `dtype` (the product is exact in float32 before the cast: 2, 4
    and 24 significant bits, rounded once by the global scale)."""
    values = jnp.asarray(E2M1_TABLE, jnp.float32)[unpack_nibbles(packed, axis)]
    scale = jnp.repeat(block_scale.astype(jnp.float32), NVFP4_BLOCK, axis=axis)
    return ((values * scale) * global_scale).astype(dtype)


def nvfp4_axis(path, leaf) -> int | None:
    """The axis a quantizable leaf is blocked along (its last contracted axis), or None when it stays as it is (not a
    matmul weight, or that axis is not a multiple of 16)."""
    if not quantizable(path, leaf):
        return None
    axis = CONTRACTED_AXES[_leaf_name(path)][-1]
    return axis if leaf.shape[axis] % NVFP4_BLOCK == 0 else None


@flax.struct.dataclass
class NVFP4Params:
    """A params tree stored as NVFP4: `values` holds the packed uint8 codes of the quantized leaves (the others as
    they were); `block_scales` (float8_e4m3fn) and `global_scales` (float32 scalars) are the same tree, None where a
    leaf is kept. Which axis a leaf is blocked along follows from its name (`nvfp4_axis`)."""

    values: Any
    block_scales: Any
    global_scales: Any

    def dequantize(self, dtype: Any) -> Any:
        flat, treedef = jax.tree_util.tree_flatten_with_path(self.values)
        blocks = treedef.flatten_up_to(self.block_scales)
        globals_ = treedef.flatten_up_to(self.global_scales)
        out = []
        for (path, v), b, g in zip(flat, blocks, globals_, strict=True):
            if b is None:
                out.append(v)
            else:
                out.append(dequantize_nvfp4_leaf(v, b, g, CONTRACTED_AXES[_leaf_name(path)][-1], dtype))
        return treedef.unflatten(out)


def quantize_nvfp4(params: Any) -> NVFP4Params:
    """`params` with every matmul weight whose blocked axis is a multiple of 16 in NVFP4 (`nvfp4_axis`)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    values, blocks, globals_ = [], [], []
    for path, leaf in flat:
        axis = nvfp4_axis(path, leaf)
        if axis is None:
            values.append(leaf), blocks.append(None), globals_.append(None)
        else:
            packed, block_scale, global_scale = quantize_nvfp4_leaf(leaf, axis)
            values.append(packed), blocks.append(block_scale), globals_.append(global_scale)
    return NVFP4Params(treedef.unflatten(values), treedef.unflatten(blocks), treedef.unflatten(globals_))


FORMATS = {"fp8": "float8_e4m3fn", "nvfp4": "nvfp4"}  # quantize --format -> the run's model.weight_dtype


def quantize_params_as(params: Any, format: str) -> QuantizedParams | NVFP4Params:
    """`params` quantized to one of `FORMATS`."""
    if format not in FORMATS:
        raise ValueError(f"format={format!r} must be one of {sorted(FORMATS)}.")
    return quantize_params(params) if format == "fp8" else quantize_nvfp4(params)
