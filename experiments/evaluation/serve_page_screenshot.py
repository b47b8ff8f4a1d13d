"""Opens the server's live page in headless Chromium and saves a screenshot of a canvas mid-denoising.

  python experiments/evaluation/serve_page_screenshot.py --workdir runs/quickstart --freeze 1:6 \
      --out results/serving/page_mid_denoising.png

Needs Chromium (Debian: `apt-get install chromium`; `--chromium` names another binary). The server runs in this
process on 127.0.0.1; the page is opened with `?autostart=1&freeze=CANVAS:STEP`, so it starts a generation by itself
(streamed with the per-step events, exactly as a click would) and stops redrawing at that step of that canvas. The
browser is driven over the DevTools protocol (aiohttp's websocket client, installed with the dev extra's lm-eval):
navigate, wait until the page's title says it froze, capture. Prints one JSON line (URL, file, size, page status).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def screenshot(port: int, url: str, out: pathlib.Path, timeout_s: float) -> str:
    """Drives the browser over the DevTools protocol: open `url`, wait until the page says it froze, capture it."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        for _ in range(200):  # the browser's debugging endpoint comes up
            try:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                    targets = [t for t in await response.json() if t["type"] == "page"]
                    if targets:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError("chromium's debugging endpoint did not come up.")
        async with session.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 1 << 30))

            async def call(method: str, **params):
                ident = next(ids)
                await ws.send_json({"id": ident, "method": method, "params": params})
                while True:
                    message = await ws.receive_json()
                    if message.get("id") == ident:
                        if "error" in message:
                            raise RuntimeError(f"{method}: {message['error']}")
                        return message["result"]

            await call("Page.enable")
            await call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout_s
            while True:
                title = await call("Runtime.evaluate", expression="document.title", returnByValue=True)
                if title["result"].get("value") == "frozen":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the page did not reach its freeze step within {timeout_s} s.")
                await asyncio.sleep(0.1)
            status = await call(
                "Runtime.evaluate", expression="document.getElementById('status').textContent", returnByValue=True
            )
            shot = await call("Page.captureScreenshot", format="png")
            out.write_bytes(base64.b64decode(shot["data"]))
            return status["result"].get("value", "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="runs/quickstart")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--max_tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--freeze", default="1:6", help="CANVAS:STEP at which the page stops redrawing")
    p.add_argument("--chromium", default="chromium")
    p.add_argument("--window", default="1100,760")
    p.add_argument("--timeout_s", type=float, default=120.0)
    p.add_argument("--out", default="results/serving/page_mid_denoising.png")
    args = p.parse_args(argv)
    binary = shutil.which(args.chromium)
    if binary is None:
        sys.exit(f"error: {args.chromium!r} not found; install Chromium (Debian: apt-get install chromium).")

    from hackable_diffusion import cli, run_config
    from hackable_diffusion.checkpoints import hf_runs
    from hackable_diffusion.serve.app import build_app
    from hackable_diffusion.serve.command import ServerThread, load_engine, warm_up

    cli.quiet_library_logs()
    config = run_config.load_saved_config(hf_runs.resolve_workdir(args.workdir))
    engine, template = load_engine(args.workdir, config, max_batch=1)
    warm_up(engine, prompt=args.prompt, max_tokens=args.max_tokens)
    out = pathlib.Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    query = urllib.parse.urlencode(
        dict(prompt=args.prompt, max_tokens=args.max_tokens, seed=args.seed, delay=0, autostart=1, freeze=args.freeze)
    )
    with ServerThread(build_app(engine, chat_template=template)) as server:
        url = f"{server.url}/?{query}"
        port = free_port()
        browser = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",  # root in a container
                "--disable-gpu",
                "--hide-scrollbars",
                f"--window-size={args.window}",
                f"--remote-debugging-port={port}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            state = asyncio.run(screenshot(port, url, out, args.timeout_s))
        finally:
            browser.terminate()
            browser.wait(30)
    print(
        json.dumps(
            {
                "experiment": "serve_page_screenshot",
                "url": url,
                "png": str(out),
                "bytes": out.stat().st_size,
                "page_status": state,
                "requests_served": engine.stats.completed + engine.stats.cancelled,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
