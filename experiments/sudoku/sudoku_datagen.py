"""Generate a Sudoku dataset into a cache folder and print one JSON line with counts and throughput.

Uses `hackable_diffusion.tasks.sudoku.generator.generate_dataset` (randomised-DFS full grids, random cell removal, optional
uniqueness; puzzle i depends only on (seed, i)). Example:

  .venv/bin/python experiments/sudoku/sudoku_datagen.py --n 20000 --givens 24 50 --seed 0 --unique --cache_dir /tmp/sudoku
"""

import argparse
import json
import os
import resource
import time

import numpy as np

from hackable_diffusion.tasks.sudoku import generator


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10000, help="number of puzzles")
    parser.add_argument(
        "--givens",
        type=int,
        nargs=2,
        default=(24, 50),
        metavar=("LOW", "HIGH"),
        help="inclusive range of the number of givens (drawn uniformly per puzzle)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--unique",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="only blank cells while the puzzle stays uniquely solvable (--no-unique: any cells)",
    )
    parser.add_argument("--num_workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--cache_dir",
        default="default",
        help="folder for the .npz cache ('default': ~/.cache/hackable_diffusion/sudoku; 'none': off)",
    )
    parser.add_argument("--max_attempts", type=int, default=50, help="grids tried per unique puzzle")
    args = parser.parse_args()

    cache_dir = None if args.cache_dir.lower() == "none" else args.cache_dir
    path = generator.dataset_cache_path(
        args.n, tuple(args.givens), args.seed, args.unique, cache_dir, args.max_attempts
    )
    from_cache = path is not None and path.exists()
    start = time.perf_counter()
    cpu_start = _cpu_seconds()
    data = generator.generate_dataset(
        args.n,
        tuple(args.givens),
        seed=args.seed,
        unique=args.unique,
        num_workers=args.num_workers,
        cache_dir=cache_dir,
        max_attempts=args.max_attempts,
    )
    seconds = time.perf_counter() - start
    cpu_seconds = _cpu_seconds() - cpu_start  # this process plus its finished workers
    givens = data["givens"]
    record = dict(
        n=int(len(givens)),
        givens_range=list(args.givens),
        seed=args.seed,
        unique=args.unique,
        num_workers=args.num_workers,
        seconds=round(seconds, 3),
        puzzles_per_s=round(len(givens) / seconds, 1),
        cpu_seconds=round(cpu_seconds, 3),
        puzzles_per_cpu_s=round(len(givens) / max(cpu_seconds, 1e-9), 1),
        load_avg_1min=round(os.getloadavg()[0], 2),
        from_cache=from_cache,
        givens_min=int(givens.min()),
        givens_mean=round(float(givens.mean()), 2),
        givens_max=int(givens.max()),
        missed_target=int(np.sum(givens != data["target_givens"])),
        solved_by_singles=round(float(np.mean(data["guesses"] == 0)), 4),
        guesses_mean=round(float(data["guesses"].mean()), 3),
        count_easy=int(np.sum(givens >= 40)),
        count_medium=int(np.sum((givens >= 30) & (givens < 40))),
        count_hard=int(np.sum(givens < 30)),
        cache_file=str(path),
    )
    print(json.dumps(record))


if __name__ == "__main__":
    main()
