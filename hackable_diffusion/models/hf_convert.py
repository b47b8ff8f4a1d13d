"""Hugging Face checkpoints <-> toolbox: DiffusionGemma (`diffusion_gemma`) and Gemma-4 (`gemma4`, `gemma4_text`).

Reads and writes the directory layout `transformers` uses: `config.json`, `model.safetensors` or
`model-0000k-of-0000N.safetensors` with `model.safetensors.index.json`, `generation_config.json`, tokenizer files.
Follows `transformers` 5.23's `DiffusionGemmaForBlockDiffusion` and `Gemma4ForCausalLM` (`modeling_diffusion_gemma.py`,
`modeling_gemma4.py`); the names and layouts below were read from that source and checked against checkpoints it
saves (`experiments/make_hf_fixtures.py`, `tests/test_hf_convert.py`); no code of theirs is used.

Mapping (one row of `RULES` per toolbox leaf; `{n}` = layer index, names relative to the text stack, which is
`model.decoder.` in a DiffusionGemma checkpoint, `model.` in `Gemma4ForCausalLM`, `model.language_model.` in the
multimodal Gemma-4; torch's Linear stores `(out, in)`; N heads, K KV heads, H head dim of the layer's type, D width,
F dense FFN hidden, E experts, He expert hidden):

| toolbox leaf (per layer: block_{i}[group])  | Hugging Face tensor(s)                                 | transform                |
|---------------------------------------------|--------------------------------------------------------|--------------------------|
| embedder/input_embedding                    | embed_tokens.weight (V, D)                             | identity (head tied)     |
| final_norm/scale                            | norm.weight                                            | identity                 |
| self_conditioner/pre_norm/scale             | self_conditioning.pre_norm.weight                      | identity                 |
| self_conditioner/ffw/gating_einsum (2,F,D)  | self_conditioning.{gate,up}_proj.weight (F, D)         | stack                    |
| self_conditioner/ffw/linear (F, D)          | self_conditioning.down_proj.weight (D, F)              | transpose                |
| pre_attention_norm/scale                    | layers.{n}.input_layernorm.weight                      | identity                 |
| post_attention_norm/scale                   | layers.{n}.post_attention_layernorm.weight             | identity                 |
| pre_ffw2_norm/scale  (dense FFN in)         | layers.{n}.pre_feedforward_layernorm.weight            | identity                 |
| post_ffw2_norm/scale (dense FFN out)        | layers.{n}.post_feedforward_layernorm_1.weight         | identity                 |
| pre_ffw_norm/scale   (experts in)           | layers.{n}.pre_feedforward_layernorm_2.weight          | identity                 |
| post_ffw1_norm/scale (experts out)          | layers.{n}.post_feedforward_layernorm_2.weight         | identity                 |
| post_ffw_norm/scale  (sum of both)          | layers.{n}.post_feedforward_layernorm.weight           | identity                 |
| skip_scale (1,)                             | layers.{n}.layer_scalar (a buffer)                     | identity                 |
| attn/q_einsum (N, D, H)                     | layers.{n}.self_attn.q_proj.weight (N*H, D)            | split heads, transpose   |
| attn/kv_einsum (2, K, D, H)                 | layers.{n}.self_attn.{k,v}_proj.weight (K*H, D)        | split heads, stack       |
| attn/k_einsum (K, D, H)  (K=V global)       | layers.{n}.self_attn.k_proj.weight (K*H, D)            | split heads, transpose   |
| attn/attn_vec_einsum (N, H, D)              | layers.{n}.self_attn.o_proj.weight (D, N*H)            | split heads, transpose   |
| attn/query_norm/scale, attn/key_norm/scale  | layers.{n}.self_attn.{q,k}_norm.weight                 | identity                 |
| mlp2/gating_einsum (2, F, D)                | layers.{n}.mlp.{gate,up}_proj.weight (F, D)            | stack                    |
| mlp2/linear (F, D)                          | layers.{n}.mlp.down_proj.weight (D, F)                 | transpose                |
| moe/router_logits (D, E)                    | layers.{n}.router.proj.weight (E, D)                   | transpose                |
| moe/router_scale, moe/per_expert_scale      | layers.{n}.router.scale, router.per_expert_scale       | identity                 |
| moe/gating_einsum (E, 2, He, D)             | layers.{n}.experts.gate_up_proj (E, 2*He, D)           | split gate / up          |
| moe/linear (E, He, D)                       | layers.{n}.experts.down_proj (E, D, He)                | transpose                |

The names are crossed relative to the gemma library's: Hugging Face's `mlp` is the *dense* FFN (the gemma library's
and this toolbox's `mlp2`), and its MoE is `router` + `experts`.

Deliberate choices
------------------
- The text weights are read one tensor at a time (`safe_open`, closed after each read, so no memory map keeps the
  file resident). With a mesh, each leaf is built straight into a sharded `jax.Array` with `make_array_from_callback`:
  a device's slice is cut from the layer's tensor, which is read once for all the devices that need it, so host memory
  never holds the model twice (`experiments/bench_load.py` measures peak RSS against checkpoint bytes).
- Strict: a missing or unexpected text tensor, a mis-shaped one, or an encoder copy (DiffusionGemma checkpoints hold
  each `layer_scalar` twice, for the encoder and the decoder stacks) that differs from the decoder's fails by name.
  Vision and audio towers are skipped and counted. `ignore_unexpected=True` tolerates other unknown tensors.
- Config fields the toolbox cannot express (another activation, attention bias, per-layer input embeddings, KV
  sharing, double-wide MLPs, a dense Gemma-4 block without experts, untied embeddings, bidirectional text attention,
  RoPE scaling) are refused by name, never dropped.
- A loaded model runs the experts dropless (the reference's ragged dispatch; on a CPU the sorted dispatch with room for
  every assignment, capacity E / k), because capacity dropping changes a pretrained model's outputs.
- `decoder_window="cache_tail"` reproduces transformers' decoder exactly when a sliding window is smaller than prompt
  + canvas; the default stays the gemma library's per-token window (docs/reference.md §6).
- Bit-exact: loading and saving copy the stored values (reshapes and transposes only); dtypes are kept unless `dtype`
  is given. HF -> toolbox -> HF reproduces every text tensor bit for bit, and the vision tower when `source` is given.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from hackable_diffusion.models.config import MoEConfig, TransformerConfig, resolve_dtype
from hackable_diffusion.models.gemma_convert import _natural_key, flatten_tree, toolbox_shapes, unflatten_tree

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_SHARD_BYTES = 5 * 10**9
DIFFUSION_GEMMA = "diffusion_gemma"
GEMMA4_TEXT = "gemma4_text"
MODEL_TYPES = (DIFFUSION_GEMMA, "gemma4", GEMMA4_TEXT)
SKIPPED_PARTS = ("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio.", "multi_modal_projector.")
TEXT_STACK = {DIFFUSION_GEMMA: "model.decoder.", "gemma4": "model.language_model.", GEMMA4_TEXT: "model."}
COPY_STACKS = {DIFFUSION_GEMMA: ("model.encoder.language_model.",)}  # tied copies that must agree with TEXT_STACK
LAYER_TYPES = {"sliding_attention": "local", "full_attention": "global"}


# ----------------------------------------------------------------------------------------------------------------
# The weight mapping.


def _identity(arrays: Sequence[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    return arrays[0]


def _heads_in(arrays, shape):  # (N*H, D) -> (N, D, H)
    n, d, h = shape
    return arrays[0].reshape(n, h, d).transpose(0, 2, 1)


def _heads_out(w: np.ndarray) -> tuple[np.ndarray, ...]:  # (N, D, H) -> (N*H, D)
    n, d, h = w.shape
    return (w.transpose(0, 2, 1).reshape(n * h, d),)


def _kv_in(arrays, shape):  # (K*H, D) x 2 -> (2, K, D, H)
    return np.stack([_heads_in([a], shape[1:]) for a in arrays])


def _kv_out(w):
    return _heads_out(w[0]) + _heads_out(w[1])


def _o_in(arrays, shape):  # (D, N*H) -> (N, H, D)
    n, h, d = shape
    return arrays[0].reshape(d, n, h).transpose(1, 2, 0)


def _o_out(w):
    n, h, d = w.shape
    return (w.transpose(2, 0, 1).reshape(d, n * h),)


def _stack_in(arrays, shape):  # (F, D) x 2 -> (2, F, D)
    return np.stack(arrays)


def _stack_out(w):
    return (w[0], w[1])


def _transpose_in(arrays, shape):
    return arrays[0].T


def _transpose_out(w):
    return (w.T,)


def _experts_in(arrays, shape):  # (E, 2*He, D) -> (E, 2, He, D), gate first
    return arrays[0].reshape(shape)


def _experts_out(w):
    e, _, he, d = w.shape
    return (w.reshape(e, 2 * he, d),)


def _down_in(arrays, shape):  # (E, D, He) -> (E, He, D)
    return arrays[0].transpose(0, 2, 1)


def _down_out(w):
    return (w.transpose(0, 2, 1),)


@dataclasses.dataclass(frozen=True)
class HFRule:
    """One toolbox leaf and the Hugging Face tensor(s) it is made of.

    `toolbox` may hold `{i}` (a scanned leaf `layers/block_{i}/...`, leading group axis) and `hf` then `{n}` (the
    layer index). `from_hf(tensors, toolbox shape of one layer)` and `to_hf(toolbox array of one layer)` are inverses.
    """

    toolbox: str
    hf: tuple[str, ...]
    from_hf: Callable[[Sequence[np.ndarray], tuple[int, ...]], np.ndarray] = _identity
    to_hf: Callable[[np.ndarray], tuple[np.ndarray, ...]] = lambda w: (w,)

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.toolbox

    def pattern(self) -> re.Pattern:
        return re.compile("^" + re.escape(self.toolbox).replace(re.escape("{i}"), r"(\d+)") + "$")


def _layer(toolbox: str, *hf: str, transform: tuple = (_identity, lambda w: (w,))) -> HFRule:
    return HFRule(f"layers/block_{{i}}/{toolbox}", tuple(f"layers.{{n}}.{name}" for name in hf), *transform)


_NORMS = {
    "pre_attention_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "pre_ffw2_norm": "pre_feedforward_layernorm",
    "post_ffw2_norm": "post_feedforward_layernorm_1",
    "pre_ffw_norm": "pre_feedforward_layernorm_2",
    "post_ffw1_norm": "post_feedforward_layernorm_2",
    "post_ffw_norm": "post_feedforward_layernorm",
}

#: The mapping, one row per toolbox leaf kind (the module docstring's table).
RULES: tuple[HFRule, ...] = (
    HFRule("embedder/input_embedding", ("embed_tokens.weight",)),
    HFRule("final_norm/scale", ("norm.weight",)),
    HFRule("self_conditioner/pre_norm/scale", ("self_conditioning.pre_norm.weight",)),
    HFRule(
        "self_conditioner/ffw/gating_einsum",
        ("self_conditioning.gate_proj.weight", "self_conditioning.up_proj.weight"),
        _stack_in,
        _stack_out,
    ),
    HFRule("self_conditioner/ffw/linear", ("self_conditioning.down_proj.weight",), _transpose_in, _transpose_out),
    *(_layer(f"{ours}/scale", f"{theirs}.weight") for ours, theirs in _NORMS.items()),
    _layer("skip_scale", "layer_scalar"),
    _layer("attn/q_einsum", "self_attn.q_proj.weight", transform=(_heads_in, _heads_out)),
    _layer("attn/kv_einsum", "self_attn.k_proj.weight", "self_attn.v_proj.weight", transform=(_kv_in, _kv_out)),
    _layer("attn/k_einsum", "self_attn.k_proj.weight", transform=(_heads_in, _heads_out)),
    _layer("attn/attn_vec_einsum", "self_attn.o_proj.weight", transform=(_o_in, _o_out)),
    _layer("attn/query_norm/scale", "self_attn.q_norm.weight"),
    _layer("attn/key_norm/scale", "self_attn.k_norm.weight"),
    _layer("mlp2/gating_einsum", "mlp.gate_proj.weight", "mlp.up_proj.weight", transform=(_stack_in, _stack_out)),
    _layer("mlp2/linear", "mlp.down_proj.weight", transform=(_transpose_in, _transpose_out)),
    _layer("moe/router_logits", "router.proj.weight", transform=(_transpose_in, _transpose_out)),
    _layer("moe/router_scale", "router.scale"),
    _layer("moe/per_expert_scale", "router.per_expert_scale"),
    _layer("moe/gating_einsum", "experts.gate_up_proj", transform=(_experts_in, _experts_out)),
    _layer("moe/linear", "experts.down_proj", transform=(_down_in, _down_out)),
)


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """How one toolbox leaf is made: its rule, the block index (None: not scanned) and its full shape."""

    path: str
    rule: HFRule
    block: int | None
    shape: tuple[int, ...]
    dtype: Any

    def layers(self, cfg: TransformerConfig) -> list[int]:
        """The Hugging Face layer index of each slice of the scanned axis."""
        return [g * len(cfg.layer_pattern) + self.block for g in range(self.shape[0])]

    def names(self, layer: int | None) -> tuple[str, ...]:
        return tuple(name.replace("{n}", str(layer)) for name in self.rule.hf)


def plan(cfg: TransformerConfig, rules: Sequence[HFRule] = RULES) -> list[_Leaf]:
    """The toolbox leaves of `cfg` with the rule that makes each (every leaf needs exactly one rule)."""
    leaves = []
    for path, struct in toolbox_shapes(cfg).items():
        found = [(rule, rule.pattern().match(path)) for rule in rules]
        found = [(rule, match) for rule, match in found if match]
        if len(found) != 1:
            raise ValueError(
                f"{len(found)} rules of hackable_diffusion/models/hf_convert.py RULES match the toolbox parameter "
                f"{path!r}; exactly one must."
            )
        rule, match = found[0]
        block = int(match.group(1)) if rule.per_layer else None
        leaves.append(_Leaf(path, rule, block, tuple(struct.shape), struct.dtype))
    return leaves


def mapping_table(cfg: TransformerConfig, rules: Sequence[HFRule] = RULES) -> list[tuple[str, tuple[str, ...]]]:
    """(toolbox leaf[layer], Hugging Face names relative to the text stack) for every leaf of `cfg`, spelled out."""
    rows = []
    for leaf in plan(cfg, rules):
        if leaf.block is None:
            rows.append((leaf.path, leaf.names(None)))
        else:
            rows += [(f"{leaf.path}[{g}]", leaf.names(n)) for g, n in enumerate(leaf.layers(cfg))]
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Configs.


@dataclasses.dataclass(frozen=True)
class HFModelInfo:
    """What a Hugging Face directory says beyond the model shape."""

    model_type: str
    canvas_length: int | None = None  # DiffusionGemma's block length
    generation: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # generation_config.json
    eos_token_ids: tuple[int, ...] = (1,)
    dtype: str = "float32"
    vision_config: Mapping[str, Any] | None = None


def _refuse(field: str, value: Any, why: str) -> None:
    raise ValueError(f"config.json field {field}={value!r} cannot be expressed by the toolbox: {why}.")


def _layer_pattern(layer_types: Sequence[str]) -> tuple[str, ...]:
    """The shortest repeating pattern of `layer_types` (the toolbox scans one pattern group at a time)."""
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        _refuse("layer_types", unknown, f"only {sorted(LAYER_TYPES)} exist in Gemma-4")
    types = [LAYER_TYPES[t] for t in layer_types]
    for period in range(1, len(types) + 1):
        if len(types) % period == 0 and types == types[:period] * (len(types) // period):
            return tuple(types[:period])
    raise AssertionError("unreachable: the whole list is always a period")


def config_from_hf(
    hf: Mapping[str, Any], *, dtype: str | None = None, dispatch: str | None = None, decoder_window: str = "per_token"
) -> tuple[TransformerConfig, HFModelInfo]:
    """A `config.json` (dict) of a DiffusionGemma or Gemma-4 checkpoint -> (TransformerConfig, HFModelInfo).

    dtype: parameter and compute dtype (None: the checkpoint's). dispatch: the MoE dispatch (None: dropless, "ragged"
    on an accelerator, "sorted" with capacity E / k on a CPU). decoder_window: "per_token" (gemma library) or
    "cache_tail" (transformers), see TransformerConfig.decoder_window."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.json model_type={model_type!r} is not one of {MODEL_TYPES}.")
    text = dict(hf.get("text_config") or hf) if model_type != GEMMA4_TEXT else dict(hf)
    checks = {
        "hidden_activation": ("gelu_pytorch_tanh", "the toolbox's FFNs are gated GELU (tanh)"),
        "attention_bias": (False, "the toolbox's projections have no bias"),
        "use_double_wide_mlp": (False, "double-wide MLPs are not implemented"),
        "num_kv_shared_layers": (0, "KV sharing across layers is not implemented"),
        "use_bidirectional_attention": (None, "the text stack must be causal (its KV cache feeds the canvases)"),
        "tie_word_embeddings": (True, "the head is tied to the embedding"),
    }
    for field, (allowed, why) in checks.items():
        if text.get(field, allowed) != allowed and not (
            field == "use_bidirectional_attention" and text[field] == "vision"
        ):
            _refuse(f"text_config.{field}", text.get(field), why)
    if text.get("hidden_size_per_layer_input"):
        _refuse(
            "text_config.hidden_size_per_layer_input",
            text["hidden_size_per_layer_input"],
            "per-layer input embeddings are not implemented (set 0)",
        )
    if model_type != DIFFUSION_GEMMA and not text.get("enable_moe_block", False):
        _refuse(
            "text_config.enable_moe_block",
            text.get("enable_moe_block"),
            "a dense Gemma-4 block (one FFN with two "
            "norms) is not the toolbox's layout, which keeps the dense FFN beside experts",
        )
    if not text.get("num_experts") or not text.get("top_k_experts") or not text.get("moe_intermediate_size"):
        _refuse(
            "text_config.num_experts",
            text.get("num_experts"),
            "the model needs its MoE block (num_experts, top_k_experts, moe_intermediate_size)",
        )
    layer_types = list(text["layer_types"])
    if len(layer_types) != text["num_hidden_layers"]:
        _refuse(
            "text_config.layer_types", len(layer_types), f"it must list num_hidden_layers={text['num_hidden_layers']}"
        )
    pattern = _layer_pattern(layer_types)

    per_layer = {int(k): dict(v) for k, v in (text.get("per_layer_config") or {}).items()}
    head_dim, kv_heads = int(text["head_dim"]), int(text["num_key_value_heads"])
    global_dims = set()
    for index, kind in enumerate(layer_types):
        override = per_layer.get(index, {})
        dims = (int(override.get("head_dim", head_dim)), int(override.get("num_key_value_heads", kv_heads)))
        if kind == "sliding_attention" and dims != (head_dim, kv_heads):
            _refuse(f"text_config.per_layer_config[{index}]", override, "sliding layers share one head shape")
        if kind == "full_attention":
            global_dims.add(dims)
    if len(global_dims) > 1:
        _refuse("text_config.per_layer_config", sorted(global_dims), "global layers share one head shape")
    global_head_dim, global_kv_heads = global_dims.pop() if global_dims else (head_dim, kv_heads)

    rope = text.get("rope_parameters") or {}
    local_rope, global_rope = dict(rope.get("sliding_attention", {})), dict(rope.get("full_attention", {}))
    if local_rope.get("rope_type", "default") != "default" or local_rope.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse("text_config.rope_parameters.sliding_attention", local_rope, "local layers rotate the whole head")
    if global_rope.get("rope_type", "default") not in ("default", "proportional"):
        _refuse("text_config.rope_parameters.full_attention", global_rope, "only default or proportional RoPE")
    if global_rope.get("rope_type", "default") == "default" and global_rope.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse("text_config.rope_parameters.full_attention", global_rope, "partial default RoPE changes the head size")
    for name, params in (("sliding_attention", local_rope), ("full_attention", global_rope)):
        if params.get("factor", 1.0) != 1.0 or any(
            k in params for k in ("rope_scaling", "original_max_position_embeddings")
        ):
            _refuse(f"text_config.rope_parameters.{name}", params, "RoPE scaling is not implemented")

    k_eq_v = True if model_type == DIFFUSION_GEMMA else bool(text.get("attention_k_eq_v", False))
    num_experts, top_k = int(text["num_experts"]), int(text["top_k_experts"])
    if dispatch is None:
        dispatch = "ragged" if jax.default_backend() != "cpu" else "sorted"
    moe = MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        hidden_dim=int(text["moe_intermediate_size"]),
        dispatch=dispatch,
        capacity_factor=num_experts / top_k,  # sorted: a slot for every assignment, nothing dropped
        load_balance_weight=0.0,
        router_z_weight=0.0,
    )
    checkpoint_dtype = str(hf.get("dtype") or hf.get("torch_dtype") or text.get("dtype") or "float32")
    dtype = dtype or checkpoint_dtype
    cfg = TransformerConfig(
        vocab_size=int(text["vocab_size"]),
        embed_dim=int(text["hidden_size"]),
        num_layers=int(text["num_hidden_layers"]),
        num_heads=int(text["num_attention_heads"]),
        head_dim=head_dim,
        num_kv_heads=kv_heads,
        ffw_hidden=int(text["intermediate_size"]),
        moe=moe,
        layer_pattern=pattern,
        sliding_window=int(text["sliding_window"]),
        decoder_window=decoder_window,
        global_head_dim=global_head_dim,
        global_num_kv_heads=global_kv_heads,
        k_eq_v_global=k_eq_v,
        rope_local_base=float(local_rope.get("rope_theta", 10_000.0)),
        rope_local_proportion=1.0,
        rope_global_base=float(global_rope.get("rope_theta", 1_000_000.0)),
        rope_global_proportion=float(global_rope.get("partial_rotary_factor", 1.0)),
        qk_norm=True,
        v_norm=True,
        scale_queries=False,
        # DiffusionGemma's text config declares the soft-cap as a class constant (30), so config.json may omit it
        final_logit_softcap=text.get("final_logit_softcapping", 30.0 if model_type == DIFFUSION_GEMMA else None),
        norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        param_dtype=dtype,
        compute_dtype=dtype,
        self_conditioning=model_type == DIFFUSION_GEMMA,
    )
    eos = text.get("eos_token_id", 1)
    info = HFModelInfo(
        model_type=model_type,
        canvas_length=hf.get("canvas_length") if model_type == DIFFUSION_GEMMA else None,
        eos_token_ids=tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),),
        dtype=checkpoint_dtype,
        vision_config=hf.get("vision_config"),
    )
    return cfg, info


