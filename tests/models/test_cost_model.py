"""The GPU cost model (`experiments/speed/aot/costs.py`, `roofline.py`, `xla_counts.py`; run for 26B-A4B by
experiments/speed/gpu_cost_model.py) on small models: XLA's cost analysis of the compiled decode programs against the
analytic counts, the MoE dispatches' expert rows as XLA:CPU compiles them, the roofline formula, and the published
hardware table's sources.

Tolerances (all measured well inside them): XLA's total FLOPs within 5% of the analytic matmul + attention count
(XLA also counts elementwise ops, 1-2.5% here); the matmul FLOPs parsed from the optimized HLO within 0.5% of the
analytic count; XLA's "bytes accessed" of the batch-1 AR step within 20% of the analytic bytes of reading every
argument once (weights dominate that step; measured 1.06), and never below 95% of it in any program.
"""

from __future__ import annotations

import math

import pytest

from aot import costs, roofline, xla_counts
from hackable_diffusion.models import param_count, presets
from hackable_diffusion.models.config import TransformerConfig

CANVAS, CACHE_SLOTS = 16, 32


def _dense_model() -> dict:
    """A small dense float32 model whose weights dominate a one-token step (2.6M parameters, one local and one global
    layer, a self-conditioner)."""
    return presets.derived(
        vocab_size=1024,
        embed_dim=256,
        num_layers=2,
        num_heads=4,
        head_dim=64,
        num_kv_heads=2,
        ffw_hidden=1024,
        layer_pattern=("local", "global"),
        sliding_window=8,
        global_head_dim=64,
        global_num_kv_heads=1,
        moe=None,
        param_dtype="float32",
        compute_dtype="float32",
        self_conditioning=True,
    )


def _moe_model(dispatch: str) -> dict:
    model = presets.tiny(vocab_size=128)
    model.update(self_conditioning=True, moe=dict(model["moe"], dispatch=dispatch, capacity_factor=1.25))
    return model


def _check(model: dict, program: costs.Program) -> tuple[dict, costs.Counts]:
    cfg = TransformerConfig.from_dict(model)
    _, compiled = xla_counts.compile_decode_program(model, program, CACHE_SLOTS)
    return xla_counts.xla_costs(compiled), costs.compiled_counts(cfg, costs.param_sizes(cfg), program, CACHE_SLOTS)


DENSE_PROGRAMS = {
    "canvas_b1": costs.Program("canvas", "canvas", 1, CANVAS, 0, CANVAS),
    "canvas_b2": costs.Program("canvas", "canvas", 2, CANVAS, 0, CANVAS),
    "ar_b1": costs.Program("ar", "append", 1, 1, 0, 1),
    "ar_b2": costs.Program("ar", "append", 2, 1, 0, 1),
    "append_b1": costs.Program("append", "append", 1, CANVAS, 0, CANVAS),
}


@pytest.fixture(scope="module")
def dense_checks():
    model = _dense_model()
    return {name: _check(model, program) for name, program in DENSE_PROGRAMS.items()}


@pytest.mark.parametrize("name", sorted(DENSE_PROGRAMS))
def test_dense_flops_match_the_analytic_count(dense_checks, name):
    xla, analytic = dense_checks[name]
    assert xla["while_loops"] == 0  # the scan is unrolled: nothing is counted once for several layers
    assert xla["dot_flops"] == pytest.approx(analytic.flops, rel=0.005), (name, xla, analytic.flops_parts)
    assert xla["flops"] == pytest.approx(analytic.flops, rel=0.05), (name, xla["flops"], analytic.flops_parts)
    assert xla["flops"] >= xla["dot_flops"]


def test_dense_bytes_against_reading_every_argument_once(dense_checks):
    xla, analytic = dense_checks["ar_b1"]
    assert 1.0 <= xla["bytes_accessed"] / analytic.bytes <= 1.2, (xla["bytes_accessed"], analytic.bytes_parts)
    for name, (xla, analytic) in dense_checks.items():
        assert xla["bytes_accessed"] >= 0.95 * analytic.bytes, (name, xla["bytes_accessed"], analytic.bytes_parts)
        # the HLO's own split of "bytes accessed" adds up to XLA's figure (within the parser's rounding of fusions)
        assert sum(xla["bytes_by_kind"].values()) == pytest.approx(xla["bytes_accessed"], rel=0.5)


@pytest.mark.parametrize("dispatch", ["sorted", "ragged", "dense"])
def test_moe_dispatch_rows_as_xla_cpu_compiles_them(dispatch):
    model = _moe_model(dispatch)
    cfg = TransformerConfig.from_dict(model)
    program = costs.Program("canvas", "canvas", 1, CANVAS, 0, CANVAS)
    xla, analytic = _check(model, program)
    assert xla["dot_flops"] == pytest.approx(analytic.flops, rel=0.01), (dispatch, xla, analytic.flops_parts)
    moe = cfg.moe
    rows = {
        "sorted": moe.num_experts * math.ceil(1.25 * CANVAS * moe.top_k / moe.num_experts),
        "ragged": CANVAS * moe.top_k * moe.num_experts,
        "dense": CANVAS * moe.num_experts,
    }[dispatch]
    assert costs.dispatch_rows(cfg, CANVAS) == rows


