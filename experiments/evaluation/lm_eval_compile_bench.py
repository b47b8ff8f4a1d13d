"""What compilation costs a user: the lm-eval harness's requests per second against the bare model calls it makes, and
the wall time of a command run cold (empty persistent compilation cache) and warm (the same command again).

  python experiments/evaluation/lm_eval_compile_bench.py lm_eval --workdir runs/quickstart --num_draws 4 --limit 20
  python experiments/evaluation/lm_eval_compile_bench.py cold_warm --workdir runs/quickstart --sudoku_workdir runs/sudoku

`lm_eval`: `hd_shakespeare_next_line` through lm-eval's `simple_evaluate` with the `hackable_diffusion` model (as
`python -m hackable_diffusion.evals.harness --model hackable_diffusion --model_args workdir=W,num_draws=4 --tasks
hd_shakespeare_next_line --limit 20` runs it, its persistent compilation cache included), in this process. Every call the scorer makes to the model, the ELBO
draws (`scoring._elbo_draws`) and the greedy check's decode (`sampling.generate.generate`), is recorded and replayed
after the run, compiled, each timed to completion: `model_s`. The evaluation runs `--passes` times in the process (the
first compiles or reads the persistent cache, the next ones must build nothing). One JSON line: the requests; per pass
the harness's wall time, requests per second, the programs built and the seconds spent building them; `model_s`; and
`ratio` = harness time per request / model time per request on the last pass (the overhead of batching, padding and
Python around the model, lm-eval's own included; `ratio_first_pass` with the first pass's compilation).

`cold_warm`: each command (`sample --workdir W --prompt ROMEO:`, `evaluate --workdir W --num_batches 2` on the text run,
and `evaluate` on a Sudoku run when `--sudoku_workdir` holds one) run twice in a fresh process against a fresh
persistent compilation cache (HD_COMPILATION_CACHE, a temporary directory): the first run compiles and fills it, the
second reads its programs back. One JSON line per run: wall seconds, programs built, how many came from the cache, the
seconds spent building them, the cache's files and size after it; then the size of one cache holding every command's
programs (`--commands` picks the commands).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]

# Run in a child process: counts the programs built while the command runs, and reports them at exit.
CHILD = """
import atexit, json, runpy, sys
from hackable_diffusion.training.compilations import count_compilations
counter = count_compilations()
log = counter.__enter__()
def report():
    print("COMPILATIONS " + json.dumps({"programs": log.count, "from_cache": log.cache_hits,
          "build_s": round(log.total_seconds, 3), "trace_and_lower_s": round(log.trace_seconds, 3)}),
          file=sys.stderr, flush=True)