def _refuse_export(cfg: TransformerConfig, model_type: str) -> None:
    problems = {
        "moe": (cfg.moe is None, "Hugging Face's Gemma-4 MoE layout needs experts beside the dense FFN"),
        "qk_norm": (not cfg.qk_norm, "Gemma-4 always norms q and k"),
        "v_norm": (not cfg.v_norm, "Gemma-4 always norms v"),
        "scale_queries": (cfg.scale_queries, "Gemma-4 has no 1/sqrt(d) factor"),
        "rope_local_proportion": (cfg.rope_local_proportion != 1.0, "local layers rotate the whole head"),
        "grid_embeddings": (bool(cfg.grid_embeddings), "no Hugging Face layer holds grid embeddings"),
        "grid_attention_bias": (bool(cfg.grid_attention_bias), "no Hugging Face layer holds a grid bias"),
        "depth_loops": (cfg.depth_loops != 1, "looped depth is not a Hugging Face architecture"),
        "self_conditioning": (
            cfg.self_conditioning != (model_type == DIFFUSION_GEMMA),
            "DiffusionGemma needs its self-conditioner and Gemma-4 has none",
        ),
        "k_eq_v_global": (
            model_type == DIFFUSION_GEMMA and not cfg.k_eq_v_global,
            "DiffusionGemma's global layers share one K=V projection",
        ),
    }
    for field, (bad, why) in problems.items():
        if bad:
            raise ValueError(f"model.{field}={getattr(cfg, field)!r} cannot be exported as {model_type}: {why}.")


