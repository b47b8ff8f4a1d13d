"""`python -m hackable_diffusion.evals.harness` on bad inputs: an unknown task or a missing workdir stops with one
`error:` line and exit status 2 before lm-eval loads a model or a dataset; the checks behind it
(`lm_eval_adapter.check_model_args`, `harness.check_tasks`)."""


import pytest

pytest.importorskip("lm_eval")

from _commands import REPO, one_error_line, run_module

from hackable_diffusion import cli
from hackable_diffusion.evals import harness, lm_eval_adapter

G4 = REPO / "tests" / "fixtures" / "hf_gemma4"


def run_harness(*args, tmp_path):
    offline = dict(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HACKABLE_DIFFUSION_CACHE=str(tmp_path / "cache"))
    return run_module("hackable_diffusion.evals.harness", "--model", "hackable_diffusion", *args, env=offline)


def harness_error_line(out) -> str:
    return one_error_line(out, alone=False)  # lm-eval may log before the error


def test_a_missing_workdir_is_one_error_line_before_anything_loads(tmp_path):
    missing = tmp_path / "runs" / "nonexistent"
    out = run_harness("--model_args", f"workdir={missing}", "--tasks", "hd_shakespeare_next_line", tmp_path=tmp_path)
    line = harness_error_line(out)
    assert f"workdir={missing}: no such directory" in line and "hf:DIR" in line


@pytest.mark.slow  # builds lm-eval's index of its ~15,000 tasks (about 10 s)
def test_an_unknown_task_is_one_error_line_naming_it(tmp_path):
    out = run_harness("--model_args", f"workdir=hf:{G4}", "--tasks", "hd_shakespeare_next_lines", tmp_path=tmp_path)
    line = harness_error_line(out)
    assert "--tasks hd_shakespeare_next_lines" in line and "hd_shakespeare_next_line" in line and "ls tasks" in line
    assert not (tmp_path / "cache").exists()  # refused before the model was touched


def test_model_args_are_checked_by_name(tmp_path):
    with pytest.raises(ValueError, match="needs workdir"):
        lm_eval_adapter.check_model_args({"num_draws": 4})
    with pytest.raises(ValueError, match=r"unknown model args \['steps'\]"):
        lm_eval_adapter.check_model_args({"workdir": str(tmp_path), "steps": 3})
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        lm_eval_adapter.check_model_args({"workdir": str(tmp_path)})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"{tmp_path / 'config.json'} is not valid JSON"):
        lm_eval_adapter.check_model_args({"workdir": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="not a Hugging Face checkpoint directory"):
        lm_eval_adapter.check_model_args({"workdir": f"hf:{tmp_path / 'nope'}"})
    with pytest.raises(cli.ConfigKeyError, match="sampler.num_steps"):
        lm_eval_adapter.check_model_args({"workdir": f"hf:{G4}", "config.sampler.num_step": 3})
    lm_eval_adapter.check_model_args({"workdir": f"hf:{G4}", "config.sampler.num_steps": 3, "batch_size": 4})


def test_the_toolbox_tasks_are_checked_without_lm_evals_index(tmp_path):
    harness.check_tasks(["hd_shakespeare_next_line,hd_ptb_*"], str(harness.TASKS_DIR))  # the include path alone
    with pytest.raises(FileNotFoundError, match="no such task file"):
        harness.check_tasks([str(tmp_path / "mine.yaml")], str(harness.TASKS_DIR))