def test_ideal_counts_agree_with_decode_bench():
    decode_bench = pytest.importorskip("decode_bench")  # experiments/ is on the test path (tests/conftest.py)
    cfg = TransformerConfig.from_dict(_moe_model("ragged"))
    params = param_count.abstract_params(cfg)
    sizes = costs.param_sizes(cfg, params)
    context = cfg.sliding_window - 2  # inside the window: both count every cached key
    for tokens in (1, CANVAS):
        program = costs.Program("canvas", "canvas", 1, tokens, context, tokens)
        ideal = costs.ideal_counts(cfg, sizes, program, weight_bytes=4)
        bench_weights = decode_bench.weight_bytes(params, cfg, tokens)
        assert ideal.bytes_parts["weights"] + ideal.bytes_parts["experts"] == pytest.approx(bench_weights, rel=1e-9)
        assert ideal.bytes_parts["kv_read"] <= decode_bench.kv_bytes(cfg, context, 2)  # K = V globals stored once


def test_expert_fraction():
    cfg = TransformerConfig.from_dict(presets.diffusiongemma_26b_a4b())
    assert costs.expert_fraction(cfg, 1) == pytest.approx(8 / 128)
    assert costs.expert_fraction(cfg, 256) == pytest.approx(1 - (1 - 8 / 128) ** 256)
    assert costs.expert_fraction(cfg, 256) > 0.9999
    assert costs.expert_fraction(TransformerConfig.from_dict(_dense_model()), 1) == 1.0


def test_roofline_is_the_max_of_compute_and_memory_time():
    counts = costs.Counts(flops_parts={"a": 3e12, "b": 1e12}, bytes_parts={"w": 2e10, "kv": 1e9})
    for hw in roofline.HARDWARE.values():
        for weights in roofline.WEIGHT_FORMATS:
            peak = 1e12 * (hw.fp8_tflops if weights == "fp8" else hw.bf16_tflops)
            roof = roofline.roofline(counts, hw, weights)
            assert roof.seconds == pytest.approx(max(4e12 / peak, 2.1e10 / (1e12 * hw.hbm_tb_per_s)))
            assert roof.bound == ("memory" if 2.1e10 / (1e12 * hw.hbm_tb_per_s) >= 4e12 / peak else "compute")
    assert roofline.canvas_tokens_per_s(batch=8, canvas=256, steps=15, step_s=0.01) == pytest.approx(8 * 256 / 0.16)
    with pytest.raises(ValueError):
        roofline.roofline(counts, roofline.HARDWARE["H100 SXM"], "int4")


def test_fp8_halves_the_weight_bytes_only():
    cfg = TransformerConfig.from_dict(presets.diffusiongemma_26b_a4b())
    sizes = costs.param_sizes(cfg)
    program = costs.Program("canvas_step", "canvas", 1, 256, 1024, 256)
    bf16 = costs.ideal_counts(cfg, sizes, program, weight_bytes=roofline.WEIGHT_FORMATS["bf16"])
    fp8 = costs.ideal_counts(cfg, sizes, program, weight_bytes=roofline.WEIGHT_FORMATS["fp8"])
    for part in ("weights", "experts", "sc_signal"):
        assert fp8.bytes_parts[part] == pytest.approx(bf16.bytes_parts[part] / 2)
    for part in ("kv_read", "logits"):
        assert fp8.bytes_parts[part] == bf16.bytes_parts[part]
    assert fp8.flops == bf16.flops
    # a 256-token canvas reaches nearly every expert, so it reads about every weight of the 50.5 GB model
    assert bf16.bytes_parts["weights"] + bf16.bytes_parts["experts"] == pytest.approx(2 * sizes.total, rel=1e-4)
    h100 = roofline.roofline(bf16, roofline.HARDWARE["H100 SXM"], "bf16")
    assert h100.bound == "memory"


def test_hardware_table_has_a_source_per_entry():
    assert {"H100 SXM", "H200 SXM", "B200 (HGX)"} <= set(roofline.HARDWARE)
    for name, hw in roofline.HARDWARE.items():
        assert hw.name == name
        assert "nvidia.com" in hw.source and len(hw.source) > 40, hw
        assert 0 < hw.bf16_tflops <= hw.fp8_tflops and hw.hbm_tb_per_s > 0 and hw.memory_gb > 0
    assert roofline.HARDWARE["H200 SXM"].bf16_tflops == roofline.HARDWARE["H100 SXM"].bf16_tflops  # same GH100 compute
    assert roofline.WEIGHT_FORMATS == {"bf16": 2, "fp8": 1}
