"""Evaluation entry point.

  python -m hackable_diffusion.evaluate --workdir runs/NAME --task likelihood [--num_batches 0] [--num_samples 4]
  python -m hackable_diffusion.evaluate --workdir runs/sudoku --task sudoku --data FILE.csv [--limit N] \
      [--config.sampler.num_steps=20 --config.sampler.selection=top_k_top_probability]

`--config.<path>=value` overrides any key of the run's saved config (workdir/config.json): the sampler section, or
e.g. `--config.model.depth_loops=3` to run a looped model's stack another number of times per pass (same weights).

`likelihood`: validation bits per token, bits per character (Shakespeare) or perplexity per word (PTB): the exact
NLL for an autoregressive run, the ELBO bound (Monte-Carlo over noise levels, standard error printed; `--repeats R`
passes with fresh noise until the SE is small) for a diffusion run; optionally `--num_samples N` samples and, with `--scorer_workdir AR_RUN`, their generative perplexity under that
autoregressive run. Prints one JSON line.

`sudoku`: solves the puzzles of `--data` with the run's sampler (givens fixed) and prints DiffusionGemma's Sudoku
metrics (`evals.sudoku_metrics`: overall, by givens >= 40 / 30-39 / < 30, and by the file's `level` column when it
has one), forward passes per puzzle and puzzles per second (after one compile batch). `--data` is a CSV file
(`data.sudoku.read_sudoku_csv` layouts) or `generated:LO-HI:N:SEED`: N unique-solution puzzles with LO..HI givens
from generator seed SEED, which must differ from the training seed; duplicate puzzles are dropped.
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
    flags.DEFINE_string("data", None, "sudoku: a CSV file or generated:LO-HI:N:SEED.")
    flags.DEFINE_integer("limit", 0, "sudoku: first N puzzles only (0 = all).")
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
    from hackable_diffusion.data.tokenizers import BOS_ID

    exp = exp_lib.build(config or cli.load_saved_config(workdir), workdir)
    weights_used = _weights_used(exp, weights)  # checks the value before loading
    params, step = exp_lib.load_params(exp, workdir, use_ema=weights_used == "ema")
    start = time.perf_counter()
    runs = [
        exp_lib.evaluate_likelihood(
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
        texts, result = exp_lib.sample_texts(exp, params, prompts, seed=seed, max_new_tokens=max_new_tokens or None)
        seconds = time.perf_counter() - start
        out["samples"] = [p + t for p, t in zip(prompts, texts)]
        out["sample_forward_passes"] = result.forward_passes
        out["sample_tokens"] = int(np.sum(result.lengths))
        out["sample_seconds_incl_compile"] = seconds
        if result.steps is not None:
            used = np.asarray(result.steps)
            out["mean_steps_per_canvas"] = float(used[used > 0].mean()) if (used > 0).any() else 0.0
        if not exp.is_autoregressive:
            out["sampler"] = {k: exp.config.sampler[k] for k in SAMPLER_REPORT_KEYS}
        if scorer_workdir:
            scorer = exp_lib.from_workdir(scorer_workdir)
            scorer_params, _ = exp_lib.load_params(scorer, scorer_workdir)
            # Re-encode the text with the scorer's tokenizer: the two runs need not share token ids.
            prompt_ids = [[BOS_ID] + scorer.tokenizer.encode(p) for p in prompts]
            cont_ids = [scorer.tokenizer.encode(t) for t in texts]
            out["scorer_workdir"] = scorer_workdir
            out.update(exp_lib.generative_perplexity(scorer, scorer_params, prompt_ids, cont_ids))
    return out


def load_sudoku_puzzles(
    spec: str, *, train_seed: int | None = None, limit: int = 0, cache_dir: str = "default"
) -> dict:
    """puzzles, solutions (and level, when the CSV has it) from a CSV (a path, or a file name looked up like the
    corpora: the shipped files, then $HD_DATA_DIR) or `generated:LO-HI:N:SEED`."""
    import numpy as np

    from hackable_diffusion.data import sudoku as sudoku_lib

    if spec.startswith("generated:"):
        parts = spec.split(":")
        try:
            lo, hi = (int(v) for v in parts[1].split("-"))
            n, seed = int(parts[2]), int(parts[3])
        except (IndexError, ValueError):
            raise ValueError(
                f"--data={spec!r}: expected generated:LO-HI:N:SEED, e.g. generated:30-36:1000:7."
            ) from None
        if len(parts) != 4:
            raise ValueError(f"--data={spec!r}: expected generated:LO-HI:N:SEED, e.g. generated:30-36:1000:7.")
        if train_seed is not None and seed == train_seed:
            raise ValueError(
                f"--data={spec!r} uses the training generator seed {train_seed}; pick another seed for held-out puzzles."
            )
        data = sudoku_lib.generate_dataset(n, (lo, hi), seed=seed, unique=True, cache_dir=cache_dir)
        _, first = np.unique(data["puzzles"], axis=0, return_index=True)
        keep = np.sort(first)
        data = {"puzzles": data["puzzles"][keep], "solutions": data["solutions"][keep]}
    else:
        import pathlib

        from hackable_diffusion.data import text as text_lib

        # a path, or the name of a file that ships with the package (kaggle3m_curated_5000.csv) or is in $HD_DATA_DIR
        data = sudoku_lib.read_sudoku_csv(spec if pathlib.Path(spec).is_file() else text_lib.data_file(spec))
        data = {k: data[k] for k in ("puzzles", "solutions", "level") if k in data}
    if limit:
        data = {k: v[:limit] for k, v in data.items()}
    return data


SAMPLER_REPORT_KEYS = (  # the diffusion sampler settings printed with every result
    "selection",
    "selection_kwargs",
    "num_steps",
    "min_temperature",
    "max_temperature",
    "score_temperature",
    "sc_temperature",
    "early_stopping",
)
SUDOKU_REPORT_KEYS = (
    "repair_rounds",
    "repair_scope",
    "restarts",
    "restart_temperature",
    "restart_selection_kwargs",
    "pass_budget",
    "constraint",
    "views",
    "parallel_attempts",
)


def _weights_used(exp, weights: str) -> str:
    if weights not in ("ema", "raw"):
        raise ValueError(f"weights={weights!r} must be 'ema' or 'raw'.")
    return "ema" if weights == "ema" and exp.config.train.ema_decay > 0 else "raw"


def _training_puzzle_overlap(config, puzzles):
    """True for each puzzle that is in the run's cached training set; None when that cache is not on this machine."""
    import numpy as np

    from hackable_diffusion.data import sudoku as sudoku_lib

    dc = config.data
    path = sudoku_lib.dataset_cache_path(
        int(dc.num_train),
        (int(dc.givens_min), int(dc.givens_max)),
        int(dc.generator_seed),
        bool(dc.unique),
        dc.cache_dir or "default",
    )
    if path is None or not path.exists():
        return None
    with np.load(path) as cached:
        train = {row.tobytes() for row in cached["puzzles"].astype(np.int8)}
    return np.array([row.astype(np.int8).tobytes() in train for row in puzzles], bool)


