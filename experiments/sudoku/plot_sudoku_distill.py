"""Exact Sudoku grids against passes (one attempt) for a teacher and its distilled students, from the rows of
experiments/sudoku_distill_table.sh.

  python experiments/sudoku/plot_sudoku_distill.py --rows results/sudoku/distill_rows.jsonl --out results/sudoku/distill.png

One line per label; prints one JSON line with each label's accuracy at each number of passes.
"""

from __future__ import annotations

import argparse
import collections
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="results/sudoku/distill_rows.jsonl")
    parser.add_argument("--out", default="results/sudoku/distill.png")
    args = parser.parse_args()
    series: dict[str, dict[int, float]] = collections.defaultdict(dict)
    with open(args.rows) as f:
        for line in f:
            row = json.loads(line)
            series[row["label"]][int(row["passes"])] = 100 * float(row["accuracy"])
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("forward passes (one attempt)")
    ax.set_ylabel("exact grids (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(json.dumps({"plot": args.out, **{k: dict(sorted(v.items())) for k, v in series.items()}}))


if __name__ == "__main__":
    main()