atexit.register(report)
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["lm_eval", "cold_warm"])
    p.add_argument("--workdir", default="runs/quickstart", help="A text run (README command 1 makes runs/quickstart).")
    p.add_argument("--num_draws", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--limit", type=int, default=20, help="lm_eval: documents of the task (4 requests each).")
    p.add_argument("--task", default="hd_shakespeare_next_line")
    p.add_argument("--passes", type=int, default=2, help="lm_eval: evaluations in this process (the first compiles).")
    p.add_argument("--sudoku_workdir", default="runs/sudoku", help="cold_warm: a Sudoku run (skipped when absent).")
    p.add_argument("--sudoku_puzzles", type=int, default=64, help="cold_warm: generated puzzles evaluate solves.")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--commands", default="sample,evaluate,sudoku", help="cold_warm: which commands to run.")
    return p.parse_args(argv)


def lm_eval_run(args) -> dict:
    import jax
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from hackable_diffusion import cli
    from hackable_diffusion.evals import harness, lm_eval_adapter, scoring

    cli.use_compilation_cache()  # as the harness command does (HD_COMPILATION_CACHE=0: every program compiled here)
    from hackable_diffusion.sampling import generate as gen_lib
    from hackable_diffusion.training.compilations import count_compilations

    calls: list[tuple] = []
    elbo_draws, generate = scoring._elbo_draws, gen_lib.generate

    def recorded_elbo(*a, **k):
        calls.append((elbo_draws, a, k))
        return elbo_draws(*a, **k)

    def recorded_generate(*a, **k):
        calls.append((generate, a, k))
        return generate(*a, **k)

    lm = lm_eval_adapter.HackableDiffusionLM(
        workdir=args.workdir, num_draws=args.num_draws, batch_size=args.batch_size
    )
    requests = []
    loglikelihood = lm.loglikelihood

    def counted(instances, disable_tqdm=False):
        requests.append(len(instances))
        return loglikelihood(instances, disable_tqdm=True)

    lm.loglikelihood = counted
    scoring._elbo_draws, gen_lib.generate = recorded_elbo, recorded_generate
    passes = []
    try:
        manager = TaskManager(include_path=str(harness.TASKS_DIR))
        for _ in range(args.passes):  # the first pass compiles (or reads the persistent cache); the next ones reuse
            calls.clear()
            requests.clear()
            with count_compilations() as built:
                start = time.perf_counter()
                results = simple_evaluate(model=lm, tasks=[args.task], task_manager=manager, limit=args.limit)
                harness_s = time.perf_counter() - start
            n = sum(requests)
            passes.append(
                {
                    "harness_s": round(harness_s, 3),
                    "requests_per_s": round(n / harness_s, 3),
                    "compilations": built.count,
                    "compilations_from_cache": built.cache_hits,
                    "compile_s": round(built.total_seconds, 3),
                    "trace_and_lower_s": round(built.trace_seconds, 3),
                }
            )
    finally:
        scoring._elbo_draws, gen_lib.generate = elbo_draws, generate
    model_s = 0.0
    with count_compilations() as replay_built:
        for fn, a, k in calls:  # the last pass's calls, compiled now: the bare model time of each
            start = time.perf_counter()
            jax.block_until_ready(getattr(fn(*a, **k), "tokens", None) if fn is generate else fn(*a, **k))
            model_s += time.perf_counter() - start
    metrics = results["results"][args.task] if results else {}
    first, last = passes[0], passes[-1]
    return {
        "benchmark": "lm_eval",
        "workdir": args.workdir,
        "task": args.task,
        "limit": args.limit,
        "num_draws": args.num_draws,
        "batch_size": args.batch_size,
        "requests": n,
        "passes": passes,
        "requests_per_s": last["requests_per_s"],
        "model_calls": len(calls),
        "model_s": round(model_s, 3),
        # harness time per request / model time per request, on the last pass (every program compiled)
        "ratio": round(last["harness_s"] / model_s, 3) if model_s else None,
        "ratio_first_pass": round(first["harness_s"] / model_s, 3) if model_s else None,
        "replay_compilations": replay_built.count,  # 0: the replay measured compiled programs only
        "acc": metrics.get("acc,none"),
    }


def run_command(module: str, args: list[str], cache: str) -> dict:
    env = dict(os.environ, HD_COMPILATION_CACHE=cache)
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        env.pop(name, None)
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, module, *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    lines = [line for line in out.stderr.splitlines() if line.startswith("COMPILATIONS ")]
    report = json.loads(lines[-1][len("COMPILATIONS ") :]) if lines else {}
    row = {"command": " ".join([module.rsplit(".", 1)[-1], *args]), "returncode": out.returncode, "wall_s": round(wall, 2)}
    if out.returncode:
        row["stderr"] = out.stderr[-600:]
    return {**row, **report}


def cache_entries(directory: str) -> dict[str, int]:
    """The cache's entries (file name -> bytes); a program's entry has the same name in any cache."""
    return {p.name: p.stat().st_size for p in pathlib.Path(directory).rglob("*") if p.is_file()}


def cold_warm(args) -> list[dict]:
    commands = {
        "sample": ("hackable_diffusion.sample", ["--workdir", args.workdir, "--prompt", args.prompt]),
        "evaluate": ("hackable_diffusion.evaluate", ["--workdir", args.workdir, "--num_batches", "2"]),
    }
    if (pathlib.Path(args.sudoku_workdir) / "config.json").is_file():
        generated = ["--givens=30,40", f"--num_puzzles={args.sudoku_puzzles}"]
        commands["sudoku"] = ("hackable_diffusion.evaluate", ["--workdir", args.sudoku_workdir, *generated])
    chosen = [name for name in args.commands.split(",") if name in commands]
    rows, union = [], {}
    with tempfile.TemporaryDirectory(prefix="hd-bench-cache-") as root:
        for name in chosen:
            module, command_args = commands[name]
            own = os.path.join(root, name)
            for run in ("cold", "warm"):
                row = {"benchmark": "cold_warm", "run": run, **run_command(module, command_args, own)}
                entries = cache_entries(own)
                row.update(cache_files=len(entries), cache_mb=round(sum(entries.values()) / 2**20, 2))
                print(json.dumps(row), flush=True)
                rows.append(row)
            union.update(cache_entries(own))
        summary = {
            "benchmark": "cold_warm",
            "commands": chosen,
            "cache_files": len(union),  # one cache after all of them: programs they share are stored once
            "cache_mb": round(sum(union.values()) / 2**20, 2),
        }
        print(json.dumps(summary), flush=True)
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.mode == "lm_eval":
        print(json.dumps(lm_eval_run(args)), flush=True)
    else:
        cold_warm(args)


if __name__ == "__main__":
    main()
