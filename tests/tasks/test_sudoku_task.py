"""The Sudoku task end to end (`tasks/sudoku/task.py`, `data.py`, `vocab.py`): givens fixed in the objective, the grain
iterator, training, solving, the evaluate command's metrics and puzzle sets, the sampler-table script."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion import cli, experiment, run_config
from hackable_diffusion.checkpoints import toolbox
from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.diffusion import elbos
from hackable_diffusion.diffusion.objectives import DiffusionPretrainObjective
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule, UniformTimeSampler
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.tasks.sudoku import data as sudoku_data
from hackable_diffusion.tasks.sudoku import generator
from hackable_diffusion.tasks.sudoku import grids as grid_lib
from hackable_diffusion.tasks.sudoku.data import GeneratedPuzzles, PuzzleFile
from hackable_diffusion.tasks.sudoku.inference import solve_puzzles
from hackable_diffusion.tasks.sudoku.recipes import sudoku_config
from hackable_diffusion.tasks.sudoku.vocab import SudokuVocab


def tiny_sudoku_config(tmp_path, steps=4):
    c = sudoku_config(model=presets.tiny(vocab_size=13, moe=False), steps=steps, batch_size=8, num_train=64)
    c.data.num_eval = 16
    c.data.givens_min, c.data.givens_max = 30, 40
    c.data.cache_dir = str(tmp_path / "cache")
    c.optimizer.warmup_steps = 2
    c.train.log_every = 2
    c.train.eval_every = steps
    c.train.checkpoint_every = steps
    c.train.peak_flops = 1e12
    c.eval.num_batches = 1
    c.eval.batch_size = 8
    c.eval.num_puzzles = 8
    c.sampler.num_steps = 6
    return c


def test_vocab_round_trip_and_layout():
    vocab = SudokuVocab()
    puzzle = generator.generate_dataset(1, (30, 30), seed=5, cache_dir=None)["puzzles"][0]
    tokens = vocab.encode(puzzle)
    assert vocab.vocab_size == 13
    assert set(np.unique(tokens)) <= {MASK_ID} | set(range(4, 13))
    np.testing.assert_array_equal(tokens == MASK_ID, puzzle == 0)
    np.testing.assert_array_equal(vocab.decode(tokens), puzzle)
    with pytest.raises(ValueError, match="81"):
        vocab.encode(np.zeros(80, int))


def _objective_and_batch(fixed_fraction=0.4):
    cfg = TransformerConfig.from_dict(presets.tiny(vocab_size=13, moe=False))
    model = T.Transformer(cfg)
    params = T.init_params(model, jax.random.key(0))
    process = MaskingProcess(vocab_size=13, schedule=LinearSchedule(), mask_id=MASK_ID)
    objective = DiffusionPretrainObjective(model, process, time_sampler=UniformTimeSampler(0.3, 0.95))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(4, 13, (4, 81)), jnp.int32)
    fixed = jnp.asarray(rng.random((4, 81)) < fixed_fraction)
    return model, params, process, objective, tokens, fixed


@pytest.mark.slow
def test_fixed_positions_are_never_corrupted_and_not_in_the_loss():
    model, params, process, objective, tokens, fixed = _objective_and_batch()
    rng = jax.random.key(3)
    loss, metrics = objective(params, {"tokens": tokens, "fixed": fixed}, rng)

    # Slow reference of the same draws: corrupt the blanks only, ELBO over the blanks only.
    t_key, noise_key, _ = jax.random.split(rng, 3)
    t = objective.time_sampler(t_key, tokens.shape[0])
    xt, corrupted = process.corrupt(noise_key, tokens, t, fixed=fixed)
    assert not bool(jnp.any(corrupted & fixed)) and bool(jnp.all(jnp.where(fixed, xt == tokens, True)))
    assert bool(jnp.any(xt == MASK_ID))
    logits, _ = T.forward(model, params, xt, causal=False)
    blanks = ~fixed
    elbo = elbos.masking_elbo(logits, tokens, xt, t, process.schedule, MASK_ID, blanks)
    expected = jnp.mean(elbo / jnp.sum(blanks, axis=-1))
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
    bits = jnp.sum(elbo) / jnp.sum(blanks) / np.log(2)
    np.testing.assert_allclose(float(metrics["elbo_bits_per_token"]), float(bits), rtol=1e-5)

    # Without "fixed" the same draws corrupt and score every cell: a different loss.
    loss_all, _ = objective(params, {"tokens": tokens}, rng)
    assert abs(float(loss_all) - float(loss)) > 1e-4
    # Everything given: nothing to denoise, nothing in the loss.
    loss_none, _ = objective(params, {"tokens": tokens, "fixed": jnp.ones_like(fixed)}, rng)
    assert float(loss_none) == 0.0
    with pytest.raises(ValueError, match="fixed"):
        objective(params, {"tokens": tokens, "fixed": fixed[:, :80]}, rng)


@pytest.mark.slow
def test_block_objective_also_leaves_fixed_positions_out():
    model, params, process, _, tokens, fixed = _objective_and_batch()
    blocks = DiffusionPretrainObjective(model, process, canvas_len=27)
    rng = jax.random.key(1)
    all_fixed, _ = blocks(params, {"tokens": tokens, "fixed": jnp.ones_like(fixed)}, rng)
    some_fixed, _ = blocks(params, {"tokens": tokens, "fixed": fixed}, rng)
    assert float(all_fixed) == 0.0 and float(some_fixed) > 0.0


def test_train_iterator_yields_tokens_and_fixed_and_restores_its_state():
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, 13, (20, 81)).astype(np.int32)
    fixed = rng.random((20, 81)) < 0.5
    it = sudoku_data.make_train_iterator(tokens, fixed, 4, seed=1)
    first = next(it)
    assert first["tokens"].shape == (4, 81) and first["fixed"].dtype == bool
    rows = [int(np.flatnonzero((tokens == r).all(1))[0]) for r in first["tokens"]]
    np.testing.assert_array_equal(first["fixed"], fixed[rows])  # each row keeps its own givens
    state = it.get_state()
    expected = [next(it) for _ in range(6)]  # crosses an epoch boundary (20 rows / 4)
    it.set_state(state)
    for batch in expected:
        again = next(it)
        np.testing.assert_array_equal(again["tokens"], batch["tokens"])
        np.testing.assert_array_equal(again["fixed"], batch["fixed"])


def test_sudoku_config_builds_a_few_million_parameter_bidirectional_model():
    from hackable_diffusion import cli
    from hackable_diffusion.models.param_count import count_params

    config = cli.load_config_file("configs/sudoku.py")
    cfg = TransformerConfig.from_dict(dict(config.model.to_dict(), vocab_size=13))
    assert 3e6 < count_params(cfg)["total_params"] < 8e6
    assert config.data.task == "sudoku" and config.diffusion.canvas_len == 0
    bad = config.copy_and_resolve_references()
    bad.diffusion.canvas_len = 9
    with pytest.raises(ValueError, match="canvas_len=0"):
        experiment.build(bad, "unused")


@pytest.mark.slow
def test_train_solve_and_evaluate_end_to_end(tmp_path, monkeypatch, capsys):
    from hackable_diffusion import evaluate, train
    from hackable_diffusion.tasks.sudoku.evaluation import SolvePuzzles, puzzle_set

    monkeypatch.setenv("HACKABLE_DIFFUSION_CACHE", str(tmp_path / "cache"))
    workdir = str(tmp_path / "run")
    train.run(tiny_sudoku_config(tmp_path, steps=4), workdir)
    out = capsys.readouterr().out
    assert "Solved held-out puzzles" in out
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [l for l in lines if l.get("split") == "eval"]
    assert evals and "sudoku_accuracy" in evals[-1] and "elbo_bits_per_blank" in evals[-1]

    # Solving keeps every given and fills every blank with a digit; the same seed gives the same grids.
    exp = experiment.from_workdir(workdir)
    params, step = toolbox.load_params(exp, workdir)
    assert step == 4
    puzzles = generator.generate_dataset(5, (30, 36), seed=11, cache_dir=None)["puzzles"]
    solved = solve_puzzles(exp, params, puzzles, seed=0, batch_size=5)
    assert solved.predictions.shape == (5, 81)
    assert grid_lib.respects_givens(solved.predictions, puzzles).all()
    assert ((solved.predictions >= 1) & (solved.predictions <= 9)).all()
    assert (solved.steps >= 1).all() and (solved.steps <= 6).all()
    alone = solve_puzzles(exp, params, puzzles[:2], seed=0, batch_size=2)
    np.testing.assert_array_equal(alone.predictions, solved.predictions[:2])  # batch-independent

    # The CLI function on generated held-out puzzles and on a CSV file with a level column.
    saved = run_config.load_saved_config(workdir)
    metrics = evaluate.run(
        workdir, SolvePuzzles(GeneratedPuzzles((30, 36), 5, 7)), config=cli.override(saved, {"sampler.num_steps": 3})
    )
    for key in (
        "accuracy",
        "cell_accuracy",
        "exact_mask_accuracy",
        "partial_mask_accuracy",
        "accuracy_hard",
        "accuracy_medium",
        "accuracy_easy",
        "blank_accuracy",
        "forward_passes_per_puzzle",
        "puzzles_per_second",
    ):
        assert key in metrics
    assert metrics["sudoku_count"] == 5 and metrics["exact_mask_accuracy"] == 1.0 and metrics["givens_kept"]
    assert metrics["sampler"]["num_steps"] == 3 and metrics["max_forward_passes_per_puzzle"] <= 3
    by_solver = metrics.get("sudoku_count_solver_singles", 0), metrics.get("sudoku_count_solver_search", 0)
    assert sum(by_solver) == 5  # every puzzle is in exactly one solver class
    json.dumps(metrics)

    data = generator.generate_dataset(6, (25, 42), seed=13, cache_dir=None)
    csv = tmp_path / "p.csv"
    rows = ["puzzle,solution,level"] + [
        "".join(map(str, p)) + "," + "".join(map(str, s)) + "," + ("easy" if i % 2 else "hard")
        for i, (p, s) in enumerate(zip(data["puzzles"], data["solutions"]))
    ]
    csv.write_text("\n".join(rows) + "\n")
    by_level = evaluate.run(workdir, SolvePuzzles(PuzzleFile(str(csv)), limit=5))
    assert by_level["sudoku_count"] == 5
    assert by_level["sudoku_count_level_easy"] == 2 and by_level["sudoku_count_level_hard"] == 3
    assert "accuracy_level_easy" in by_level

    assert metrics["dropped_as_in_training"] == 0 and by_level["dropped_as_in_training"] == 0
    raw = evaluate.run(
        workdir,
        SolvePuzzles(GeneratedPuzzles((30, 36), 5, 7)),
        config=cli.override(saved, {"sampler.num_steps": 3, "solver.restarts": 1}),
        weights="raw",
    )
    assert raw["weights"] == "raw" and raw["solver"]["restarts"] == 1
    assert raw["accuracy"] >= metrics["accuracy"]  # a restart only replaces a grid that breaks a rule
    with pytest.raises(ValueError, match="weights"):
        evaluate.run(workdir, SolvePuzzles(GeneratedPuzzles((30, 36), 5, 7)), weights="average")
    # The same weights with the layer stack applied twice per pass (test-time depth of a looped run): same passes.
    looped = evaluate.run(
        workdir,
        SolvePuzzles(GeneratedPuzzles((30, 36), 5, 7)),
        config=cli.override(saved, {"sampler.num_steps": 3, "model.depth_loops": 2}),
    )
    assert (looped["depth_loops"], metrics["depth_loops"]) == (2, 1)
    assert looped["config_overrides"]["model.depth_loops"] == [1, 2]  # trained with 1 loop, evaluated with 2
    assert looped["max_forward_passes_per_puzzle"] <= 3 and looped["givens_kept"]
    with pytest.raises(ValueError, match="depth_loops"):
        evaluate.run(
            workdir,
            SolvePuzzles(GeneratedPuzzles((30, 36), 5, 7)),
            config=cli.override(saved, {"model.depth_loops": 0}),
        )

    # The sampler table script: a table of two settings, then one more merged into it.
    import runpy
    import sys

    script = str(pathlib.Path(__file__).parents[2] / "experiments" / "sudoku" / "sudoku_samplers.py")
    out_dir = tmp_path / "table"
    common = ["--workdir", workdir, "--ar_workdir", "", "--kaggle", "", "--num", "4", "--out", str(out_dir)]
    monkeypatch.setattr(sys, "argv", ["sudoku_samplers.py", *common, "--settings", "4,16"])
    runpy.run_path(script, run_name="__main__")
    table = json.loads((out_dir / "samplers.json").read_text())
    assert [(r["sampler"], r["max_steps"], r["restarts"]) for r in table["rows"]] == [
        ("top-prob. margin", 12, 0),
        ("margin + 4 restarts", 12, 4),
    ]
    # An interrupted run's printed rows are taken over, not solved again (a fresh solve would time differently).
    log = tmp_path / "table.log"
    log.write_text("resumed: noise\n" + "".join(json.dumps(r) + "\n" for r in table["rows"]))
    resumed_dir = tmp_path / "resumed"
    monkeypatch.setattr(
        sys,
        "argv",
        ["sudoku_samplers.py", *common[:-1], str(resumed_dir), "--settings", "4,16", "--resume_from", str(log)],
    )
    runpy.run_path(script, run_name="__main__")
    assert json.loads((resumed_dir / "samplers.json").read_text())["rows"] == table["rows"]
    log.write_text(json.dumps({**table["rows"][0], "checkpoint_step": 99}) + "\n")
    with pytest.raises(ValueError, match="checkpoint step 99"):
        runpy.run_path(script, run_name="__main__")
    monkeypatch.setattr(sys, "argv", ["sudoku_samplers.py", *common, "--settings", "24,28", "--merge"])
    runpy.run_path(script, run_name="__main__")
    merged = json.loads((out_dir / "samplers.json").read_text())
    assert [r["max_steps"] for r in merged["rows"]] == [12, 12, 81, 12] and "rows added by" in merged["command"]
    attempts = merged["rows"][3]  # 8 parallel attempts: the slowest copy's passes, all 8 copies' network evaluations
    assert attempts["parallel_attempts"] == 8 and "parallel_attempts" not in merged["rows"][2]
    passes, evaluations = (
        attempts["a_30_36"][k] for k in ("forward_passes_per_puzzle", "network_evaluations_per_puzzle")
    )
    assert passes <= evaluations <= 8 * passes and attempts["a_30_36"]["max_forward_passes_per_puzzle"] <= 12
    adaptive = merged["rows"][2]["a_30_36"]  # rules + sure cells: passes adapt, the most any puzzle took is kept
    assert 1 <= adaptive["forward_passes_per_puzzle"] <= adaptive["max_forward_passes_per_puzzle"] <= 81
    markdown = (out_dir / "samplers.md").read_text()
    assert "margin + 4 restarts" in markdown and "Restart rows" in markdown and (out_dir / "samplers.png").is_file()
    assert 'Rows with "parallel attempts"' in markdown
    assert f", max {adaptive['max_forward_passes_per_puzzle']})" in markdown
    monkeypatch.setattr(
        sys, "argv", ["sudoku_samplers.py", *common[:-4], "--num", "5", "--out", str(out_dir), "--merge"]
    )
    with pytest.raises(ValueError, match="same sets"):
        runpy.run_path(script, run_name="__main__")

    # Puzzles of the training set are dropped from an evaluation file.
    config = exp.config
    train_set = generator.generate_dataset(
        config.data.num_train, (config.data.givens_min, config.data.givens_max), seed=0, cache_dir=config.data.cache_dir
    )
    mixed = tmp_path / "mixed.csv"
    pairs = list(zip(train_set["puzzles"][:2], train_set["solutions"][:2])) + list(
        zip(data["puzzles"][:3], data["solutions"][:3])
    )
    mixed.write_text("".join("".join(map(str, p)) + "," + "".join(map(str, s)) + "\n" for p, s in pairs))
    cleaned = evaluate.run(workdir, SolvePuzzles(PuzzleFile(str(mixed))))
    assert cleaned["dropped_as_in_training"] == 2 and cleaned["sudoku_count"] == 3

    with pytest.raises(ValueError, match="training generator seed"):
        evaluate.run(workdir, SolvePuzzles(GeneratedPuzzles((30, 36), 5, 0)))
    assert puzzle_set(None, ["30", "36"], 5, 7) == GeneratedPuzzles((30, 36), 5, 7)
    assert puzzle_set("p.csv", None, 5, 7) == PuzzleFile("p.csv")
    assert puzzle_set(None, ["30", "36"], 5, 7, "search") == GeneratedPuzzles((30, 36), 5, 7, "search")
    assert puzzle_set("p.csv", None, 5, 7, "all", 3, 2) == PuzzleFile("p.csv", 3, 2)
    for args, message in [
        (("p.csv", None, 5, 7, "search"), "--solver_class filters generated"),
        ((None, ["30", "36"], 5, 7, "all", 3), "--subset picks rows"),
        (("p.csv", None, 5, 7, "all", -1), "--subset=-1"),
        ((None, ["30"], 5, 7), "two integers"),
        (("p.csv", ["30", "36"], 5, 7), "either --data"),
        ((None, None, 5, 7), "evaluated on --data"),
        ((None, ["30", "90"], 5, 7), "givens must satisfy"),
    ]:
        with pytest.raises(ValueError, match=message):
            puzzle_set(*args)
