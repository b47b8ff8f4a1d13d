"""Model shapes: the exact DiffusionGemma 26B-A4B shape and smaller shapes derived from it.

The 26B-A4B numbers are those of docs/reference.md §1. Smaller shapes start from the same
dictionary and override sizes only, so every architectural switch (qk-norm, K=V globals, partial RoPE, softcap,
skip_scale, dense FFN beside the MoE) is the same code path at every size.
"""

from __future__ import annotations

from typing import Any


def gemma4_26b_a4b() -> dict[str, Any]:
    """The Gemma-4 26B-A4B backbone: 30 layers (5 local + 1 global), d 2816, 128 experts top-8."""
    return dict(
        vocab_size=262_144,
        embed_dim=2816,
        num_layers=30,
        num_heads=16,
        head_dim=256,
        num_kv_heads=8,
        ffw_hidden=2112,
        # every MoEConfig field spelled out, so that a derived shape's config can override any of them by flag
        moe=dict(
            num_experts=128,
            top_k=8,
            hidden_dim=704,
            dispatch="ragged",
            capacity_factor=1.25,
            load_balance_weight=0.0,  # the reference trains with no auxiliary losses
            router_z_weight=0.0,
        ),
        layer_pattern=("local",) * 5 + ("global",),
        sliding_window=1024,
        decoder_window="per_token",
        global_head_dim=512,
        global_num_kv_heads=2,
        k_eq_v_global=True,
        rope_local_base=10_000.0,
        rope_local_proportion=1.0,
        rope_global_base=1_000_000.0,
        rope_global_proportion=0.25,
        qk_norm=True,
        v_norm=True,
        scale_queries=False,
        final_logit_softcap=30.0,
        norm_eps=1e-6,
        param_dtype="bfloat16",
        compute_dtype="bfloat16",
        # not Gemma-4 architecture, spelled out so that every TransformerConfig field can be set by flag
        remat="none",
        self_conditioning=False,
        structure="",
        structure_embeddings=False,
        structure_attention_bias=0.0,
        scan_unroll=1,
        depth_loops=1,
        attention_impl="einsum",
    )


def diffusiongemma_26b_a4b() -> dict[str, Any]:
    """DiffusionGemma 26B-A4B: the Gemma-4 backbone plus the self-conditioner on canvas embeddings (17.8M parameters),
    as the released checkpoint holds it."""
    return dict(gemma4_26b_a4b(), self_conditioning=True)


def derived(**overrides: Any) -> dict[str, Any]:
    """The Gemma-4 26B-A4B dictionary with some fields replaced (a `moe` dict is merged, `moe=None` removes it)."""
    shape = gemma4_26b_a4b()
    if overrides.get("moe") is not None:
        overrides["moe"] = {**shape["moe"], **overrides["moe"]}
    shape.update(overrides)
    return shape


# For shapes trained from scratch with capacity dropping (`small`, `mini`): the Switch Transformer load-balance loss
# (1e-2 per layer; Fedus et al. 2021) and the ST-MoE router z-loss (1e-3; Zoph et al. 2022). The reference has neither.
# Without them the router of the mini Shakespeare AR run collapsed: 43% of its token assignments were dropped at
# capacity factor 1.25 at step 800 (6% at step 100 with them, 38% without; `moe_dropped_fraction`, results/text/README.md).
FROM_SCRATCH_AUX_LOSSES = dict(load_balance_weight=1e-2, router_z_weight=1e-3)


def tiny(vocab_size: int = 64, moe: bool = True) -> dict[str, Any]:
    """A few-thousand-parameter shape for tests: one local + one global layer, all features on."""
    return derived(
        vocab_size=vocab_size,
        embed_dim=32,
        num_layers=2,
        num_heads=4,
        head_dim=8,
        num_kv_heads=2,
        ffw_hidden=48,
        layer_pattern=("local", "global"),
        sliding_window=4,
        global_head_dim=16,
        global_num_kv_heads=1,
        moe=dict(num_experts=4, top_k=2, hidden_dim=16, dispatch="sorted", capacity_factor=2.0) if moe else None,
        param_dtype="float32",
        compute_dtype="float32",
    )


