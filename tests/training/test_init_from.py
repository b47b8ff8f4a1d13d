"""`train` from weights (`config.init`, `checkpoints.base_weights`): a masking run started from a tiny autoregressive
run loads every parameter of it unchanged (the two parameter trees are the same), reports what it loaded in the
printed table, `init_report.json` and `config.json`; a self-conditioner the source lacks is new (allowed by the
default `init.allow_new`, refused when the allow list is empty, with how to allow it); a shape mismatch names the
parameter and both shapes; a rerun of a workdir with checkpoints resumes without reading the source again; a Gemma-4
checkpoint starts a DiffusionGemma model whose self-conditioner is new."""

import contextlib
import dataclasses
import io
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from _tiny_configs import tiny_text_config

from hackable_diffusion import builders, train
from hackable_diffusion.checkpoints import base_weights, toolbox, weight_matching
from hackable_diffusion.checkpoints.trees import flatten_tree

SELF_CONDITIONER = (
    "self_conditioner/ffw/gating_einsum",
    "self_conditioner/ffw/linear",
    "self_conditioner/pre_norm/scale",
)


def from_weights_config(process: str, source: pathlib.Path, steps: int = 1):
    """A tiny dense run of `process` started from the toolbox run `source`, trained at learning rate 0 (every update
    is zero, so a checkpoint holds the starting parameters)."""
    config = tiny_text_config(process, steps=steps, moe=False)
    config.init.kind, config.init.checkpoint = "toolbox", str(source)
    config.optimizer.peak_lr = config.optimizer.end_lr = 0.0
    config.optimizer.warmup_steps = 0
    config.train.log_every = 1
    config.train.eval_every = 0
    config.train.checkpoint_every = 1
    return config


def train_quietly(config, workdir: pathlib.Path) -> str:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        train.run(config, str(workdir), sample_at_end=False)
    return output.getvalue()


@pytest.fixture(scope="module")
def masking_from_ar(trained_text_runs, tmp_path_factory):
    """(source AR run, a masking run trained 1 step from it at lr 0, what training printed)."""
    source = trained_text_runs["none"]
    workdir = tmp_path_factory.mktemp("init_from") / "masking_from_ar"
    output = train_quietly(from_weights_config("masking", source), workdir)
    return source, workdir, output


def test_autoregressive_and_masking_runs_have_the_same_parameters_and_uniform_adds_a_self_conditioner():
    def paths(process):
        shapes = weight_matching.param_shapes(builders.build_model(tiny_text_config(process, moe=False), 68))
        return {p: s.shape for p, s in flatten_tree(shapes).items()}

    ar, masking, uniform = paths("none"), paths("masking"), paths("uniform")
    assert ar == masking  # no time embedding, no head of its own: the process and objective are outside the tree
    assert set(uniform) - set(ar) == set(SELF_CONDITIONER) and set(ar) <= set(uniform)


def test_a_masking_run_starts_from_an_autoregressive_run(masking_from_ar):
    source, workdir, output = masking_from_ar
    source_params = flatten_tree(toolbox.load_toolbox_params(source, weights="raw")[0])

    report = json.loads((workdir / weight_matching.REPORT_FILE).read_text())
    assert report["source"].startswith(f"toolbox:{source}@")
    assert report["totals"]["loaded"] == {
        "arrays": len(source_params),
        "values": sum(int(np.prod(a.shape)) for a in source_params.values()),
    }
    assert report["new"] == [] and report["unused"] == [] and report["cast"] == []
    assert "Starting weights: toolbox:" in output and "Initialised a new model" in output
    assert "Restored checkpoint" not in output

    saved = json.loads((workdir / "config.json").read_text())
    assert saved["init"]["kind"] == "toolbox" and saved["init"]["checkpoint"] == str(source)
    assert saved["diffusion"]["process"] == "masking"
    assert saved["model"]["vocab_size"] == source_params["embedder/input_embedding"].shape[0]
    tokenizer = pathlib.Path("tokenizer", "tokenizer.json")
    assert (workdir / tokenizer).read_bytes() == (source / tokenizer).read_bytes()  # the source's ids

    # step 0 is the source: the one update at lr 0 changed nothing, and the step counter started at 0
    params, step = toolbox.load_toolbox_params(workdir, weights="raw")
    assert step == 1
    for path, array in flatten_tree(params).items():
        np.testing.assert_array_equal(array, source_params[path], err_msg=path)
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]


def test_new_parameters_are_reported_when_allowed_and_refused_otherwise(trained_text_runs, tmp_path):
    source = trained_text_runs["none"]
    config = from_weights_config("uniform", source)  # DiffusionGemma's recipe: a self-conditioner the source lacks
    base = base_weights.load_base(config)
    resolved = base_weights.resolve_train_config(config, base)
    model = builders.build_model(resolved, int(resolved.model.vocab_size))
    loaded, report = base_weights.report_start(base, model, resolved, tmp_path)
    assert [(p, g) for p, _, g in report.new] == [(p, "self_conditioner/*") for p in SELF_CONDITIONER]
    assert set(loaded) == set(flatten_tree(base.params)) and report.unused == ()
    table = report.table()
    assert "new" in table and "self_conditioner/ffw/linear" in table
    assert json.loads((tmp_path / weight_matching.REPORT_FILE).read_text())["totals"]["new"]["arrays"] == 3

    # the start: the source's arrays, the self-conditioner from the model's own random init
    params = flatten_tree(jax.device_get(weight_matching.start_init_fn(model, loaded)(jax.random.key(0))))
    np.testing.assert_array_equal(params["final_norm/scale"], loaded["final_norm/scale"])
    assert np.abs(params["self_conditioner/ffw/linear"]).sum() > 0

    config.init.allow_new = ""
    workdir = tmp_path / "refused"
    with pytest.raises(ValueError, match=r"not in the source toolbox:.*self_conditioner/ffw/gating_einsum") as err:
        train_quietly(config, workdir)
    assert "--config.init.allow_new='self_conditioner/*'" in str(err.value)
    assert not (workdir / "config.json").exists()  # refused before anything was written


