"""An OpenAI-compatible server over a run: python -m hackable_diffusion.serve --workdir RUN|hf:DIR

  python -m hackable_diffusion.serve --workdir runs/quickstart [--host 127.0.0.1 --port 8000] [--max_batch 8]
      [--max_queue 64] [--request_timeout_s 600] [--config.sampler.num_steps=16]

Then any OpenAI client talks to it (base URL http://HOST:PORT/v1, any API key), e.g.
`curl localhost:8000/v1/completions -d '{"prompt": "ROMEO:", "max_tokens": 64, "seed": 1}'`, and the page at
http://HOST:PORT/ shows a canvas denoising live. SIGTERM / Ctrl-C stop taking connections and let running requests
finish (up to --shutdown_timeout_s). The address is bound before the server says where it serves: a port in use or
outside 0-65535 (0: any free port) stops the command with one error line. Needs the serving extra: pip install -e
'.[serve]'. See docs/serving.md.
"""

from __future__ import annotations

import pathlib
import signal
import socket
import threading
import time
from collections.abc import Sequence

from absl import app, flags

from hackable_diffusion import cli, run_config
from hackable_diffusion.tasks.capabilities import GeneratesText, require

FLAGS = flags.FLAGS
_HAS_RUN = {"saved": False}


def define_flags(argv: list[str]):
    _, saved = cli.define_workdir_config_flag(argv)
    _HAS_RUN["saved"] = saved is not None
    flags.DEFINE_string("workdir", None, "A training run directory, or hf:DIR for a Hugging Face checkpoint.")
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0 for every interface).")
    flags.DEFINE_integer(
        "port", 8000, "Port to listen on (0 = any free port, printed at start).", lower_bound=0, upper_bound=65535
    )
    flags.DEFINE_integer("max_batch", 8, "Most requests in one generation (rounded up to a power of two).")
    flags.DEFINE_integer("max_queue", 64, "Most waiting requests; more are answered 429.")
    flags.DEFINE_float("request_timeout_s", 600.0, "A request still running after this long gets a 504.")
    flags.DEFINE_float("shutdown_timeout_s", 60.0, "On SIGTERM, how long running requests may take to finish.")
    flags.DEFINE_integer("prompt_bucket", 32, "Prompt widths are padded to a multiple of this (fewer compilations).")
    flags.DEFINE_integer("max_context", 0, "Most prompt + max_tokens tokens (0 = twice the trained sequence length).")
    flags.DEFINE_string("model_name", "", "The model id clients send (default: the run directory's name).")
    flags.DEFINE_enum("weights", "ema", ["ema", "raw"], "Which weights of a toolbox run: the EMA or the trained ones.")
    flags.DEFINE_integer(
        "vocab_chunk", -1, "The canvas step reads the vocabulary in chunks of this size (-1: 16,384 if larger; 0: off)."
    )
    flags.DEFINE_bool("warm_up", True, "Compile the batch-1 and full-batch programs before taking requests.")


class ServeAddressError(ValueError):
    """The server cannot listen where it was asked to (bad input, one line)."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (0: any free port) for uvicorn to listen on, bound before anything is announced;
    raises ServeAddressError for a port outside 0-65535, an address that does not resolve, or one that cannot be bound
    (a port another program listens on)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ServeAddressError(f"--port={port} is not a port: give one in 1-65535 (0: any free port).")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ServeAddressError(f"--host={host!r} does not resolve ({e}): give an address such as 127.0.0.1.") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart reuses a port left in TIME_WAIT
        sock.bind(address)
    except OSError as e:
        sock.close()
        reason = e.strerror or str(e)
        raise ServeAddressError(
            f"cannot listen on {host}:{port} ({reason}): another program may be using the port; pass another --port "
            "(0: any free port)."
        ) from None
    sock.set_inheritable(True)
    return sock


def load_engine(workdir: str, config, *, weights: str = "ema", model_name: str = "", **engine_args):
    """(engine, chat template) for a run directory or hf:DIR, with the config's overrides applied."""
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import hf_runs, toolbox
    from hackable_diffusion.serve import chat
    from hackable_diffusion.serve.engine import Engine

    run_dir = hf_runs.resolve_workdir(workdir)
    exp = exp_lib.build(config, run_dir, inference=True)
    require(exp.task, GeneratesText, f"serving {workdir} (the server serves text)")
    params, _ = toolbox.load_params(exp, run_dir, weights=weights)
    init = config.get("init", {})
    template = chat.find_chat_template(init.get("checkpoint")) if init.get("kind") == "hf" else None
    name = model_name or pathlib.Path(workdir.removeprefix(hf_runs.HF_PREFIX)).name
    return Engine(exp, params, model_name=name, **engine_args), template


