"""The serving engine compiles once per shape bucket (batch slots, prompt width, canvases) and sampler setting: after
one batch of each bucket, batches of requests with other prompt lengths, max_tokens, seeds, stop strings and
temperatures build no program (`training.compilations.count_compilations`); a request's temperature is a traced
factor, not a constant of the compiled loop."""

import jax
import pytest
from _tiny_configs import tiny_text_config

from hackable_diffusion import experiment
from hackable_diffusion.models import transformer as T
from hackable_diffusion.serve.engine import Engine
from hackable_diffusion.serve.requests import Request, SamplerSettings
from hackable_diffusion.training.compilations import count_compilations

PROMPT = "ROMEO: what light through yonder"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    config = tiny_text_config("masking", moe=False)  # canvases of 8, 4 steps
    exp = experiment.build(config, str(tmp_path_factory.mktemp("serve_compiles")), inference=True)
    params = T.init_params(exp.model, jax.random.key(0))  # random weights: the programs are what is counted
    return Engine(exp, params, max_batch=4, prompt_bucket=8, max_context=64, start=False)


def batch(engine, rows, temperature=None):
    """Requests (prompt characters, max_tokens, seed, stop strings) with one sampler setting; the events are kept."""
    events = []
    settings = SamplerSettings(temperature=temperature)
    requests = [
        Request(engine.encode(PROMPT[:n]), max_tokens=m, emit=events.append, seed=seed, stop=stop, settings=settings)
        for n, m, seed, stop in rows
    ]
    return requests, events


@pytest.mark.slow
def test_requests_inside_the_warm_buckets_compile_nothing(engine):
    """Buckets: 3 or 4 rows (4 slots), prompts of 1-7 characters + BOS (a width of 8), max_tokens 1-8 (one canvas);
    settings: the run's sampler, and a request temperature."""
    for temperature in (None, 0.7):
        requests, _ = batch(engine, [(5, 8, 0, ()), (3, 8, 1, ()), (1, 6, 2, ())], temperature)
        engine._run(requests)
    stream = [
        ([(7, 5, 3, ()), (2, 3, 4, ("e",)), (6, 1, 5, ()), (4, 8, 6, ())], None),
        ([(1, 2, 7, ()), (3, 7, 8, ("\n",)), (7, 8, 9, ())], 1.3),
        ([(2, 8, 10, ()), (5, 4, 11, ()), (4, 6, 12, ())], 0.45),
    ]
    for second_pass in (False, True):
        with count_compilations() as log:
            for rows, temperature in stream:
                requests, events = batch(engine, rows, temperature)
                engine._run(requests)
                assert sum(e["type"] == "done" for e in events) == len(rows), events
        assert log.count == 0, f"{'a second pass' if second_pass else 'the stream'} recompiled: {log.summary()}"


@pytest.mark.slow
def test_after_the_servers_warm_up_streamed_requests_compile_nothing(tmp_path):
    """`serve.command.warm_up` compiles the streamed loop too (a batch with a streaming client runs the denoising loop
    with a per-step host callback): the first streaming clients of a warm server wait for no compilation."""
    from hackable_diffusion.serve.command import warm_up

    config = tiny_text_config("masking", moe=False)
    exp = experiment.build(config, str(tmp_path), inference=True)
    params = T.init_params(exp.model, jax.random.key(0))
    warm = Engine(exp, params, max_batch=2, prompt_bucket=8, max_context=64)
    try:
        warm_up(warm, prompt=PROMPT[:5], max_tokens=8)
        with count_compilations() as log:
            for size in (1, 2):
                events = []
                requests = [
                    Request(warm.encode(PROMPT[: 3 + i]), max_tokens=8, emit=events.append, seed=i, stream=True)
                    for i in range(size)
                ]
                warm._run(requests)
                assert sum(e["type"] == "done" for e in events) == size, events
        assert log.count == 0, f"streamed requests after the warm-up compiled: {log.summary()}"
    finally:
        warm.close()
