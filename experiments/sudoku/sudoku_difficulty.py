"""Guess counts of a file of Sudoku puzzles under the plain and fewest rules, with the solver's speed: one JSON line.

Reads any layout `csv_io.read_sudoku_csv` reads (a file of bare 81-character puzzles too: they are solved first, and
must be unique). Per rule: puzzles/s and guesses/s of `exact_solver.count_guesses` (to the first solution unless
--max_solutions 2), guess quantiles overall and on the puzzles with 17-23 givens, the guess bands, and the median per
value of a `level` column when the file has one. With --relabel K, also how much the count of each puzzle moves
under K random relabellings of its digits (seeded; the largest over the smallest count of the K + 1 labellings).
Example (Norvig's top95 file, one puzzle a line):

  .venv/bin/python experiments/sudoku/sudoku_difficulty.py --data top95.txt
  .venv/bin/python experiments/sudoku/sudoku_difficulty.py --data top95.txt --limit 30 --relabel 5
"""

import argparse
import json
import time

import numpy as np

from hackable_diffusion.tasks.sudoku import csv_io, difficulty, exact_solver

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def _quantiles(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {}
    return {f"q{int(q * 100)}": round(float(np.quantile(values, q)), 1) for q in QUANTILES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a CSV file of puzzles (csv_io layouts)")
    parser.add_argument("--limit", type=int, default=None, help="the first N puzzles only")
    parser.add_argument("--rules", nargs="+", choices=exact_solver.GUESS_RULES, default=list(exact_solver.GUESS_RULES))
    parser.add_argument("--max_solutions", type=int, default=1, help="1: to the first solution; 2: the whole tree")
    parser.add_argument("--max_guesses", type=int, default=0, help="stop each count here (0: no cap)")
    parser.add_argument("--relabel", type=int, default=0, help="random digit relabellings per puzzle (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the relabellings")
    args = parser.parse_args()

    data = csv_io.read_sudoku_csv(args.data, limit=args.limit, solve_missing=True)
    puzzles = data["puzzles"]
    givens = np.count_nonzero(puzzles, axis=1)
    low = (givens >= 17) & (givens <= 23)
    record: dict = dict(data=args.data, n=int(len(puzzles)), puzzles_17_23_givens=int(low.sum()))
    for rule in args.rules:
        start = time.perf_counter()
        counts = [exact_solver.count_guesses(p, rule, args.max_solutions, args.max_guesses) for p in puzzles]
        seconds = time.perf_counter() - start
        guesses = np.array([c.guesses for c in counts])
        bands = difficulty.guess_band(guesses)
        entry = dict(
            seconds=round(seconds, 2),
            puzzles_per_s=round(len(puzzles) / max(seconds, 1e-9), 1),
            guesses_per_s=round(float(guesses.sum()) / max(seconds, 1e-9)),
            mean=round(float(guesses.mean()), 1),
            quantiles=_quantiles(guesses),
            quantiles_17_23_givens=_quantiles(guesses[low]),
            bands={b: int((bands == b).sum()) for b in difficulty.GUESS_BANDS},
            stopped_at_cap=int(sum(not c.complete for c in counts)),
        )
        if "level" in data:
            levels = np.asarray(data["level"])
            entry["median_by_level"] = {
                str(v): float(np.median(guesses[levels == v])) for v in sorted(set(levels.tolist()))
            }
        if args.relabel:
            rng = np.random.default_rng(args.seed)
            spread = []
            for puzzle, count in zip(puzzles, guesses):
                values = [int(count)]
                for _ in range(args.relabel):
                    labels = np.concatenate([[0], rng.permutation(9) + 1]).astype(np.int8)
                    values.append(
                        exact_solver.count_guesses(labels[puzzle], rule, args.max_solutions, args.max_guesses).guesses
                    )
                spread.append(max(values) / max(min(values), 1))
            entry["relabel_max_over_min"] = _quantiles(np.array(spread))
        record[rule] = entry
    print(json.dumps(record))


if __name__ == "__main__":
    main()
