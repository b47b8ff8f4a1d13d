"""Evaluation entry point.

  python -m hackable_diffusion.evaluate --workdir runs/NAME --task likelihood [--num_batches 0] [--num_samples 4]
  python -m hackable_diffusion.evaluate --workdir runs/sudoku --task sudoku --data FILE.csv [--limit N] \
      [--config.sampler.num_steps=20 --config.sampler.selection.rule=top_k_top_probability]
  python -m hackable_diffusion.evaluate --workdir runs/sudoku --task sudoku --givens=30,36 --num_puzzles=1000 \
      --puzzle_seed=7 [--config.solver.rules=True --config.solver.parallel_attempts=8]

`--config.<path>=value` overrides any key of the run's saved config (workdir/config.json): the sampler section, the
Sudoku solver section, or e.g. `--config.model.depth_loops=3` to run a looped model's stack another number of times per pass (same weights).

`likelihood`: validation bits per token, bits per character (Shakespeare) or perplexity per word (PTB): the exact
NLL for an autoregressive run, the ELBO bound (Monte-Carlo over noise levels, standard error printed; `--repeats R`
passes with fresh noise until the SE is small) for a diffusion run; optionally `--num_samples N` samples and, with `--scorer_workdir AR_RUN`, their generative perplexity under that
autoregressive run. Prints one JSON line.

`sudoku`: solves puzzles with the run's sampler and solver settings (givens fixed) and prints DiffusionGemma's Sudoku
metrics (`tasks/sudoku/metrics.py`: overall, by givens >= 40 / 30-39 / < 30, and by the file's `level` column when it
has one), forward passes per puzzle and puzzles per second (after one compile batch). The puzzles: `--data FILE.csv`
(`tasks/sudoku/csv_io.py` layouts), or `--num_puzzles` generated unique-solution puzzles with `--givens=LO,HI` givens
from generator seed `--puzzle_seed`, which must differ from the training seed (duplicates and puzzles the run trained
on are dropped); `--solver_class=search` keeps only those that make the exact solver guess.
"""

from __future__ import annotations

import time

import ml_collections
from absl import app, flags

from hackable_diffusion import cli

FLAGS = flags.FLAGS


def define_flags(argv: list[str]):
    cli.define_workdir_config_flag(argv)
    flags.DEFINE_string("workdir", None, "A training workdir, or hf:DIR for a Hugging Face checkpoint directory.")
    flags.DEFINE_enum("task", "likelihood", ["likelihood", "sudoku"], "What to evaluate.")
    flags.DEFINE_string("data", None, "sudoku: a CSV file of puzzles (else generated puzzles: --givens etc.).")
    flags.DEFINE_list("givens", None, "sudoku: generate puzzles with LO,HI givens (inclusive), e.g. 30,36.")
    flags.DEFINE_integer("num_puzzles", 1000, "sudoku: how many puzzles to generate (with --givens).")
    flags.DEFINE_integer("puzzle_seed", 7, "sudoku: the generator seed of the puzzles (not the run's training seed).")
    flags.DEFINE_enum(
        "solver_class",
        "all",
        ["all", "singles", "search"],
        "sudoku, generated puzzles: keep only those the exact solver finishes by singles alone, or only those that "
        "made it guess (of the --num_puzzles generated).",
    )
    flags.DEFINE_integer("limit", 0, "sudoku: first N puzzles only (0 = all).")
    flags.DEFINE_integer(
        "subset", 0, "sudoku, --data file: a seeded random subset of N rows in file order (0 = every row)."
    )
    flags.DEFINE_integer("subset_seed", 1, "sudoku: the seed of --subset.")
    flags.DEFINE_integer("num_batches", 0, "Validation batches (0 = the whole split).")
    flags.DEFINE_integer("batch_size", 0, "Evaluation batch size (0 = config.eval.batch_size).")
    flags.DEFINE_integer("repeats", 1, "Monte-Carlo passes over the split (diffusion ELBO).")
    flags.DEFINE_integer("num_samples", 0, "Also generate and print this many samples.")
    flags.DEFINE_integer("seed", 0, "Seed for the noise levels and samples.")
    flags.DEFINE_enum(
        "weights", "ema", ["ema", "raw"], "ema: the run's EMA weights when it kept them; raw: the trained weights."
    )
    flags.DEFINE_string(
        "scorer_workdir", None, "likelihood: an autoregressive run that scores the samples (generative perplexity)."
    )
    flags.DEFINE_integer("max_new_tokens", 0, "likelihood: tokens per sample (0 = config.sampler.max_new_tokens).")


