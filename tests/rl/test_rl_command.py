"""`python -m hackable_diffusion.rl` on a tiny Sudoku run: exact resume mid-rollout, the run directory, bad input."""

import json

import jax
import numpy as np
import pytest
from _commands import one_error_line, run_module
from _tiny_countdown import tiny_countdown_config
from _tiny_sudoku import train_tiny_sudoku_run

from hackable_diffusion import experiment, train
from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.checkpoints import toolbox
from hackable_diffusion.rl import command, rollouts
from hackable_diffusion.tasks.sudoku.inference import solve_puzzles

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    return train_tiny_sudoku_run(tmp_path_factory.mktemp("rl_source"), name="src")


def rl_config(source_config, source_dir, steps, objective="diffu_grpo"):
    r = rl_settings.rl_sections(source_config, checkpoint=str(source_dir), objective=objective, steps=steps)
    r.rl.prompts_per_rollout, r.rl.group_size, r.rl.inner_updates = 2, 4, 2
    r.rl.shaped_reward = True  # the tiny model never solves a puzzle: partial credit gives the groups a signal
    r.rl.kl_beta = 0.05
    r.optimizer.peak_lr = r.optimizer.end_lr = 1e-3
    r.optimizer.warmup_steps = 1
    r.train.checkpoint_every, r.train.log_every, r.train.eval_every = 1, 1, 0
    return r


def final_params(workdir):
    exp = experiment.from_workdir(str(workdir))
    params, step = toolbox.load_params(exp, str(workdir), weights="raw")
    return jax.device_get(params), step


def test_a_run_resumed_mid_rollout_equals_the_uninterrupted_one(source_run, tmp_path):
    config, source = source_run
    command.run_rl(rl_config(config, source, steps=5), str(tmp_path / "whole"))
    command.run_rl(rl_config(config, source, steps=3), str(tmp_path / "parts"))  # stops inside rollout 2 (steps 3-4)
    state = json.loads((tmp_path / "parts" / "checkpoints" / "3" / "data" / "process_0-of-1.json").read_text())
    assert state["inner"] == 1 and "cached" in state  # mid-rollout: the rollout's arrays are in the checkpoint
    command.run_rl(rl_config(config, source, steps=5), str(tmp_path / "parts"))
    whole, whole_step = final_params(tmp_path / "whole")
    parts, parts_step = final_params(tmp_path / "parts")
    assert whole_step == parts_step == 5
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(parts)):
        np.testing.assert_array_equal(a, b)
    start = toolbox.load_toolbox_params(source, weights="ema")[0]
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(whole)))
    rows = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r.get("split") == "train"]
    for key in ("reward_mean", "reward_std", "solve_rate", "kl", "entropy", "clip_fraction", "rollout_seconds"):
        assert key in train_rows[-1], key
    assert (tmp_path / "whole" / "tensorboard").is_dir()


def test_a_trajectory_scored_run_records_the_order_and_resumes_exactly(source_run, tmp_path):
    config, source = source_run

    def trajectory(steps):
        r = rl_config(config, source, steps=steps)
        r.rl.scorer, r.rl.trajectory_passes_per_forward = "trajectory", 2
        r.rl.prompt_mask_prob = 0.0  # the sampler's own probability: the prompt is never masked
        return r

    command.run_rl(trajectory(4), str(tmp_path / "whole"))
    command.run_rl(trajectory(3), str(tmp_path / "parts"))  # stops inside rollout 2 (steps 3-4)
    state = json.loads((tmp_path / "parts" / "checkpoints" / "3" / "data" / "process_0-of-1.json").read_text())
    cached = rollouts._decode(state["cached"])
    blanks = cached["completion"]
    assert np.all(cached["commit_pass"][~blanks] == -1)
    assert np.all((cached["commit_pass"][blanks] >= 0) & (cached["commit_pass"][blanks] < config.sampler.num_steps))
    command.run_rl(trajectory(4), str(tmp_path / "parts"))
    for a, b in zip(
        jax.tree.leaves(final_params(tmp_path / "whole")[0]), jax.tree.leaves(final_params(tmp_path / "parts")[0])
    ):
        np.testing.assert_array_equal(a, b)


