"""Logical axis names of every parameter, from its path: the sharding contract between model and mesh.

The training code maps logical names to mesh axes with a rule table (`training/sharding.py`), the same idea as
flax's logical partitioning and MaxText's rules, but keyed on the gemma-style parameter names so that converted
Gemma-4 trees are placed by the same table (LoRA factors derive theirs from the weight they adapt:
`models/lora.py: logical_axes`). Parameters under the scanned `layers` collection
carry a leading `layers` axis (the pattern repeats), which is never sharded.
"""

from __future__ import annotations

from typing import Sequence

# Leaf name (with its parent where the name alone is ambiguous) -> logical axes of the unstacked parameter.
_RULES: dict[tuple[str, ...], tuple[str | None, ...]] = {
    ("embedder", "input_embedding"): ("vocab", "embed"),
    ("attn", "q_einsum"): ("heads", "embed", "head_dim"),
    ("attn", "kv_einsum"): (None, "kv_heads", "embed", "head_dim"),
    ("attn", "k_einsum"): ("kv_heads", "embed", "head_dim"),
    ("attn", "attn_vec_einsum"): ("heads", "head_dim", "embed"),
    ("moe", "router_logits"): ("embed", None),
    ("moe", "router_scale"): (None,),
    ("moe", "per_expert_scale"): ("experts",),
    ("moe", "gating_einsum"): ("experts", None, "expert_mlp", "embed"),
    ("moe", "linear"): ("experts", "expert_mlp", "embed"),
    ("gating_einsum",): (None, "mlp", "embed"),  # dense FFNs: mlp2, self_conditioner/ffw
    ("linear",): ("mlp", "embed"),
    ("scale",): (None,),  # every RMSNorm
    ("skip_scale",): (None,),
}


def _structure_axes(names: Sequence[str]) -> tuple[str | None, ...] | None:
    """A structure prior's parameters (`{name}_embedding/{unit}`, `attn/{name}_bias`, models/structure.py)."""
    if len(names) >= 2 and names[-2].endswith("_embedding") and names[-2] != "input_embedding":
        return (None, "embed")
    if len(names) >= 2 and names[-2] == "attn" and names[-1].endswith("_bias"):
        return (None, "heads")
    return None


def logical_axes(path: Sequence[str], shape: Sequence[int]) -> tuple[str | None, ...]:
    """Logical axes of the parameter at `path` (e.g. ('layers', 'block_0', 'attn', 'q_einsum'))."""
    names = [str(p) for p in path if str(p) != "params"]
    rules = list(_RULES.items())
    structure = _structure_axes(names)
    if structure is not None:
        rules = [(tuple(names[-2:]), structure)]
    for key, axes in rules:
        if tuple(names[-len(key) :]) == key:
            if "layers" in names:
                axes = ("layers",) + axes
            if len(axes) != len(shape):
                raise ValueError(
                    f"Parameter {'/'.join(names)} has shape {tuple(shape)} but its logical axes {axes} "
                    f"have {len(axes)} entries."
                )
            return axes
    raise ValueError(
        f"No logical axes known for parameter {'/'.join(names)} (shape {tuple(shape)}); add it to "
        "hackable_diffusion/models/partitioning.py."
    )
