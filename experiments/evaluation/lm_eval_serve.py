"""lm-evaluation-harness's OpenAI-compatible model (`local-completions`) against the toolbox's server, beside the
in-process adapter on the same run and task: the generations must agree.

  python experiments/evaluation/lm_eval_serve.py --workdir runs/quickstart --task hd_shakespeare_continuation --limit 40 \
      [--out results/serving/lm_eval_serve.json]

The server runs in this process on 127.0.0.1 (uvicorn in a thread). lm-eval's `local-completions` sends
`temperature: 0` and a fixed seed, which the server serves near-greedily (temperature 1e-4, positions ranked by the
model's own probabilities); the in-process adapter (`--model hackable_diffusion`) is given the same sampler through
its config overrides, so both decode the same way and each document's generation is compared as text. Prints one
JSON line: both runs' metrics, the fraction of identical generations, the first differences, wall times.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

GREEDY = {  # the server's temperature 0, as the adapter's config overrides
    "config.sampler.min_temperature": 1e-4,
    "config.sampler.max_temperature": 1e-4,
    "config.sampler.score_temperature": 1.0,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="runs/quickstart")
    p.add_argument("--task", default="hd_shakespeare_continuation", help="a generate_until task of evals/lm_eval_tasks")
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--num_concurrent", type=int, default=4, help="lm-eval's concurrent requests to the server")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)

    import lm_eval
    import lm_eval.models.openai_completions  # noqa: F401 - registers local-completions
    from lm_eval.tasks import TaskManager

    from hackable_diffusion import cli, run_config
    from hackable_diffusion.checkpoints import hf_runs
    from hackable_diffusion.evals.harness import TASKS_DIR
    from hackable_diffusion.evals.lm_eval_adapter import HackableDiffusionLM
    from hackable_diffusion.serve.app import build_app
    from hackable_diffusion.serve.command import ServerThread, load_engine

    cli.quiet_library_logs()
    manager = TaskManager(include_path=str(TASKS_DIR))
    config = run_config.load_saved_config(hf_runs.resolve_workdir(args.workdir))
    engine, template = load_engine(args.workdir, config, max_batch=8, max_context=4096, model_name="served")

    def generations(results) -> list[str]:
        samples = sorted(results["samples"][args.task], key=lambda s: s["doc_id"])
        return [
            s["filtered_resps"][0] if isinstance(s["filtered_resps"][0], str) else s["filtered_resps"][0][0]
            for s in samples
        ]

    start = time.perf_counter()
    with ServerThread(build_app(engine, chat_template=template)) as server:
        served = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={
                "model": "served",
                "base_url": server.url + "/v1/completions",
                "tokenizer_backend": None,
                "tokenized_requests": False,
                "num_concurrent": args.num_concurrent,
                "max_retries": 1,
            },
            tasks=[args.task],
            task_manager=manager,
            limit=args.limit,
            log_samples=True,
        )
    served_s = time.perf_counter() - start
    start = time.perf_counter()
    adapter = HackableDiffusionLM(workdir=args.workdir, greedy_check=False, batch_size=8, **GREEDY)
    local = lm_eval.simple_evaluate(
        model=adapter, tasks=[args.task], task_manager=manager, limit=args.limit, log_samples=True
    )
    local_s = time.perf_counter() - start
    a, b = generations(served), generations(local)
    same = [x == y for x, y in zip(a, b)]
    line = {
        "experiment": "lm_eval_serve",
        "workdir": args.workdir,
        "task": args.task,
        "documents": len(a),
        "identical_generations": sum(same),
        "identical_fraction": sum(same) / max(len(a), 1),
        "first_differences": [{"doc": i, "served": x, "adapter": y} for i, (x, y) in enumerate(zip(a, b)) if x != y][
            :3
        ],
        "served_metrics": {k: v for k, v in served["results"][args.task].items() if k != "alias"},
        "adapter_metrics": {k: v for k, v in local["results"][args.task].items() if k != "alias"},
        "served_wall_s": round(served_s, 1),
        "adapter_wall_s": round(local_s, 1),
        "server_requests": engine.stats.completed,
        "server_batches": engine.stats.batches,
    }
    print(json.dumps(line), flush=True)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(line, indent=1) + "\n")
    return 0 if line["identical_fraction"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
