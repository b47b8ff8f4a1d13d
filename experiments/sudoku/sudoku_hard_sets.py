"""Make a hard Sudoku training set and a hard held-out set, print progress, and one JSON line of figures at the end.

Both sets come from `hackable_diffusion.tasks.sudoku.hard_puzzles.generate_hard_dataset` (seeded, unique solutions,
cached as .npz; puzzle i depends only on (seed, i), so the worker count does not change the sets) and are also written
as CSV files with the columns `puzzle,solution,givens,guesses,plain_guesses,fewest_guesses` (`evaluate --data FILE`
reads them). Guesses: `exact_solver.count_guesses` under --rule (and under each rule), to the first solution; the
searches run in the compiled `fast_solver`, which gives the same counts and puzzles as the pure-Python reference.
Defaults: 20,000 training puzzles with 22-36 givens and >= 10 guesses (seed 0), 500 held-out puzzles with 17-23
givens and >= 100 guesses (seed 1), plain rule, no hill-climb (the fastest method for these two specs; --*_climb
helps for stricter ones, see results/sudoku/README.md); held-out puzzles that the training set holds are reported
(none expected: the seeds differ).

  .venv/bin/python experiments/sudoku/sudoku_hard_sets.py --train_n 20000 --heldout_n 500 --num_workers 2 \\
      --out_dir runs/sudoku_hard_sets
"""

import argparse
import json
import os
import pathlib
import resource
import sys
import time

import numpy as np

from hackable_diffusion.tasks.sudoku import difficulty, hard_puzzles

QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def _progress(name: str, start: float):
    def report(done: int, total: int) -> None:
        seconds = time.perf_counter() - start
        rate = done / max(seconds, 1e-9)
        eta = (total - done) / max(rate, 1e-9)
        print(
            f"[{name}] {done}/{total} puzzles, {seconds:.0f} s, {rate:.2f} puzzles/s, ETA {eta:.0f} s", file=sys.stderr
        )

    return report


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _write_csv(path: pathlib.Path, data: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = ("givens", "guesses", "plain_guesses", "fewest_guesses")
    lines = ["puzzle,solution," + ",".join(columns)]
    for i, (p, s) in enumerate(zip(data["puzzles"], data["solutions"])):
        lines.append(",".join(["".join(map(str, p)), "".join(map(str, s))] + [str(data[c][i]) for c in columns]))
    path.write_text("\n".join(lines) + "\n")


def _quantiles(values: np.ndarray) -> dict[str, float]:
    return {f"q{int(q * 100)}": round(float(np.quantile(values, q)), 1) for q in QUANTILES}


def _figures(data: dict[str, np.ndarray], seconds: float, from_cache: bool) -> dict:
    givens, counts = np.unique(data["givens"], return_counts=True)
    plain_bands = difficulty.guess_band(data["plain_guesses"])
    fewest_bands = difficulty.guess_band(data["fewest_guesses"], rule="fewest")
    return dict(
        n=int(len(data["puzzles"])),
        seconds=round(seconds, 1),
        puzzles_per_s=round(len(data["puzzles"]) / max(seconds, 1e-9), 2),
        from_cache=from_cache,
        guesses=_quantiles(data["guesses"]),
        guesses_stopped_at_cap=int((~data["guesses_complete"]).sum()),
        plain_bands={b: int((plain_bands == b).sum()) for b in difficulty.GUESS_BANDS},
        fewest_bands={b: int((fewest_bands == b).sum()) for b in difficulty.FEWEST_BANDS},
        plain_guesses=_quantiles(data["plain_guesses"]),
        fewest_guesses=_quantiles(data["fewest_guesses"]),
        givens_histogram={int(g): int(c) for g, c in zip(givens, counts)},
        grids_per_puzzle=round(float(data["grids"].mean()), 2),
        climb_moves_per_puzzle=round(float(data["moves"].mean()), 2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_n", type=int, default=20000, help="training puzzles (0: none)")
    parser.add_argument("--train_givens", type=int, nargs=2, default=(22, 36), metavar=("LOW", "HIGH"))
    parser.add_argument("--train_min_guesses", type=int, default=10)
    parser.add_argument("--train_climb", type=int, default=0, help="hill-climb moves per grid (training set)")
    parser.add_argument("--train_seed", type=int, default=0)
    parser.add_argument("--heldout_n", type=int, default=500, help="held-out puzzles (0: none)")
    parser.add_argument("--heldout_givens", type=int, nargs=2, default=(17, 23), metavar=("LOW", "HIGH"))
    parser.add_argument("--heldout_min_guesses", type=int, default=100)
    parser.add_argument("--heldout_climb", type=int, default=0, help="hill-climb moves per grid (held-out set)")
    parser.add_argument("--heldout_seed", type=int, default=1)
    parser.add_argument("--rule", choices=("plain", "fewest"), default="plain", help="the guess-counting rule")
    parser.add_argument("--max_grids", type=int, default=2000, help="grids tried per puzzle before giving up")
    parser.add_argument("--num_workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out_dir", default="runs/sudoku_hard_sets", help="folder for train.csv and heldout.csv")
    parser.add_argument("--train_out", default=None, help="CSV path of the training set (default OUT_DIR/train.csv)")
    parser.add_argument(
        "--heldout_out", default=None, help="CSV path of the held-out set (default OUT_DIR/heldout.csv)"
    )
    parser.add_argument(
        "--cache_dir", default="default", help="folder for the .npz caches ('default': the generator's; 'none': off)"
    )
    args = parser.parse_args()
    if args.train_n and args.heldout_n and args.train_seed == args.heldout_seed:
        parser.error("--train_seed and --heldout_seed must differ (the held-out set would repeat training puzzles).")
    cache_dir = None if args.cache_dir.lower() == "none" else args.cache_dir
    out_dir = pathlib.Path(args.out_dir)
    sets = [
        ("train", args.train_n, args.train_givens, args.train_min_guesses, args.train_climb, args.train_seed,
         args.train_out or out_dir / "train.csv"),
        ("heldout", args.heldout_n, args.heldout_givens, args.heldout_min_guesses, args.heldout_climb,
         args.heldout_seed, args.heldout_out or out_dir / "heldout.csv"),
    ]  # fmt: skip
    record: dict = dict(rule=args.rule, num_workers=args.num_workers, command=" ".join(sys.argv))
    made = {}
    for name, n, givens, min_guesses, climb, seed, out in sets:
        if not n:
            continue
        spec = hard_puzzles.HardSpec(tuple(givens), min_guesses, args.rule, climb, args.max_grids)
        path = hard_puzzles.hard_cache_path(n, spec, seed, cache_dir)
        from_cache = path is not None and path.exists()
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        data = hard_puzzles.generate_hard_dataset(
            n, spec, seed, num_workers=args.num_workers, cache_dir=cache_dir, progress=_progress(name, start)
        )
        seconds = time.perf_counter() - start
        cpu_seconds = _cpu_seconds() - cpu_start  # this process plus its finished workers
        _write_csv(pathlib.Path(out), data)
        made[name] = data
        record[name] = dict(
            spec=dict(givens=list(spec.givens), min_guesses=min_guesses, climb_steps=climb, seed=seed),
            csv=str(out),
            cache_file=str(path),
            **_figures(data, seconds, from_cache),
            cpu_seconds=round(cpu_seconds, 1),
            puzzles_per_cpu_s=round(len(data["puzzles"]) / max(cpu_seconds, 1e-9), 2),
        )
        print(f"[{name}] done: {json.dumps(record[name]['guesses'])}", file=sys.stderr)
    if len(made) == 2:
        train = {row.tobytes() for row in made["train"]["puzzles"]}
        record["heldout_in_train"] = int(sum(row.tobytes() in train for row in made["heldout"]["puzzles"]))
    record["load_avg_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
