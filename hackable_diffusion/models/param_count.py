"""Parameter counts from shapes alone (`jax.eval_shape`: nothing is allocated, so the 26B model counts on a laptop).

Active parameters per token follow the usual MoE convention: every parameter except the experts' weights, plus
`top_k / num_experts` of the expert weights (the embedding is counted once, as the tied head shares it).
"""

from __future__ import annotations

import math
from typing import Any

import jax

from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.transformer import Transformer, init_params

EXPERT_LEAVES = ("gating_einsum", "linear")


def abstract_params(cfg: TransformerConfig) -> Any:
    """The parameter tree as ShapeDtypeStructs."""
    model = Transformer(cfg)
    return jax.eval_shape(lambda: init_params(model, jax.random.key(0), batch_size=1, seq_len=2))


def count_params(cfg: TransformerConfig, params: Any | None = None) -> dict[str, int]:
    """Total and per-token-active parameter counts, plus a breakdown by top-level component."""
    params = abstract_params(cfg) if params is None else params
    total = active = experts = embedding = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [getattr(k, "key", str(k)) for k in path]
        size = math.prod(leaf.shape)
        total += size
        is_expert = "moe" in names and names[-1] in EXPERT_LEAVES
        if is_expert:
            experts += size
            active += size * cfg.moe.top_k // cfg.moe.num_experts
        else:
            active += size
        if "embedder" in names:
            embedding += size
    return dict(
        total_params=int(total),
        active_params_per_token=int(active),
        expert_params=int(experts),
        embedding_params=int(embedding),
        non_embedding_params=int(total - embedding),
    )
