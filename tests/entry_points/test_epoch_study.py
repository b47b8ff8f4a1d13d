"""experiments/likelihood/epoch_study.py's bookkeeping, with `train` and `evaluate` replaced by recorders: stage order (the
adapted run starts before the AR run moves on), step counts per epoch, FLOPs, rows, resuming, and the refusal to
start the adapted run from an AR run that has moved past its starting epoch."""

import importlib.util
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--config.data.seq_len=32", "--config.data.batch_size=8", "--config.diffusion.canvas_len=8"]


@pytest.fixture
def study(monkeypatch):
    spec = importlib.util.spec_from_file_location("epoch_study", REPO / "experiments" / "likelihood" / "epoch_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls, steps = [], {}

    def fake_run(args, log):
        calls.append(args)
        workdir = next(a for a in args if a.startswith("--workdir=")).split("=", 1)[1]
        if args[0] == "hackable_diffusion.train":
            steps[workdir] = int(next(a for a in args if a.startswith("--config.train.num_steps=")).split("=")[1])
            return ""
        return json.dumps({"bits_per_char": 1.0 + len(calls) / 100, "bits_per_token_se": 0.01})

    monkeypatch.setattr(module, "run_command", fake_run)
    monkeypatch.setattr(module, "latest_step", lambda workdir: steps.get(str(workdir), 0))
    return module, calls, steps


def run(module, root, epochs, adapt_from=1.0):
    args = ["--root", str(root), "--epochs", epochs, "--adapt_from_epoch", str(adapt_from), "--num_batches", "1"]
    args += [f"--override={o}" for o in TINY]
    old = sys.argv
    sys.argv = ["epoch_study.py", *args]
    try:
        module.main()
    finally:
        sys.argv = old
    return module.read_rows(root)


def test_stages_order_steps_flops_and_resume(study, tmp_path):
    module, calls, steps = study
    rows = run(module, tmp_path, "1,2")
    order = [(r["run"], r["epochs"]) for r in rows]
    assert order == [("ar", 1.0), ("masking", 1.0), ("adapted", 2.0), ("ar", 2.0), ("masking", 2.0)]
    by = {(r["run"], r["epochs"]): r for r in rows}
    per_epoch = by[("ar", 1.0)]["step"]
    assert per_epoch > 100  # tiny Shakespeare's training split in 32-character sequences, batch 8
    assert by[("ar", 2.0)]["step"] == 2 * per_epoch and by[("masking", 2.0)]["step"] == 2 * per_epoch
    assert by[("adapted", 2.0)]["step"] == per_epoch  # one epoch of its own after the AR run's first
    # masking runs two passes per token, AR one; the adapted run counts the AR epoch it started from
    assert by[("masking", 1.0)]["train_flops"] == pytest.approx(2 * by[("ar", 1.0)]["train_flops"])
    assert by[("adapted", 2.0)]["train_flops"] == pytest.approx(by[("ar", 1.0)]["train_flops"] * 3)
    adapted_train = next(c for c in calls if "--config=configs/epoch_study.py:adapted,quickstart" in c)
    assert f"--config.init.checkpoint={tmp_path / 'ar'}" in adapted_train
    count = len(calls)
    assert run(module, tmp_path, "1,2") == rows and len(calls) == count  # everything done: nothing runs again
    rows = run(module, tmp_path, "1,2,4")  # a later stage adds three rows
    assert [(r["run"], r["epochs"]) for r in rows[5:]] == [("adapted", 4.0), ("ar", 4.0), ("masking", 4.0)]


def test_refuses_an_ar_run_past_the_adapted_start(study, tmp_path):
    module, calls, steps = study
    run(module, tmp_path, "1,2", adapt_from=2.0)  # stages 1 and 2 of AR and masking; adapted starts after 2
    steps[str(tmp_path / "ar")] += 5  # the AR run has moved on since
    with pytest.raises(SystemExit, match="starts from the AR run at 2.0 epochs"):
        run(module, tmp_path, "1,2,4", adapt_from=2.0)
    with pytest.raises(SystemExit, match="must be increasing"):
        run(module, tmp_path, "2,1", adapt_from=1.0)


def test_a_subset_of_runs_at_another_size(study, tmp_path):
    module, calls, steps = study
    old = sys.argv
    sys.argv = ["epoch_study.py", "--root", str(tmp_path), "--epochs", "1,2", "--size", "mini", "--runs", "ar"]
    try:
        module.main()
    finally:
        sys.argv = old
    rows = module.read_rows(tmp_path)
    assert [(r["run"], r["epochs"]) for r in rows] == [("ar", 1.0), ("ar", 2.0)]
    assert all("--config=configs/epoch_study.py:ar,mini" in c for c in calls if c[0] == "hackable_diffusion.train")
    assert rows[1]["step"] == 2 * rows[0]["step"] > 100  # 8 x 256 characters per step
    for bad in ("adapted", "ar,cnn", ""):
        sys.argv = ["epoch_study.py", "--root", str(tmp_path / "x"), "--epochs", "1", "--runs", bad]
        try:
            with pytest.raises(SystemExit, match="--runs must name"):
                module.main()
        finally:
            sys.argv = old
