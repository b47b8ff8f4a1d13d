"""Exact grids against the forward-pass budget for the Sudoku search, from the rows of sudoku_search_table.sh.

  python experiments/plot_sudoku_search.py --rows results/sudoku/search_rows.jsonl --out results/sudoku/search_passes.png

A search row holds `search_solved_within_passes` (the accuracy at every budget up to its own: the search never looks at
its budget before running out), drawn as a curve; a sampler row is one point at its mean passes. Prints one JSON line
with the accuracy of each row at 12 and 64 passes.
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
    parser.add_argument("--rows", default="results/sudoku/search_rows.jsonl")
    parser.add_argument("--out", default="results/sudoku/search_passes.png")
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.rows)]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    summary = {}
    for row in rows:
        kind, _, name = row["row"].rpartition("_")
        if name not in SETS:
            continue
        curve = row.get("search_solved_within_passes")
        if curve:
            budgets = sorted(int(b) for b in curve)
            accuracy = [100 * curve[str(b)] for b in budgets]
            styles = {
                "search": ("-", "search"),
                "rules_only": (":", "rules alone"),
                "cells5": ("--", "5 cells per branch"),
            }
            if kind not in styles:
                continue  # other ablations stay in the table
            style, what = styles[kind]
            label = f"{what}: {SETS[name]}"
            ax.plot(budgets, accuracy, style, marker=".", color=COLOURS[name], label=label)
            summary[row["row"]] = {"at_12": 100 * curve.get("12", 0.0), "at_64": 100 * curve[str(budgets[-1])]}
        else:
            passes = row["forward_passes_per_puzzle"]
            ax.plot(
                [passes],
                [100 * row["accuracy"]],
                "x",
                markersize=9,
                color=COLOURS[name],
                label=f"sampler: {SETS[name]}",
            )
            summary[row["row"]] = {"accuracy": 100 * row["accuracy"], "mean_passes": passes}
    ax.set_xscale("log", base=2)
    ax.set_xlabel("forward passes per puzzle (budget; sampler: mean)")
    ax.set_ylabel("exact grids (%)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Sudoku: model-steered search vs the 12-pass sampler (looped model)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out)
    print(json.dumps({"plot": args.out, **summary}))


if __name__ == "__main__":
    main()