def test_the_order_is_recorded_for_one_plain_decode_only(source_run):
    config, source = source_run
    exp = experiment.from_workdir(str(source))
    params = toolbox.load_params(exp, str(source), weights="ema")[0]
    puzzles = exp.data.eval_puzzles[:2]
    solution = solve_puzzles(exp, params, puzzles, config=exp.config, record_order=True, warm_up=False)
    assert np.all((solution.commit_pass == -1) == (puzzles != 0))
    repaired = exp.config.copy_and_resolve_references()
    repaired.solver.repair_rounds = 1
    with pytest.raises(ValueError, match="repair_rounds=0"):
        solve_puzzles(exp, params, puzzles, config=repaired, record_order=True)


def test_dynamic_sampling_draws_again_for_tied_groups(source_run, tmp_path):
    config, source = source_run
    r = rl_config(config, source, steps=3)
    r.rl.shaped_reward = False  # exact rewards: the tiny model's groups tie (all 0), so each rollout draws again
    r.rl.dynamic_sampling = 1
    command.run_rl(r, str(tmp_path / "rl"))
    state = json.loads((tmp_path / "rl" / "checkpoints" / "3" / "data" / "process_0-of-1.json").read_text())
    assert state["rollout_index"] == 2 and 2 <= state["draw_index"] <= 4
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if row.get("split") == "train"]
    assert len(train_rows) == 3
    for row in train_rows:  # a short batch is one that used the extra draw (the cap) and still holds tied groups
        assert row["draws"] == 2.0 or row["groups_used"] == 1.0, row


def test_steps_without_an_informative_group_are_reported_skipped(source_run, tmp_path):
    """Exact rewards: the tiny model solves nothing, every group ties; with rl.skip_uninformative_steps each step
    reports apply_update = 0, the step counter advances and the weights stay the starting ones bit for bit (that the
    optimizer state and EMA stay too, where AdamW alone would move the weights, is test_rl_reference.py's)."""
    config, source = source_run
    r = rl_config(config, source, steps=2)
    r.rl.shaped_reward, r.rl.skip_uninformative_steps = False, True
    command.run_rl(r, str(tmp_path / "rl"))
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if row.get("split") == "train"]
    assert len(train_rows) == 2
    assert all(row["groups_used"] == 0.0 and row["apply_update"] == 0.0 for row in train_rows), train_rows
    after, step = final_params(tmp_path / "rl")
    start = toolbox.load_toolbox_params(source, weights="ema")[0]
    assert step == 2
    for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)