def likelihood(
    workdir: str,
    *,
    num_batches: int = 0,
    batch_size: int = 0,
    repeats: int = 1,
    seed: int = 0,
    num_samples: int = 0,
    scorer_workdir: str | None = None,
    max_new_tokens: int = 0,
    config: ml_collections.ConfigDict | None = None,
    weights: str = "ema",
) -> dict:
    """Validation likelihood of the run in `workdir`; `config`: its saved config with overrides (None = as saved)."""
    import numpy as np

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion import pretrained
    from hackable_diffusion.data.tokenizers import BOS_ID
    from hackable_diffusion.tasks import text

    exp = exp_lib.build(config or cli.load_saved_config(workdir), workdir)
    if exp.task.name != "text":
        raise ValueError(f"{workdir} is a {exp.task.name!r} run; --task likelihood needs a text run.")
    weights_used = _weights_used(exp, weights)  # checks the value before loading
    params, step = pretrained.load_params(exp, workdir, use_ema=weights_used == "ema")
    start = time.perf_counter()
    runs = [
        text.evaluate_likelihood(
            exp, params, num_batches=num_batches or None, seed=seed + r, batch_size=batch_size or None
        )
        for r in range(max(repeats, 1))
    ]
    out = {
        "task": "likelihood",
        "workdir": workdir,
        "checkpoint_step": step,
        "weights": weights_used,
        "model": "autoregressive" if exp.is_autoregressive else f"diffusion/{exp.config.diffusion.process}",
        "bound": "exact NLL" if exp.is_autoregressive else "ELBO (upper bound on NLL)",
    }
    for key in runs[0]:
        values = np.asarray([r[key] for r in runs], dtype=float)
        out[key] = float(values.mean())
    if len(runs) > 1:
        per_token = np.asarray([r["bits_per_token"] for r in runs])
        out["bits_per_token_se"] = float(per_token.std(ddof=1) / np.sqrt(len(runs)))
    out["bits_per_token_se_relative"] = out["bits_per_token_se"] / out["bits_per_token"]
    out["eval_seconds"] = time.perf_counter() - start
    if num_samples:
        prompts = [exp.config.sampler.prompt] * num_samples
        start = time.perf_counter()
        texts, result = text.sample_texts(exp, params, prompts, seed=seed, max_new_tokens=max_new_tokens or None)
        seconds = time.perf_counter() - start
        out["samples"] = [p + t for p, t in zip(prompts, texts)]
        out["sample_forward_passes"] = result.forward_passes
        out["sample_tokens"] = int(np.sum(result.lengths))
        out["sample_seconds_incl_compile"] = seconds
        if result.steps is not None:
            used = np.asarray(result.steps)
            out["mean_steps_per_canvas"] = float(used[used > 0].mean()) if (used > 0).any() else 0.0
        if not exp.is_autoregressive:
            out["sampler"] = sampler_report(exp.config)
        if scorer_workdir:
            scorer = exp_lib.from_workdir(scorer_workdir)
            scorer_params, _ = pretrained.load_params(scorer, scorer_workdir)
            # Re-encode the text with the scorer's tokenizer: the two runs need not share token ids.
            prompt_ids = [[BOS_ID] + scorer.tokenizer.encode(p) for p in prompts]
            cont_ids = [scorer.tokenizer.encode(t) for t in texts]
            out["scorer_workdir"] = scorer_workdir
            out.update(text.generative_perplexity(scorer, scorer_params, prompt_ids, cont_ids))
    return out


SAMPLER_REPORT_KEYS = (  # the diffusion sampler settings printed with every result
    "num_steps",
    "min_temperature",
    "max_temperature",
    "score_temperature",
    "sc_temperature",
    "early_stopping",
    "draw",
)


def sampler_report(config: ml_collections.ConfigDict) -> dict:
    """The sampler settings of a result: the selection rule with the arguments that are set, and the main knobs."""
    selection = {k: v for k, v in config.sampler.selection.items() if v is not None}
    return {"selection": selection, **{k: config.sampler[k] for k in SAMPLER_REPORT_KEYS}}


def _weights_used(exp, weights: str) -> str:
    if weights not in ("ema", "raw"):
        raise ValueError(f"weights={weights!r} must be 'ema' or 'raw'.")
    return "ema" if weights == "ema" and exp.config.train.ema_decay > 0 else "raw"


