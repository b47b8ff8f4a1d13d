"""Exact grids against the forward-pass budget for the Sudoku search, from the rows of sudoku_search_table.sh.

  python experiments/sudoku/plot_sudoku_search.py --rows results/sudoku/search_rows.jsonl:looped \
      --rows results/sudoku/search_rows_hard.jsonl:hard --out results/sudoku/search_passes.png

`--rows FILE:LABEL` once per model (the first drawn solid, the next dash-dotted). A search row holds
`search_solved_within_passes` (the accuracy at every budget up to its own: the search never looks at its budget before
running out), drawn as a curve; a sampler row and a paced search row are one point at their mean passes (squares:
parallel attempts, whose network evaluations are K times more). Prints one JSON line with the accuracy of each row at
12 and 64 passes.
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SETS = {
    "h1": "17-25 givens, search class",
    "h2": "22-28 givens, search class",
    "kaggle": "Kaggle subset",
    "easy": "30-36 givens",
}
COLOURS = {"h1": "tab:red", "h2": "tab:orange", "kaggle": "tab:blue", "easy": "tab:green"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="append", help="FILE:LABEL of a model's rows (repeat per model)")
    parser.add_argument("--out", default="results/sudoku/search_passes.png")
    args = parser.parse_args()
    sources = [entry.rpartition(":")[::2] if ":" in entry else (entry, "") for entry in args.rows or []]
    sources = sources or [("results/sudoku/search_rows.jsonl", "")]
    fig, ax = plt.subplots(figsize=(11, 4.8), dpi=110)
    summary = {}
    curve_styles = {"search": "search", "rules_only": "rules alone", "cells5": "5 cells per branch"}
    dashes = {"search": "-", "rules_only": ":", "cells5": "--"}
    for index, (path, model) in enumerate(sources):
        prefix = f"{model}, " if model else ""
        with open(path) as lines:
            rows = [json.loads(line) for line in lines]
        for row in rows:
            kind, _, name = row["row"].rpartition("_")
            if name not in SETS:
                continue
            key = f"{model}:{row['row']}" if model else row["row"]
            curve = row.get("search_solved_within_passes")
            if curve and len(curve) > 1:
                if kind not in curve_styles:
                    continue  # other ablations stay in the table
                budgets = sorted(int(b) for b in curve)
                accuracy = [100 * curve[str(b)] for b in budgets]
                style = "-." if index and kind == "search" else dashes[kind]
                label = f"{prefix}{curve_styles[kind]}: {SETS[name]}"
                ax.plot(budgets, accuracy, style, marker=".", color=COLOURS[name], label=label)
                summary[key] = {"at_12": 100 * curve.get("12", 0.0), "at_64": 100 * curve[str(budgets[-1])]}
            else:
                passes = row["forward_passes_per_puzzle"]
                budget = row.get("solver", {}).get("pass_budget")
                paced = f"paced search, budget {budget}"
                marker, what = ("o", paced) if curve else ("x" if not index else "+", "sampler")
                attempts = row.get("solver", {}).get("parallel_attempts", 1)
                if attempts > 1:
                    marker, what = ("s" if curve else "D"), f"{what}, {attempts} attempts"
                ax.plot(
                    [passes],
                    [100 * row["accuracy"]],
                    marker,
                    markersize=8,
                    color=COLOURS[name],
                    fillstyle="none",
                    label=f"{prefix}{what}: {SETS[name]}",
                )
                summary[key] = {
                    "accuracy": 100 * row["accuracy"],
                    "mean_passes": passes,
                    "network_evaluations": row.get("network_evaluations_per_puzzle", passes),
                }
    ax.set_xscale("log", base=2)
    ax.set_xlabel("forward passes per puzzle (budget; sampler and paced search: mean)")
    ax.set_ylabel("exact grids (%)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Sudoku: model-steered search vs the 12-pass sampler (squares: 4 copies in lockstep)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out)
    print(json.dumps({"plot": args.out, **summary}))


if __name__ == "__main__":
    main()
