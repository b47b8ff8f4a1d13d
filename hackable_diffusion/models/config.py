"""Model shape configuration for the Gemma-4-style mixture-of-experts transformer.

Follows the Gemma-4 26B-A4B text transformer as described in docs/reference.md §1
(google-deepmind/gemma `gm/nn/gemma4`). Every architectural choice of the reference is a field here, so a
config file can switch it off (e.g. `scale_queries=True` for the usual 1/sqrt(d) attention, `moe=None` for a
dense model). Validation happens at construction: an impossible shape raises a `ValueError` naming the field.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping

import jax.numpy as jnp

from hackable_diffusion.models.structure import get_structure

LAYER_TYPES = ("local", "global")
DISPATCHES = ("dense", "sorted", "ragged")
DECODER_WINDOWS = ("per_token", "cache_tail")  # how local layers of a canvas see the cache (decoder_window)
ATTENTION_IMPLS = ("einsum", "dot_product")  # attention_impl
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def resolve_dtype(name: str | Any):
    """Maps a dtype name ('float32', 'bfloat16') to a jnp dtype; passes dtypes through."""
    if isinstance(name, str):
        if name not in _DTYPES:
            raise ValueError(f"Unknown dtype {name!r}; choose one of {sorted(_DTYPES)}.")
        return _DTYPES[name]
    return name


def _from_mapping(cls, values: Mapping[str, Any], where: str):
    """Builds a frozen dataclass from a mapping, rejecting unknown keys with the closest valid ones."""
    fields = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"Unknown key {where}.{key} for {cls.__name__}.{hint} Valid keys: {sorted(fields)}.")
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts FFN beside the dense FFN (Gemma-4: 128 experts, top-8, hidden 704)."""

    num_experts: int
    top_k: int
    hidden_dim: int
    dispatch: str = "sorted"  # "dense" (reference, all experts) | "sorted" (capacity, CPU) | "ragged" (dropless, GPU)
    capacity_factor: float = 1.25
    load_balance_weight: float = 0.0  # off by default: the reference has no auxiliary losses
    router_z_weight: float = 0.0

    def __post_init__(self):
        if self.num_experts < 1:
            raise ValueError(f"moe.num_experts must be >= 1, got {self.num_experts}.")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"moe.top_k={self.top_k} must be between 1 and moe.num_experts={self.num_experts}; "
                "lower top_k or add experts."
            )
        if self.hidden_dim < 1:
            raise ValueError(f"moe.hidden_dim must be >= 1, got {self.hidden_dim}.")
        if self.dispatch not in DISPATCHES:
            raise ValueError(f"moe.dispatch={self.dispatch!r} is not one of {DISPATCHES}.")
        if self.capacity_factor <= 0:
            raise ValueError(f"moe.capacity_factor must be > 0, got {self.capacity_factor}.")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "MoEConfig":
        return _from_mapping(cls, dict(values), "model.moe")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Shape and options of the backbone. Defaults are the Gemma-4 choices; sizes have no defaults."""

    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    head_dim: int
    num_kv_heads: int
    ffw_hidden: int  # dense gated-GELU FFN present in every layer ("mlp2" in Gemma-4)
    moe: MoEConfig | None = None
    layer_pattern: tuple[str, ...] = ("local",) * 5 + ("global",)
    sliding_window: int = 1024  # local layers: a key is visible iff |pos_q - pos_k| < sliding_window
    # Local layers in decoder mode (a canvas reading the cache, docs/reference.md §6): "per_token" (the gemma library,
    # the training reference) applies the window above to cache and canvas alike; "cache_tail" (transformers'
    # DiffusionGemma decoder) lets every canvas token see the last sliding_window - 1 cached tokens and the whole canvas.
    decoder_window: str = "per_token"
    global_head_dim: int | None = None  # None: same as head_dim
    global_num_kv_heads: int | None = None  # None: same as num_kv_heads
    k_eq_v_global: bool = False  # global layers: one projection serves as K and (scale-free normed) V
    rope_local_base: float = 10_000.0
    rope_local_proportion: float = 1.0
    rope_global_base: float = 1_000_000.0
    rope_global_proportion: float = 1.0
    qk_norm: bool = True  # RMSNorm with scale on queries and keys
    v_norm: bool = True  # RMSNorm without scale on values
    scale_queries: bool = False  # Gemma-4 uses no 1/sqrt(head_dim) factor (qk-norm bounds the logits)
    final_logit_softcap: float | None = 30.0
    norm_eps: float = 1e-6
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    # How a run's weights are stored: None = in param_dtype; "float8_e4m3fn" = weight-only FP8 with per-output-channel
    # scales, "nvfp4" = weight-only NVFP4 (models/quantize.py, written once by `python -m hackable_diffusion.quantize`),
    # dequantized to param_dtype inside every jitted model call.
    weight_dtype: str | None = None
    remat: str = "none"  # "none" | "full" (recompute the whole layer group) | "dots" (save matmul outputs)
    self_conditioning: bool = (
        False  # DiffusionGemma's self_conditioner on canvas embeddings (models/self_conditioning.py)
    )
    # A structure prior a task registered (models/structure.py), "NAME:ARGUMENT", e.g. the Sudoku task's "grid:9";
    # "": none (text). structure_embeddings: learned embeddings of each position's units (row, column, box) added to
    # the input. structure_attention_bias > 0: every attention layer adds a learned per-head bias to the logits of
    # pairs that share a unit, heads starting round-robin over the units (and none) with this value; 0: no bias.
    structure: str = ""
    structure_embeddings: bool = False
    structure_attention_bias: float = 0.0
    # Layer groups per iteration of the layer scan (parameters are identical for every value). 1: a rolled loop (fast
    # to compile, the training default); num_groups: fully unrolled, each layer's weights a static slice of the stack.
    # `transformer.with_scan_unroll` switches a built model, e.g. for decoding. Measured on CPU (presets.mini, 2
    # groups, batch 1): no gain, AR step 7.4 -> 8.3 ms, 64-token canvas step 22.1 -> 23.4 ms. Training (presets.small,
    # 2 groups, AR, batch 8 x 256): the step 2,336 -> 2,100 ms, MFU 0.49 -> 0.56 (results/text, "The train step").
    scan_unroll: int = 1
    # > 1: the whole layer stack is applied this many times with the same weights (looped / universal-transformer
    # depth, Dehghani et al. 2019): the compute of depth_loops * num_layers layers for the parameters of num_layers.
    # Passes that write no KV cache only (`forward`, a puzzle solved in place): a cache holds one pass's keys, not one per loop.
    depth_loops: int = 1
    # How the attention of every layer is computed (the same function, tested equal): "einsum" reads the cache and the
    # block as two einsums under one softmax (no copy of the cache); "dot_product" concatenates them and calls
    # `jax.nn.dot_product_attention`, which picks cuDNN's fused kernel on a GPU where the shapes allow (XLA elsewhere).
    attention_impl: str = "einsum"

    def __post_init__(self):
        object.__setattr__(self, "layer_pattern", tuple(self.layer_pattern))
        if isinstance(self.moe, Mapping):
            object.__setattr__(self, "moe", MoEConfig.from_dict(self.moe))
        positive = ("vocab_size", "embed_dim", "num_layers", "num_heads", "head_dim", "num_kv_heads", "ffw_hidden")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} is not divisible by model.num_kv_heads={self.num_kv_heads} "
                "(grouped-query attention shares each kv head by a whole number of query heads)."
            )
        if self.num_heads % self.global_kv_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} is not divisible by model.global_num_kv_heads={self.global_kv_heads}."
            )
        if self.sliding_window < 1:
            raise ValueError(f"model.sliding_window must be >= 1, got {self.sliding_window}.")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"model.attention_impl={self.attention_impl!r} must be one of {ATTENTION_IMPLS}.")
        if self.decoder_window not in DECODER_WINDOWS:
            raise ValueError(
                f"model.decoder_window={self.decoder_window!r} must be one of {DECODER_WINDOWS}: 'per_token' (the "
                "gemma library) or 'cache_tail' (transformers' DiffusionGemma decoder)."
            )
        if not self.layer_pattern or any(t not in LAYER_TYPES for t in self.layer_pattern):
            raise ValueError(f"model.layer_pattern={self.layer_pattern} must be a non-empty tuple of {LAYER_TYPES}.")
        if self.num_layers % len(self.layer_pattern):
            raise ValueError(
                f"model.num_layers={self.num_layers} is not a multiple of len(model.layer_pattern)="
                f"{len(self.layer_pattern)}; layers are scanned one pattern group at a time."
            )
        for name in ("rope_local_proportion", "rope_global_proportion"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"model.{name} must be in [0, 1], got {getattr(self, name)}.")
        for name in ("head_dim", "global_attn_head_dim"):
            if getattr(self, name) % 2:
                raise ValueError(f"model.{name}={getattr(self, name)} must be even for half-split RoPE.")
        if self.structure:
            get_structure(self.structure)  # registered, with a valid argument
        if self.structure_attention_bias < 0:
            raise ValueError(f"model.structure_attention_bias={self.structure_attention_bias} must be >= 0.")
        if (self.structure_embeddings or self.structure_attention_bias) and not self.structure:
            raise ValueError(
                "model.structure_embeddings / structure_attention_bias need model.structure (e.g. 'grid:9' for a "
                "9 x 9 grid puzzle)."
            )
        if self.depth_loops < 1:
            raise ValueError(f"model.depth_loops must be >= 1 (1 = every layer applied once), got {self.depth_loops}.")
        if self.scan_unroll < 1:
            raise ValueError(f"model.scan_unroll must be >= 1 (1 = rolled loop), got {self.scan_unroll}.")
        if self.remat not in ("none", "full", "dots"):
            raise ValueError(f"model.remat={self.remat!r} must be 'none', 'full' or 'dots'.")
        resolve_dtype(self.param_dtype)
        resolve_dtype(self.compute_dtype)
        if self.weight_dtype not in (None, "float8_e4m3fn", "nvfp4"):
            raise ValueError(
                f"model.weight_dtype={self.weight_dtype!r} must be None (weights in param_dtype), 'float8_e4m3fn' or "
                "'nvfp4' (weight-only: python -m hackable_diffusion.quantize --workdir RUN --out NEW_RUN [--format])."
            )
        if self.final_logit_softcap is not None and self.final_logit_softcap <= 0:
            raise ValueError(f"model.final_logit_softcap must be > 0 or None, got {self.final_logit_softcap}.")

    @property
    def global_kv_heads(self) -> int:
        return self.global_num_kv_heads or self.num_kv_heads

    @property
    def global_attn_head_dim(self) -> int:
        return self.global_head_dim or self.head_dim

    @property
    def num_groups(self) -> int:
        """Number of repeats of `layer_pattern`; the scan runs over this axis."""
        return self.num_layers // len(self.layer_pattern)

    def layer_types(self) -> tuple[str, ...]:
        return self.layer_pattern * self.num_groups

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TransformerConfig":
        values = dict(values)
        if values.get("moe") is not None:
            values["moe"] = MoEConfig.from_dict(values["moe"])
        return _from_mapping(cls, values, "model")

    def replace(self, **changes) -> "TransformerConfig":
        return dataclasses.replace(self, **changes)

    def dropless(self) -> "TransformerConfig":
        """The same model with no expert assignment ever dropped: the sorted dispatch gets a slot for every assignment
        (capacity factor E / k); dense and ragged never drop. For pretrained weights, whose outputs capacity dropping
        would change."""
        if self.moe is None or self.moe.dispatch != "sorted":
            return self
        moe = dataclasses.replace(
            self.moe, capacity_factor=max(self.moe.capacity_factor, self.moe.num_experts / self.moe.top_k)
        )
        return dataclasses.replace(self, moe=moe)
