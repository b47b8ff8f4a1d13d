"""serve/: the OpenAI-compatible server, through the official `openai` client on 127.0.0.1 — completions and chat,
streamed and not, equal to `sample` for the same prompt and seed; batching that keeps every request equal to its run
alone; the error shape; the queue bound; a client that goes away; timeouts; the first-canvas knob; metrics."""

import json
import threading

import httpx2 as httpx  # what the openai client itself is built on
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from hackable_diffusion import experiment as exp_lib  # noqa: E402
from hackable_diffusion.checkpoints import toolbox  # noqa: E402
from hackable_diffusion.serve import chat, metrics  # noqa: E402
from hackable_diffusion.serve.app import build_app  # noqa: E402
from hackable_diffusion.serve.command import ServerThread  # noqa: E402
from hackable_diffusion.serve.engine import Engine  # noqa: E402
from hackable_diffusion.serve.requests import QueueFull, Request, SamplerSettings, cut_at_stop  # noqa: E402
from hackable_diffusion.tasks import text  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(trained_text_runs):
    """A server over the tiny masking run (canvas 8, 4 steps), with the experiment and weights to compare against."""
    workdir = str(trained_text_runs["masking"])
    exp = exp_lib.from_workdir(workdir)
    params, _ = toolbox.load_params(exp, workdir)
    engine = Engine(exp, params, max_batch=4, max_queue=32, prompt_bucket=8, max_context=256, model_name="tiny")
    with ServerThread(build_app(engine, request_timeout_s=120)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        yield dict(exp=exp, params=params, engine=engine, url=server.url, client=client)


def alone(served, prompt: str, seed: int, max_tokens: int = 16, **sampler):
    """What `sample --seed S --prompt P` prints for the continuation (its own process, one prompt)."""
    exp = served["exp"]
    if sampler:
        exp.config.sampler.update(sampler)  # restored by the caller's copy below
    texts, _ = text.sample_texts(exp, served["params"], [prompt], seed=seed, max_new_tokens=max_tokens)
    return texts[0]


def test_completion_equals_sample_for_the_same_prompt_and_seed(served):
    client = served["client"]
    for prompt, seed in (("ROMEO:", 0), ("First Citizen:\nBefore we", 7)):
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, seed=seed)
        assert got.choices[0].text == alone(served, prompt, seed)
        assert got.usage.completion_tokens >= len(got.choices[0].text) > 0 or got.choices[0].finish_reason == "stop"
        assert got.choices[0].finish_reason in ("stop", "length")


def test_greedy_completion_equals_sample_at_temperature_zero(served):
    client = served["client"]
    got = client.completions.create(model="tiny", prompt="KING:", max_tokens=16, seed=3, temperature=0)
    exp = served["exp"]
    saved = exp.config.sampler.to_dict()
    try:
        s = exp.config.sampler
        s.min_temperature = s.max_temperature = 1e-4
        s.score_temperature = 1.0
        want = text.sample_texts(exp, served["params"], ["KING:"], seed=3, max_new_tokens=16)[0][0]
    finally:
        exp.config.sampler.update(saved)
    assert got.choices[0].text == want
    again = client.completions.create(model="tiny", prompt="KING:", max_tokens=16, seed=99, temperature=0)
    assert again.choices[0].text == want  # greedy: the seed does not matter


def test_streaming_sends_decided_text_as_it_is_final_and_the_same_text(served):
    client = served["client"]
    whole = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=24, seed=5).choices[0].text
    chunks = list(client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=24, seed=5, stream=True))
    texts = [c.choices[0].text for c in chunks if c.choices[0].text]
    assert "".join(texts) == whole
    assert 1 <= len(texts) <= 3 * 4  # at most one chunk per step: 3 canvases of 8 tokens, 4 steps each
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_streamed_and_not_equals_the_completion_of_the_templated_prompt(served):
    client = served["client"]
    messages = [{"role": "system", "content": "Speak verse."}, {"role": "user", "content": "Who goes there?"}]
    prompt = chat.render(messages, None)
    want = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, seed=2).choices[0].text
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, seed=2)
    assert got.choices[0].message.role == "assistant" and got.choices[0].message.content == want
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, seed=2, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want