def sudoku(
    workdir: str,
    data: str,
    *,
    limit: int = 0,
    batch_size: int = 0,
    seed: int = 0,
    config: ml_collections.ConfigDict | None = None,
    weights: str = "ema",
) -> dict:
    """Solves the puzzles of `data` with the Sudoku run in `workdir`; `config`: its saved config with overrides (None
    = as saved), e.g. the sampler section, or `model.depth_loops` to apply a looped stack another number of times."""
    from hackable_diffusion import experiment as exp_lib

    saved = cli.load_saved_config(workdir)
    exp = exp_lib.build(config or saved, workdir)
    if exp.config.data.task != "sudoku":
        raise ValueError(f"{workdir} is a {exp.config.data.task!r} run; --task sudoku needs a Sudoku run.")
    trained_loops = int(saved.model.get("depth_loops", 1))
    weights_used = _weights_used(exp, weights)  # checks the value before loading
    params, step = exp_lib.load_params(exp, workdir, use_ema=weights_used == "ema")
    puzzles = load_sudoku_puzzles(
        data,
        train_seed=int(exp.config.data.generator_seed),
        limit=limit,
        cache_dir=exp.config.data.get("cache_dir") or "default",  # the run's own cache, as training used
    )
    seen = _training_puzzle_overlap(exp.config, puzzles["puzzles"])
    if seen is not None and seen.any():  # a generated held-out puzzle that training saw is no test: drop it
        puzzles = {k: v[~seen] for k, v in puzzles.items()}
    scores = exp_lib.evaluate_sudoku(
        exp,
        params,
        puzzles["puzzles"],
        puzzles["solutions"],
        levels=puzzles.get("level"),
        seed=seed,
        batch_size=batch_size or 256,
    )
    config = exp.config
    head = {
        "task": "sudoku",
        "workdir": workdir,
        "data": data,
        "checkpoint_step": step,
        "weights": weights_used,
        "dropped_as_in_training": None if seen is None else int(seen.sum()),
        "depth_loops": exp.model.cfg.depth_loops,
        "trained_depth_loops": trained_loops,
        "sampler": {k: config.sampler.get(k) for k in SAMPLER_REPORT_KEYS + SUDOKU_REPORT_KEYS},
    }
    return {**head, **scores}


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
    if FLAGS.task == "sudoku" and not FLAGS.data:
        raise app.UsageError("--task sudoku needs --data FILE.csv or --data generated:LO-HI:N:SEED.")
    workdir = cli.resolve_workdir(FLAGS.workdir)  # hf:DIR -> the run directory that stands for the checkpoint
    cli.load_saved_config(workdir)  # a clear error when the workdir holds no run
    if FLAGS.task == "sudoku":
        result = sudoku(
            workdir,
            FLAGS.data,
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
