"""Speed of the compiled Sudoku solver against the pure-Python reference, side by side on the same puzzles: JSON lines.

For every measurement both solvers run in this one process on the same puzzles, one after the other, and the line
holds puzzles per CPU-second (`time.process_time`, this process only) of each, their ratio, and whether every number
agreed (guesses, backtracks and solutions of each puzzle; the same hard puzzles from the generator). The compiled
solver's calls on a set are repeated until they add up to 0.5 CPU-s and averaged (the reference runs once):

- ``count_guesses``: `exact_solver.count_guesses` against `fast_solver.count_guesses`, under the plain and fewest
  rules, to the first solution (``max_solutions=1``) and over the whole tree (2), on a seeded subset of the shipped
  Kaggle file and on a set of generated puzzles that need >= 30 fewest-rule guesses (17-23 givens, the hard band);
- ``is_unique``: `exact_solver.solve(max_solutions=2)` against `fast_solver.solve` on the same sets;
- ``generate_hard``: `hard_puzzles.generate_hard_puzzle` with ``solver="reference"`` against ``solver="fast"`` on
  the hard band's spec (puzzle i of seed s from the same seeds as `generate_hard_dataset`).

The first line describes the machine and the run (the compiled kernels are loaded or compiled before any timing;
that time is reported as ``fast_first_call_s``). The hard set comes from `generate_hard_dataset` (cached).

  .venv/bin/python experiments/sudoku/sudoku_solver_bench.py --out results/sudoku/solver_speed.jsonl
"""

import argparse
import json
import os
import pathlib
import platform
import sys
import time

import numba
import numpy as np

from hackable_diffusion.tasks.sudoku import csv_io, exact_solver, fast_solver, hard_puzzles

KAGGLE = pathlib.Path(__file__).resolve().parents[2] / "hackable_diffusion/data/files/kaggle3m_curated_5000.csv"


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _timed(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def _timed_repeated(fn, min_seconds: float = 0.5):
    """``fn()`` run until ``min_seconds`` of CPU time have passed; its output and the CPU seconds of one run."""
    out, seconds = _timed(fn)
    runs, total = 1, seconds
    while total < min_seconds:
        _, seconds = _timed(fn)
        runs, total = runs + 1, total + seconds
    return out, total / runs


def _line(record: dict, out) -> None:
    text = json.dumps(record)
    print(text, flush=True)
    if out is not None:
        out.write(text + "\n")
        out.flush()


def _side_by_side(what: str, set_name: str, n: int, reference: float, fast: float, identical: bool, **extra) -> dict:
    return dict(
        what=what, set=set_name, n=n, **extra,
        reference_cpu_s=round(reference, 3), fast_cpu_s=round(fast, 4),
        reference_puzzles_per_cpu_s=round(n / max(reference, 1e-9), 2),
        fast_puzzles_per_cpu_s=round(n / max(fast, 1e-9), 1),
        speedup=round(reference / max(fast, 1e-9), 1), identical=bool(identical),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kaggle", type=int, default=1000, help="puzzles of the shipped Kaggle file (seeded subset)")
    parser.add_argument("--hard", type=int, default=20, help="generated puzzles with >= 30 fewest-rule guesses")
    parser.add_argument("--generate", type=int, default=4, help="hard puzzles made by each generator side by side")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Kaggle subset and of the hard puzzles")
    parser.add_argument("--cache_dir", default="default", help="folder of the hard set's cache ('none': off)")
    parser.add_argument("--out", default=None, help="also write the JSON lines to this file")
    args = parser.parse_args()
    out = None
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        out = open(args.out, "w")

    _, first_call = _timed(lambda: [fast_solver.count_guesses(np.zeros(81, np.int8), r) for r in ("plain", "fewest")])
    _line(
        dict(
            what="machine", cpu=_cpu_model(), cores=os.cpu_count(), load_avg_1min_start=round(os.getloadavg()[0], 2),
            python=platform.python_version(), numpy=np.__version__, numba=numba.__version__,
            fast_first_call_s=round(first_call, 2), command=" ".join(["python"] + sys.argv),
        ),
        out,
    )  # fmt: skip

    kaggle = csv_io.read_sudoku_csv(KAGGLE)["puzzles"]
    pick = np.sort(np.random.default_rng(args.seed).choice(len(kaggle), min(args.kaggle, len(kaggle)), replace=False))
    spec = hard_puzzles.HardSpec(givens=(17, 23), min_guesses=30, rule="fewest", climb_steps=300)
    cache_dir = None if args.cache_dir.lower() == "none" else args.cache_dir
    hard = hard_puzzles.generate_hard_dataset(args.hard, spec, seed=args.seed, num_workers=1, cache_dir=cache_dir)
    sets = {"kaggle": kaggle[pick], "hard_fewest30": hard["puzzles"]}

    for set_name, puzzles in sets.items():
        for rule in exact_solver.GUESS_RULES:
            for max_solutions in (1, 2):
                want, slow = _timed(lambda: [exact_solver.count_guesses(p, rule, max_solutions) for p in puzzles])
                got, fast = _timed_repeated(lambda: fast_solver.count_guesses(puzzles, rule, max_solutions))
                same = [(w.guesses, w.backtracks, w.num_solutions) for w in want] == list(
                    zip(got.guesses.tolist(), got.backtracks.tolist(), got.num_solutions.tolist())
                )
                guesses = np.array([w.guesses for w in want])
                _line(
                    _side_by_side("count_guesses", set_name, len(puzzles), slow, fast, same, rule=rule,
                                  max_solutions=max_solutions, median_guesses=float(np.median(guesses)),
                                  max_guesses=int(guesses.max())),
                    out,
                )  # fmt: skip
        want, slow = _timed(lambda: [exact_solver.solve(p, 2) for p in puzzles])
        got, fast = _timed_repeated(lambda: fast_solver.solve(puzzles, 2))
        same = [w.num_solutions for w in want] == got.num_solutions.tolist() and all(
            np.array_equal(w.solutions[0], got.solutions[i, 0]) for i, w in enumerate(want) if w.num_solutions
        )
        _line(_side_by_side("is_unique", set_name, len(puzzles), slow, fast, same), out)

    seeds = [np.random.default_rng([args.seed, i, hard_puzzles.SALT]) for i in range(args.generate)]
    slow_made, slow = _timed(lambda: [hard_puzzles.generate_hard_puzzle(r, spec, "reference") for r in seeds])
    seeds = [np.random.default_rng([args.seed, i, hard_puzzles.SALT]) for i in range(args.generate)]
    fast_made, fast = _timed(lambda: [hard_puzzles.generate_hard_puzzle(r, spec, "fast") for r in seeds])
    same = all(
        np.array_equal(a.puzzle, b.puzzle) and (a.grids, a.moves) == (b.grids, b.moves)
        for a, b in zip(slow_made, fast_made)
    )
    _line(
        _side_by_side("generate_hard", "17-23 givens, >= 30 fewest, 300 climb moves", args.generate, slow, fast, same,
                      grids=sum(m.grids for m in fast_made), climb_moves=sum(m.moves for m in fast_made)),
        out,
    )  # fmt: skip
    _line(dict(what="end", load_avg_1min_end=round(os.getloadavg()[0], 2)), out)
    if out is not None:
        out.close()


if __name__ == "__main__":
    main()