def test_concurrent_requests_are_batched_and_each_equals_its_run_alone(served):
    client, engine = served["client"], served["engine"]
    batches_before = engine.stats.batches
    jobs = [("ROMEO:", 1), ("JULIET:", 2), ("First Citizen:\nSpeak", 3), ("A", 4), ("ROMEO:", 5), ("B", 6)]
    results = {}

    def ask(prompt, seed):
        results[(prompt, seed)] = (
            client.completions.create(model="tiny", prompt=prompt, max_tokens=16, seed=seed).choices[0].text
        )

    threads = [threading.Thread(target=ask, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.stats.batches - batches_before < len(jobs)  # some requests shared a generation
    for prompt, seed in jobs:
        assert results[(prompt, seed)] == alone(served, prompt, seed), (prompt, seed)
    batch = client.completions.create(model="tiny", prompt=["ROMEO:", "JULIET:"], max_tokens=16, seed=1)
    assert [c.index for c in batch.choices] == [0, 1]
    assert [c.text for c in batch.choices] == [alone(served, "ROMEO:", 1), alone(served, "JULIET:", 1)]


def test_stop_strings_and_max_tokens(served):
    client = served["client"]
    full = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=16, seed=11).choices[0].text
    stop = next((ch for ch in full[2:] if ch.strip()), None)
    assert stop is not None
    got = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=16, seed=11, stop=[stop])
    assert got.choices[0].text == full[: full.index(stop)] and got.choices[0].finish_reason == "stop"
    short = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=5, seed=11)
    assert short.usage.completion_tokens <= 5 and full.startswith(short.choices[0].text)


def test_bad_requests_get_400_with_openai_error_shape(served):
    client, url = served["client"], served["url"]
    bad = [
        dict(max_tokens=-1),
        dict(max_tokens=1_000),  # past the context
        dict(extra_body={"selection": {"rule": "no_such_rule"}}),
        dict(extra_body={"steps": 0}),
        dict(n=2),
        dict(logprobs=2),
        dict(temperature=-1),
    ]
    for fields in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny", prompt="ROMEO:", **{"max_tokens": 8, **fields})
        error = e.value.body
        assert e.value.status_code == 400 and error["message"] and error["type"] == "invalid_request_error", fields
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=4)
    raw = httpx.post(url + "/v1/completions", content=b"{not json", timeout=30)
    assert raw.status_code == 400 and "JSON" in raw.json()["error"]["message"]
    raw = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "hi"}]}, timeout=30)
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "messages"
    assert httpx.get(url + "/v1/nothing", timeout=30).json()["error"]["code"] == 404


