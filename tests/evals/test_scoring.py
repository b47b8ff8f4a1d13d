"""evals/scoring.py and evals/local_tasks.py: the adapter's log-likelihoods against the toolbox's own estimators, the
diffusion layout (context fixed, continuation on a canvas boundary), rolling windows, generation, the local tasks."""

import math

import jax
import numpy as np
import pytest

from hackable_diffusion import experiment
from hackable_diffusion.checkpoints import toolbox
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data.tokenizers import BOS_ID
from hackable_diffusion.evals import local_tasks, scoring
from hackable_diffusion.tasks import text
from hackable_diffusion.tasks.text_task import TextTask


@pytest.fixture(scope="module")
def runs(trained_text_runs):
    out = {}
    for name in ("none", "masking"):
        exp = experiment.from_workdir(str(trained_text_runs[name]))
        out[name] = (exp, toolbox.load_params(exp, str(trained_text_runs[name]))[0])
    return out


PAIRS = [("ROMEO:\nWhat", " is this?"), ("JULIET", ":\nO Romeo"), ("", "First Citizen")]


@pytest.mark.slow
def test_autoregressive_loglikelihood_is_the_exact_nll_and_the_greedy_flag_is_the_argmax(runs):
    exp, params = runs["none"]
    scorer = scoring.Scorer(exp, params, batch_size=2)
    pairs = [(scorer.encode(c), scorer.encode(x)) for c, x in PAIRS]
    scores = scorer.loglikelihood(pairs)
    for (context, continuation), score in zip(pairs, scores):
        own = text.generative_perplexity(exp, params, [[BOS_ID] + context], [continuation], batch_size=1)
        assert score.num_tokens == len(continuation) and score.stderr == 0.0
        np.testing.assert_allclose(-score.logprob, own["gen_nats_per_token"] * own["gen_tokens"], rtol=1e-5)
    # The greedy continuation, token by token from the full causal pass, is flagged greedy; one changed token is not.
    context = scorer.encode("ROMEO:\n")
    greedy = []
    for _ in range(4):  # one padded width: one compile
        row = [BOS_ID] + context + greedy
        tokens = np.zeros((1, 16), np.int32)
        tokens[0, : len(row)] = row
        logits, _ = scoring._causal_forward(exp.model, params, tokens)
        greedy.append(int(np.argmax(np.asarray(logits)[0, len(row) - 1])))
    changed = greedy[:-1] + [(greedy[-1] + 1 - 4) % (exp.model.cfg.vocab_size - 4) + 4]
    flags = [s.is_greedy for s in scorer.loglikelihood([(context, greedy), (context, changed)])]
    assert flags == [True, False]


@pytest.mark.slow
def test_diffusion_elbo_per_example_is_the_objectives_estimator(runs):
    """elbo_per_example sums to the objective's elbo_bits_per_token on the same batch and key (one estimator)."""
    exp, params = runs["masking"]
    batch = {k: jax.numpy.asarray(v) for k, v in text_lib.make_eval_batches(exp.data.eval_sequences[:4], 4)[0].items()}
    key = jax.random.key(3)
    nats, scored = exp.objective.elbo_per_example(params, batch, key)
    _, metrics = exp.objective(params, batch, key)
    np.testing.assert_allclose(
        float(np.sum(nats)) / float(np.sum(scored)) / math.log(2), float(metrics["elbo_bits_per_token"]), rtol=1e-5
    )
    assert int(np.sum(scored)) == int(np.sum(batch["weights"] > 0))


@pytest.mark.slow
def test_diffusion_rolling_bound_agrees_with_evaluate_likelihood_within_three_standard_errors(runs):
    exp, params = runs["masking"]
    sequences = exp.data.eval_sequences[:8]
    own = text.evaluate_likelihood(exp, params, batch_size=8, num_batches=1)  # the same 8 sequences, one draw
    repeats = [
        text.evaluate_likelihood(exp, params, batch_size=8, num_batches=1, seed=s)["bits_per_token"] for s in range(4)
    ]
    own_se = float(np.std(repeats, ddof=1) / 2)
    scorer = scoring.Scorer(exp, params, num_draws=4, batch_size=8, greedy_check=False)
    documents = [list(map(int, row)) for row in sequences]
    scores = scorer.loglikelihood_rolling(documents)
    bits = -sum(s.logprob for s in scores) / sum(s.num_tokens for s in scores) / math.log(2)
    se = math.sqrt(sum(s.stderr**2 for s in scores)) / sum(s.num_tokens for s in scores) / math.log(2)
    assert sum(s.num_tokens for s in scores) == sequences.size
    assert abs(bits - np.mean(repeats)) < 3 * math.hypot(se, own_se), (bits, np.mean(repeats), se, own_se, own)


