"""The OpenAI-compatible HTTP API over the serving engine (Starlette; run by uvicorn).

Routes follow OpenAI's (and vLLM's OpenAI server's) request and response shapes: `GET /v1/models`,
`POST /v1/completions`, `POST /v1/chat/completions` (streaming as server-sent events, `data: [DONE]` at the end),
`GET /health`, `GET /metrics` (Prometheus text) and `GET /`, a page that shows a canvas denoising live.

Request fields: `prompt` (a string or a list of strings: one choice each) or `messages`, `max_tokens` (default 16
for completions as OpenAI; the run's sampler length for chat), `temperature` (omitted: the run's own sampler; 0:
near-greedy), `stop` (a string or up to 16), `seed` (default 0), `stream`, `n` (1 only). The toolbox's sampler fields
go in the extra body: `steps` (denoising steps per canvas), `selection` ({"rule": ..., its arguments}),
`first_canvas` (tokens in the first canvas), `stream_steps` (also send the canvas after every step as
`event: step`). Fields OpenAI has but this server does not compute (`logprobs`, `echo`, `best_of` > 1, penalties
other than 0, `n` > 1, tools) are refused with a 400 rather than silently ignored.

Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 bad request (text the run's
tokenizer cannot encode, e.g. characters outside a character vocabulary, included), 404 unknown model
(as OpenAI's and vLLM's servers answer) or route, 429 queue full, 503 while the model loads or the server shuts down,
504 request timeout, 500 generation failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from hackable_diffusion.serve import chat, metrics
from hackable_diffusion.serve.engine import Engine
from hackable_diffusion.serve.requests import QueueFull, Request, RequestError, SamplerSettings

PAGE = pathlib.Path(__file__).with_name("page") / "index.html"
MAX_STOPS = 16  # OpenAI allows 4; lm-eval's local-completions sends a task's stop strings plus EOS untrimmed
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 503: "unavailable"}
UNSUPPORTED = {  # field: the value that means "off"
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "suffix": (None, ""),
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _int(body: dict, name: str, default: int | None, low: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {value!r}.", name)
    if low is not None and value < low:
        raise ApiError(400, f"{name} must be >= {low}, got {value}.", name)
    return value


def _float(body: dict, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{name} must be a number, got {value!r}.", name)
    return float(value)


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop must be a string or a list of at most {MAX_STOPS} strings.", "stop")
    return tuple(stops)


def _settings(body: dict) -> SamplerSettings:
    selection = body.get("selection")
    rule, args = None, ()
    if selection is not None:
        if not isinstance(selection, dict) or not isinstance(selection.get("rule"), str):
            raise ApiError(400, 'selection must be an object {"rule": NAME, ...its arguments}.', "selection")
        rule = selection["rule"]
        args = tuple(sorted((k, v) for k, v in selection.items() if k != "rule"))
    temperature = _float(body, "temperature")
    if temperature is not None and temperature < 0:
        raise ApiError(400, f"temperature must be >= 0, got {temperature}.", "temperature")
    top_p = _float(body, "top_p")
    if top_p not in (None, 1.0):
        raise ApiError(400, "top_p other than 1 is not supported; use temperature or the selection rule.", "top_p")
    return SamplerSettings(
        num_steps=_int(body, "steps", None, 1),
        selection_rule=rule,
        selection_args=args,
        temperature=temperature,
        first_canvas=_int(body, "first_canvas", None, 1),
    )


def _check_common(body: Any, engine: Engine) -> None:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object.")
    model = body.get("model")
    if model is not None and model != engine.model_name:
        raise ApiError(404, f"model {model!r} does not exist; this server serves {engine.model_name!r}.", "model")
    for name, off in UNSUPPORTED.items():
        if body.get(name) not in off:
            raise ApiError(400, f"{name} is not supported by this server.", name)
    if (_int(body, "n", 1, 1) or 1) != 1:
        raise ApiError(400, "n > 1 is not supported; send one request per completion (they are batched).", "n")


class Api:
    """The route handlers, bound to one engine."""

    def __init__(self, engine: Engine | None, chat_template: str | None = None, request_timeout_s: float = 600.0):
        self.engine = engine
        self.chat_template = chat_template
        self.request_timeout_s = request_timeout_s
        self.created = int(time.time())

    def set_engine(self, engine: Engine, chat_template: str | None = None) -> None:
        """The model is ready: routes stop answering 503."""
        self.chat_template = chat_template
        self.engine = engine

    async def body(self, http: HttpRequest) -> Any:
        try:
            return await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            raise ApiError(400, "the request body is not valid JSON.") from None

    # ---- plain routes --------------------------------------------------------------------------------------------
    async def models(self, http: HttpRequest) -> Response:
        card = {
            "id": self.engine.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "hackable-diffusion",
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, http: HttpRequest) -> Response:
        return JSONResponse({"status": "ok", "queue_depth": self.engine.queue_depth()})

    async def metrics(self, http: HttpRequest) -> Response:
        return PlainTextResponse(metrics.render(self.engine), media_type="text/plain; version=0.0.4")

    async def page(self, http: HttpRequest) -> Response:
        return HTMLResponse(PAGE.read_text())

    # ---- completions ---------------------------------------------------------------------------------------------
    def _requests(self, prompts: list[str], body: dict, default_max: int) -> list[Request]:
        settings = _settings(body)
        max_tokens = _int(body, "max_tokens", None, 1) or _int(body, "max_completion_tokens", None, 1) or default_max
        stops, seed = _stops(body), _int(body, "seed", 0)
        want_steps = bool(body.get("stream_steps", False))
        out = []
        for text in prompts:
            try:
                prompt_ids = self.engine.encode(text)
            except ValueError as e:  # the client's text, not the server: a 400 (a 500 would be retried)
                raise ApiError(400, f"the prompt cannot be encoded by this model's tokenizer: {e}", "prompt") from None
            request = Request(
                prompt_ids=prompt_ids,
                max_tokens=max_tokens,
                emit=lambda event: None,
                stop=stops,
                seed=seed,
                settings=settings,
                want_steps=want_steps,
                stream=bool(body.get("stream", False)),
                timeout_s=self.request_timeout_s,
            )
            try:
                self.engine.check(request)
            except RequestError as e:
                raise ApiError(400, str(e)) from None
            out.append(request)
        return out

    def _submit(self, requests: list[Request]) -> list[asyncio.Queue]:
        loop = asyncio.get_running_loop()
        queues = []
        for request in requests:
            events: asyncio.Queue = asyncio.Queue()
            request.emit = lambda event, q=events: loop.call_soon_threadsafe(q.put_nowait, event)
            queues.append(events)
        try:
            self.engine.submit_many(requests)  # together: a list of prompts shares one generation
        except QueueFull as e:
            raise ApiError(429, str(e)) from None
        except RequestError as e:
            raise ApiError(400, str(e)) from None
        except RuntimeError as e:
            raise ApiError(503, str(e)) from None
        return queues

    async def completions(self, http: HttpRequest) -> Response:
        body = await self.body(http)
        _check_common(body, self.engine)
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise ApiError(400, "prompt must be a string or a non-empty list of strings.", "prompt")
        if body.get("stream") and len(prompts) > 1:
            raise ApiError(400, "stream with a list of prompts is not supported; send one request per prompt.")
        requests = self._requests(prompts, body, default_max=16)
        return await self._respond(http, requests, body, chat_kind=False)

    async def chat_completions(self, http: HttpRequest) -> Response:
        body = await self.body(http)
        _check_common(body, self.engine)
        try:
            messages = chat.check_messages(body.get("messages"))
            prompt = chat.render(messages, self.chat_template)
        except ValueError as e:
            raise ApiError(400, str(e), "messages") from None
        default_max = int(self.engine.exp.config.sampler.get("max_new_tokens") or 256)
        requests = self._requests([prompt], body, default_max=default_max)
        return await self._respond(http, requests, body, chat_kind=True)

    async def _respond(self, http: HttpRequest, requests: list[Request], body: dict, chat_kind: bool) -> Response:
        ident = ("chatcmpl-" if chat_kind else "cmpl-") + uuid.uuid4().hex[:24]
        head = {"id": ident, "created": int(time.time()), "model": self.engine.model_name}
        queues = self._submit(requests)
        if body.get("stream"):
            return StreamingResponse(
                self._stream(requests[0], queues[0], head, chat_kind), media_type="text/event-stream"
            )
        waits = [asyncio.ensure_future(self._wait(http, r, q)) for r, q in zip(requests, queues)]
        try:
            finals = await asyncio.gather(*waits)
        finally:
            for r in requests:
                r.cancel()  # no-op for finished rows; frees the rows of a client that went away
            for w in waits:
                w.cancel()  # the other prompts of a request that failed
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for index, final in enumerate(finals):
            prompt_tokens += final["prompt_tokens"]
            completion_tokens += final["completion_tokens"]
            if chat_kind:
                message = {"role": "assistant", "content": final["text"]}
                choices.append({"index": index, "message": message, "finish_reason": final["finish_reason"]})
            else:
                choices.append(
                    {"index": index, "text": final["text"], "finish_reason": final["finish_reason"], "logprobs": None}
                )
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        kind = "chat.completion" if chat_kind else "text_completion"
        return JSONResponse({**head, "object": kind, "choices": choices, "usage": usage})

    async def _wait(self, http: HttpRequest, request: Request, events: asyncio.Queue) -> dict:
        loop = asyncio.get_running_loop()
        next_check = loop.time() + 1.0
        while True:
            try:
                event = await asyncio.wait_for(events.get(), timeout=1.0)
            except asyncio.TimeoutError:
                event = None
            if loop.time() >= next_check:  # once a second, however many events arrive
                next_check = loop.time() + 1.0
                if await http.is_disconnected():
                    request.cancel()
                    raise ApiError(499, "the client closed the connection.")
            if event is None:
                continue
            if event["type"] == "done":
                return event
            if event["type"] == "error":
                raise ApiError(int(event.get("code", 500)), event["message"])

    async def _stream(self, request: Request, events: asyncio.Queue, head: dict, chat_kind: bool):
        kind = "chat.completion.chunk" if chat_kind else "text_completion"

        def chunk(text: str | None, finish_reason: str | None, first: bool = False) -> str:
            if chat_kind:
                delta = {} if text is None else {"content": text}
                if first:
                    delta["role"] = "assistant"
                choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
            return f"data: {json.dumps({**head, 'object': kind, 'choices': [choice]})}\n\n"

        try:
            if chat_kind:
                yield chunk(None, None, first=True)
            while True:
                event = await events.get()
                if event["type"] == "step":
                    payload = {"canvas": event["canvas"], "step": event["step"], "pieces": event["pieces"]}
                    yield f"event: step\ndata: {json.dumps(payload)}\n\n"
                elif event["type"] == "text":
                    yield chunk(event["text"], None)
                elif event["type"] == "done":
                    yield chunk(None, event["finish_reason"])
                    yield "data: [DONE]\n\n"
                    return
                else:  # an error mid-stream: OpenAI's error object as a data event, then the end
                    status = int(event.get("code", 500))
                    error = {
                        "message": event["message"],
                        "type": ERROR_TYPES.get(status, "server_error"),
                        "code": status,
                    }
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    yield "data: [DONE]\n\n"
                    return
        finally:
            request.cancel()  # the client went away (or the stream ended): its row is freed at the next canvas


def build_app(
    engine: Engine | None, *, chat_template: str | None = None, request_timeout_s: float = 600.0
) -> Starlette:
    """The Starlette application; the engine is closed (drained) when the app shuts down.

    `engine=None` starts the server before the model is ready: every route but the page answers 503 ("the model is
    loading") until `app.state.api.set_engine(engine)` is called (the command loads and warms the model meanwhile)."""
    api = Api(engine, chat_template=chat_template, request_timeout_s=request_timeout_s)

    def guarded(handler, needs_engine: bool = True):
        async def endpoint(http: HttpRequest) -> Response:
            if needs_engine and api.engine is None:
                response = error_response(503, "the model is loading; retry in a few seconds.")
                response.headers["Retry-After"] = "5"
                return response
            try:
                return await handler(http)
            except ApiError as e:
                return error_response(e.status, e.message, e.param)
            except Exception as e:  # noqa: BLE001 - anything unforeseen still answers in OpenAI's shape
                return error_response(500, f"{type(e).__name__}: {e}")

        return endpoint

    async def not_found(http: HttpRequest, exc: HTTPException) -> Response:
        return error_response(exc.status_code, f"{http.method} {http.url.path}: {exc.detail}")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if api.engine is not None:
            await asyncio.to_thread(api.engine.close)

    routes = [
        Route("/", guarded(api.page, needs_engine=False), methods=["GET"]),
        Route("/health", guarded(api.health), methods=["GET"]),
        Route("/metrics", guarded(api.metrics), methods=["GET"]),
        Route("/v1/models", guarded(api.models), methods=["GET"]),
        Route("/v1/completions", guarded(api.completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(api.chat_completions), methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found}, lifespan=lifespan)
    app.state.api = api
    return app
