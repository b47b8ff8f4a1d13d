"""experiments/rl/rl_vs_sft.py: the statistics against hand computations, the FLOP count, the wall-budget bookkeeping,
and the study end to end on a tiny Countdown AR run (arms trained, matched on FLOPs, evaluated, resumed)."""

import json
import math
import pathlib
import types

import numpy as np
import pytest
import rl_vs_sft
from _tiny_countdown import tiny_countdown_config

# problem:   0  1  2  3  4  5  6  7
A = np.array([1, 1, 0, 0, 1, 0, 1, 1], bool)  # 5 / 8 right
B = np.array([1, 0, 0, 1, 0, 0, 1, 1], bool)  # 4 / 8 right; A alone right on 1 and 4, B alone on 3
RL_CONFIG = f"--rl_config={pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'rl_countdown.py'}:ar"


def test_binomial_se_is_sqrt_p_q_over_n():
    assert rl_vs_sft.binomial_se(A) == pytest.approx(math.sqrt(5 / 8 * 3 / 8 / 8))
    assert rl_vs_sft.binomial_se(np.ones(4, bool)) == 0.0


def test_paired_se_of_a_difference_matches_the_discordant_count_formula():
    out = rl_vs_sft.paired_difference(A, B)
    n, only_a, only_b = 8, 2, 1  # McNemar's discordant counts
    se = math.sqrt((only_a + only_b) / n**2 - (only_a - only_b) ** 2 / n**3)  # = sqrt(23 / 512)
    assert out["difference"] == pytest.approx(1 / 8)
    assert out["se_difference"] == pytest.approx(se) == pytest.approx(math.sqrt(23 / 512))
    assert out["z"] == pytest.approx((1 / 8) / se)
    unpaired = math.sqrt(5 / 8 * 3 / 8 / n + 4 / 8 * 4 / 8 / n)  # what independent samples would give: not this
    assert abs(out["se_difference"] - unpaired) > 0.03
    same = rl_vs_sft.paired_difference(A, A)
    assert same["difference"] == 0.0 and same["se_difference"] == 0.0 and math.isnan(same["z"])
    with pytest.raises(ValueError, match="same problems"):
        rl_vs_sft.paired_difference(A, B[:4])


def test_rl_flops_count_sampling_scoring_and_updates():
    counts = rl_vs_sft.FlopCounts(forward_per_token=10.0, train_per_token=30.0, seq_len=4)
    rl = {"prompts_per_rollout": 2, "group_size": 3, "inner_updates": 2, "objective": "diffu_grpo", "kl_beta": 0.0}
    row_forward = 2 * 3 * 4 * 10.0
    # 4 steps = 2 rollouts: in place, 5 passes a draw; two old-policy forwards per rollout; 4 forward+backwards
    in_place = rl_vs_sft.rl_flops(counts, rl, steps=4, draws=2, autoregressive=False, sampler_passes=5)
    assert in_place == pytest.approx((2 * 5 + 2 * 2 + 4 * 3) * row_forward)
    # wd1 needs no old log-probs; AR samples each token once; a KL term adds the reference's forward per update
    wd1_rl = {**rl, "objective": "wd1"}
    wd1 = rl_vs_sft.rl_flops(counts, wd1_rl, steps=4, draws=2, autoregressive=True, sampler_passes=5)
    assert wd1 == pytest.approx((2 + 0 + 4 * 3) * row_forward)
    kl = rl_vs_sft.rl_flops(counts, {**rl, "kl_beta": 0.1}, steps=4, draws=2, autoregressive=True, sampler_passes=5)
    assert kl == pytest.approx((2 + 2 * 2 * 2 + 4 * 3) * row_forward)


def fake_clock(monkeypatch) -> list[float]:
    """The script's clock replaced by one the test advances: budget logic checked without sleeping or noise."""
    clock = [1000.0]
    monkeypatch.setattr(rl_vs_sft, "time", types.SimpleNamespace(perf_counter=lambda: clock[0], time=lambda: clock[0]))
    return clock


