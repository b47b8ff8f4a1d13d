"""End-to-end tests of the command-line paths: train (and resume), sample, evaluate, config override errors."""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest
from _commands import run_module
from _tiny_configs import tiny_text_config

from hackable_diffusion import builders, cli, recipes, run_config
from hackable_diffusion import sft

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_batch_not_divisible_by_mesh_is_a_clear_error(tmp_path):
    from hackable_diffusion import train

    config = tiny_text_config()
    config.data.batch_size = 4  # 8 simulated devices on the data axis
    with pytest.raises(ValueError, match="not divisible by the mesh"):
        train.run(config, str(tmp_path))


def test_unknown_override_names_the_closest_keys():
    config = tiny_text_config()
    with pytest.raises(cli.ConfigKeyError, match="train.num_steps"):
        cli.check_overrides(config, ["--config.train.num_step=3"])
    cli.check_overrides(config, ["--config.train.num_steps=3", "--workdir=x"])  # valid keys pass


def test_train_command_rejects_unknown_key_before_running(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hackable_diffusion.train",
            "--config",
            str(REPO / "configs/quickstart.py"),
            "--workdir",
            str(tmp_path),
            "--config.optimizer.peak_lrr=1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "optimizer.peak_lr" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "config.json").exists()


@pytest.mark.slow
def test_train_resume_sample_and_evaluate(trained_text_runs, tmp_path, capsys):
    """The full path with DiffusionGemma's recipe: train, checkpoints, metrics, resume, sample, evaluate."""
    from _tiny_configs import TRAIN_OUTPUT

    from hackable_diffusion import evaluate, experiment, train
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.tasks import text
    from hackable_diffusion.tasks.text_evaluation import Likelihood

    process = "uniform"
    trained = trained_text_runs[process]  # tiny_text_config(process, steps=6), trained once per test run
    assert "Sample (" in (trained / TRAIN_OUTPUT).read_text()
    assert json.loads((trained / "config.json").read_text())["diffusion"]["process"] == process
    lines = [json.loads(l) for l in (trained / "metrics.jsonl").read_text().splitlines()]
    assert {l.get("split") for l in lines} >= {"train", "eval"}
    assert any(p.name.startswith("events") for p in (trained / "tensorboard").rglob("*"))
    assert sorted(int(p.name) for p in (trained / "checkpoints").iterdir() if p.name.isdigit()) == [3, 6]

    # The same command with more steps resumes from step 6 instead of restarting.
    workdir = str(shutil.copytree(trained, tmp_path / "run"))
    train.run(tiny_text_config(process, steps=9), workdir, sample_at_end=False)
    assert "Restored checkpoint at step 6" in capsys.readouterr().out

    exp = experiment.from_workdir(workdir)
    params, step = toolbox.load_params(exp, workdir)
    assert step == 9
    texts, result = text.sample_texts(exp, params, ["ROMEO:", "JULIET:"], seed=0, max_new_tokens=16)
    again, _ = text.sample_texts(exp, params, ["ROMEO:", "JULIET:"], seed=0, max_new_tokens=16)
    assert texts == again and len(texts) == 2  # same seed, same output
    metrics = evaluate.run(workdir, Likelihood(num_batches=2, batch_size=8))
    assert metrics["bits_per_token"] > 0 and metrics["bits_per_char"] > 0
    assert metrics["bound"] == "ELBO (upper bound on NLL)"


def test_every_config_file_loads_and_the_text_triples_see_the_same_tokens():
    from hackable_diffusion.models.config import TransformerConfig

    seen, adapted = {}, {}
    for path in sorted((REPO / "configs").glob("*.py")):
        config = cli.load_config_file(str(path))
        TransformerConfig.from_dict(dict(config.model.to_dict(), vocab_size=config.data.get("vocab_size") or 128))
        name = path.stem
        for corpus in ("shakespeare", "ptb"):
            if name.startswith(corpus + "_") and not name.startswith("sft"):
                variant = "moe" if name.endswith("_moe") else "dense"
                key = (corpus, variant)
                shape = (config.model.to_dict(), config.data.seq_len, config.data.batch_size, config.train.num_steps)
                shape[0].pop("self_conditioning", None)  # the uniform recipe's self-conditioner is its only extra
                if name.endswith("_from_ar"):  # an adaptation of the AR run: its shape, a quarter of its FLOPs
                    adapted[name] = (key, shape)
                    continue
                seen.setdefault(key, []).append((name, shape))
    assert sorted(seen) == [("ptb", "dense"), ("ptb", "moe"), ("shakespeare", "dense"), ("shakespeare", "moe")]
    for key, entries in seen.items():
        assert len(entries) == 3, entries
        assert all(shape == entries[0][1] for _, shape in entries), key
    assert sorted(adapted) == [
        "ptb_masking_from_ar",
        "ptb_uniform_from_ar",
        "shakespeare_masking_from_ar",
        "shakespeare_uniform_from_ar",
    ]
    for name, (key, shape) in adapted.items():
        model, seq_len, batch_size, steps = seen[key][0][1]
        config = cli.load_config_file(str(REPO / "configs" / f"{name}.py"))
        passes = builders.objective_passes(config)
        assert shape[:3] == (model, seq_len, batch_size), name
        assert abs(shape[3] * passes - steps / 4) <= passes / 2, name  # a quarter of the AR run's training FLOPs


def test_rerunning_a_workdir_with_a_changed_config_records_the_change(tmp_path, capsys):
    """config.json is replaced by the new config, and what changed (old -> new) goes to config_changes.jsonl."""
    path = tmp_path / "config.json"
    config = recipes.base_config()
    assert run_config.save_config(config, path) == {}  # first run: nothing to compare with
    assert run_config.save_config(config, path) == {}  # the same command again (a plain resume): nothing recorded
    assert not (tmp_path / run_config.CONFIG_CHANGES_FILE).exists()

    longer = recipes.base_config()
    longer.train.num_steps = config.train.num_steps + 100
    longer.optimizer.peak_lr = config.optimizer.peak_lr / 2
    longer.data.new_key = "x"  # keys that appear or disappear are recorded too
    changes = run_config.save_config(longer, path)
    expected = {
        "data.new_key": ("<absent>", "x"),
        "optimizer.peak_lr": (config.optimizer.peak_lr, config.optimizer.peak_lr / 2),
        "train.num_steps": (config.train.num_steps, config.train.num_steps + 100),
    }
    assert changes == expected
    assert "train.num_steps" in capsys.readouterr().out
    assert json.loads(path.read_text())["train"]["num_steps"] == config.train.num_steps + 100
    (record,) = [json.loads(line) for line in (tmp_path / run_config.CONFIG_CHANGES_FILE).read_text().splitlines()]
    assert record["changes"] == {key: list(pair) for key, pair in expected.items()}
    assert "time" in record


def test_saved_configs_from_older_runs_get_new_sampler_keys(tmp_path):
    """A run saved before a sampler key existed (here score_temperature) loads with that key's default."""
    config = recipes.base_config().to_dict()
    del config["sampler"]["score_temperature"]
    config["sampler"]["num_steps"] = 7  # a saved value must survive the fill
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = run_config.load_saved_config(str(tmp_path))
    assert loaded.sampler.score_temperature == recipes.base_config().sampler.score_temperature
    assert loaded.sampler.num_steps == 7


def test_early_stopping_and_draw_arguments_are_set_from_the_config(tmp_path):
    """The early-stopping rule and the draw are sections (rule + arguments) like the selection: their arguments reach
    the objects; a run saved when they were bare names loads them as sections."""
    from hackable_diffusion import builders
    from hackable_diffusion.diffusion.processes import UniformProcess
    from hackable_diffusion.diffusion.schedules import LinearSchedule
    from hackable_diffusion.sampling.draws import BlockedInverseCdf
    from hackable_diffusion.sampling.early_stopping import EntropyBelow, TokenStability

    config = cli.override(
        recipes.base_config(),
        {"sampler.early_stopping.rule": "entropy", "sampler.early_stopping.threshold": 0.05,
         "sampler.draw.rule": "blocked_inverse_cdf", "sampler.draw.block": 16},
    )  # fmt: skip
    sampler = builders.build_sampler(config, UniformProcess(32, LinearSchedule()))
    assert sampler.early_stopping == EntropyBelow(threshold=0.05)
    assert sampler.draw == BlockedInverseCdf(block=16)
    chained = builders.build_early_stopping(recipes.early_stopping("transformers", threshold=0.01))
    assert chained.rules == (TokenStability(against="previous_argmax"), EntropyBelow(0.01, strict=True))
    with pytest.raises(ValueError, match="does not take"):
        builders.build_early_stopping(recipes.early_stopping("token_stability", threshold=0.1))
    with pytest.raises(ValueError, match="unknown draw arguments"):
        recipes.draw("gumbel_max", size=3)

    old = recipes.base_config().to_dict()
    old["sampler"].update(early_stopping="none", draw="blocked_inverse_cdf")  # names, as older runs saved them
    (tmp_path / "config.json").write_text(json.dumps(old))
    loaded = run_config.load_saved_config(str(tmp_path))
    assert loaded.sampler.early_stopping.rule == "none" and loaded.sampler.draw.rule == "blocked_inverse_cdf"
    assert loaded.sampler.draw.block is None


def _command(module, *args, env=None):
    return run_module(module, *args, env=env)


@pytest.mark.parametrize("command", ["train", "sample", "evaluate", "sft", "convert"])
def test_help_works_alone_and_exits_zero(command):
    out = _command(f"hackable_diffusion.{command}", "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--config" in out.stdout and "flags:" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config.train.num_steps=20"], "warmup_steps=30 is longer than the run"),
        (["--config.train.num_steps=0"], "num_steps=0 must be >= 1"),
        (["--config.data.batch_size=0"], "batch_size=0 must be >= 1"),
        (["--config.data.corpus=nope"], "corpus='nope'"),
    ],
)
def test_a_bad_setting_stops_train_before_anything_is_written(tmp_path, args, message):
    workdir = tmp_path / "run"
    out = _command("hackable_diffusion.train", "--config", "configs/quickstart.py", f"--workdir={workdir}", *args)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and message in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert not workdir.exists()


