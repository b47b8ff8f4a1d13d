"""Sudoku search accuracy against its pass budget, puzzle by puzzle, beside the exact depth-first solver's guesses.

  python experiments/sudoku/sudoku_budget_curve.py --workdir runs/sudoku_extreme_ft --data runs/sudoku_hard_sets/heldout.csv \
      --pass_budget 1024 --label finetune [--subset 100] [--config.model.depth_loops=3 ...]
  python experiments/sudoku/sudoku_budget_curve.py --plot results/sudoku/budget/finetune.jsonl \
      results/sudoku/budget/baseline.jsonl --out results/sudoku/budget_curve.png

The model-steered search (`config.solver.search`, confidence orders the branches and decides backtracking,
`--parallel_attempts` symmetric copies side by side) never looks at its budget before it runs out, so one run at
budget B gives the accuracy at every budget up to B: a puzzle counts as solved within b passes when its first exact
grid came at pass <= b. The run writes `results/sudoku/budget/LABEL.jsonl`: a summary line (the command, checkpoint,
settings, accuracy within 1 .. B passes, at the budget and within 64 passes by the plain and the fewest rule's guess
band (`difficulty.guess_band`), wall time), then one line per puzzle (givens, the
plain and fewest-candidates rules' guesses to the first solution uncapped, solved, passes, network evaluations).

`--plot` draws the accuracy-vs-passes curve of each file and, for each, passes per solved puzzle against the plain
solver's guesses on the same puzzle (unsolved puzzles at the budget, as crosses), and prints one JSON line with the
accuracy at 12, 64, 256 and 1,024 passes and the rank correlation of passes with guesses (`--guess_rule`: whose).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

from hackable_diffusion import cli

CURVE_BUDGETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096)


def within(passes: np.ndarray, solved: np.ndarray, budget: int) -> np.ndarray:
    """Solved within `budget` passes: solved, and its first exact grid came at pass <= budget."""
    return solved & (passes <= budget)


def curve(passes: np.ndarray, solved: np.ndarray, pass_budget: int) -> dict[str, float]:
    budgets = [b for b in CURVE_BUDGETS if b < pass_budget] + [pass_budget]
    return {str(b): float(within(passes, solved, b).mean()) for b in budgets}


def by_guess_band(solved: np.ndarray, passes: np.ndarray, counts: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per guess band of each rule in `counts` (rule -> guesses per puzzle; `difficulty.guess_band`'s bands, empty
    bands left out): the accuracy at the budget, within 64 passes, and the number of puzzles."""
    from hackable_diffusion.tasks.sudoku import difficulty

    out = {}
    for rule, guesses in counts.items():
        bands = difficulty.guess_band(guesses, rule=rule)
        present = [band for band in difficulty.bands_of(rule) if (bands == band).any()]
        out[f"accuracy_by_{rule}_band"] = {band: float(solved[bands == band].mean()) for band in present}
        out[f"within_64_by_{rule}_band"] = {
            band: float(within(passes, solved, 64)[bands == band].mean()) for band in present
        }
        out[f"puzzles_by_{rule}_band"] = {band: int((bands == band).sum()) for band in present}
    return out


def run(args, overrides: list[str]) -> None:
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion import run_config
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.tasks.sudoku import difficulty
    from hackable_diffusion.tasks.sudoku.data import PuzzleFile, load_held_out
    from hackable_diffusion.tasks.sudoku.inference import solve_puzzles

    cli.quiet_library_logs()
    config = run_config.load_saved_config(args.workdir)
    solver = {
        "solver.rules": True,
        "solver.search": True,
        "solver.pass_budget": args.pass_budget,
        "solver.parallel_attempts": args.parallel_attempts,
    }
    config = cli.override(config, solver)
    config = cli.parse_config_overrides(config, overrides)
    exp = exp_lib.build(config, args.workdir)
    params, step = toolbox.load_params(exp, args.workdir, step=args.step or None)
    data, dropped = load_held_out(PuzzleFile(args.data, args.subset, args.subset_seed), exp.config)
    puzzles, solutions = data["puzzles"], data["solutions"]
    started = time.perf_counter()
    solution = solve_puzzles(exp, params, puzzles, batch_size=args.batch_size, config=exp.config)
    wall = time.perf_counter() - started
    solved = np.all(solution.predictions == solutions, axis=1)
    passes = np.asarray(solution.steps)
    plain = difficulty.guess_counts(puzzles, "plain", max_guesses=0)
    fewest = difficulty.guess_counts(puzzles, "fewest", max_guesses=0)
    by_band = by_guess_band(solved, passes, {"plain": plain, "fewest": fewest})
    summary = {
        "command": cli.argparse_command("experiments/sudoku/sudoku_budget_curve.py", args) + " " + " ".join(overrides),
        "label": args.label,
        "workdir": args.workdir,
        "checkpoint_step": int(step),
        "data": PuzzleFile(args.data, args.subset, args.subset_seed).label,
        "dropped_as_in_training": dropped,
        "puzzles": int(len(puzzles)),
        "depth_loops": int(exp.model.cfg.depth_loops),
        "pass_budget": args.pass_budget,
        "parallel_attempts": args.parallel_attempts,
        "accuracy": float(solved.mean()),
        "accuracy_within_passes": curve(passes, solved, args.pass_budget),
        **by_band,
        "median_plain_guesses": float(np.median(plain)),
        "median_fewest_guesses": float(np.median(fewest)),
        "mean_passes_solved": float(passes[solved].mean()) if solved.any() else None,
        "network_evaluations_per_puzzle": float(np.mean(solution.network_passes)),
        "batch_forward_passes": int(solution.batch_forward_passes),
        "wall_seconds": wall,
    }
    givens = (puzzles > 0).sum(axis=1)
    out = pathlib.Path(args.out_dir) / f"{args.label}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        f.write(json.dumps(summary) + "\n")
        for i in range(len(puzzles)):
            row = {
                "puzzle": i,
                "givens": int(givens[i]),
                "plain_guesses": int(plain[i]),
                "fewest_guesses": int(fewest[i]),
                "solved": bool(solved[i]),
                "passes": int(passes[i]),
                "network_evaluations": int(solution.network_passes[i]),
            }
            f.write(json.dumps(row) + "\n")
    print(cli.json_line(summary), flush=True)