def test_a_wall_budget_trains_in_calls_until_it_is_spent(tmp_path, monkeypatch):
    state = rl_vs_sft.ArmState(tmp_path / "arm")
    calls, clock = [], fake_clock(monkeypatch)

    def train_to(steps):  # 0.02 s start-up + 0.01 s a new step
        new = steps - (calls[-1] if calls else 0)
        calls.append(steps)
        clock[0] += 0.02 + 0.01 * new

    rl_vs_sft.train_for_wall(state, train_to, wall_s=0.3, first_steps=4, multiple=2)
    assert calls[0] == 4 and calls == sorted(calls) and all(c % 2 == 0 for c in calls)
    assert state.data["wall_s"] >= 0.3 or len(calls) == rl_vs_sft.MAX_WALL_CALLS
    assert state.data["steps"] == calls[-1] and state.data["calls"] == len(calls)
    assert json.loads((tmp_path / "arm" / "arm.json").read_text())["steps"] == calls[-1]


def test_a_wall_budget_leaves_the_start_up_out_of_the_rate_when_the_metrics_time_the_steps(tmp_path, monkeypatch):
    folder, calls = tmp_path / "arm", []
    folder.mkdir()
    clock = fake_clock(monkeypatch)

    def train_to(steps):  # 0.15 s start-up, then 0.01 s a step, each step logged with its time as the loop does
        first = calls[-1] if calls else 0
        calls.append(steps)
        clock[0] += 0.15
        with open(folder / "metrics.jsonl", "a") as f:
            for step in range(first + 1, steps + 1):
                clock[0] += 0.01
                f.write(json.dumps({"step": step, "split": "train", "wall_time": clock[0]}) + "\n")

    assert rl_vs_sft.steady_seconds_per_step(folder, 0) is None
    state = rl_vs_sft.ArmState(folder)
    rl_vs_sft.train_for_wall(state, train_to, wall_s=1.0, first_steps=5, workdir=folder)
    assert 0.009 <= rl_vs_sft.steady_seconds_per_step(folder, calls[0]) < 0.02  # the second call's steps alone
    assert rl_vs_sft.steady_seconds_per_step(folder, 0) > 0.011  # across calls: the start-ups in between count
    # two calls: the second sized by 0.01 s a step and one start-up; the mean over the first call (start-up
    # included, about 0.04 s a step) would have taken more, each adding a start-up
    assert len(calls) == 2 and 1.0 - 0.15 <= state.data["wall_s"] < 1.0 + 0.15


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="--objectives"):
        rl_vs_sft.run([RL_CONFIG, "--objectives=elbo", f"--workdir={tmp_path}"])
    with pytest.raises(ValueError, match="--match"):
        rl_vs_sft.run([RL_CONFIG, "--match=steps", f"--workdir={tmp_path}"])
    with pytest.raises(ValueError, match="training generator seed"):
        rl_vs_sft.run([RL_CONFIG, "--held_out_seed=0", f"--workdir={tmp_path}"])
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_study_runs_end_to_end_matches_flops_and_resumes(tmp_path, capsys):
    from hackable_diffusion import train

    source = tiny_countdown_config(tmp_path, layout="ar", steps=2)
    source.train.eval_every = 0
    train.run(source, str(tmp_path / "src"), sample_at_end=False)
    argv = [
        RL_CONFIG, f"--start={tmp_path / 'src'}", "--objectives=ar_grpo", "--rl_steps=2", "--match=flops",
        "--held_out=16", "--held_out_seed=7", "--eval_batch_size=8", f"--workdir={tmp_path / 'study'}",
        f"--out={tmp_path / 'o.jsonl'}",
        "--config.data.num_train=64", "--config.data.num_eval=16", f"--config.data.cache_dir={tmp_path / 'cache'}",
        "--config.rl.prompts_per_rollout=2", "--config.rl.group_size=4", "--config.rl.inner_updates=1",
        "--config.eval.batch_size=8", "--config.optimizer.warmup_steps=1", "--config.train.log_every=1",
    ]  # fmt: skip
    lines = rl_vs_sft.run(argv)
    written = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    arms = {r["arm"]: r for r in written if r["kind"] == "arm"}
    assert len(written) == len(lines) and {r["study"] for r in written} == {str(tmp_path / "study")}
    assert set(arms) == {"start", "rl_ar_grpo", "sft_ar_grpo"}
    for r in arms.values():
        assert {"objective", "steps", "wall_s", "flops", "accuracy", "se", "held_out"} <= set(r)
        assert r["held_out"] == arms["start"]["held_out"] > 0 and 0.0 <= r["accuracy"] <= 1.0
    rl, sft = arms["rl_ar_grpo"], arms["sft_ar_grpo"]
    assert rl["steps"] == 2 and rl["wall_s"] > 0 and sft["wall_s"] > 0
    # RL: 2 rollouts of 8 rows x 44 tokens (AR: each token once), 2 old-policy forwards, 2 forward+backwards
    from hackable_diffusion import run_config
    from hackable_diffusion.models.config import TransformerConfig
    from hackable_diffusion.models.param_count import training_flops_per_token

    cfg = TransformerConfig.from_dict(run_config.load_saved_config(str(tmp_path / "src")).model.to_dict())
    train_token = training_flops_per_token(cfg, 44)
    assert rl["flops"] == pytest.approx((2 + 2 + 2 * 3) * 8 * 44 * train_token / 3)
    sft_step = 8 * 44 * train_token
    assert sft["steps"] == round(rl["flops"] / sft_step) and abs(sft["flops"] - rl["flops"]) <= sft_step / 2
    assert sft["matched"] == "flops" and sft["binding"] in ("flops", "wall") and sft["rl_flops"] == rl["flops"]
    # the SFT arm trains on the problems RL draws its prompts from: the same data section, K x G rows a batch
    rl_data, sft_data = (run_config.load_saved_config(str(tmp_path / "study" / a)).data for a in arms if a != "start")
    assert sft_data.batch_size == 8
    assert {**sft_data.to_dict(), "batch_size": 0} == {**rl_data.to_dict(), "batch_size": 0}
    comparisons = {(r["a"], r["b"]): r for r in written if r["kind"] == "comparison"}
    assert set(comparisons) == {("rl_ar_grpo", "sft_ar_grpo"), ("rl_ar_grpo", "start"), ("sft_ar_grpo", "start")}
    for r in comparisons.values():
        assert {"difference", "se_difference", "z"} <= set(r)
        assert r["difference"] == pytest.approx(arms[r["a"]]["accuracy"] - arms[r["b"]]["accuracy"])
    assert "| rl_ar_grpo - sft_ar_grpo |" in capsys.readouterr().out

    # resumed: nothing is trained or evaluated again, and the study's lines are replaced, not appended
    state = json.loads((tmp_path / "study" / "sft_ar_grpo" / "arm.json").read_text())
    before = (tmp_path / "o.jsonl").read_text()
    rl_vs_sft.run(argv)
    assert json.loads((tmp_path / "study" / "sft_ar_grpo" / "arm.json").read_text()) == state
    assert (tmp_path / "o.jsonl").read_text() == before
    with pytest.raises(ValueError, match="needs a diffusion run"):  # refused before the start is evaluated again
        rl_vs_sft.run([*argv, "--objectives=diffu_grpo", f"--workdir={tmp_path / 'other'}"])
    with pytest.raises(ValueError, match="lora.rank=0"):
        rl_vs_sft.run([*argv, "--config.lora.rank=4", f"--workdir={tmp_path / 'other'}"])
    assert not (tmp_path / "other").exists()
    with pytest.raises(ValueError, match="another --workdir"):
        rl_vs_sft.run([a if a != "--rl_steps=2" else "--rl_steps=3" for a in argv])
