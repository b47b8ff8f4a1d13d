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


def training_flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """Training FLOPs per token of one forward+backward pass (6 N + attention), N = active matmul parameters."""
    counts = count_params(cfg)
    # Matmul parameters per token: active minus the embedding lookup (the layers, run depth_loops times), plus the tied
    # head (V x D matmul).
    layers = counts["active_params_per_token"] - counts["embedding_params"]
    n = layers * cfg.depth_loops + cfg.vocab_size * cfg.embed_dim
    attn = 0
    for layer_type in cfg.layer_types():
        head_dim = cfg.global_attn_head_dim if layer_type == "global" else cfg.head_dim
        span = seq_len if layer_type == "global" else min(seq_len, 2 * cfg.sliding_window)
        attn += 2 * 2 * cfg.num_heads * head_dim * span  # QK^T and PV, forward
    return float(3 * (2 * n + attn * cfg.depth_loops))
