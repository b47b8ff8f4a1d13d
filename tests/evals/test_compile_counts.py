"""The lm-eval adapter's request paths compile once per shape bucket: after one request of each bucket, a stream of
requests of varied lengths inside those buckets (the last batch partial) builds no new program, and neither does a
second pass over the same stream (`training.compilations.count_compilations`)."""

import pytest

pytest.importorskip("lm_eval")

from hackable_diffusion.evals import lm_eval_adapter
from hackable_diffusion.training.compilations import count_compilations


class Request:  # what the adapter reads of lm-eval's Instance
    def __init__(self, *args):
        self.args = args


TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n"


def piece(start: int, length: int) -> str:
    return (TEXT * 2)[start : start + length]


@pytest.fixture(scope="module")
def lm(trained_text_runs):
    # the shared masking run: sequences of 32 tokens (characters), canvases of 8, 4 sampler steps
    return lm_eval_adapter.HackableDiffusionLM(workdir=str(trained_text_runs["masking"]), num_draws=2, batch_size=4)


def assert_compiles_once_per_bucket(call, warm, stream):
    """`call([request])` for each request of `warm` meets every bucket once (each in a batch of its own); then
    `call(stream)`, and `call(stream)` again, must build no program."""
    for request in warm:
        call([request])
    with count_compilations() as first:
        call(stream)
    with count_compilations() as second:
        call(stream)
    assert first.count == 0, f"the stream recompiled after its buckets were warm: {first.summary()}"
    assert second.count == 0, f"a second pass over the same stream recompiled: {second.summary()}"


@pytest.mark.slow
def test_loglikelihood_with_the_greedy_check_compiles_once_per_bucket(lm):
    """Two buckets: contexts and continuations of at most one canvas (8 tokens), and of two. Inside a bucket the
    context lengths (the greedy decode's prompt widths) and continuation lengths vary; the last batch is partial."""
    assert lm.scorer.greedy_check and lm.scorer.canvas_len == 8
    one = [Request(piece(i, 1 + i % 7), piece(40 + i, 1 + (3 * i) % 8)) for i in range(8)]
    two = [Request(piece(i, 8 + i % 8), piece(20 + i, 9 + (5 * i) % 8)) for i in range(6)]

    def call(requests):
        return lm.loglikelihood(requests, disable_tqdm=True)

    assert_compiles_once_per_bucket(call, [one[0], two[0]], one + two)


@pytest.mark.slow
def test_loglikelihood_rolling_compiles_once_per_bucket(lm):
    """Documents of varied lengths: windows of 30 tokens and a last window of any length (continuations of 1 to 4
    canvases, four buckets)."""
    documents = [Request(piece(0, n)) for n in (3, 12, 19, 29, 31, 45, 57, 62)]
    warm = [Request(piece(0, n)) for n in (8, 16, 24, 30)]

    def call(requests):
        return lm.loglikelihood_rolling(requests, disable_tqdm=True)

    assert_compiles_once_per_bucket(call, warm, documents)


@pytest.mark.slow
def test_generate_until_compiles_once_per_bucket(lm):
    """Prompts of 1 to 16 tokens (one width bucket), `max_gen_toks` of 1 to 8 and 9 to 16 (one and two canvases),
    groups of varied sizes (partial batches) and stop strings."""
    stream = [Request(piece(i, 1 + i % 14), {"until": ["\n"], "max_gen_toks": 1 + (5 * i) % 8}) for i in range(5)]
    stream += [Request(piece(i, 2 + i), {"until": [":"], "max_gen_toks": 9 + i}) for i in range(3)]
    warm = [Request("A", {"until": [], "max_gen_toks": 8}), Request("B", {"until": [], "max_gen_toks": 16})]

    def call(requests):
        return lm.generate_until(requests, disable_tqdm=True)

    assert_compiles_once_per_bucket(call, warm, stream)