def read(path: str) -> tuple[dict, list[dict]]:
    lines = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
    return lines[0], lines[1:]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def plot(files: list[str], out: str, guess_rule: str = "plain") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(files), figsize=(5 * (1 + len(files)), 4))
    report = {}
    for index, path in enumerate(files):
        summary, rows = read(path)
        solved = np.array([r["solved"] for r in rows])
        passes = np.array([r["passes"] for r in rows])
        guesses = np.array([r[f"{guess_rule}_guesses"] for r in rows])
        acc = summary["accuracy_within_passes"]
        budgets = [int(b) for b in acc]
        label = f"{summary['label']} (step {summary['checkpoint_step']}, {summary['parallel_attempts']} copies)"
        axes[0].plot(budgets, [100 * acc[str(b)] for b in budgets], marker="o", markersize=3, label=label)
        ax = axes[1 + index]
        ax.scatter(guesses[solved], passes[solved], s=8, alpha=0.6, label="solved")
        ax.scatter(guesses[~solved], passes[~solved], s=12, marker="x", color="tab:red", label="unsolved (at budget)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"exact solver's guesses ({guess_rule} rule)")
        ax.set_ylabel("model search passes")
        ax.set_title(summary["label"], fontsize=9)
        ax.legend(fontsize=8)
        report[summary["label"]] = {
            "puzzles": len(rows),
            **{f"accuracy_at_{b}": acc.get(str(b)) for b in (12, 64, 256, 1024)},
            "spearman_passes_guesses_solved": spearman(guesses[solved], passes[solved]) if solved.sum() > 2 else None,
        }
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("sequential passes (budget)")
    axes[0].set_ylabel("exact grids (%)")
    axes[0].set_ylim(0, 100)
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[0].set_title("accuracy within a pass budget", fontsize=9)
    fig.tight_layout()
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(cli.json_line({"plot": out, **report}), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", nargs="+", default=None, help="budget files to draw (instead of solving)")
    parser.add_argument("--out", default="results/sudoku/budget_curve.png", help="--plot: the PNG")
    parser.add_argument("--guess_rule", choices=("plain", "fewest"), default="plain", help="--plot: the x axis")
    parser.add_argument("--workdir", default="runs/sudoku_extreme_ft")
    parser.add_argument("--step", type=int, default=0, help="checkpoint step (0: the latest)")
    parser.add_argument("--data", default="runs/sudoku_hard_sets/heldout.csv")
    parser.add_argument("--subset", type=int, default=0, help="a seeded random subset of N rows (0: every row)")
    parser.add_argument("--subset_seed", type=int, default=1)
    parser.add_argument("--pass_budget", type=int, default=1024)
    parser.add_argument("--parallel_attempts", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=256, help="search rows per batch")
    parser.add_argument("--label", default="run")
    parser.add_argument("--out_dir", default="results/sudoku/budget")
    args, rest = parser.parse_known_args(argv)
    if args.plot:
        plot(args.plot, args.out, args.guess_rule)
        return
    if args.pass_budget < 1:
        cli.fail(f"--pass_budget={args.pass_budget} must be >= 1.")
    run(args, rest)


if __name__ == "__main__":
    main(sys.argv[1:])
