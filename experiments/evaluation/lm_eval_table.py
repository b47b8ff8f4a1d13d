"""Runs lm-evaluation-harness tasks on several toolbox runs through the `hackable_diffusion` adapter and writes one
comparison table (markdown + JSON), one JSON line per run on stdout.

  python experiments/evaluation/lm_eval_table.py --runs runs/shakespeare_masking,runs/shakespeare_ar \
      --tasks hd_shakespeare_next_line,hd_shakespeare_perplexity,hd_shakespeare_continuation \
      --num_draws 8 --batch_size 8 --out results/lm_eval/text [--merge]

Each run is evaluated with lm-eval's `simple_evaluate` on the toolbox's offline tasks (evals/lm_eval_tasks); the table
holds every metric with lm-eval's standard error, the estimator (exact / ELBO bound) and the sampler settings.
"""

import argparse
import json
import pathlib
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="comma-separated workdirs (or hf:DIR)")
    parser.add_argument(
        "--tasks", default="hd_shakespeare_next_line,hd_shakespeare_perplexity,hd_shakespeare_continuation"
    )
    parser.add_argument("--num_draws", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--limit", type=int, default=0, help="documents per task (0 = all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="folder for table.md and results.json")
    parser.add_argument(
        "--merge", action="store_true", help="keep the rows of other runs already in --out (a run's row is replaced)"
    )
    args, overrides = parser.parse_known_args()
    bad = [a for a in overrides if not a.startswith("--config.")]
    if bad:
        sys.exit(f"error: unknown arguments {bad}; sampler settings are --config.sampler.<key>=value.")

    import lm_eval
    from lm_eval.tasks import TaskManager

    from hackable_diffusion.evals.harness import TASKS_DIR
    from hackable_diffusion.evals.lm_eval_adapter import HackableDiffusionLM

    config_args = dict(a[2:].split("=", 1) for a in overrides)
    rows = []
    for workdir in args.runs.split(","):
        start = time.perf_counter()
        model = HackableDiffusionLM(
            workdir=workdir,
            num_draws=args.num_draws,
            seed=args.seed,
            batch_size=args.batch_size,
            greedy_check=False,
            **config_args,
        )
        results = lm_eval.simple_evaluate(
            model=model,
            tasks=args.tasks.split(","),
            task_manager=TaskManager(include_path=str(TASKS_DIR)),
            limit=args.limit or None,
            random_seed=args.seed,
            numpy_random_seed=args.seed,
            torch_random_seed=args.seed,
            fewshot_random_seed=args.seed,
        )
        metrics = {
            task: {k.split(",")[0]: v for k, v in values.items() if k != "alias" and isinstance(v, (int, float))}
            for task, values in results["results"].items()
        }
        row = {
            "run": workdir,
            "model_info": model.get_model_info(),
            "metrics": metrics,
            "limit": args.limit or None,
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if args.merge and (out / "results.json").exists():
            new_runs = {row["run"] for row in rows}
            kept = [row for row in json.loads((out / "results.json").read_text()) if row["run"] not in new_runs]
            rows = kept + rows
        (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
        (out / "table.md").write_text(markdown(rows))


def markdown(rows: list[dict]) -> str:
    lines = ["| run | estimator | task | metric | value | stderr |", "|---|---|---|---|---:|---:|"]
    for row in rows:
        info = row["model_info"]
        for task, values in sorted(row["metrics"].items()):
            for metric, value in sorted(values.items()):
                if metric.endswith("_stderr"):
                    continue
                se = values.get(metric + "_stderr")
                se_text = f"{se:.4f}" if isinstance(se, float) else "–"
                lines.append(
                    f"| {row['run']} | {info['loglikelihood']} | {task} | {metric} | {value:.4f} | {se_text} |"
                )
    lines.append("")
    for row in rows:  # what produced each row: checkpoint, estimator, sampler / solver settings and their cost
        info = {k: v for k, v in row["model_info"].items() if k != "workdir"}
        lines.append(f"- `{row['run']}`: `{json.dumps(info)}`")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
