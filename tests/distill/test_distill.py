"""Few-step distillation: the methods' rows, the teacher's trajectories, the student's loss against a row-by-row
reference, a run that resumes exactly, and a student that learns its teacher's output."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _commands import one_error_line, run_module

from hackable_diffusion import builders, cli, experiment, recipes
from hackable_diffusion.distill import settings as distill_settings
from hackable_diffusion.checkpoints import toolbox
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.distill import command, methods
from hackable_diffusion.distill.student_loss import StudentLoss
from hackable_diffusion.distill.teacher import CanvasPrompts, TeacherPool, split_batch, teacher_trajectories
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling.early_stopping import NoEarlyStop
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.sampling.selection import make_selection

M = 3  # the mask id of the hand-made trajectories


def hand_trajectory():
    """N = 4 steps over one canvas of 5 (position 0 fixed to 7); each step decides one more position."""
    steps = [
        [7, M, M, M, M],
        [7, 9, M, M, M],
        [7, 9, M, 5, M],
        [7, 9, 6, 5, M],
        [7, 9, 6, 5, 8],
    ]
    trajectory = np.array(steps, np.int32)[:, None, :]  # (N + 1, b = 1, c)
    fixed = np.array([[True, False, False, False, False]])
    return trajectory, fixed


def test_trajectory_rows_target_the_tokens_the_teacher_decided_in_each_span():
    trajectory, fixed = hand_trajectory()
    rows = methods.TrajectoryDistillation(student_steps=2)(trajectory, fixed, M)
    np.testing.assert_array_equal(rows.states[0], [[7, M, M, M, M], [7, 9, M, 5, M]])
    # span 0 (teacher steps 1-2) decided positions 1 and 3; span 1 (steps 3-4) positions 2 and 4
    np.testing.assert_array_equal(rows.weights[0], [[0, 1, 0, 1, 0], [0, 0, 1, 0, 1]])
    np.testing.assert_array_equal(rows.targets[0][0][[1, 3]], [9, 5])
    np.testing.assert_array_equal(rows.targets[0][1][[2, 4]], [6, 8])
    rest = methods.TrajectoryDistillation(student_steps=2, rest_weight=0.25)(trajectory, fixed, M)
    np.testing.assert_allclose(rest.weights[0][0], [0, 1, 0.25, 1, 0.25])  # the rest: the teacher's final tokens
    np.testing.assert_array_equal(rest.targets[0][0][[2, 4]], [6, 8])


def test_consistency_rows_target_the_end_at_every_open_position():
    trajectory, fixed = hand_trajectory()
    rows = methods.ConsistencyDistillation(student_steps=4)(trajectory, fixed, M)
    assert rows.states.shape == (1, 4, 5)
    np.testing.assert_array_equal(rows.targets[0], np.broadcast_to([7, 9, 6, 5, 8], (4, 5)))
    np.testing.assert_array_equal(rows.weights[0].sum(axis=1), [4, 3, 2, 1])  # still masked at each state
    uniform = methods.ConsistencyDistillation(student_steps=2)(trajectory, fixed, None)
    np.testing.assert_array_equal(uniform.weights[0], [[0, 1, 1, 1, 1]] * 2)  # uniform: every free position


def test_fixed_order_rows_write_the_teachers_end_in_the_dilated_order():
    """Canvas of 5, position 0 fixed: the dilated order of the free positions is 4, 2, then 1, 3, so two student
    steps decide {4, 2} and then {1, 3}; the states hold the teacher's end at earlier steps' positions and noise at
    the others (masking: the mask; uniform: the given noise tokens)."""
    trajectory, fixed = hand_trajectory()
    np.testing.assert_array_equal(methods.dilated_decision_steps(~fixed, 2), [[-1, 1, 0, 1, 0]])
    rows = methods.FixedOrderDistillation(student_steps=2)(trajectory, fixed, M)
    np.testing.assert_array_equal(rows.states[0], [[7, M, M, M, M], [7, M, 6, M, 8]])
    np.testing.assert_array_equal(rows.weights[0], [[0, 0, 1, 0, 1], [0, 1, 0, 1, 0]])
    np.testing.assert_array_equal(rows.targets[0], [[7, 9, 6, 5, 8]] * 2)
    rest = methods.FixedOrderDistillation(student_steps=2, rest_weight=0.5)(trajectory, fixed, M)
    np.testing.assert_allclose(rest.weights[0], [[0, 0.5, 1, 0.5, 1], [0, 1, 0, 1, 0]])
    noise = np.full((1, 2, 5), 11, np.int32)
    uniform = methods.FixedOrderDistillation(student_steps=2)(trajectory, fixed, None, noise=noise)
    np.testing.assert_array_equal(uniform.states[0], [[7, 11, 11, 11, 11], [7, 11, 6, 11, 8]])
    with pytest.raises(ValueError, match="noise"):
        methods.FixedOrderDistillation(student_steps=2)(trajectory, fixed, None)


@pytest.mark.parametrize("steps", [2, 3, 8])
def test_the_dilated_decision_steps_are_when_the_dilated_sampler_decides(steps):
    """`dilated_decision_steps` against the sampler itself: the step at which each position of a masking canvas
    (random givens, some rows with fewer free positions than steps) first holds a token."""
    from hackable_diffusion.sampling.canvas import commit_passes

    model, params = tiny_model()
    b, c = 4, 8
    rng = np.random.default_rng(steps)
    fixed = rng.random((b, c)) < 0.4
    fixed[0] = np.arange(c) < 6  # 2 free positions
    tokens = rng.integers(4, 12, (b, c)).astype(np.int32)
    prompts = CanvasPrompts(np.zeros((b, 0), np.int32), np.zeros((b, 0), bool), tokens, fixed)
    sampler = masking_sampler(12, steps, c).replace(selection=make_selection("dilated"))
    traj = teacher_trajectories(model, params, prompts, jax.random.split(jax.random.key(3), b), sampler)
    np.testing.assert_array_equal(commit_passes(traj[1:], fixed, M), methods.dilated_decision_steps(~fixed, steps))


@dataclasses.dataclass(frozen=True)
class TaskFreeExperiment:
    """What `teacher_sampler` reads of an experiment: its process and a task without a sampler of its own."""

    process: object
    task: object = None
    config: object = None


def test_fixed_order_gives_the_student_the_dilated_rule_and_the_teacher_its_own():
    from hackable_diffusion.checkpoints import base_weights
    from hackable_diffusion.diffusion.processes import UniformProcess

    teacher = recipes.text_config("shakespeare", "uniform", seq_len=48, canvas_len=16)
    model, params = tiny_model()
    base = base_weights.Base(model=model, tokenizer=None, params=params, source="toolbox:t", source_config=teacher)
    config = distill_config("unused", method="fixed_order")
    resolved = command.resolve_config(config, base, ["--config.sampler.selection.min_count=even"])
    assert resolved.sampler.selection.rule == "dilated" and resolved.sampler.commit  # uniform: decisions stay
    assert resolved.distill.teacher_selection.rule == "entropy_bound"
    assert resolved.distill.teacher_selection.min_count == "even"
    exp = TaskFreeExperiment(UniformProcess(12, LinearSchedule()))
    method = command.check_distill_config(resolved)
    teacher_sampler = command.teacher_sampler(exp, resolved, method)
    assert type(teacher_sampler.selection).__name__ == "EntropyBound" and not teacher_sampler.commit
    assert teacher_sampler.num_steps == 4
    masking = command.resolve_config(
        config, dataclasses.replace(base, source_config=recipes.text_config("shakespeare", "masking")), []
    )
    assert masking.sampler.selection.rule == "dilated" and not masking.sampler.commit
    across = command.resolve_config(config, base, ["--config.distill.student_process=masking"])  # uniform teacher
    assert across.diffusion.process == "masking" and across.distill.teacher_process == "uniform"
    assert not across.sampler.commit  # a masking student keeps its decisions anyway
    student_exp = TaskFreeExperiment(MaskingProcess(12, LinearSchedule(), M))
    teacher_sampler = command.teacher_sampler(student_exp, across, command.check_distill_config(across))
    assert isinstance(teacher_sampler.process, UniformProcess)  # the teacher samples with its own process
    with pytest.raises(ValueError, match="fixed_order"):
        command.resolve_config(
            distill_config("unused", method="trajectory"), base, ["--config.distill.student_process=masking"]
        )


def test_a_student_temperature_is_saved_for_the_student_while_the_teacher_keeps_its_own():
    from hackable_diffusion.checkpoints import base_weights
    from hackable_diffusion.diffusion.processes import UniformProcess

    teacher = recipes.text_config("shakespeare", "uniform", seq_len=48, canvas_len=16)
    model, params = tiny_model()
    base = base_weights.Base(model=model, tokenizer=None, params=params, source="toolbox:t", source_config=teacher)
    config = distill_config("unused", method="fixed_order")
    hot_first = ["--config.distill.student_temperature=1.6/0.2^0.25", "--config.sampler.max_temperature=0.9"]
    resolved = command.resolve_config(config, base, hot_first)
    s = resolved.sampler
    assert (s.max_temperature, s.min_temperature, s.temperature_exponent) == (1.6, 0.2, 0.25)
    assert resolved.distill.teacher_temperature == "0.9/0.4^1"  # the inherited schedule with the command line's change
    teacher_sampler = command.teacher_sampler(TaskFreeExperiment(UniformProcess(12, LinearSchedule())), resolved,
                                              command.check_distill_config(resolved))  # fmt: skip
    levels = np.array([1.0, 0.5, 0.0])
    np.testing.assert_allclose(teacher_sampler.temperature(levels), [0.9, 0.65, 0.4], rtol=1e-6)
    student = builders.build_sampler(resolved, UniformProcess(12, LinearSchedule()))
    np.testing.assert_allclose(student.temperature(levels), [1.6, 0.2 + 1.4 * (1 - 0.5**0.25), 0.2], rtol=1e-6)
    plain = command.resolve_config(config, base, [])
    assert not plain.distill.get("teacher_temperature") and plain.sampler.max_temperature == 0.8
    with pytest.raises(ValueError, match="MAX/MIN"):
        command.resolve_config(config, base, ["--config.distill.student_temperature=0.2/1.6"])


@pytest.mark.parametrize("teacher,student", [(4, 3), (4, 8), (4, 0)])
def test_a_student_grid_that_does_not_divide_the_teacher_is_refused(teacher, student):
    with pytest.raises(ValueError, match="student_steps"):
        methods.student_grid(teacher, student)


def test_trajectory_method_refuses_a_uniform_run():
    with pytest.raises(ValueError, match="consistency"):
        methods.TrajectoryDistillation(2).check_process(persistent=False)


def tiny_model(vocab=12):
    cfg = TransformerConfig.from_dict(dict(presets.tiny(moe=False), vocab_size=vocab))
    model = T.Transformer(cfg)
    return model, T.init_params(model, jax.random.key(0))


def masking_sampler(vocab, steps, canvas):
    return DiffusionSampler(
        process=MaskingProcess(vocab, LinearSchedule(), M),
        selection=make_selection("top_k_margin"),
        early_stopping=NoEarlyStop(),
        num_steps=steps,
        canvas_length=canvas,
        forbidden_tokens=(0, 1, 2),
    )


def test_teacher_trajectories_only_unmask_and_keep_the_fixed_positions():
    model, params = tiny_model()
    b, c, p = 3, 8, 5
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, 12, (b, c)).astype(np.int32)
    fixed = rng.random((b, c)) < 0.3
    prompts = CanvasPrompts(rng.integers(4, 12, (b, p)).astype(np.int32), np.ones((b, p), bool), tokens, fixed)
    traj = teacher_trajectories(
        model, params, prompts, jax.random.split(jax.random.key(1), b), masking_sampler(12, 4, c)
    )
    assert traj.shape == (5, b, c)
    assert np.all((traj[0] == M) == ~fixed)  # the start: masked except the givens
    assert np.all(traj[-1] != M)  # top-k over 4 steps decides every position
    for before, after in zip(traj[:-1], traj[1:]):
        decided = before != M
        assert np.all(after[decided] == before[decided])  # a decided token never changes
    assert np.all(traj[:, fixed] == tokens[fixed])


def test_split_batch_in_place_and_in_blocks():
    tokens = np.arange(24, dtype=np.int32).reshape(2, 12)
    blocks = split_batch({"tokens": tokens}, canvas_len=4)
    assert blocks.prefix.shape == (2, 8) and blocks.canvas_tokens.shape == (2, 4)
    in_place = split_batch({"tokens": tokens, "fixed": tokens % 2 == 0}, canvas_len=0)
    assert in_place.prefix.shape == (2, 0) and in_place.fixed.sum() == 12
    with pytest.raises(ValueError, match="longer than"):
        split_batch({"tokens": tokens}, canvas_len=12)


def test_student_loss_over_a_shared_cache_equals_row_by_row():
    """The fast path (the prefix encoded once, tiled over the k states, one decoder call) against each state run
    alone with its own prefix cache."""
    model, params = tiny_model()
    b, k, c, p = 2, 3, 6, 5
    rng = np.random.default_rng(2)
    batch = {
        "prefix": jnp.asarray(rng.integers(4, 12, (b, p)), jnp.int32),
        "prefix_mask": jnp.asarray(np.arange(p)[None] < np.array([[5], [3]])),  # row 1 has a shorter prefix
        "states": jnp.asarray(np.where(rng.random((b, k, c)) < 0.5, M, rng.integers(4, 12, (b, k, c))), jnp.int32),
        "targets": jnp.asarray(rng.integers(4, 12, (b, k, c)), jnp.int32),
        "weights": jnp.asarray(rng.random((b, k, c)) < 0.6, jnp.float32),
    }
    loss, metrics = StudentLoss(model)(params, batch, jax.random.key(0))
    total, count = 0.0, 0.0
    for i in range(b):
        cache = init_cache(model.cfg, 1, p)
        _, cache = T.append(
            model, params, batch["prefix"][i : i + 1], cache, token_mask=batch["prefix_mask"][i : i + 1]
        )
        for j in range(k):
            logits, _ = T.decode_block(model, params, batch["states"][i, j][None], cache)
            lp = jax.nn.log_softmax(logits[0].astype(jnp.float32), -1)
            ce = -lp[jnp.arange(c), batch["targets"][i, j]]
            total += float(jnp.sum(ce * batch["weights"][i, j]))
            count += float(jnp.sum(batch["weights"][i, j]))
    np.testing.assert_allclose(float(metrics["distill_ce"]), total / count, rtol=2e-5)
    np.testing.assert_allclose(float(loss), total / count, rtol=2e-5)


def test_the_pool_iterator_resumes_with_the_same_batches():
    trajectory, fixed = hand_trajectory()
    n = 10
    pool = {
        "trajectory": np.repeat(trajectory.transpose(1, 0, 2), n, axis=0) + np.arange(n)[:, None, None] * 0,
        "fixed": np.repeat(fixed, n, axis=0),
        "prefix": np.arange(n * 2, dtype=np.int32).reshape(n, 2),
        "prefix_mask": np.ones((n, 2), bool),
    }
    make = lambda: TeacherPool(pool, methods.TrajectoryDistillation(2), batch_size=4, seed=3, mask_id=M)  # noqa: E731
    first = make()
    batches = [next(first) for _ in range(5)]
    epoch = np.concatenate([first.indices(0), first.indices(1), first.indices(2)])[:n]
    assert sorted(epoch.tolist()) == list(range(n))  # each trajectory once per epoch
    again = make()
    next(again), next(again)
    state = again.get_state()
    resumed = make()
    resumed.set_state(state)
    for want in batches[2:]:
        got = next(resumed)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def distill_config(source_dir, method="trajectory", steps=4):
    c = distill_settings.distill_sections(
        recipes.text_config("shakespeare", "masking"),
        checkpoint=str(source_dir),
        method=method,
        teacher_steps=4,
        student_steps=2,
        steps=steps,
        batch_size=8,  # the suite's 8 simulated devices split it
        pool_size=16,
        peak_lr=1e-3,
    )
    c.optimizer.warmup_steps = 1
    c.train.checkpoint_every, c.train.log_every = 2, 1
    return c


@pytest.mark.slow
@pytest.mark.parametrize(
    "method,process", [("trajectory", "masking"), ("reverse_kl", "masking"), ("fixed_order", "uniform")]
)
def test_a_resumed_distillation_equals_the_uninterrupted_one(trained_text_runs, tmp_path, method, process):
    """fixed_order on a uniform run: the states' noise tokens are drawn again, per batch, on resume."""
    source = trained_text_runs[process]
    whole = tmp_path / "whole"
    command.run_distill(distill_config(source, method, steps=4), str(whole))
    half = tmp_path / "half"
    command.run_distill(distill_config(source, method, steps=2), str(half))
    assert (half / "teacher_pool.npz").exists() == (method != "reverse_kl")  # on-policy: no pool
    command.run_distill(distill_config(source, method, steps=4), str(half))  # resumes at 2 (the cached pool)
    a, b = (toolbox.load_params(experiment.from_workdir(str(d)), str(d), weights="raw") for d in (whole, half))
    assert a[1] == b[1] == 4
    for x, y in zip(jax.tree.leaves(a[0]), jax.tree.leaves(b[0])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    saved = json.loads((half / "config.json").read_text())
    assert saved["sampler"]["num_steps"] == 2  # the student samples at its own budget
    assert saved["data"]["seq_len"] == 32  # the teacher run's data, not the config file's


@pytest.mark.slow
def test_the_uniform_recipe_distils_a_uniform_run_by_consistency_with_its_self_conditioner(trained_text_runs, tmp_path):
    recipe = cli.load_config_file("configs/distill_shakespeare_uniform.py").distill
    assert recipe.method == "fixed_order" and recipe.student_process == "masking" and recipe.student_temperature
    same_process = cli.load_config_file("configs/distill_shakespeare_uniform.py:uniform_student").distill
    assert same_process.method == "fixed_order" and not same_process.student_process
    c = cli.load_config_file("configs/distill_shakespeare_uniform.py:consistency")
    assert c.distill.method == "consistency" and c.distill.self_condition_prob == 0.5
    c.init = recipes.init_section("toolbox", str(trained_text_runs["uniform"]))
    c.distill.update(teacher_steps=4, student_steps=2, pool_size=16, batch_size=8)
    c.train.update(num_steps=2, checkpoint_every=2, log_every=1)
    c.optimizer.warmup_steps = 1
    student = tmp_path / "student"
    command.run_distill(c, str(student))
    saved = json.loads((student / "config.json").read_text())
    assert saved["diffusion"]["process"] == "uniform" and saved["sampler"]["num_steps"] == 2
    params, step = toolbox.load_params(experiment.from_workdir(str(student)), str(student), weights="raw")
    names = ["/".join(map(str, path)) for path, _ in jax.tree_util.tree_leaves_with_path(params)]
    assert step == 2 and any("self_conditioner" in name for name in names)  # trained with the rest
    losses = [json.loads(line) for line in (student / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(m["loss"]) for m in losses if "loss" in m)
    with pytest.raises(ValueError, match="method='consistency'"):  # the path methods refuse a uniform run
        command.run_distill(distill_config(trained_text_runs["uniform"], "trajectory", steps=2), str(tmp_path / "t"))


@pytest.mark.slow
def test_the_student_learns_the_teachers_greedy_output(tmp_path):
    """Consistency distillation of a random tiny model on a fixed pool: after training, the student's one-step
    greedy canvas agrees with the teacher's 4-step greedy canvas on far more positions than before."""
    import optax

    model, teacher = tiny_model()
    b, c, p = 16, 6, 4
    rng = np.random.default_rng(0)
    prompts = CanvasPrompts(
        rng.integers(4, 12, (b, p)).astype(np.int32), np.ones((b, p), bool), np.zeros((b, c), np.int32),
        np.zeros((b, c), bool),
    )  # fmt: skip
    sampler = masking_sampler(12, 4, c)
    from hackable_diffusion.sampling.temperature import AnnealedTemperature

    sampler = sampler.replace(temperature=AnnealedTemperature(1e-4, 1e-4), score_temperature=1.0)
    keys = jax.random.split(jax.random.key(0), b)
    traj = teacher_trajectories(model, teacher, prompts, keys, sampler)
    one_step = sampler.replace(num_steps=1)
    method = methods.ConsistencyDistillation(student_steps=1)
    rows = method(traj, prompts.fixed, M)
    batch = {k: jnp.asarray(v) for k, v in dict(states=rows.states, targets=rows.targets, weights=rows.weights).items()}
    batch.update(prefix=jnp.asarray(prompts.prefix), prefix_mask=jnp.asarray(prompts.prefix_mask))
    loss_fn = StudentLoss(model)

    def agreement(params):
        out = teacher_trajectories(model, params, prompts, keys, one_step)[-1]
        return float(np.mean(out == traj[-1]))

    before = agreement(teacher)
    opt = optax.adam(3e-3)
    params, state = teacher, opt.init(teacher)

    @jax.jit
    def step(params, state):
        grads = jax.grad(lambda q: loss_fn(q, batch, jax.random.key(0))[0])(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(60):
        params, state = step(params, state)
    after = agreement(params)
    assert after > 0.95 and after > before + 0.2, (before, after)


@pytest.mark.slow
def test_bad_distill_settings_stop_with_one_line(trained_text_runs, tmp_path):
    source = trained_text_runs["masking"]
    out = run_module(
        "hackable_diffusion.distill",
        "--config=configs/distill_shakespeare_masking.py",
        f"--init_from=toolbox:{source}",
        f"--workdir={tmp_path / 'bad'}",
        "--config.distill.student_steps=3",
    )
    assert "student_steps=3 must divide" in one_error_line(out)
    uniform = trained_text_runs["uniform"]
    out = run_module(
        "hackable_diffusion.distill",
        "--config=configs/distill_shakespeare_masking.py",
        f"--init_from=toolbox:{uniform}",
        f"--workdir={tmp_path / 'bad2'}",
    )
    assert "method='consistency'" in one_error_line(out)
    out = run_module(
        "hackable_diffusion.distill",
        "--config=configs/distill_shakespeare_masking.py:reverse_kl",
        f"--init_from=toolbox:{source}",
        f"--workdir={tmp_path / 'bad3'}",
        "--config.distill.group_size=1",
    )
    assert "group_size=1 must be >= 2" in one_error_line(out)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_keep_correct_keeps_only_the_trajectories_that_end_on_the_rows_canvas():
    from hackable_diffusion.distill.teacher import build_pool
    from hackable_diffusion.sampling.temperature import AnnealedTemperature

    model, params = tiny_model()
    b, c = 4, 6
    sampler = masking_sampler(12, 3, c).replace(temperature=AnnealedTemperature(1e-4, 1e-4), score_temperature=1.0)
    givens = np.zeros((b, c), bool)
    givens[:, 0] = True
    start = np.full((b, c), 5, np.int32)
    prompts = CanvasPrompts(np.zeros((b, 0), np.int32), np.zeros((b, 0), bool), start, givens)
    keys = jax.random.split(jax.random.key(0), b)
    ends = teacher_trajectories(model, params, prompts, keys, sampler)[-1]

    def batches(canvas):
        while True:
            yield {"tokens": canvas, "fixed": givens}

    wrong = np.where(givens, ends, (ends - 4 + 1) % 8 + 4)  # every free cell another token than the teacher's end
    mixed = np.where(np.arange(b)[:, None] % 2 == 0, ends, wrong)
    common = dict(model=model, params=params, sampler=sampler, canvas_len=0, seed=0, workdir=None, meta={})
    pool = build_pool(prompt_batches=batches(mixed), pool_size=4, keep_correct=True, **common)
    assert len(pool["trajectory"]) == 4
    np.testing.assert_array_equal(pool["trajectory"][:, -1], np.concatenate([ends[::2], ends[::2]]))
    with pytest.raises(ValueError, match="out of reach"):
        build_pool(prompt_batches=batches(wrong), pool_size=4, keep_correct=True, max_batches=3, **common)


def test_command_line_overrides_apply_after_the_teachers_sections_are_inherited():
    from hackable_diffusion.checkpoints import base_weights

    teacher = recipes.text_config("shakespeare", "masking", seq_len=48, canvas_len=16)
    teacher.sampler.min_temperature = teacher.sampler.max_temperature = 0.3
    model, params = tiny_model()
    base = base_weights.Base(model=model, tokenizer=None, params=params, source="toolbox:t", source_config=teacher)
    config = distill_config("unused")
    resolved = command.resolve_config(config, base, ["--config.sampler.max_temperature=0.9"])
    assert resolved.data.seq_len == 48 and resolved.diffusion.canvas_len == 16  # the teacher's layout
    assert resolved.sampler.min_temperature == 0.3 and resolved.sampler.max_temperature == 0.9
    assert resolved.sampler.num_steps == 2 and resolved.data.batch_size == 8  # the student's budget and batch


def test_the_distill_recipe_takes_a_selection_floor_and_the_estimator_keys_on_the_command_line():
    """The recipe keeps the sampler's typed placeholders (a resolved copy would turn them into untyped Nones)."""

    recipe = cli.load_config_file("configs/distill_shakespeare_masking.py:reverse_kl")
    config = cli.parse_config_overrides(
        recipe, ["--config.sampler.selection.min_count=even", "--config.distill.shared_noise=True"]
    )
    assert config.sampler.selection.min_count == "even" and config.distill.shared_noise is True
    method = command.check_distill_config(config)
    assert method.shared_noise and not method.exact_entropy