@pytest.mark.slow
def test_diffusion_scores_are_deterministic_and_the_context_is_never_scored(runs):
    exp, params = runs["masking"]
    scorer = scoring.Scorer(exp, params, num_draws=3, batch_size=3)
    pairs = [(scorer.encode(c), scorer.encode(x)) for c, x in PAIRS]
    first, again = scorer.loglikelihood(pairs), scorer.loglikelihood(pairs)
    assert first == again
    assert all(s.logprob < 0 and s.stderr >= 0 and isinstance(s.is_greedy, bool) for s in first)
    layout = scorer.diffusion_layout([scorer.fit(c, x) for c, x in pairs])
    c = scorer.canvas_len
    for row, (context, continuation) in enumerate(scorer.fit(c_, x_) for c_, x_ in pairs):
        start = int(np.argmax(layout["weights"][row] > 0))
        first_scored = int(np.argmax(layout["weights"][row] * ~layout["fixed"][row] > 0))
        assert first_scored % c == 0  # the continuation starts a canvas
        assert layout["fixed"][row].sum() == len(context) and (layout["tokens"][row, start] == BOS_ID)
        assert list(layout["tokens"][row, first_scored : first_scored + len(continuation)]) == continuation


def test_fit_keeps_the_end_of_the_context_and_long_continuations_are_scored_in_pieces():
    class Exp:  # the parts of an Experiment that fit() reads
        task = TextTask()

        config = type("C", (), {"data": type("D", (), {"seq_len": 10})()})()
        is_autoregressive = True

    scorer = scoring.Scorer(Exp(), None)
    context, continuation = scorer.fit(list(range(20, 40)), [7, 8, 9])
    assert context == [BOS_ID] + list(range(34, 40)) and continuation == [7, 8, 9]
    assert len(context) + len(continuation) == 10
    with pytest.raises(ValueError, match="continuation has 10 tokens"):
        scorer.fit([5], list(range(10, 20)))
    with pytest.raises(ValueError, match="empty continuation"):
        scorer.fit([5], [])
    # A continuation longer than a window: chunks of half a window, each after all the tokens before it that fit.
    pieces = scorer.pieces([5, 6], list(range(10, 23)))
    assert sum((x for _, x in pieces), []) == list(range(10, 23))
    assert pieces[1] == ([BOS_ID, 11, 12, 13, 14], [15, 16, 17, 18, 19])
    assert all(len(c) + len(x) <= 10 and c[0] == BOS_ID for c, x in pieces)
    assert scorer.pieces([5], [7, 8]) == [([BOS_ID, 5], [7, 8])]
    windows = scorer.rolling_windows(list(range(10, 35)))
    assert windows[0][0] == [BOS_ID] and windows[1][0] == [windows[0][1][-1]]
    assert sum((w[1] for w in windows), []) == list(range(10, 35))  # every token scored exactly once
    assert all(len(scorer.fit(c[1:] if c[0] == BOS_ID else c, x)[0]) == len(c) + (c[0] != BOS_ID) for c, x in windows)


@pytest.mark.slow
def test_generation_ends_at_eos_and_respects_the_token_budget(runs):
    for name in ("masking", "none"):
        exp, params = runs[name]
        scorer = scoring.Scorer(exp, params, batch_size=2)
        out = scorer.generate([scorer.encode("ROMEO:"), scorer.encode("JULIET:\nO")], max_new_tokens=10)
        assert len(out) == 2 and all(0 <= len(row) <= 10 for row in out)
        assert all(BOS_ID not in row for row in out)
        assert scorer.generate([scorer.encode("ROMEO:"), scorer.encode("JULIET:\nO")], max_new_tokens=10) == out


def test_local_tasks_are_deterministic_and_encodable():
    docs = local_tasks.next_line_docs(local_tasks.shakespeare_lines(), count=50, context_lines=3, num_choices=4, seed=0)
    assert docs == local_tasks.next_line_docs(
        local_tasks.shakespeare_lines(), count=50, context_lines=3, num_choices=4, seed=0
    )
    lines = local_tasks.shakespeare_lines()
    for doc in docs:
        assert len(set(doc["choices"])) == 4 and doc["context"].endswith("\n")
        window = doc["context"].split("\n")[:-1] + [doc["choices"][doc["label"]]]
        assert any(lines[i : i + 4] == window for i in range(len(lines)))  # the answer is the true next line
    known = set(text_lib.load_shakespeare("train"))
    speeches = local_tasks.shakespeare_speeches(20)
    assert all(set(s) <= known for s in speeches)
    cont = local_tasks.shakespeare_continuation_docs(20, seed=0)
    assert all(d["context"].count("\n") == 2 and d["target"] and "\n" not in d["target"] for d in cont)
    with pytest.raises(ValueError, match="asked for"):
        local_tasks.shakespeare_speeches(10**6)
