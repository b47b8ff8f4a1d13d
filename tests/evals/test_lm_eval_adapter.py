"""evals/lm_eval_adapter.py and evals/harness.py: lm-eval's requests answered by a toolbox run, stop strings, and a
local task end to end through lm-eval's command line, offline."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval")

from hackable_diffusion.evals import lm_eval_adapter


class Request:  # what the adapter reads of lm-eval's Instance
    def __init__(self, *args):
        self.args = args


def test_cut_at_stop_takes_the_earliest_stop_string():
    assert lm_eval_adapter.cut_at_stop("abc\ndef.ghi", ["\n", "."]) == "abc"
    assert lm_eval_adapter.cut_at_stop("abc", ["x"]) == "abc"
    assert lm_eval_adapter.cut_at_stop("abc", []) == "abc"


@pytest.mark.slow
def test_adapter_answers_every_request_type_and_honours_stop_strings(trained_text_runs):
    lm = lm_eval_adapter.HackableDiffusionLM(
        workdir=str(trained_text_runs["masking"]),
        num_draws=2,
        batch_size=4,
        greedy_check=False,  # the greedy decode of a diffusion run: tests/evals/test_scoring.py
        **{"config.sampler.num_steps": 3},
    )
    assert lm.scorer.exp.config.sampler.num_steps == 3 and lm.get_model_info()["sampler"]["num_steps"] == 3
    scores = lm.loglikelihood([Request("ROMEO:\n", "What is this?"), Request("JULIET:", " O")], disable_tqdm=True)
    assert len(scores) == 2 and all(lp < 0 and isinstance(g, bool) for lp, g in scores)
    rolling = lm.loglikelihood_rolling(
        [Request("First Citizen:\nBefore we proceed any further, hear me speak.\n")], True
    )
    assert len(rolling) == 1 and rolling[0] < 0
    free = lm.generate_until([Request("ROMEO:", {"until": [], "max_gen_toks": 16})], disable_tqdm=True)[0]
    assert 0 < len(free) <= 16
    stop = free[len(free) // 2]
    stopped = lm.generate_until([Request("ROMEO:", {"until": [stop], "max_gen_toks": 16})], disable_tqdm=True)[0]
    assert stopped == free[: free.index(stop)] and stop not in stopped
    with pytest.raises(ValueError, match="unknown model args"):
        lm_eval_adapter.HackableDiffusionLM(workdir=str(trained_text_runs["masking"]), steps=3)


@pytest.mark.slow
def test_a_local_task_runs_end_to_end_through_the_lm_eval_command_line(trained_text_runs, tmp_path):
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "hf"))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "hackable_diffusion.evals.harness",
            "--model",
            "hackable_diffusion",
            "--model_args",
            f"workdir={trained_text_runs['none']}",
            "--tasks",
            "hd_shakespeare_next_line,hd_shakespeare_perplexity,hd_shakespeare_continuation",
            "--limit",
            "2",
            "--batch_size",
            "4",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table = run.stdout
    for name in ("hd_shakespeare_next_line", "hd_shakespeare_perplexity", "hd_shakespeare_continuation"):
        assert name in table
    for metric in ("acc", "acc_norm", "word_perplexity", "bits_per_byte", "exact_match", "chrf"):
        assert f"|{metric}" in table.replace(" ", "")