def test_unused_source_parameters_are_listed_and_dtypes_cast():
    shapes = {"a": {"w": jax.ShapeDtypeStruct((2, 3), np.float32)}, "b": jax.ShapeDtypeStruct((4,), np.float32)}
    source = {"a": {"w": np.ones((2, 3), np.float16)}, "b": np.zeros(4, np.float32), "extra": np.zeros((5, 5))}
    loaded, report = weight_matching.match_params(source, shapes, allow_new=(), source="test")
    assert loaded["a/w"].dtype == np.float32 and report.cast == (("a/w", "float16", "float32"),)
    assert report.unused == (("extra", (5, 5)),)
    assert report.totals() == {
        "loaded": {"arrays": 2, "values": 10},
        "new": {"arrays": 0, "values": 0},
        "unused": {"arrays": 1, "values": 25},
    }
    assert "extra (5, 5)" in report.table()


def test_a_shape_mismatch_names_the_parameter_and_both_shapes(trained_text_runs, tmp_path):
    config = from_weights_config("masking", trained_text_runs["none"])
    config.model.ffw_hidden = 64  # the source's is 48
    workdir = tmp_path / "mismatch"
    with pytest.raises(weight_matching.InitMismatchError) as err:
        train_quietly(config, workdir)
    message = str(err.value)
    assert "'layers/block_0/mlp2/gating_einsum': (1, 2, 48, 32) in the source, (1, 2, 64, 32) in this model" in message
    assert "4 parameter(s)" in message and "config.model" in message
    assert not (workdir / "config.json").exists()


def test_a_resumed_run_does_not_read_the_source_again(masking_from_ar, tmp_path, monkeypatch):
    source, finished, _ = masking_from_ar
    workdir = tmp_path / "resumed"
    shutil.copytree(finished, workdir)
    report = (workdir / weight_matching.REPORT_FILE).read_text()

    def no_source(config):
        raise AssertionError("a resumed run read config.init's source")

    monkeypatch.setattr(base_weights, "load_base", no_source)
    config = from_weights_config("masking", tmp_path / "moved_away", steps=2)  # given now: a path that is not there
    output = train_quietly(config, workdir)
    assert "Restored checkpoint at step 1" in output and "Initialised a new model" not in output
    assert "keeps the init it started with" in output
    assert (workdir / weight_matching.REPORT_FILE).read_text() == report
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["init"]["checkpoint"] == str(source)  # the init the run started with
    assert toolbox.load_toolbox_params(workdir, weights="raw")[1] == 2


def test_init_step_starts_from_that_checkpoint_and_names_the_steps_there(trained_text_runs):
    source = trained_text_runs["uniform"]  # checkpoints at steps 3 and 6
    config = from_weights_config("uniform", source)
    latest = base_weights.load_base(config)
    config.init.step = 3
    earlier = base_weights.load_base(config)
    assert (latest.source, earlier.source) == (f"toolbox:{source}@6", f"toolbox:{source}@3")
    expected = flatten_tree(toolbox.load_toolbox_params(source, step=3)[0])
    got, last = flatten_tree(earlier.params), flatten_tree(latest.params)
    assert set(got) == set(expected)
    for path, array in got.items():
        np.testing.assert_array_equal(array, expected[path], err_msg=path)
    assert any(not np.array_equal(got[p], last[p]) for p in got)  # six steps of training moved the weights
    config.init.step = 4
    with pytest.raises(ValueError, match=r"step 4 not found .*available: \[3, 6\]"):
        base_weights.load_base(config)


def test_init_from_sets_the_section_of_any_config():
    config = tiny_text_config("masking", moe=False)
    del config["init"]
    base_weights.set_init_from(config, "toolbox:runs/ar")
    init = config.init
    assert (init.kind, init.checkpoint, init.allow_new) == ("toolbox", "runs/ar", "self_conditioner/*")
    with pytest.raises(ValueError, match="KIND:PATH"):
        base_weights.set_init_from(config, "scratch:x")


def test_a_gemma4_checkpoint_starts_a_diffusiongemma_model_with_a_new_self_conditioner(tmp_path):
    fixture = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_gemma4"
    config = tiny_text_config("uniform", moe=True)
    config.init.kind, config.init.checkpoint = "hf", str(fixture)
    base = base_weights.load_base(config)
    with pytest.raises(ValueError, match="--config.data.tokenizer=pretrained"):
        base_weights.resolve_train_config(config, base)
    config.data.tokenizer = "pretrained"
    config.model.update(dict(dataclasses.asdict(base.model.cfg), self_conditioning=True))  # Gemma-4 + self-conditioner
    resolved = base_weights.resolve_train_config(config, base)
    model = builders.build_model(resolved, int(resolved.model.vocab_size))
    loaded, report = base_weights.report_start(base, model, resolved, tmp_path)
    assert [p for p, _, _ in report.new] == list(SELF_CONDITIONER) and report.unused == ()
    assert len(loaded) == len(flatten_tree(base.params))
    base_weights.install_tokenizer(base, tmp_path)
    assert json.loads((tmp_path / "tokenizer" / "tokenizer.json").read_text())["metadata"] == {"kind": "pretrained"}
