"""A bounded load test of the OpenAI-compatible server on 127.0.0.1: every request answered, none lost when a
quarter of the clients hang up mid-stream, TTFT and latency quantiles, tokens/s against concurrency.

  python experiments/evaluation/serve_bench.py --workdir runs/quickstart --concurrency 1,4,16,64 --requests_per_client 4 \
      --max_tokens 128 --time_limit_s 600 [--out results/serving/serve_bench.jsonl]

The server runs in this process (uvicorn in a thread, the engine's worker thread); the clients are asyncio tasks
on one httpx connection pool, each sending its requests one after the other, streamed. At each concurrency level a
quarter of the clients (rounded down; none at concurrency 1) close their first request's stream after its first
chunk. Checked per level: every request that was not hung up ended with `data: [DONE]` and a finish reason; the
server's count of cancelled requests is reported beside the hang-ups (a request whose last canvas was already
running when its client left is answered, not cancelled), and the programs compiled during the level
(`compilations`: 0 once the warm-up has compiled every batch shape). One JSON line per level, then a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="runs/quickstart", help="A text run (README command 1 makes runs/quickstart).")
    p.add_argument("--concurrency", default="1,4,16,64", help="Comma-separated numbers of concurrent clients.")
    p.add_argument("--requests_per_client", type=int, default=4)
    p.add_argument("--max_tokens", type=int, default=128)
    p.add_argument("--max_batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=0, help="Denoising steps per canvas (0 = the run's own).")
    p.add_argument("--time_limit_s", type=float, default=600.0, help="Per concurrency level.")
    p.add_argument("--out", default="", help="Append the JSON lines here too.")
    return p.parse_args(argv)


PROMPTS = ("ROMEO:", "JULIET:", "First Citizen:\n", "KING RICHARD III:\n", "Nurse:", "MENENIUS:\nWhat")


async def one_request(client, url, body, hang_up: bool) -> dict:
    start = time.perf_counter()
    first, text, finish, done = None, "", None, False
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return {"status": response.status_code, "error": (await response.aread()).decode()[:200]}
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            choice = json.loads(line[6:])["choices"][0]
            if choice["text"] and first is None:
                first = time.perf_counter() - start
                if hang_up:
                    break  # leaving the block closes the connection mid-stream
            text += choice["text"]
            finish = choice["finish_reason"] or finish
    return {
        "status": 200,
        "ttft_s": first,
        "latency_s": time.perf_counter() - start,
        "chars": len(text),
        "finish": finish,
        "done": done,
        "hung_up": hang_up,
    }


async def client_task(client, url, index, args, hang_up_first: bool) -> list[dict]:
    out = []
    for r in range(args.requests_per_client):
        body = {
            "prompt": PROMPTS[(index + r) % len(PROMPTS)],
            "max_tokens": args.max_tokens,
            "seed": index * 1000 + r,
            "stream": True,
        }
        if args.steps:
            body["steps"] = args.steps
        out.append(await one_request(client, url, body, hang_up=hang_up_first and r == 0))
    return out


async def run_level(url, engine, concurrency: int, args) -> dict:
    import httpx2 as httpx

    cancelled_before, tokens_before, busy_before = (
        engine.stats.cancelled,
        engine.stats.generated_tokens,
        engine.stats.busy_s,
    )
    hang_ups = concurrency // 4
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=args.time_limit_s, limits=limits) as client:
        start = time.perf_counter()
        tasks = [client_task(client, url, i, args, hang_up_first=i < hang_ups) for i in range(concurrency)]
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=args.time_limit_s)
        wall = time.perf_counter() - start
    flat = [r for rs in results for r in rs]
    for _ in range(200):  # the hung-up rows are counted at their next canvas
        if engine.stats.cancelled - cancelled_before >= hang_ups:
            break
        await asyncio.sleep(0.05)
    kept = [r for r in flat if not r.get("hung_up")]
    answered = [r for r in kept if r["status"] == 200 and r["done"] and r["finish"] in ("stop", "length")]
    ttft = np.array([r["ttft_s"] for r in answered if r["ttft_s"] is not None])
    latency = np.array([r["latency_s"] for r in answered])
    tokens = engine.stats.generated_tokens - tokens_before

    def q(a, p):
        return round(float(np.quantile(a, p)), 4) if a.size else None

    return {
        "concurrency": concurrency,
        "requests": len(flat),
        "hung_up": hang_ups,
        "answered": len(answered),
        "lost": len(kept) - len(answered),
        "server_cancelled": engine.stats.cancelled - cancelled_before,
        "errors": sorted({r.get("error", "") for r in kept if r["status"] != 200}),
        "ttft_p50_s": q(ttft, 0.5),
        "ttft_p99_s": q(ttft, 0.99),
        "latency_p50_s": q(latency, 0.5),
        "latency_p99_s": q(latency, 0.99),
        "completion_tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "generation_busy_s": round(engine.stats.busy_s - busy_before, 2),
    }


def main(argv=None):
    args = parse_args(argv)
    from hackable_diffusion import cli, run_config
    from hackable_diffusion.checkpoints import hf_runs
    from hackable_diffusion.serve.app import build_app
    from hackable_diffusion.serve.command import ServerThread, load_engine, warm_up
    from hackable_diffusion.training.compilations import count_compilations

    cli.quiet_library_logs()
    levels = [int(x) for x in args.concurrency.split(",") if x]
    config = run_config.load_saved_config(hf_runs.resolve_workdir(args.workdir))
    engine, template = load_engine(
        args.workdir, config, max_batch=args.max_batch, max_queue=max(levels) * 2 + 8, prompt_bucket=32
    )
    # every batch size a level can form, compiled before the clock starts, without and with per-step streaming (the
    # clients stream: a batch with a streaming client runs the denoising loop with a host callback, another program)
    warm = warm_up(engine, prompt=PROMPTS[0], max_tokens=args.max_tokens, batch_sizes=(1, 2, 4, 8, 16))
    lines = []
    with ServerThread(build_app(engine, chat_template=template, request_timeout_s=args.time_limit_s)) as server:
        for concurrency in levels:
            with count_compilations() as compiled:  # after the warm-up every batch shape is compiled: 0 expected
                row = asyncio.run(run_level(server.url, engine, concurrency, args))
            row.update(workdir=args.workdir, max_tokens=args.max_tokens, max_batch=engine.max_batch)
            row.update(compilations=compiled.count, compiled=compiled.by_name())
            print(json.dumps(row), flush=True)
            lines.append(row)
    summary = {
        "summary": "serve_bench",
        "warm_up_s": round(warm, 1),
        "compilations_after_warm_up": sum(r["compilations"] for r in lines),
        "all_answered": all(r["lost"] == 0 and not r["errors"] for r in lines),
        "tokens_per_s_by_concurrency": {r["concurrency"]: r["tokens_per_s"] for r in lines},
        "ttft_p50_s_by_concurrency": {r["concurrency"]: r["ttft_p50_s"] for r in lines},
    }
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for row in lines + [summary]:
                f.write(json.dumps(row) + "\n")
    return 0 if summary["all_answered"] else 1


if __name__ == "__main__":
    sys.exit(main())
