"""The weight mapping between the toolbox's parameter tree and a Hugging Face DiffusionGemma / Gemma-4 checkpoint.

Follows `transformers` 5.23's `modeling_diffusion_gemma.py` and `modeling_gemma4.py`: the names and layouts were read
from that source and checked against checkpoints it saves (`experiments/checkpoints/make_hf_fixtures.py`); no code of theirs is
used. Mapping (one row of `RULES` per toolbox leaf; `{n}` = layer index, names relative to the text stack, which is
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
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hackable_diffusion.checkpoints.gemma import toolbox_shapes
from hackable_diffusion.models.config import TransformerConfig

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
                f"{len(found)} rules of hackable_diffusion/checkpoints/hf.py RULES match the toolbox parameter "
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
