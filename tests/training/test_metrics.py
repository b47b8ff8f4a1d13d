"""Metrics files, the progress line and MFU (`training/metrics.py`)."""

from __future__ import annotations

import os

import _toy_train_worker as toy
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _training_helpers import (
    _mesh,
    _run_toy_loop,
)

from hackable_diffusion.training import metrics


def test_metrics_files_and_progress_line(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(3, {"loss": jnp.float32(1.5), "acc": 0.25})
    writer.write(3, {"bpt": np.float64(np.nan)}, split="eval")
    with pytest.raises(ValueError, match="reserved"):
        writer.write(4, {"step": 1.0})
    writer.close()
    records = metrics.read_metrics(str(tmp_path))
    assert records[0]["step"] == 3 and records[0]["split"] == "train" and records[0]["loss"] == 1.5
    assert records[1] == {**records[1], "split": "eval", "bpt": "nan"}
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tensorboard"))

    clock = iter([0.0, 10.0, 20.0]).__next__
    progress = metrics.ProgressLogger(1000, tokens_per_step=2560, flops_per_token=1e6, peak_flops=1e11, clock=clock)
    assert progress.update(100, 3.5) == "step 100/1000 | loss 3.5"
    progress.update(140, 3.3)  # 4 steps/s
    line = progress.update(180, 3.21)
    assert line == "step 180/1000 | loss 3.21 | 4 steps/s | 10.2k tok/s | MFU 10% | ETA 3m25s"
    peak = metrics.measure_peak_matmul_flops(n=128, repeats=3)
    assert 1e6 < peak < 1e15


def test_read_metrics_lets_a_resumed_run_replace_the_steps_it_redoes(tmp_path):
    """Killed after logging steps 3-4 past its checkpoint at 2, the run resumes at 2 and logs 3-5 again."""
    writer = metrics.MetricsWriter(str(tmp_path))
    for step in (1, 2, 3, 4):
        writer.write(step, {"loss": float(step)})
        if step % 2 == 0:
            writer.write(step, {"bpt": float(step)}, split="eval")
    for step in (3, 4, 5):
        writer.write(step, {"loss": 10.0 + step})
    writer.write(4, {"bpt": 14.0}, split="eval")
    writer.write(4, {"bpt": 24.0}, split="eval")  # the same split and step again: the later record stands
    writer.close()
    train = metrics.read_metrics(str(tmp_path), "train")
    assert [(r["step"], r["loss"]) for r in train] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]
    assert [(r["step"], r["bpt"]) for r in metrics.read_metrics(str(tmp_path), "eval")] == [(2, 2.0), (4, 24.0)]
    everything = metrics.read_metrics(str(tmp_path), keep_superseded=True)
    assert [r["step"] for r in everything if r["split"] == "train"] == [1, 2, 3, 4, 3, 4, 5]
    assert len(everything) == 7 + 4  # 7 train lines, 4 eval lines


@pytest.mark.slow
def test_mfu_counts_the_compiled_programs_flops_and_stays_below_the_measured_peak(tmp_path):
    """The analytic FLOPs per token that the MFU divides equal XLA's count of the compiled forward and backward pass
    (layers unrolled so XLA sees each one; looped depth too) within 6%; a run measured against this machine's
    calibrated peak never reports an MFU above 1."""
    from hackable_diffusion.diffusion.objectives import AutoregressiveObjective
    from hackable_diffusion.models import presets
    from hackable_diffusion.models import transformer as T
    from hackable_diffusion.models.config import TransformerConfig
    from hackable_diffusion.models.param_count import training_flops_per_token

    for loops in (1, 2):
        shape = presets.derived(
            vocab_size=256,
            embed_dim=128,
            num_layers=2,
            num_heads=4,
            head_dim=32,
            num_kv_heads=2,
            ffw_hidden=512,
            moe=None,
            layer_pattern=("local", "global"),
            sliding_window=16,
            global_head_dim=32,
            global_num_kv_heads=2,
            param_dtype="float32",
            compute_dtype="float32",
            depth_loops=loops,
            scan_unroll=2,
        )
        model = T.Transformer(TransformerConfig.from_dict(shape))
        objective = AutoregressiveObjective(model)
        params = T.init_params(model, jax.random.key(0))
        b, l = 4, 64
        batch = {"tokens": jnp.ones((b, l), jnp.int32)}
        grad = jax.jit(jax.value_and_grad(lambda p: objective(p, batch, jax.random.key(0))[0]))
        cost = grad.lower(params).compile().cost_analysis()
        compiled = (cost[0] if isinstance(cost, list) else cost)["flops"] / (b * l)
        assert abs(compiled / training_flops_per_token(model.cfg, l) - 1) < 0.06, (loops, compiled)

    peak = metrics.calibrated_peak_flops()
    flops_per_token = 6 * sum(int(np.prod(x.shape)) for x in jax.tree.leaves(toy.init_fn(jax.random.key(0))))
    _run_toy_loop(
        tmp_path / "mfu",
        _mesh(devices=jax.devices()[:1]),
        6,
        tokens_per_example=toy.SEQ,
        flops_per_token=flops_per_token,
        peak_flops=peak,
    )
    mfus = [r["mfu"] for r in metrics.read_metrics(tmp_path / "mfu", "train") if "mfu" in r]
    assert mfus and all(0 < m <= 1 for m in mfus)
