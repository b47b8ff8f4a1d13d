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
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

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
    """The params a model call applies: `params` itself, or a `QuantizedParams` dequantized to `dtype` (called
    inside the jitted model functions, so the dequantization is part of the compiled program)."""
    return params.dequantize(dtype) if isinstance(params, QuantizedParams) else params
