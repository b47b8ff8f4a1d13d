"""AOT compilation (`experiments/speed/aot/`) on the tiny preset: every program lowers and compiles on an 8-device
fsdp x expert mesh.

The full-size run (26B-A4B) is experiments/speed/aot_26b.py; here the same code paths compile a tiny model with every
feature on (MoE, K=V globals, self-conditioning) in seconds, and the bookkeeping is checked exactly.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aot import layout as aot_layout
from aot import programs as aot_programs
from hackable_diffusion.models import partitioning, presets, transformer
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.training import sharding

MESH = dict(data=1, fsdp=2, expert=4, tensor=1)


def _tiny_model_dict(num_layers: int = 2) -> dict:
    model = presets.tiny()
    model.update(self_conditioning=True, num_layers=num_layers)
    return model


@pytest.fixture(scope="module")
def reports():
    if jax.device_count() < 8:
        pytest.skip("needs 8 (simulated) devices; tests/conftest.py sets XLA_FLAGS")
    settings = aot_layout.AotSettings(
        model=_tiny_model_dict(),
        mesh=MESH,
        train_batch=8,
        train_seq=8,
        canvas=4,
        cache_len=16,
        append_len=4,
        # Low optimisation level: the tiny programs compile ~2x faster; the memory analysis is still XLA's.
        compiler_options=dict(aot_layout.NO_LICM, xla_backend_optimization_level=0),
    )
    emitted = []
    summary = aot_programs.run(settings, emit=emitted.append)
    return {r["program"]: r for r in emitted}, summary


@pytest.mark.slow
def test_every_program_compiles_with_positive_memory(reports):
    by_name, summary = reports
    assert set(by_name) == {"params", "train_adamw", "train_adafactor", "canvas_denoise", "append_4", "decode_1"}
    for name, report in by_name.items():
        if name == "params":
            continue
        mem = report["memory_per_device"]
        for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"):
            assert mem[field] > 0, (name, field, mem)
        assert report["compile_s"] > 0 and report["lower_s"] > 0
        # The analytic per-device bytes of the sharded arguments equal XLA's argument size.
        assert report["analytic_vs_compiled_argument_ratio"] == pytest.approx(1.0, abs=1e-3), (name, report)
        assert report["mesh"] == MESH
    assert [row["program"] for row in summary["programs"]] == [
        "train_adamw",
        "train_adafactor",
        "canvas_denoise",
        "append_4",
        "decode_1",
    ]


@pytest.mark.slow
def test_train_state_bytes_add_up_and_state_is_donated(reports):
    by_name, _ = reports
    adamw, adafactor = by_name["train_adamw"], by_name["train_adafactor"]
    params = adamw["params_bytes_per_device"]
    assert params == by_name["params"]["params_bytes_per_device"]
    # AdamW: mu and nu have the parameters' shapes, dtypes and shardings, plus int32 step counts (Adam's and the
    # schedule's; clipping keeps no state) -> 2 * params + a few scalars.
    assert 0 <= adamw["opt_state_bytes_per_device"] - 2 * params <= 64
    # Adafactor keeps factored moments: strictly less than AdamW's state.
    assert adafactor["opt_state_bytes_per_device"] < adamw["opt_state_bytes_per_device"]
    for report in (adamw, adafactor):
        mem = report["memory_per_device"]
        # The whole state is donated: every state byte is aliased to an output.
        state = report["params_bytes_per_device"] + report["opt_state_bytes_per_device"]
        assert mem["alias_size_in_bytes"] >= state
        assert report["batch_shape"] == [8, 8]
        assert report["tokens_per_device"] == 8  # batch 8 over data x fsdp x expert = 8 devices
        assert report["master_weights"] == "f32 params"  # the tiny preset is float32


@pytest.mark.slow
def test_inference_programs_read_the_cache(reports):
    by_name, _ = reports
    denoise, append, decode = by_name["canvas_denoise"], by_name["append_4"], by_name["decode_1"]
    assert denoise["self_conditioning_input"] is True
    assert denoise["tokens_shape"] == [1, 4] and decode["tokens_shape"] == [1, 1]
    for report in (denoise, append, decode):
        assert report["cache_len"] == 16
        assert report["cache_bytes_per_device"] > 0
    # append/decode donate the cache: the new cache aliases the old one.
    for report in (append, decode):
        assert report["memory_per_device"]["alias_size_in_bytes"] >= report["cache_bytes_per_device"]
    assert denoise["memory_per_device"]["alias_size_in_bytes"] == 0


def test_no_expert_weight_is_replicated_across_the_expert_axis():
    mesh = sharding.make_mesh(MESH)
    model = transformer.Transformer(TransformerConfig.from_dict(_tiny_model_dict()))
    params, shardings = aot_layout.sharded_params(model, mesh)
    assert sharding.replicated_expert_params(params, shardings, partitioning.logical_axes) == []
    specs = aot_layout.expert_param_specs(params)
    assert len(specs) == 6  # gating_einsum, linear, per_expert_scale in each of the two layers
    assert all("'expert'" in spec for spec in specs.values()), specs
    # The check can fail: rules that replicate the experts are caught, naming every expert weight.
    bad_rules = dict(sharding.DEFAULT_RULES, experts=None)
    with pytest.raises(AssertionError, match="moe/gating_einsum"):
        aot_layout.sharded_params(model, mesh, bad_rules)


def test_parameter_bytes_are_affine_in_depth():
    mesh = sharding.make_mesh(MESH)
    sizes = {}
    for groups in (1, 2, 3):
        model = transformer.Transformer(TransformerConfig.from_dict(_tiny_model_dict(num_layers=2 * groups)))
        params, _ = aot_layout.sharded_params(model, mesh)
        sizes[groups] = (aot_layout.per_device_bytes(params), aot_layout.depth_split(params, groups))
    fixed = sizes[1][1]["fixed_bytes_per_device"]
    per_group = sizes[1][1]["per_group_bytes_per_device"]
    for groups, (total, split) in sizes.items():
        assert split == {"fixed_bytes_per_device": fixed, "per_group_bytes_per_device": per_group}
        assert total == fixed + groups * per_group


@pytest.mark.slow
def test_constrained_model_has_the_same_params_and_logits():
    mesh = sharding.make_mesh(MESH)
    cfg = TransformerConfig.from_dict(_tiny_model_dict())
    plain = transformer.Transformer(cfg)
    constrained = aot_layout.ConstrainedTransformer(cfg, mesh=mesh, batch_axes=("data", "fsdp", "expert"))
    fast = {"xla_backend_optimization_level": 0}
    params = jax.jit(lambda k: transformer.init_params(plain, k), compiler_options=fast)(jax.random.key(0))
    shapes = jax.eval_shape(lambda: transformer.init_params(constrained, jax.random.key(0)))
    assert jax.tree.structure(shapes) == jax.tree.structure(params)
    assert jax.tree.map(lambda a: a.shape, shapes) == jax.tree.map(lambda a: a.shape, params)
    tokens = jax.random.randint(jax.random.key(1), (8, 6), 4, cfg.vocab_size)
    ref, _ = jax.jit(lambda p, t: transformer.forward(plain, p, t), compiler_options=fast)(params, tokens)
    got, _ = jax.jit(lambda p, t: transformer.forward(constrained, p, t), compiler_options=fast)(params, tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_gpu_count_closed_form():
    gib = 2**30
    report = {
        "program": "train_x",
        "memory_per_device": {"live_bytes_per_device": 30 * gib, "temp_size_in_bytes": 10 * gib},
        "params_bytes_per_device": 15 * gib,
        "opt_state_bytes_per_device": 5 * gib,
        "state_sharded_global_bytes": 160 * gib,  # 20 GiB per device x 8 devices
        "state_replicated_bytes": 0,
        "batch_shape": [8, 4096],
        "tokens_per_device": 4096,
        "compile_s": 1.0,
    }
    row = aot_layout.gpus_needed(report, num_devices=8, gpu_bytes=80e9)
    assert row["gpus_80gb_pooled"] == math.ceil(8 * 30 * gib / 80e9)  # 240 GiB pooled -> 4
    # 160 GiB / n + 10 GiB <= 80e9 bytes -> n >= 2.47 -> 3 -> rounded up to a power of two.
    assert row["gpus_80gb_same_per_device_batch"] == 4
    assert row["non_state_gib_per_device"] == pytest.approx(10.0)
    report["memory_per_device"]["live_bytes_per_device"] = 100 * gib  # non-state 80 GiB > 80 GB
    assert aot_layout.gpus_needed(report, num_devices=8)["gpus_80gb_same_per_device_batch"] == "does not fit"


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown programs"):
        aot_layout.AotSettings(model=_tiny_model_dict(), mesh=MESH, programs=("train_sgd",))
    with pytest.raises(ValueError, match="not mesh axes"):
        aot_layout.AotSettings(model=_tiny_model_dict(), mesh=MESH, batch_axes=("batch",))
    with pytest.raises(ValueError, match="mesh entries"):
        aot_layout.mesh_from_spec("fsdp2")
    assert aot_layout.mesh_from_spec("data=1,fsdp=2") == {"data": 1, "fsdp": 2}
    assert jnp.dtype(presets.diffusiongemma_26b_a4b()["param_dtype"]) == jnp.bfloat16  # the script's default model