def config_to_hf(
    cfg: TransformerConfig,
    *,
    model_type: str = DIFFUSION_GEMMA,
    canvas_length: int = 256,
    dtype: str | None = None,
    vision_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `config.json` dict of `cfg` as a DiffusionGemma or text-only Gemma-4 checkpoint (inverse of
    `config_from_hf` for every field the toolbox holds)."""
    if model_type not in (DIFFUSION_GEMMA, GEMMA4_TEXT):
        raise ValueError(f"model_type={model_type!r} must be {DIFFUSION_GEMMA!r} or {GEMMA4_TEXT!r}.")
    _refuse_export(cfg, model_type)
    types = ["sliding_attention" if t == "local" else "full_attention" for t in cfg.layer_types()]
    rope_global = {"rope_type": "proportional", "partial_rotary_factor": cfg.rope_global_proportion}
    text = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.embed_dim,
        "intermediate_size": cfg.ffw_hidden,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": cfg.norm_eps,
        "layer_types": types,
        "sliding_window": cfg.sliding_window,
        "per_layer_config": {
            str(i): {"head_dim": cfg.global_attn_head_dim, "num_key_value_heads": cfg.global_kv_heads}
            for i, t in enumerate(types)
            if t == "full_attention"
        },
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_base},
            "full_attention": dict(rope_global, rope_theta=cfg.rope_global_base),
        },
        "num_experts": cfg.moe.num_experts,
        "top_k_experts": cfg.moe.top_k,
        "moe_intermediate_size": cfg.moe.hidden_dim,
        "final_logit_softcapping": cfg.final_logit_softcap,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "max_position_embeddings": 131_072,
        "use_bidirectional_attention": None,
    }
    dtype = dtype or cfg.param_dtype
    if model_type == GEMMA4_TEXT:
        return dict(
            text,
            model_type=GEMMA4_TEXT,
            architectures=["Gemma4ForCausalLM"],
            attention_k_eq_v=cfg.k_eq_v_global,
            enable_moe_block=True,
            hidden_size_per_layer_input=0,
            num_kv_shared_layers=0,
            use_double_wide_mlp=False,
            dtype=dtype,
        )
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "model_type": DIFFUSION_GEMMA,
        "canvas_length": canvas_length,
        "tie_word_embeddings": True,
        "dtype": dtype,
        "text_config": dict(text, model_type="diffusion_gemma_text"),
        # The vision tower is not used for text; without one from a source checkpoint a one-layer stand-in is declared.
        "vision_config": dict(vision_config or MINIMAL_VISION_CONFIG),
    }


MINIMAL_VISION_CONFIG = {
    "model_type": "gemma4_vision",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "position_embedding_size": 64,
    "patch_size": 4,
}


def generation_config_from_sampler(sampler: Mapping[str, Any]) -> dict[str, Any]:
    """`generation_config.json` fields for the toolbox's sampler defaults where transformers has a field for them."""
    out: dict[str, Any] = {"max_denoising_steps": int(sampler.get("num_steps", 48))}
    kwargs = sampler.get("selection_kwargs") or "{}"
    kwargs = json.loads(kwargs) if isinstance(kwargs, str) else dict(kwargs)
    if sampler.get("selection", "entropy_bound") == "entropy_bound":
        out["sampler_config"] = {
            "entropy_bound": float(kwargs.get("gamma", 0.1)),
            "_cls_name": "EntropyBoundSamplerConfig",
        }
    if "min_temperature" in sampler:
        out["t_min"], out["t_max"] = float(sampler["min_temperature"]), float(sampler["max_temperature"])
    if sampler.get("early_stopping", "diffusiongemma") == "diffusiongemma":
        out["stability_threshold"], out["confidence_threshold"] = 1, 0.005
    return out


# ----------------------------------------------------------------------------------------------------------------
# Reading.


def is_hf_directory(path: str | os.PathLike) -> bool:
    path = pathlib.Path(path)
    return (path / CONFIG_FILE).is_file() and ((path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file())


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    path = pathlib.Path(path)
    if not is_hf_directory(path):
        raise FileNotFoundError(
            f"{path} is not a Hugging Face checkpoint directory (it needs {CONFIG_FILE} and {SINGLE_FILE} or "
            f"{INDEX_FILE})."
        )
    return json.loads((path / CONFIG_FILE).read_text())


def weight_files(path: str | os.PathLike) -> dict[str, pathlib.Path]:
    """{tensor name: safetensors file} of a checkpoint directory."""
    path = pathlib.Path(path)
    if (path / INDEX_FILE).is_file():
        index = json.loads((path / INDEX_FILE).read_text())
        return {name: path / file for name, file in index["weight_map"].items()}
    from safetensors import safe_open

    with safe_open(path / SINGLE_FILE, framework="numpy") as f:
        return {name: path / SINGLE_FILE for name in f.keys()}


def tensor_shapes(files: Mapping[str, pathlib.Path]) -> dict[str, tuple[int, ...]]:
    """{name: shape} from the safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    shapes = {}
    for file in sorted(set(files.values())):
        with safe_open(file, framework="numpy") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def read_tensor(files: Mapping[str, pathlib.Path], name: str) -> np.ndarray:
    """One tensor, read and the file closed again (no memory map stays open)."""
    from safetensors import safe_open

    with safe_open(files[name], framework="numpy") as f:
        return f.get_tensor(name)


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where each text tensor of a checkpoint is, after the checks."""

    files: Mapping[str, pathlib.Path]
    stack: str  # the text stack prefix whose names the rules complete
    skipped: int  # vision/audio tensors left out


def _check_names(
    cfg: TransformerConfig, info: HFModelInfo, files: Mapping[str, pathlib.Path], rules, ignore_unexpected: bool
) -> _Source:
    stack = TEXT_STACK[info.model_type]
    copies = COPY_STACKS.get(info.model_type, ())
    expected = {stack + name for _, names in mapping_table(cfg, rules) for name in names}
    skipped = [n for n in files if any(part in n for part in SKIPPED_PARTS)]
    text = set(files) - set(skipped)
    missing = sorted(expected - text, key=_natural_key)
    if missing:
        raise ValueError(
            f"The checkpoint lacks {len(missing)} text tensor(s) the model needs, first {missing[:3]} (model shape "
            "from config.json; is it the right checkpoint?)."
        )

    def twin(name: str) -> str:
        """The stored weight a tied copy must equal (the name itself for a weight that is not a copy)."""
        if name == "lm_head.weight":
            return stack + "embed_tokens.weight"
        copy = next((c for c in copies if name.startswith(c)), None)
        return stack + name[len(copy) :] if copy else name

    unexpected = sorted((n for n in text - expected if twin(n) not in expected), key=_natural_key)
    if unexpected and not ignore_unexpected:
        raise ValueError(
            f"The checkpoint holds {len(unexpected)} text tensor(s) the toolbox has no place for, first "
            f"{unexpected[:3]}; pass ignore_unexpected=True to skip them."
        )
    for name in sorted(text - expected - set(unexpected), key=_natural_key):
        same = np.array_equal(read_tensor(files, name).view(np.uint8), read_tensor(files, twin(name)).view(np.uint8))
        if not same:
            raise ValueError(
                f"{name} differs from {twin(name)}: the checkpoint stores one tied weight twice with two values, so "
                "it cannot be loaded as one model."
            )
    return _Source(files, stack, len(skipped))


class _LayerCache:
    """The last few toolbox-layout layer arrays, so that the devices sharing a layer read it once."""

    def __init__(self, size: int):
        self.size, self.items = size, collections.OrderedDict()

    def get(self, key, make):
        if key not in self.items:
            self.items[key] = make()
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return self.items[key]


def _leaf_layer(source: _Source, leaf: _Leaf, layer: int | None, dtype: Any) -> np.ndarray:
    names = [source.stack + name for name in leaf.names(layer)]
    arrays = [read_tensor(source.files, name) for name in names]
    shape = leaf.shape[1:] if leaf.block is not None else leaf.shape
    try:
        out = leaf.rule.from_hf(arrays, shape)
    except ValueError as err:
        raise ValueError(f"{names} have shapes {[a.shape for a in arrays]}, not what {leaf.path} {shape} needs: {err}")
    if out.shape != shape:
        raise ValueError(f"{names} give {leaf.path} the shape {out.shape}, expected {shape}.")
    return out.astype(dtype) if dtype is not None and out.dtype != dtype else out


@dataclasses.dataclass(frozen=True)
class HFCheckpoint:
    """A loaded checkpoint: the toolbox config, parameters (a nested dict) and what else the directory says."""

    config: TransformerConfig
    params: Any
    info: HFModelInfo
    skipped_tensors: int


def load_hf(
    path: str | os.PathLike,
    *,
    mesh: jax.sharding.Mesh | None = None,
    logical_axes_fn: Callable | None = None,
    dtype: str | None = None,
    dispatch: str | None = None,
    decoder_window: str = "per_token",
    ignore_unexpected: bool = False,
    rules: Sequence[HFRule] = RULES,
) -> HFCheckpoint:
    """Loads a DiffusionGemma or Gemma-4 checkpoint directory into the toolbox's config and parameters.

    Without a mesh the parameters are numpy arrays on the host. With a mesh every leaf is a `jax.Array` sharded by
    `logical_axes_fn` (default: `models.partitioning.logical_axes`), each device's slice read straight from the files.
    """
    hf = read_config(path)
    cfg, info = config_from_hf(hf, dtype=dtype, dispatch=dispatch, decoder_window=decoder_window)
    source = _check_names(cfg, info, weight_files(path), rules, ignore_unexpected)
    target = None if dtype is None else resolve_dtype(dtype)
    leaves = plan(cfg, rules)
    flat: dict[str, Any] = {}
    if mesh is None:
        for leaf in leaves:
            if leaf.block is None:
                flat[leaf.path] = _leaf_layer(source, leaf, None, target)
            else:
                flat[leaf.path] = np.stack([_leaf_layer(source, leaf, n, target) for n in leaf.layers(cfg)])
    else:
        from hackable_diffusion.models import partitioning
        from hackable_diffusion.training import sharding

        abstract = unflatten_tree(
            {leaf.path: jax.ShapeDtypeStruct(leaf.shape, target or leaf.dtype) for leaf in leaves}
        )
        shardings = flatten_tree(sharding.param_shardings(abstract, logical_axes_fn or partitioning.logical_axes, mesh))
        for leaf in leaves:  # one leaf at a time: its layers are read once, then dropped
            cache = _LayerCache(size=1 if leaf.block is None else leaf.shape[0])
            flat[leaf.path] = jax.make_array_from_callback(
                leaf.shape, shardings[leaf.path], _slice_reader(source, leaf, cfg, target, cache)
            )
            del cache
    params = unflatten_tree(flat)
    if source.skipped:
        print(f"Skipped {source.skipped} vision/audio tensors of {path} (text only).", flush=True)
    return HFCheckpoint(cfg, params, info, source.skipped)


def _slice_reader(source: _Source, leaf: _Leaf, cfg: TransformerConfig, dtype, cache: _LayerCache):
    def read(index: tuple[slice, ...]) -> np.ndarray:
        if leaf.block is None:
            whole = cache.get((leaf.path, None), lambda: _leaf_layer(source, leaf, None, dtype))
            return whole[index]
        layers = leaf.layers(cfg)[index[0]]
        slices = [cache.get((leaf.path, n), lambda n=n: _leaf_layer(source, leaf, n, dtype))[index[1:]] for n in layers]
        return slices[0][None] if len(slices) == 1 else np.stack(slices)  # one layer: a view, no host copy

    return read


# ----------------------------------------------------------------------------------------------------------------
# Writing.


def hf_tensors(cfg: TransformerConfig, params: Any, *, model_type: str = DIFFUSION_GEMMA, rules=RULES):
    """Yields (name, numpy array) of every text tensor of `params` in the Hugging Face layout, layer by layer (the
    DiffusionGemma encoder's `layer_scalar` copies included), so a writer never holds more than one layer."""
    stack = TEXT_STACK[model_type]
    flat = flatten_tree(params)
    for leaf in plan(cfg, rules):
        array = flat[leaf.path]
        slices = [(None, array)] if leaf.block is None else [(n, array[g]) for g, n in enumerate(leaf.layers(cfg))]
        for layer, value in slices:
            tensors = leaf.rule.to_hf(np.asarray(value))
            for name, tensor in zip(leaf.names(layer), tensors):
                yield stack + name, np.ascontiguousarray(tensor)
                if model_type == DIFFUSION_GEMMA and name.endswith("layer_scalar"):
                    yield COPY_STACKS[DIFFUSION_GEMMA][0] + name, np.ascontiguousarray(tensor)


def save_hf(
    directory: str | os.PathLike,
    cfg: TransformerConfig,
    params: Any,
    *,
    model_type: str = DIFFUSION_GEMMA,
    canvas_length: int = 256,
    sampler: Mapping[str, Any] | None = None,
    source: str | os.PathLike | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    rules: Sequence[HFRule] = RULES,
) -> pathlib.Path:
    """Writes `(cfg, params)` as a Hugging Face directory that `from_pretrained` (and vLLM) load: config.json,
    safetensors shards of at most `max_shard_bytes` (with model.safetensors.index.json when there are several) and
    generation_config.json (the toolbox's sampler defaults, `sampler`, where transformers has a field for them).

    source: the Hugging Face directory the parameters came from; its vision/audio tensors, vision config and tokenizer
    files are carried over, so that HF -> toolbox -> HF is bit-exact."""
    from safetensors.numpy import save_file

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source_config = read_config(source) if source is not None else {}
    hf = config_to_hf(
        cfg,
        model_type=model_type,
        canvas_length=canvas_length,
        vision_config=source_config.get("vision_config"),
    )
    tensors = hf_tensors(cfg, params, model_type=model_type, rules=rules)
    if source is not None:
        files = weight_files(source)
        extra = [n for n in files if any(part in n for part in SKIPPED_PARTS)]
        tensors = _chain(tensors, ((name, read_tensor(files, name)) for name in sorted(extra, key=_natural_key)))

    shards, current, size = [], {}, 0
    for name, tensor in tensors:
        if current and size + tensor.nbytes > max_shard_bytes:
            shards.append(_write_shard(directory, len(shards), current, save_file))
            current, size = {}, 0
        current[name], size = tensor, size + tensor.nbytes
    shards.append(_write_shard(directory, len(shards), current, save_file))
    for old in list(directory.glob("model*.safetensors")) + [directory / INDEX_FILE]:
        if old.is_file() and old.name not in {s[0] for s in shards}:
            old.unlink()
    total = sum(sum(sizes.values()) for _, sizes in shards)
    if len(shards) == 1:
        (directory / shards[0][0]).rename(directory / SINGLE_FILE)
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        weight_map = {}
        for (tmp, shard_tensors), final in zip(shards, names):
            (directory / tmp).rename(directory / final)
            weight_map.update({name: final for name in shard_tensors})
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (directory / CONFIG_FILE).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    generation = generation_config_from_sampler(sampler or {}) if model_type == DIFFUSION_GEMMA else {}
    (directory / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    if source is not None:
        for name in TOKENIZER_FILES:
            if (pathlib.Path(source) / name).is_file():
                shutil.copyfile(pathlib.Path(source) / name, directory / name)
    return directory


def _chain(*iterables):
    for iterable in iterables:
        yield from iterable


def _write_shard(directory: pathlib.Path, index: int, tensors: dict[str, np.ndarray], save_file) -> tuple[str, dict]:
    """Writes one shard under a temporary name; returns (that name, {tensor name: bytes})."""
    name = f".shard-{index:05d}.safetensors"
    save_file(tensors, str(directory / name), metadata={"format": "pt"})
    return name, {n: t.nbytes for n, t in tensors.items()}


TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def checkpoint_bytes(path: str | os.PathLike) -> int:
    """Bytes of the safetensors files of a checkpoint directory."""
    return sum(f.stat().st_size for f in set(weight_files(path).values()))


def read_all_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint as numpy (for tests and the naive loading path of the benchmark)."""
    files = weight_files(path)
    return {name: read_tensor(files, name) for name in files}