def test_a_client_that_goes_away_frees_its_row(served, monkeypatch):
    from hackable_diffusion.serve import engine as engine_lib

    engine, url = served["engine"], served["url"]
    cancelled_before = engine.stats.cancelled
    hung_up, original = threading.Event(), engine_lib.gen_lib.stream_canvases

    def held_after_the_first_canvas(*args, **kwargs):  # the request cannot finish before the hang-up is seen
        canvases = original(*args, **kwargs)
        yield next(canvases)
        hung_up.wait(60)
        yield from canvases

    monkeypatch.setattr(engine_lib.gen_lib, "stream_canvases", held_after_the_first_canvas)
    body = {"model": "tiny", "prompt": "ROMEO:", "max_tokens": 64, "seed": 1, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one canvas, then hang up
    for _ in range(600):  # the server sees the hang-up and flags the request
        live = engine._live
        if live is not None and all(row.request.cancelled.is_set() for row in live.rows):
            break
        threading.Event().wait(0.05)
    hung_up.set()
    for _ in range(600):
        if engine.stats.cancelled > cancelled_before:
            break
        threading.Event().wait(0.05)
    assert engine.stats.cancelled == cancelled_before + 1
    assert served["client"].completions.create(model="tiny", prompt="A", max_tokens=8).choices  # still serving


def test_step_events_and_the_first_canvas_knob(served):
    url = served["url"]
    body = {"prompt": "ROMEO:", "max_tokens": 16, "seed": 4, "stream": True, "stream_steps": True, "first_canvas": 2}
    steps, texts = [], []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: {"):
                payload = json.loads(line[len("data: ") :])
                (steps if event == "step" else texts).append(payload)
                event = None
    assert steps and steps[0]["canvas"] == 0 and len(steps[0]["pieces"]) == 2  # the short first canvas
    assert [s["step"] for s in steps if s["canvas"] == 0] == [1]  # ceil(4 steps x 2 / 8): one step
    later = [s for s in steps if s["canvas"] == 1]
    assert {len(s["pieces"]) for s in later} == {8} and [s["step"] for s in later] == list(range(1, len(later) + 1))
    assert any(p is None for p in later[0]["pieces"])  # masked positions left after a full canvas's first step
    first_text = next(t["choices"][0]["text"] for t in texts if t["choices"][0]["text"])
    assert 0 < len(first_text) <= 2


def test_queue_bound_and_timeouts(served):
    exp, params = served["exp"], served["params"]
    engine = Engine(exp, params, max_batch=2, max_queue=2, start=False)
    events = []
    for _ in range(2):
        engine.submit(Request(prompt_ids=engine.encode("A"), max_tokens=8, emit=events.append))
    with pytest.raises(QueueFull):
        engine.submit(Request(prompt_ids=engine.encode("A"), max_tokens=8, emit=events.append))
    late = Request(prompt_ids=engine.encode("A"), max_tokens=8, emit=events.append, timeout_s=0.0)
    engine._pending.append(late)  # a request already past its deadline when its generation starts
    engine.start()
    engine.close()
    kinds = sorted(e["type"] for e in events if e["type"] != "text")
    assert kinds == ["done", "done", "error"] and engine.stats.timed_out == 1 and engine.stats.rejected == 1
    assert next(e for e in events if e["type"] == "error")["code"] == 504


def test_health_models_metrics_and_page(served):
    url = served["url"]
    assert httpx.get(url + "/health", timeout=30).json()["status"] == "ok"
    assert [m.id for m in served["client"].models.list()] == ["tiny"]
    page = httpx.get(url + "/metrics", timeout=30).text
    for name in (
        "hd_time_to_first_token_seconds_count",
        "hd_tokens_per_second",
        "hd_queue_depth",
        "hd_batch_occupancy",
    ):
        assert name in page
    count = int(
        next(line for line in page.splitlines() if line.startswith("hd_time_to_first_token_seconds_count")).split()[1]
    )
    assert count >= 1
    html = httpx.get(url + "/", timeout=30).text
    assert "<script>" in html and "/v1/completions" in html


def test_autoregressive_run_is_served_and_equals_sample(trained_text_runs):
    workdir = str(trained_text_runs["none"])
    exp = exp_lib.from_workdir(workdir)
    params, _ = toolbox.load_params(exp, workdir)
    engine = Engine(exp, params, max_batch=2, prompt_bucket=8, model_name="ar")
    with ServerThread(build_app(engine)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        got = client.completions.create(model="ar", prompt="ROMEO:", max_tokens=16, seed=2)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="ar", prompt="ROMEO:", max_tokens=4, extra_body={"steps": 4})
    want = text.sample_texts(exp, params, ["ROMEO:"], seed=2, max_new_tokens=16)[0][0]
    assert got.choices[0].text == want


def test_small_pieces():
    assert cut_at_stop("abc\ndef", ["\n", "e"]) == ("abc", True)
    assert cut_at_stop("abc", ["x", ""]) == ("abc", False)
    messages = chat.check_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert chat.render(messages, None) == "User: hi\n\nAssistant:"
    template = (
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    assert chat.render(messages, template) == "<user>hi<assistant>"
    with pytest.raises(ValueError, match="role"):
        chat.check_messages([{"role": "x", "content": "y"}])
    assert SamplerSettings() == SamplerSettings()  # hashable grouping key
    assert np.isnan(float(metrics._summary("x", "h", [])[2].split()[-1]))


def test_the_command_serves_and_sigterm_lets_a_running_stream_finish(trained_text_runs):
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "hackable_diffusion.serve", "--workdir", str(trained_text_runs["masking"])]
    argv += ["--port", str(port), "--max_context", "256", "--max_batch", "2", "--model_name", "tiny"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.5)
        lines = []
        body = {"model": "tiny", "prompt": "ROMEO:", "max_tokens": 48, "seed": 1, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and not lines:
                    os.kill(process.pid, signal.SIGTERM)  # mid-stream: the request still finishes
                if line.startswith("data: "):
                    lines.append(line)
        assert lines[-1] == "data: [DONE]"
        finals = [json.loads(x[6:]) for x in lines[:-1]]
        assert finals[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        assert process.wait(timeout=120) == 0
        output = process.stdout.read()
        assert f"on http://127.0.0.1:{port}/" in output and "ready:" in output
    finally:
        if process.poll() is None:
            process.kill()


def test_the_server_answers_503_while_the_model_loads(served):
    app = build_app(None)
    with ServerThread(app) as server:
        loading = httpx.post(server.url + "/v1/completions", json={"prompt": "A", "max_tokens": 4}, timeout=30)
        assert loading.status_code == 503 and loading.json()["error"]["code"] == 503
        assert loading.headers["retry-after"] == "5"
        assert httpx.get(server.url + "/health", timeout=30).status_code == 503
        assert httpx.get(server.url + "/", timeout=30).status_code == 200  # the page needs no model
        engine = Engine(served["exp"], served["params"], max_batch=1, prompt_bucket=8)  # closed with the app
        app.state.api.set_engine(engine)
        ready = httpx.post(server.url + "/v1/completions", json={"prompt": "A", "max_tokens": 4}, timeout=60)
        assert ready.status_code == 200 and ready.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_vocabulary_chunked_step_serves_the_same_text(served):
    exp, params = served["exp"], served["params"]
    assert Engine(exp, params, start=False).vocab_chunk == 0  # a small vocabulary: whole arrays
    engine = Engine(exp, params, max_batch=2, prompt_bucket=8, max_context=256, vocab_chunk=16)
    events = []
    done = threading.Event()

    def emit(event):
        events.append(event)
        if event["type"] in ("done", "error"):
            done.set()

    engine.submit(Request(prompt_ids=engine.encode("ROMEO:"), max_tokens=16, emit=emit, seed=3))
    assert done.wait(120)
    engine.close()
    assert events[-1]["type"] == "done" and events[-1]["text"] == alone(served, "ROMEO:", 3)


def test_stop_strings_across_chunks_and_finish_reasons(served):
    from hackable_diffusion.data.tokenizers import EOS_ID
    from hackable_diffusion.serve.engine import _Row

    client = served["client"]
    full = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=24, seed=21).choices[0].text
    stop = full[3:5]  # two characters: a stop string that per-step chunks can split
    whole = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=24, seed=21, stop=[stop])
    chunks = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=24, seed=21, stop=[stop], stream=True)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text == full[: full.index(stop)]
    engine, events = served["engine"], []
    ids = engine.exp.tokenizer.encode("abcdefgh")
    for max_tokens, reason in ((3, "length"), (12, "stop")):  # EOS after the cut is not a stop
        events.clear()
        row = _Row(Request(prompt_ids=[2], max_tokens=max_tokens, emit=events.append))
        engine._advance(row, [*ids[:5], EOS_ID, *ids[5:]])
        assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == reason
        assert "".join(e["text"] for e in events if e["type"] == "text") == events[-1]["text"]