def sudoku(
    workdir: str,
    puzzle_set,
    *,
    limit: int = 0,
    batch_size: int = 0,
    seed: int = 0,
    config: ml_collections.ConfigDict | None = None,
    weights: str = "ema",
) -> dict:
    """Solves the puzzles of `puzzle_set` (`tasks.sudoku.data.PuzzleFile` or `GeneratedPuzzles`) with the Sudoku run
    in `workdir`; `config`: its saved config with overrides (None = as saved), e.g. the sampler and solver sections,
    or `model.depth_loops` to apply a looped stack another number of times."""
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion import pretrained
    from hackable_diffusion.tasks.sudoku.data import load_held_out
    from hackable_diffusion.tasks.sudoku.task import evaluate_puzzles

    saved = cli.load_saved_config(workdir)
    exp = exp_lib.build(config or saved, workdir)
    if exp.task.name != "sudoku":
        raise ValueError(f"{workdir} is a {exp.task.name!r} run; --task sudoku needs a Sudoku run.")
    exp.task.check_config(exp.config)  # the solver settings, before loading anything
    trained_loops = int(saved.model.get("depth_loops", 1))
    weights_used = _weights_used(exp, weights)  # checks the value before loading
    params, step = pretrained.load_params(exp, workdir, use_ema=weights_used == "ema")
    puzzles, dropped = load_held_out(puzzle_set, exp.config, limit=limit)
    scores = evaluate_puzzles(
        exp,
        params,
        puzzles["puzzles"],
        puzzles["solutions"],
        levels=puzzles.get("level"),
        seed=seed,
        batch_size=batch_size or 256,
    )
    head = {
        "task": "sudoku",
        "workdir": workdir,
        "data": puzzle_set.label,
        "checkpoint_step": step,
        "weights": weights_used,
        "dropped_as_in_training": dropped,
        "depth_loops": exp.model.cfg.depth_loops,
        "trained_depth_loops": trained_loops,
        "sampler": sampler_report(exp.config),
        "solver": exp.config.solver.to_dict(),
    }
    return {**head, **scores}


def puzzle_set_from_flags(
    data: str | None,
    givens: list[str] | None,
    num_puzzles: int,
    puzzle_seed: int,
    solver_class: str = "all",
    subset: int = 0,
    subset_seed: int = 1,
):
    """`--data FILE` or `--givens=LO,HI --num_puzzles=N --puzzle_seed=S [--solver_class=search]` as a puzzle set."""
    from hackable_diffusion.tasks.sudoku.data import GeneratedPuzzles, PuzzleFile

    if data and givens:
        raise app.UsageError("pass either --data FILE.csv or --givens=LO,HI (generated puzzles), not both.")
    if data:
        if solver_class != "all":
            raise app.UsageError("--solver_class filters generated puzzles (--givens); a --data file is used whole.")
        if subset < 0:
            raise app.UsageError(f"--subset={subset} must be >= 0 (0: every row of the file).")
        return PuzzleFile(data, subset, subset_seed)
    if subset:
        raise app.UsageError("--subset picks rows of a --data file; for generated puzzles set --num_puzzles.")
    if not givens:
        raise app.UsageError(
            "--task sudoku needs --data FILE.csv or --givens=LO,HI (with --num_puzzles, --puzzle_seed)."
        )
    try:
        lo, hi = (int(v) for v in givens)
    except ValueError:
        raise app.UsageError(f"--givens={','.join(givens)} must be two integers LO,HI, e.g. --givens=30,36.") from None
    try:
        return GeneratedPuzzles((lo, hi), num_puzzles, puzzle_seed, None if solver_class == "all" else solver_class)
    except ValueError as err:
        raise app.UsageError(f"--givens / --num_puzzles: {err}") from None


FLAG_ZERO = {  # what 0 means for each count flag
    "limit": "every puzzle",
    "num_batches": "the whole split",
    "batch_size": "config.eval.batch_size",
    "num_samples": "no samples",
    "max_new_tokens": "config.sampler.max_new_tokens",
}


def main(argv):
    del argv
    if FLAGS.workdir is None:
        raise app.UsageError("--workdir is required.")
    cli.quiet_library_logs()
    for name in ("limit", "num_batches", "batch_size", "num_samples", "max_new_tokens"):
        if getattr(FLAGS, name) < 0:
            raise app.UsageError(f"--{name}={getattr(FLAGS, name)} must be >= 0 (0: {FLAG_ZERO[name]}).")
    if FLAGS.repeats < 1:
        raise app.UsageError(f"--repeats={FLAGS.repeats} must be >= 1.")
    puzzle_set = (
        puzzle_set_from_flags(
            FLAGS.data,
            FLAGS.givens,
            FLAGS.num_puzzles,
            FLAGS.puzzle_seed,
            FLAGS.solver_class,
            FLAGS.subset,
            FLAGS.subset_seed,
        )
        if (FLAGS.task == "sudoku")
        else None
    )
    workdir = cli.resolve_workdir(FLAGS.workdir)  # hf:DIR -> the run directory that stands for the checkpoint
    cli.load_saved_config(workdir)  # a clear error when the workdir holds no run
    if FLAGS.task == "sudoku":
        result = sudoku(
            workdir,
            puzzle_set,
            limit=FLAGS.limit,
            batch_size=FLAGS.batch_size,
            seed=FLAGS.seed,
            config=FLAGS.config,
            weights=FLAGS.weights,
        )
    else:
        result = likelihood(
            workdir,
            num_batches=FLAGS.num_batches,
            batch_size=FLAGS.batch_size,
            repeats=FLAGS.repeats,
            seed=FLAGS.seed,
            num_samples=FLAGS.num_samples,
            scorer_workdir=FLAGS.scorer_workdir,
            max_new_tokens=FLAGS.max_new_tokens,
            config=FLAGS.config,
            weights=FLAGS.weights,
        )
    print(cli.json_line(result))


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