@pytest.mark.slow
def test_bad_inputs_to_sample_and_evaluate_are_one_error_line(tmp_path):
    (tmp_path / "run").mkdir()
    cases = [
        (["hackable_diffusion.sample", f"--workdir={tmp_path / 'run'}"], "config.json not found"),
        (["hackable_diffusion.sample", "--workdir=x", "--max_new_tokens=-5"], "--max_new_tokens=-5 must be >= 0"),
        (["hackable_diffusion.evaluate", "--workdir=x", "--limit=-1"], "--limit=-1 must be >= 0"),
        (["hackable_diffusion.evaluate", "--workdir=x", "--no_such_flag=1"], "no_such_flag"),
        (["hackable_diffusion.sample", "--workdir=x", "--config.sampler.num_step=3"], "sampler.num_steps"),
    ]
    for args, message in cases:
        out = _command(*args)
        assert out.returncode == 2, (args, out.stderr[-2000:])
        assert out.stderr.startswith("error: ") and message in out.stderr, (args, out.stderr[-2000:])


def test_json_output_is_strict_json():
    assert (
        cli.json_line({"se": float("nan"), "x": [1.0, float("inf")], "n": 2})
        == '{"se": null, "x": [1.0, null], "n": 2}'
    )


def test_a_saved_init_use_ema_reads_as_the_weights_choice(tmp_path):
    """Fine-tuning runs saved `init.use_ema` (a bool); the EMA choice is now `init.weights` ("ema" | "raw")."""
    config = sft.sft_config().to_dict()
    del config["init"]["weights"]
    config["init"]["use_ema"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = run_config.load_saved_config(str(tmp_path))
    assert loaded.init.weights == "raw" and "use_ema" not in loaded.init
    assert loaded.init.checkpoint == config["init"]["checkpoint"]
