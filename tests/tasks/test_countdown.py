"""The Countdown task (`tasks/countdown/`): the exact verifier and its reward, the solver, the seeded generator, the
vocabulary and row layouts, the reinforcement-learning hooks, and a tiny training and evaluation of each layout."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _commands import run_module
from _tiny_countdown import tiny_countdown_config
from absl import flags

from hackable_diffusion import cli, experiment, run_config
from hackable_diffusion.checkpoints import toolbox
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, PAD_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.tasks import get_task
from hackable_diffusion.tasks.countdown import data as data_lib
from hackable_diffusion.tasks.countdown import evaluation, exact_solver, expressions, problems, rewards
from hackable_diffusion.tasks.countdown.inference import solve_problems
from hackable_diffusion.tasks.countdown.layouts import CountdownAutoregressiveObjective, layout_of
from hackable_diffusion.tasks.countdown.task import CountdownTask
from hackable_diffusion.tasks.countdown.vocab import VOCAB_SIZE, CountdownVocab

P, C = 20, 24


def rows_of(prompt: str, answer: str) -> tuple[np.ndarray, np.ndarray]:
    vocab = CountdownVocab()
    return vocab.encode_padded(prompt, P)[None], vocab.encode_padded(answer, C, eos=True)[None]


# --------------------------------------------------------------------------------------------------------------------
# The verifier, the reward and the solver
# --------------------------------------------------------------------------------------------------------------------

VERIFIER_CASES = [
    # (numbers, target, answer, valid)
    ((3, 7, 25, 50), 75, "(50+7*25)/3", True),
    ((3, 7, 25, 50), 75, "25*3", True),  # a number may be left unused
    ((3, 7, 25, 50), 75, " 25 * 3 ", True),  # spaces are ignored
    ((3, 7, 25, 50), 75, "3*25", True),
    ((3, 7, 25, 50), 75, "50+25", True),
    ((3, 7, 25, 50), 76, "50+25", False),  # the wrong value
    ((3, 7, 25, 50), 75, "25*3+0", False),  # 0 is not given
    ((3, 7, 25, 50), 75, "25+25+25", False),  # 25 is given once
    ((25, 25, 25), 75, "25+25+25", True),  # ... three times here
    ((3, 7, 25, 50), 75, "75", False),  # the target is not a given number
    ((3, 5, 8), 8, "8/(5-5)", False),  # 5 reused
    ((3, 5, 8, 5), 1, "3/(5-5)+1", False),  # division by zero, even with the numbers right
    ((1, 3, 4, 6), 24, "6/(1-3/4)", True),  # a fractional intermediate (1/4), exact final value
    ((1, 1, 3, 3), 4, "(1+1/3)*3", True),
    ((2, 3), 1, "2/3", False),  # a fraction that is not the target
    ((2, 4), 2, "4/2", True),
    ((3, 7), 4, "7-3", True),
    ((3, 7), -4, "3-7", True),  # a negative value is a value (targets are positive in generated sets)
    ((3, 7), 4, "-3+7", False),  # no unary minus
    ((3, 7), 10, "(3+7", False),  # unbalanced
    ((3, 7), 10, "3+7)", False),
    ((3, 7), 10, "()3+7", False),
    ((3, 7), 10, "3++7", False),
    ((3, 7), 10, "3+7=10", False),  # trailing text
    ((3, 7), 10, "03+7", False),  # a leading zero
    ((3, 7), 21, "3x7", False),
    ((3, 7), 21, "3**7", False),
    ((3, 7), 10, "", False),
    ((3, 7), 10, "((3))+(((7)))", True),
]


@pytest.mark.parametrize("numbers,target,answer,valid", VERIFIER_CASES)
def test_verifier_on_hand_written_cases(numbers, target, answer, valid):
    assert expressions.verify(numbers, target, answer) is valid
    assert expressions.reward(numbers, target, answer) == (1.0 if valid else 0.0)


def test_verifier_refuses_garbage_without_raising():
    deep = "(" * 5000 + "3" + ")" * 5000
    for answer in [deep, "(" * 17 + "3" + ")" * 17, "9" * 10_000, "3+" * 40 + "7", "\x00", "٣+7", None, 37, b"3+7"]:
        assert expressions.reward((3, 7), 10, answer) == 0.0
    assert expressions.verify((3,), 3, "(" * 16 + "3" + ")" * 16)  # the deepest nesting allowed
    assert expressions.reward((3, 7), 10, "3+7") == 1.0
    with pytest.raises(expressions.InvalidExpression, match="division by zero"):
        expressions.evaluate((3, 3, 1), "1/(3-3)")


def test_solver_finds_short_canonical_answers_and_none_when_unreachable():
    assert exact_solver.solve((3, 7, 25, 50), 75) == "3*25"  # as few numbers as possible
    full = exact_solver.solve((3, 7, 25, 50), 75, use_all_numbers=True)
    assert expressions.verify((3, 7, 25, 50), 75, full) and all(str(n) in full for n in (3, 7, 25, 50))
    assert exact_solver.solve((50, 25, 7, 3), 75, use_all_numbers=True) == full  # canonical: the order of the numbers
    assert expressions.verify((1, 3, 4, 6), 24, exact_solver.solve((1, 3, 4, 6), 24, use_all_numbers=True))
    assert exact_solver.solve((2, 2), 5) is None
    assert exact_solver.solve((1, 3, 4, 6), 24, use_all_numbers=True, allow_division=False) is None  # needs 6/(1-3/4)
    assert exact_solver.solve((2, 4), 2, allow_division=False) == "2"
    assert exact_solver.solve((4, 6), 3, allow_division=False) is None and exact_solver.solve((4, 6), 3) is None
    values = exact_solver.reachable_values((2, 3))
    assert set(values) == {5, -1, 1, 6, exact_solver.Fraction(2, 3), exact_solver.Fraction(3, 2)}


# --------------------------------------------------------------------------------------------------------------------
# The generator
# --------------------------------------------------------------------------------------------------------------------


def test_generator_is_deterministic_and_every_problem_is_solvable(tmp_path):
    made = problems.generate_problems(60, 3, cache_dir=None)
    again = problems.generate_problems(60, 3, cache_dir=None)
    np.testing.assert_array_equal(made.numbers, again.numbers)
    np.testing.assert_array_equal(made.targets, again.targets)
    np.testing.assert_array_equal(made.solutions, again.solutions)
    prefix = problems.generate_problems(7, 3, cache_dir=None)  # problem i depends on (seed, i) only
    np.testing.assert_array_equal(prefix.targets, made.targets[:7])
    other = problems.generate_problems(60, 4, cache_dir=None)
    assert made.problem_keys() != other.problem_keys()
    assert set(made.labels.tolist()) == {"3 numbers", "4 numbers"}
    for i in range(len(made)):
        numbers, target = made.numbers_of(i), int(made.targets[i])
        assert len(numbers) in (3, 4) and all(1 <= n <= 99 for n in numbers)
        assert 1 <= target <= 99 and target not in numbers
        assert target in exact_solver.reachable_values(numbers)  # reached with every number
        assert expressions.verify(numbers, target, str(made.solutions[i]))
        assert exact_solver.solve(numbers, target) == str(made.solutions[i])

    easy = problems.generate_problems(
        30, 1, num_numbers=(3,), number_range=(1, 10), target_range=(1, 20), allow_division=False, cache_dir=None
    )
    assert (easy.counts == 3).all() and (easy.targets <= 20).all() and easy.numbers.max() <= 10
    assert not any("/" in s for s in easy.solutions)
    with pytest.raises(ValueError, match="number_range"):
        problems.generate_problems(3, 0, number_range=(0, 9), cache_dir=None)

    cached = problems.generate_problems(20, 5, cache_dir=tmp_path)
    path = problems.cache_path(20, 5, problems.ProblemSpec(), tmp_path)
    assert path.exists()
    loaded = problems.generate_problems(20, 5, cache_dir=tmp_path)
    np.testing.assert_array_equal(loaded.solutions, cached.solutions)


def test_reward_equals_the_verifier_on_answers_and_corrupted_answers():
    made = problems.generate_problems(40, 11, cache_dir=None)
    rng = np.random.default_rng(0)
    prompts = data_lib.prompt_rows(made, P)
    answers = []
    for i in range(len(made)):
        numbers, answer = made.numbers_of(i), str(made.solutions[i])
        chars = list(answer)
        j = int(rng.integers(len(chars)))
        variants = [
            answer,
            answer + "+" + str(numbers[0]),  # reuses a number, or changes the value
            answer.replace(str(numbers[0]), str(numbers[0] + 1), 1),  # a number not given
            "".join(chars[:j] + chars[j + 1 :]),  # one character dropped
            answer + "*1",
            "(" + answer,  # unbalanced
            "(" + answer + ")",  # still right
            answer + "-" + answer,
        ]
        answers += variants
    vocab = CountdownVocab()
    answers = [a[: C - 1] for a in answers]  # what a completion of C tokens (with its EOS) can hold
    completions = np.stack([vocab.encode_padded(a, C, eos=True) for a in answers])
    repeated = np.repeat(prompts, 8, axis=0)
    got = rewards.row_rewards(repeated, completions)
    expected = [
        expressions.reward(made.numbers_of(i // 8), int(made.targets[i // 8]), a) for i, a in enumerate(answers)
    ]
    np.testing.assert_array_equal(got, np.asarray(expected, np.float32))
    by_variant = got.reshape(len(made), 8).mean(axis=0)
    assert by_variant[0] == by_variant[6] == 1.0  # the reference answer, and it in parentheses
    assert by_variant[[1, 2, 3, 5, 7]].max() < 0.5  # corrupted: mostly wrong ("*1" is right when 1 is given)


def test_task_reward_is_zero_and_never_raises_on_garbage():
    task = CountdownTask()
    rng = np.random.default_rng(1)
    prompt, answer = rows_of("3,7,25,50=75", "(50+7*25)/3")
    assert task.reward(prompt, answer).tolist() == [1.0]
    garbage = rng.integers(-5, VOCAB_SIZE + 5, (200, C))
    rewards = task.reward(np.repeat(prompt, 200, axis=0), garbage)
    assert rewards.shape == (200,) and rewards.dtype == np.float32 and rewards.max() == 0.0
    vocab = CountdownVocab()
    holes = np.concatenate([vocab.encode("25*3"), [MASK_ID, EOS_ID], [PAD_ID] * (C - 6)])[None]
    assert expressions.verify((3, 7, 25, 50), 75, vocab.decode(holes[0]))  # decode skips the hole ...
    bad_answers = [
        np.full((1, C), PAD_ID),  # empty
        np.full((1, C), EOS_ID),
        rows_of("3,7,25,50=75", "((50+7*25)/3")[1],  # unbalanced
        rows_of("3,7,25,50=75", "50+25=75")[1],
        holes,  # ... the reward does not: a completion with a hole is no answer
        np.concatenate([[[BOS_ID]], answer[:, :-1]], axis=1),
    ]
    for bad in bad_answers:
        assert task.reward(prompt, bad).tolist() == [0.0]
    for bad_prompt in (np.full((1, P), PAD_ID), rows_of("3,7,25,50", "0")[0], rows_of("3,,7=10", "0")[0]):
        assert task.reward(bad_prompt, answer).tolist() == [0.0]
    assert task.reward(prompt.astype(float), answer).tolist() == [1.0]
    with pytest.raises(ValueError, match="one n"):
        task.reward(np.repeat(prompt, 2, axis=0), answer)


# --------------------------------------------------------------------------------------------------------------------
# Vocabulary, rows, layouts, hooks
# --------------------------------------------------------------------------------------------------------------------


def test_vocab_round_trip():
    vocab = CountdownVocab()
    assert vocab.vocab_size == VOCAB_SIZE == 22
    text = "3,7,25,50=75(1+2)-4*5/6890"
    ids = vocab.encode(text)
    assert min(ids) == 4 and max(ids) < VOCAB_SIZE and vocab.decode(np.asarray(ids)) == text
    with_specials = [BOS_ID] + ids[:3] + [MASK_ID] + ids[3:] + [EOS_ID] + vocab.encode("99")
    assert vocab.decode(np.asarray(with_specials)) == text  # specials skipped, EOS ends the text
    assert vocab.decode(np.asarray(ids[:4] + [PAD_ID] + ids[4:])) == text[:4]
    assert vocab.strict_text(np.asarray(with_specials)) is None and vocab.strict_text(np.asarray(ids)) == text
    assert vocab.encode_padded("1+2", 5, eos=True).tolist() == vocab.encode("1+2") + [EOS_ID, PAD_ID]
    with pytest.raises(ValueError, match="not in the Countdown vocabulary"):
        vocab.encode("3 + 4")
    with pytest.raises(ValueError, match="row holds 3"):
        vocab.encode_padded("1+2", 3, eos=True)
    assert data_lib.parse_prompt("3,7,25,50=75") == ((3, 7, 25, 50), 75)
    for bad in ("3,7=", "=75", "3,,7=75", "03,7=75", "3,7=75=1", "", "3+7=10"):
        assert data_lib.parse_prompt(bad) is None


def test_rows_fixed_prompt_and_policy_rows(tmp_path):
    made = problems.generate_problems(5, 2, cache_dir=None)
    tokens, fixed = data_lib.training_rows(made, P, C)
    assert tokens.shape == fixed.shape == (5, P + C) and tokens.dtype == np.int32
    assert fixed[:, :P].all() and not fixed[:, P:].any()
    vocab = CountdownVocab()
    for i in range(5):
        assert data_lib.parse_prompt(vocab.decode(tokens[i, :P])) == (made.numbers_of(i), int(made.targets[i]))
        assert vocab.decode(tokens[i, P:]) == made.solutions[i] and EOS_ID in tokens[i, P:]

    config = tiny_countdown_config(tmp_path)
    exp = type("Exp", (), {"config": config})()
    completions = np.random.default_rng(0).integers(0, VOCAB_SIZE, (5, C)).astype(np.int32)
    rows = CountdownTask().policy_rows(exp, tokens[:, :P], completions)
    assert rows["tokens"].shape == rows["completion"].shape == (5, P + C)
    assert rows["tokens"].dtype == np.int32 and rows["completion"].dtype == bool
    np.testing.assert_array_equal(rows["tokens"][:, P:], completions)
    np.testing.assert_array_equal(rows["tokens"][:, :P], tokens[:, :P])
    assert rows["completion"][:, P:].all() and not rows["completion"][:, :P].any()
    with pytest.raises(ValueError, match="completions"):
        CountdownTask().policy_rows(exp, tokens[:, :P], completions[:, :-1])


def test_config_checks_name_the_key(tmp_path):
    task = CountdownTask()
    config = tiny_countdown_config(tmp_path)
    task.check_config(config)
    task.check_config(tiny_countdown_config(tmp_path, layout="ar"))
    assert layout_of(config) == "in_place"
    for key, value, message in [
        ("diffusion.process", "uniform", "process='masking'"),
        ("diffusion.canvas_len", 8, "canvas_len=0"),
        ("data.seq_len", 40, "seq_len"),
        ("data.completion_len", 10, "completion_len"),
        ("data.number_min", 0, "number_range"),
    ]:
        bad = cli.override(config, {key: value})
        with pytest.raises(ValueError, match=message):
            task.check_config(bad)


def test_ar_objective_scores_the_answer_only():
    model = T.Transformer(TransformerConfig.from_dict(presets.tiny(vocab_size=VOCAB_SIZE, moe=False)))
    params = T.init_params(model, jax.random.key(0))
    made = problems.generate_problems(4, 2, cache_dir=None)
    tokens, fixed = data_lib.training_rows(made, P, C)
    objective = jax.jit(CountdownAutoregressiveObjective(model))
    key = jax.random.key(0)

    def loss(rows):
        return float(objective(params, {"tokens": jnp.asarray(rows), "fixed": jnp.asarray(fixed)}, key)[0])

    base = loss(tokens)
    tail = tokens.copy()
    tail[:, -1] = CountdownVocab().encode("7")[0]  # after EOS: neither a target nor seen by an earlier target
    assert loss(tail) == pytest.approx(base, abs=1e-6)
    prompt = tokens.copy()
    prompt[:, 0] = CountdownVocab().encode("9")[0]  # the prompt is attended: the answer's loss changes
    assert abs(loss(prompt) - base) > 1e-5


def test_train_iterator_yields_rows_and_restores_its_state():
    made = problems.generate_problems(10, 2, cache_dir=None)
    tokens, fixed = data_lib.training_rows(made, P, C)
    it = data_lib.make_train_iterator(tokens, fixed, 4, seed=1)
    first = next(it)
    assert first["tokens"].shape == (4, P + C) and first["fixed"].dtype == bool and first["fixed"][:, :P].all()
    state = it.get_state()
    expected = [next(it) for _ in range(4)]  # crosses an epoch boundary (10 rows / 4)
    it.set_state(state)
    for batch in expected:
        np.testing.assert_array_equal(next(it)["tokens"], batch["tokens"])


def test_evaluation_flags_live_beside_every_other_task(tmp_path):
    flag_values = flags.FlagValues()
    flags.DEFINE_integer("batch_size", 0, "evaluate's own flag", flag_values=flag_values)
    for name in ("text", "sudoku", "countdown"):  # a dry parse of evaluate defines them all in one namespace
        get_task(name).define_evaluation_flags(flag_values)
    flag_values(["evaluate", "--num_problems=12", "--problem_seed=9", "--countdown_numbers=4"])
    flag_values["countdown_target_range"].parse("10,99")
    flag_values["countdown_division"].parse("false")
    made = evaluation.from_flags(flag_values)
    assert made == evaluation.SolveProblems(12, 9, (4,), None, (10, 99), False, 0)
    spec = made.spec(tiny_countdown_config(tmp_path))
    assert spec.num_numbers == (4,) and spec.target_range == (10, 99) and not spec.allow_division
    assert spec.number_range == (1, 99)  # the run's
    flag_values["countdown_number_range"].parse("5")
    with pytest.raises(ValueError, match="LO,HI"):
        evaluation.from_flags(flag_values)


# --------------------------------------------------------------------------------------------------------------------
# Training, answering and evaluating, each layout
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["in_place", "ar"])
def test_train_rollout_and_evaluate(layout, tmp_path, capsys):
    from hackable_diffusion import evaluate, train

    workdir = str(tmp_path / "run")
    train.run(tiny_countdown_config(tmp_path, layout), workdir)
    assert "Solved held-out Countdown problems" in capsys.readouterr().out
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in lines if line.get("split") == "eval"]
    assert evals and "countdown_accuracy" in evals[-1] and "held_out_loss" in evals[-1]
    assert evals[-1]["countdown_count"] == 8

    exp = experiment.from_workdir(workdir)
    params, step = toolbox.load_params(exp, workdir)
    assert step == 2
    task = exp.task
    prompts = task.rl_prompts(exp)
    assert prompts.shape == (64, P) and prompts.dtype == np.int32
    config = cli.override(exp.config, {"sampler.ar_temperature": 1.0, "sampler.max_temperature": 1.0})
    completions = task.rollout(exp, params, prompts[:5], seed=3, config=config)
    assert completions.shape == (5, C) and completions.dtype == np.int32
    assert not np.isin(completions, (BOS_ID, MASK_ID)).any()
    in_pairs = solve_problems(exp, params, prompts[:5], seed=3, batch_size=2, config=config)
    np.testing.assert_array_equal(in_pairs, completions)  # a row's answer does not depend on its batch
    rewards = task.reward(prompts[:5], completions)
    assert rewards.shape == (5,) and rewards.dtype == np.float32
    rows = task.policy_rows(exp, prompts[:5], completions)
    assert rows["tokens"].shape == (5, P + C)

    if layout == "in_place":  # the command as a user runs it
        out = run_module(
            "hackable_diffusion.evaluate", "--workdir", workdir, "--num_problems=6", "--batch_size=4", timeout=240
        )
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        saved = run_config.load_saved_config(workdir)
        result = evaluate.run(
            workdir, evaluation.SolveProblems(num_problems=6, batch_size=4), config=saved, saved=saved
        )
    for key in ("accuracy", "count", "problems_per_second", "forward_passes_per_problem", "examples"):
        assert key in result
    assert result["count"] + result["dropped_as_in_training"] == 6
    assert sum(v for k, v in result.items() if k.startswith("count_")) == result["count"]
    assert result["layout"] == layout and result["task"] == "countdown"
    json.dumps(result)
    with pytest.raises(ValueError, match="training generator seed"):
        evaluate.run(workdir, evaluation.SolveProblems(num_problems=6, seed=0))


def test_the_config_files_build_a_small_model_of_each_layout():
    from hackable_diffusion.models.param_count import count_params

    in_place, ar = cli.load_config_file("configs/countdown.py"), cli.load_config_file("configs/countdown_ar.py")
    for config in (in_place, ar):
        experiment.check_config(config)  # every check that needs no data
        assert config.data.task == "countdown" and config.data.seq_len == P + C
    cfg = TransformerConfig.from_dict(dict(in_place.model.to_dict(), vocab_size=VOCAB_SIZE))
    assert 3e6 < count_params(cfg)["total_params"] < 6e6
    assert (layout_of(in_place), layout_of(ar)) == ("in_place", "ar")
    changed = run_config.config_changes(in_place.to_dict(), ar.to_dict())
    assert set(changed) == {"diffusion.process", "diffusion.objective"}  # the same backbone, data and schedule


@pytest.mark.slow
def test_the_commands_parse_countdown_command_lines(tmp_path):
    check = {"HD_CHECK_FLAGS": "1", "JAX_PLATFORMS": "cpu", "HACKABLE_DIFFUSION_CACHE": str(tmp_path)}
    train = run_module(
        "hackable_diffusion.train",
        "--config",
        "configs/countdown.py",
        "--workdir",
        tmp_path / "run",
        "--config.train.num_steps=2",
        "--config.data.num_numbers=4",
        env=check,
        timeout=120,
    )
    assert train.returncode == 0 and "flags ok" in train.stdout, train.stderr[-3000:]
    # No run yet: evaluate defines the flags of every task at once; Countdown's clash with none.
    evaluate = run_module(
        "hackable_diffusion.evaluate", "--workdir", tmp_path / "none", "--num_problems=5", env=check, timeout=120
    )
    assert evaluate.returncode == 0 and "flags ok" in evaluate.stdout, evaluate.stderr[-3000:]
    assert not (tmp_path / "run").exists()  # a checked command line writes nothing