def small(vocab_size: int = 128, moe: bool = False) -> dict[str, Any]:
    """About 20M parameters (dense) for CPU training; the MoE variant has equal active parameters.

    Dense: FFN hidden 1536. MoE: dense FFN hidden 768 plus 8 experts top-2 of hidden 384 (768 active), with
    `FROM_SCRATCH_AUX_LOSSES`.
    """
    return derived(
        vocab_size=vocab_size,
        embed_dim=512,
        num_layers=6,
        num_heads=8,
        head_dim=64,
        num_kv_heads=4,
        ffw_hidden=768 if moe else 1536,
        layer_pattern=("local", "local", "global"),
        sliding_window=256,
        global_head_dim=64,
        global_num_kv_heads=2,
        moe=dict(
            num_experts=8, top_k=2, hidden_dim=384, dispatch="sorted", capacity_factor=1.25, **FROM_SCRATCH_AUX_LOSSES
        )
        if moe
        else None,
        param_dtype="float32",
        compute_dtype="float32",
    )


def mini(vocab_size: int = 128, moe: bool = False) -> dict[str, Any]:
    """About 5M parameters (dense) for the text comparisons that must train three models on a 2-core CPU; the MoE
    variant has equal active parameters. Dense: FFN hidden 1024. MoE: dense FFN 512 plus 8 experts top-2 of 256,
    with `FROM_SCRATCH_AUX_LOSSES`."""
    return derived(
        vocab_size=vocab_size,
        embed_dim=256,
        num_layers=6,
        num_heads=4,
        head_dim=64,
        num_kv_heads=2,
        ffw_hidden=512 if moe else 1024,
        layer_pattern=("local", "local", "global"),
        sliding_window=256,
        global_head_dim=64,
        global_num_kv_heads=2,
        moe=dict(
            num_experts=8, top_k=2, hidden_dim=256, dispatch="sorted", capacity_factor=1.25, **FROM_SCRATCH_AUX_LOSSES
        )
        if moe
        else None,
        param_dtype="float32",
        compute_dtype="float32",
    )


def quickstart(vocab_size: int = 128) -> dict[str, Any]:
    """1.37M parameters (at the 69-character Shakespeare vocabulary) with every feature on (MoE, K=V globals, partial RoPE): trains in minutes on a CPU."""
    return derived(
        vocab_size=vocab_size,
        embed_dim=128,
        num_layers=4,
        num_heads=4,
        head_dim=32,
        num_kv_heads=2,
        ffw_hidden=256,
        layer_pattern=("local", "global"),
        sliding_window=64,
        global_head_dim=32,
        global_num_kv_heads=1,
        moe=dict(num_experts=4, top_k=2, hidden_dim=128, dispatch="sorted", capacity_factor=2.0),
        param_dtype="float32",
        compute_dtype="float32",
    )


def puzzle(vocab_size: int, sequence_length: int, **overrides: Any) -> dict[str, Any]:
    """The puzzle tasks' backbone (Sudoku, Countdown), about 4.5M parameters: 6 global layers (a puzzle's rows need no
    sliding window; the window is set to the row length), d 256, 8 heads of 32 with separate K and V, dense gated-GELU
    FFN of 640, full RoPE (the reference rotates a quarter of the global head; without absolute positions a cell's
    place has to come from them), float32. Bidirectional or causal is the objective's choice; `overrides` adds a task's
    priors (e.g. Sudoku's grid embeddings)."""
    return derived(
        vocab_size=vocab_size,
        embed_dim=256,
        num_layers=6,
        num_heads=8,
        head_dim=32,
        num_kv_heads=8,
        ffw_hidden=640,
        layer_pattern=("global",),
        sliding_window=sequence_length,
        global_head_dim=32,
        global_num_kv_heads=8,
        k_eq_v_global=False,
        rope_global_base=10_000.0,
        rope_global_proportion=1.0,
        moe=None,
        param_dtype="float32",
        compute_dtype="float32",
        self_conditioning=False,
        **overrides,
    )