def warm_up(engine, prompt: str = "", max_tokens: int | None = None, batch_sizes: Sequence[int] = ()) -> float:
    """Runs one request at batch 1 and a full batch (and any `batch_sizes`), each once plain and once streamed (a
    batch with a streaming client runs the denoising loop with a per-step host callback: another program), so that
    the first clients do not wait for compilation; returns the seconds it took. The engine's statistics start afresh
    afterwards."""
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.serve.requests import EngineStats, Request, next_power_of_two

    start = time.perf_counter()
    for size in sorted({1, engine.max_batch, *(next_power_of_two(b) for b in batch_sizes)}):
        for stream in (False, True):
            done = threading.Semaphore(0)
            release = lambda event, d=done: d.release() if event["type"] in ("done", "error") else None  # noqa: E731
            tokens = max_tokens or engine.canvas_length
            count = min(size, engine.max_batch)
            engine.submit_many([Request(engine.encode(prompt), tokens, release, stream=stream) for _ in range(count)])
            for _ in range(count):
                done.acquire()
    engine.stats = EngineStats()  # the figures /metrics shows are the clients'
    return time.perf_counter() - start


class ServerThread:
    """uvicorn serving `app` from a background thread (tests, benchmarks): `with ServerThread(app) as s: s.url`."""

    def __init__(self, app_, host: str = "127.0.0.1", port: int = 0, shutdown_timeout_s: float = 30.0):
        import uvicorn

        config = uvicorn.Config(
            app_, host=host, port=port, log_level="warning", timeout_graceful_shutdown=shutdown_timeout_s
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (is the port free?).")
            time.sleep(0.02)
        return self

    @property
    def url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)


def main(argv):
    del argv
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.checkpoints import hf_runs

    try:
        import uvicorn

        # deferred: the command loads no jax before it runs (test_light_imports.py)
        from hackable_diffusion.serve.app import build_app
    except ImportError as e:
        raise app.UsageError(f"the server needs its extra: pip install -e '.[serve]' ({e}).") from None
    if FLAGS.workdir is None:
        raise app.UsageError("--workdir is required (a run directory, or hf:DIR).")
    cli.quiet_library_logs()
    if not _HAS_RUN["saved"]:
        run_config.load_saved_config(hf_runs.resolve_workdir(FLAGS.workdir))  # the clear error: no run there
    listening = bind_socket(FLAGS.host, FLAGS.port)  # a taken port stops the command here, before it is announced
    port = listening.getsockname()[1]
    application = build_app(None, request_timeout_s=FLAGS.request_timeout_s)  # 503 until the model is ready
    server = uvicorn.Server(
        uvicorn.Config(
            application,
            host=FLAGS.host,
            port=port,
            log_level="info",
            timeout_graceful_shutdown=FLAGS.shutdown_timeout_s,
        )
    )
    loaded: dict = {}

    def load() -> None:  # while the server answers 503 "loading"
        try:
            engine, template = load_engine(
                FLAGS.workdir,
                FLAGS.config,
                weights=FLAGS.weights,
                model_name=FLAGS.model_name,
                max_batch=FLAGS.max_batch,
                max_queue=FLAGS.max_queue,
                prompt_bucket=FLAGS.prompt_bucket,
                max_context=FLAGS.max_context or None,
                vocab_chunk=None if FLAGS.vocab_chunk < 0 else FLAGS.vocab_chunk,
            )
            if FLAGS.warm_up:
                print(f"compiling (batch 1 and {engine.max_batch}) ...", flush=True)
                print(f"warm in {warm_up(engine):.1f} s", flush=True)
            application.state.api.set_engine(engine, template)
            loaded["engine"] = engine
            kind = "autoregressive" if engine.is_autoregressive else f"diffusion, canvas {engine.canvas_length}"
            print(f"ready: {engine.model_name!r} ({kind})", flush=True)
        except Exception as e:  # noqa: BLE001 - reported by the main thread after the server stops
            loaded["error"] = e
            server.should_exit = True

    print(f"serving on http://{FLAGS.host}:{port}/ (OpenAI API under /v1); loading the model ...", flush=True)
    threading.Thread(target=load, name="serve-load", daemon=True).start()

    def stopped(signum, frame):  # uvicorn drains, then re-raises the signal it caught: a clean exit, not a kill
        raise SystemExit(0)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stopped)
    try:
        server.run(sockets=[listening])
    except SystemExit as stop:  # a signal: a clean stop; uvicorn's own start-up failure keeps its status
        if stop.code not in (0, None):
            raise
    finally:
        listening.close()
    if "error" in loaded:
        raise loaded["error"]
    if "engine" in loaded:
        s = loaded["engine"].stats
        print(f"stopped: {s.completed} requests answered, {s.cancelled} cancelled, {s.rejected} refused", flush=True)