def test_evaluate_reads_an_rl_run(source_run, tmp_path):
    config, source = source_run
    r = rl_config(config, source, steps=2, objective="wd1")
    command.run_rl(r, str(tmp_path / "rl"))
    out = run_module(
        "hackable_diffusion.evaluate", "--workdir", tmp_path / "rl", "--givens=30,36", "--num_puzzles=4",
        "--puzzle_seed=7",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.0 <= result["accuracy"] <= 1.0 and result["checkpoint_step"] == 2


@pytest.mark.parametrize(
    "override, message",
    [
        ("--config.rl.objective=ppo", "config.rl.objective='ppo' must be one of"),
        ("--config.rl.group_size=1", "it needs group_size >= 2"),
        ("--config.rl.objective=expert_iteration --config.rl.kl_beta=0.1", "set config.rl.kl_beta=0"),
        ("--config.rl.temperature=0", "temperature=0"),
        ("--config.rl.scorer=exact", "config.rl.scorer='exact' must be one of"),
        ("--config.rl.trajectory_passes_per_forward=0", "trajectory_passes_per_forward=0 must be an integer >= 1"),
    ],
)
def test_bad_rl_settings_stop_with_one_line(tmp_path, override, message):
    out = run_module(
        "hackable_diffusion.rl", "--config", "configs/rl_sudoku.py", "--workdir", tmp_path / "rl", *override.split()
    )
    assert message in one_error_line(out, alone=False)
    assert not (tmp_path / "rl" / "checkpoints").exists()


def test_expert_iteration_runs_on_search_rollouts_and_trains_on_the_accepted_grids(source_run, tmp_path):
    """One completion per puzzle from the paced search on 2 symmetric copies (the rules do most of the work on the
    tiny puzzles): the accepted share is the solve rate, and training on those grids moves the weights, also with
    rl.skip_uninformative_steps (groups of one always tie: the gate reads the accepted rows)."""
    config, source = source_run
    r = rl_config(config, source, steps=2, objective="expert_iteration")
    r.rl.skip_uninformative_steps = True
    r.rl.prompts_per_rollout, r.rl.group_size, r.rl.kl_beta, r.rl.shaped_reward = 8, 1, 0.0, False
    r.rl.expert_iteration.draws = 1
    r.solver.rules, r.solver.search, r.solver.search_paced = True, True, True
    r.solver.pass_budget, r.solver.parallel_attempts = 6, 2
    command.run_rl(r, str(tmp_path / "rl"))
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if row.get("split") == "train"]
    assert len(train_rows) == 2
    assert all(0.0 < row["accepted_rows"] == row["solve_rate"] for row in train_rows), train_rows
    assert all(row["groups_used"] == 0.0 for row in train_rows)  # a group of one has no relative signal
    start = toolbox.load_toolbox_params(source, weights="ema")[0]
    after, step = final_params(tmp_path / "rl")
    assert step == 2
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(after)))


def test_the_objective_must_fit_the_run(source_run, tmp_path):
    config, source = source_run
    with pytest.raises(ValueError, match="needs an autoregressive run"):
        command.run_rl(rl_config(config, source, steps=1, objective="ar_grpo"), str(tmp_path / "rl"))


def test_a_missing_starting_run_is_named(tmp_path):
    out = run_module(
        "hackable_diffusion.rl", "--config", "configs/rl_sudoku.py", "--workdir", tmp_path / "rl",
        f"--init_from=toolbox:{tmp_path / 'nothing'}",
    )  # fmt: skip
    assert "nothing" in one_error_line(out, alone=False)


def test_lora_rl_trains_the_adapters_and_loads_merged(source_run, tmp_path):
    config, source = source_run
    r = rl_config(config, source, steps=2, objective="elbo")
    r.lora.rank, r.lora.alpha = 2, 4.0
    r.rl.kl_beta = 0.1  # the reference is the base half of the state: no second copy
    state = command.run_rl(r, str(tmp_path / "rl"))
    assert set(state.params) == {"base", "lora"}
    start = toolbox.load_toolbox_params(source, weights="ema")[0]
    for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(jax.device_get(state.params["base"]))):
        np.testing.assert_array_equal(a, b)  # the base is frozen
    merged, step = final_params(tmp_path / "rl")
    assert step == 2
    assert jax.tree.structure(merged) == jax.tree.structure(start)
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(merged)))


@pytest.mark.parametrize("layout, objective", [("in_place", "diffu_grpo"), ("ar", "ar_grpo"), ("ar", "wd1")])
def test_rl_runs_on_countdown(tmp_path, layout, objective):
    source = tiny_countdown_config(tmp_path, layout=layout, steps=2)
    train.run(source, str(tmp_path / "src"), sample_at_end=False)
    r = rl_settings.rl_sections(source, checkpoint=str(tmp_path / "src"), objective=objective, steps=2)
    r.rl.prompts_per_rollout, r.rl.group_size, r.rl.inner_updates = 2, 4, 1
    r.rl.prompt_mask_prob = 0.15 if layout == "in_place" else 0.0
    r.optimizer.warmup_steps = 1
    r.train.checkpoint_every, r.train.log_every, r.train.eval_every = 2, 1, 2
    state = command.run_rl(r, str(tmp_path / "rl"))
    assert int(state.step) == 2
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert any(row.get("split") == "eval" for row in rows)
    assert all(0.0 <= row["reward_mean"] <= 1.0 for row in rows if row.get("split") == "train")
