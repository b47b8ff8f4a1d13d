"""Reward and accuracy against the RL step, one curve per run, from the runs' metrics.jsonl.

  python experiments/rl/plot_rl.py --runs runs/rl_sudoku,runs/rl_sudoku_shaped --out results/rl/sudoku_reward_curve.png \
      --start 0.328

Top: the rollouts' mean reward and solve rate (means over each logged interval); middle: the fraction of groups whose
rewards differ (the only ones with a gradient); bottom: the held-out solve rate of the evaluation the run makes every
`train.eval_every` steps (the run's one-attempt sampler on generated puzzles of the RL data's givens range), when
present, and with `--rows` the evaluations of a rows file (one curve per row label). Prints one JSON line per run with
its first and last values.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(run: pathlib.Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == "train"], [r for r in rows if r.get("split") == "eval"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", required=True, help="comma-separated RL run directories")
    parser.add_argument("--out", required=True)
    parser.add_argument("--start", type=float, default=None, help="the starting weights' held-out exact (a line)")
    parser.add_argument(
        "--rows",
        default=None,
        help="a rows file of experiments/sudoku/sudoku_search_table.sh: each row label's exact against the RL step in the "
        "bottom panel (rows of another workdir than the runs', the starting run, at step 0)",
    )
    args = parser.parse_args()
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    for name in args.runs.split(","):
        run = pathlib.Path(name)
        train, evals = read(run)
        config = json.loads((run / "config.json").read_text())
        label = f"{run.name} ({config['rl']['objective']})"
        steps = [r["step"] for r in train]
        (line,) = top.plot(steps, [r["reward_mean"] for r in train], label=f"{label}: reward")
        top.plot(steps, [r["solve_rate"] for r in train], "--", color=line.get_color(), label=f"{label}: solved")
        if train and "groups_used" in train[0]:
            middle.plot(steps, [r["groups_used"] for r in train], color=line.get_color(), label=label)
        held = [r for r in evals if "sudoku_accuracy" in r or "countdown_accuracy" in r]
        key = "sudoku_accuracy" if held and "sudoku_accuracy" in held[0] else "countdown_accuracy"
        if held:
            bottom.plot([r["step"] for r in held], [r[key] for r in held], "o-", color=line.get_color(), label=label)
        print(
            json.dumps(
                {
                    "run": name,
                    "objective": config["rl"]["objective"],
                    "steps": steps[-1] if steps else 0,
                    "first_reward": train[0]["reward_mean"] if train else None,
                    "last_reward": train[-1]["reward_mean"] if train else None,
                    "held_out": [(r["step"], r[key]) for r in held],
                }
            )
        )
    if args.rows:
        runs = set(args.runs.split(","))
        by_label: dict[str, list[tuple[int, float]]] = {}
        for line in pathlib.Path(args.rows).read_text().splitlines():
            row = json.loads(line)
            step = row["checkpoint_step"] if row["workdir"] in runs else 0
            by_label.setdefault(row["row"], []).append((step, row["accuracy"]))
        for label, points in sorted(by_label.items()):
            points.sort()
            bottom.plot([p[0] for p in points], [p[1] for p in points], "s--", label=label)
        print(json.dumps({"rows": {k: sorted(v) for k, v in by_label.items()}}))
    if args.start is not None:
        bottom.axhline(args.start, color="gray", linestyle=":", label="starting weights")
    top.set_ylabel("rollouts")
    top.legend(fontsize=7)
    middle.set_ylabel("groups with a signal")
    middle.legend(fontsize=7)
    bottom.set_ylabel("held-out exact")
    bottom.set_xlabel("RL step")
    bottom.legend(fontsize=7)
    fig.tight_layout()
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
