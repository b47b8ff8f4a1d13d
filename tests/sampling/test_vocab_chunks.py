"""The canvas step over vocabulary chunks (`sampling/vocab_chunks.py`, `DiffusionSampler.vocab_chunk`): the chunk's
Gumbel noise is the full draw's bit for bit, so the candidates equal the unchunked draw's; maxima, argmaxes, entropies,
confidences, margins and the self-conditioning signal equal the whole-vocabulary ones (exactly or to float32 rounding);
whole denoising runs and `generate` give identical tokens; the draw has the categorical distribution; rules that
cannot be chunked are refused; and the compiled step holds no extra vocabulary-sized temporary."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sampling import CANVAS, PROMPTS, VOCAB, masking_sampler, prefilled_prompts, uniform_sampler

from hackable_diffusion import builders, cli, recipes
from aot import layout as aot_layout
from aot import programs as aot_programs
from hackable_diffusion.data.tokenizers import BOS_ID
from hackable_diffusion.models import attention, presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling import counts as C
from hackable_diffusion.sampling import draws as D
from hackable_diffusion.sampling import early_stopping as E
from hackable_diffusion.sampling import remasking as RM
from hackable_diffusion.sampling import scores as SC
from hackable_diffusion.sampling import selection as S
from hackable_diffusion.sampling import selection_base as SB
from hackable_diffusion.sampling import temperature as TEMP
from hackable_diffusion.sampling import vocab_chunks as VC
from hackable_diffusion.sampling.canvas import _denoise, canvas_logits, denoise_canvas
from hackable_diffusion.sampling.constraints import LogitConstraint
from hackable_diffusion.sampling.generate import generate
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.sampling.scores import NEG_LOGIT
from hackable_diffusion.sampling.views import PermutationViews

CHUNKS = [7, 16, 64, 100]  # do not divide 64, divide it, the whole vocabulary, more than it


def test_gumbel_columns_are_the_full_draw_restricted_to_the_columns():
    keys = jax.random.split(jax.random.key(3), 3)
    rows, vocab = 5, 97
    full = np.asarray(jax.vmap(lambda k: jax.random.gumbel(k, (rows, vocab)))(keys))
    for start, stop in [(0, 97), (0, 13), (40, 97), (96, 97)]:
        part = np.asarray(jax.jit(VC.gumbel_columns, static_argnums=(2, 3))(keys, jnp.arange(start, stop), rows, vocab))
        np.testing.assert_array_equal(part, full[:, :, start:stop])


def _logits_with_ties_and_forbidden(b=2, c=5, v=VOCAB):
    logits = np.array(jax.random.normal(jax.random.key(1), (b, c, v)) * 3.0)
    logits[0, 0, [5, 40]] = logits[0, 0].max() + 1.0  # the maximum twice: the second maximum equals it
    logits[1, 2, :] = 0.0  # a flat row: every id ties
    bias = np.zeros(v, np.float32)
    bias[[3, 17]] = NEG_LOGIT  # forbidden ids
    excluded = np.zeros((b, c, v), bool)
    excluded[0, 1, :32] = True  # a task constraint
    return jnp.asarray(logits), jnp.asarray(bias), jnp.asarray(excluded)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_summary_scores_and_candidates_equal_the_whole_vocabulary(chunk):
    logits, bias, excluded = _logits_with_ties_and_forbidden()
    divisors = (0.7, 1.0)
    keys = jax.random.split(jax.random.key(2), logits.shape[0])
    biased = VC.BiasedLogits(logits, bias, excluded)

    @jax.jit
    def chunked(keys):
        scan = VC.summarise(biased, divisors, chunk, gumbel_keys=keys)
        return scan.candidates, tuple(
            VC.with_candidates(s, biased, d, scan.candidates) for s, d in zip(scan.summaries, divisors)
        )

    candidates, summaries = chunked(keys)
    full_biased = jnp.where(excluded, NEG_LOGIT, logits + bias)
    np.testing.assert_array_equal(candidates, D.GumbelMax()(keys, full_biased / divisors[0]))  # the same draw
    for summary, d in zip(summaries, divisors):
        x = full_biased / d
        np.testing.assert_array_equal(summary.max, jnp.max(x, axis=-1))
        np.testing.assert_array_equal(summary.argmax, jnp.argmax(x, axis=-1))
        np.testing.assert_array_equal(summary.second, jax.lax.top_k(x, 2)[0][..., 1])
        np.testing.assert_array_equal(summary.at_candidate, jnp.take_along_axis(x, candidates[..., None], -1)[..., 0])
        np.testing.assert_allclose(summary.max + jnp.log(summary.sumexp), jax.nn.logsumexp(x, axis=-1), rtol=1e-6)
        np.testing.assert_allclose(SC.entropy(summary), SC.entropy(x), rtol=1e-5, atol=1e-6)
        for score in (SC.Confidence(), SC.Confidence(of_top=True), SC.Margin(), SC.NegEntropy()):
            np.testing.assert_allclose(score(summary, candidates), score(x, candidates), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(SC.top_index(summary), SC.top_index(x))
    assert float(summaries[0].second[0, 0]) == float(summaries[0].max[0, 0])  # the tie is kept as the second maximum
    assert float(SC.Margin()(summaries[0], candidates)[0, 0]) == 0.0


@pytest.mark.parametrize("chunk", [7, 16, 100])
def test_self_conditioning_signal_equals_the_whole_vocabulary_one(model_and_params, chunk):
    model, params = model_and_params
    logits = jax.random.normal(jax.random.key(4), (2, CANVAS, VOCAB)) * 4.0
    bias = jnp.zeros(VOCAB).at[3].set(NEG_LOGIT)
    expected = T.model_method(model, params, "sc_signal", (logits + bias) / 0.5)

    @jax.jit
    def chunked(logits):
        table = VC.embedding_table(model, params)
        scan = VC.summarise(VC.BiasedLogits(logits, bias), (1.0, 0.5), chunk, embedding=table, sc_view=1)
        return VC.sc_signal(scan.expected_embedding, model.cfg.embed_dim, expected.dtype)

    np.testing.assert_allclose(chunked(logits), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab, chunk", [(64, 16), (64, 24), (70, 16), (70, 100)])
def test_chunked_blocked_inverse_cdf_draws_the_same_tokens(vocab, chunk):
    logits = jax.random.normal(jax.random.key(5), (3, 6, vocab)) * 2.0
    keys = jax.random.split(jax.random.key(6), 3)
    x = logits / 0.8
    biased = VC.BiasedLogits(logits, jnp.zeros(vocab))
    drawn = jax.jit(lambda k: VC.blocked_inverse_cdf(k, biased, 0.8, jnp.max(x, axis=-1), chunk, 8))(keys)
    np.testing.assert_array_equal(drawn, D.BlockedInverseCdf(8)(keys, x))
    with pytest.raises(ValueError, match="multiple of BlockedInverseCdf.block"):
        VC.blocked_inverse_cdf(keys, biased, 0.8, jnp.max(x, axis=-1), 12, 8)


def test_chunked_draw_has_the_categorical_distribution():
    """4,000 draws per position with chunks of 3 ids over 10: frequencies within 4.5 standard errors of the
    probabilities and a chi-square statistic below the 0.999 quantile; zero-probability ids never drawn."""
    probs = np.array([[0.3, 0.0, 0.2, 0.05, 0.05, 0.1, 0.0, 0.15, 0.1, 0.05], [0.0] * 8 + [0.2, 0.8]])
    logits = np.where(probs > 0, np.log(np.maximum(probs, 1e-30)), NEG_LOGIT).astype(np.float32)
    n = 4000
    rows = jnp.broadcast_to(jnp.asarray(logits), (n, *logits.shape))
    keys = jax.random.split(jax.random.key(11), n)
    biased = VC.BiasedLogits(rows, jnp.zeros(10))
    gumbel = jax.jit(lambda k: VC.summarise(biased, (1.0,), 3, gumbel_keys=k).candidates)(keys)
    blocked = jax.jit(lambda k: VC.blocked_inverse_cdf(k, biased, 1.0, jnp.max(rows, axis=-1), 4, 2))(keys)
    for ids in (np.asarray(gumbel), np.asarray(blocked)):
        seen = np.stack([np.bincount(ids[:, j], minlength=10) / n for j in range(2)])
        se = np.sqrt(probs * (1 - probs) / n) + 1e-12
        assert np.all(np.abs(seen - probs) <= 4.5 * se + 1e-9), (seen, probs)
        assert np.all(seen[probs == 0] == 0)
        positive = probs > 0
        chi2 = (n * (seen - probs) ** 2 / np.where(positive, probs, 1.0))[positive]
        assert chi2[: positive[0].sum()].sum() < 24.32  # row 0: 8 ids with mass, 7 degrees of freedom, 0.999 quantile
        assert chi2[positive[0].sum() :].sum() < 10.83  # row 1: 2 ids, 1 degree of freedom


@dataclasses.dataclass(frozen=True)
class NoTokenEqualToItsPosition(LogitConstraint):
    """A test constraint: position i may not take token 10 + i."""

    def __call__(self, canvas, decided, vocab_size):
        forbidden = 10 + jnp.arange(canvas.shape[1])
        return jnp.arange(vocab_size)[None, None, :] == forbidden[None, :, None]


@pytest.fixture(scope="module")
def prefix_cache(model_and_params):
    return prefilled_prompts(*model_and_params)[2]


SAMPLERS = {
    # DiffusionGemma's sampler as it is: annealed temperature, random draws, entropy bound, self-conditioning,
    # stability + entropy early stopping; equal because the chunked draw reproduces the Gumbel stream
    "diffusiongemma_chunk_24": lambda: uniform_sampler(num_steps=6, vocab_chunk=24),
    # near-greedy tokens, margins scored at T = 1, the model's own probabilities fed back, a task constraint: three
    # logits views in one scan
    "masking_three_views_chunk_16": lambda: masking_sampler(
        S.TopK(score=SC.Margin(), count=C.EvenCount()),
        early_stopping=E.EntropyBelow(0.01),
        temperature=TEMP.ConstantTemperature(1e-3),
        score_temperature=1.0,
        sc_temperature=1.0,
        constraint=NoTokenEqualToItsPosition(),
        vocab_chunk=16,
    ),
    "masking_threshold_blocked_chunk_40": lambda: masking_sampler(
        S.ConfidenceThreshold(0.5, score=SC.Confidence()),
        early_stopping=E.NoEarlyStop(),
        draw=D.BlockedInverseCdf(8),
        vocab_chunk=40,
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_denoise_canvas_with_chunks_gives_the_same_trajectory(model_and_params, prefix_cache, name):
    model, params = model_and_params
    chunked = SAMPLERS[name]()
    whole = chunked.replace(vocab_chunk=0)
    init = whole.initial_canvas(jax.random.key(7), 2)
    runs = [
        denoise_canvas(model, params, prefix_cache, init, jax.random.key(8), sampler=s, return_trajectory=True)
        for s in (whole, chunked)
    ]
    np.testing.assert_array_equal(runs[1].trajectory, runs[0].trajectory)
    np.testing.assert_array_equal(runs[1].steps, runs[0].steps)
    assert len({tuple(t.ravel()) for t in np.asarray(runs[0].trajectory)}) > 1  # the canvas changed along the way


def test_generate_with_chunks_gives_the_same_tokens_at_greedy_settings(model_and_params):
    model, params = model_and_params
    sampler = uniform_sampler(temperature=TEMP.ConstantTemperature(1e-3), num_steps=4, vocab_chunk=24)
    out = [
        generate(model, params, PROMPTS, sampler=s, key=3, max_new_tokens=2 * CANVAS).tokens
        for s in (sampler.replace(vocab_chunk=0), sampler)
    ]
    np.testing.assert_array_equal(out[1], out[0])
    assert len(np.unique(np.asarray(out[0]))) > 2


@dataclasses.dataclass(frozen=True)
class SortedTopRule(SB.SelectionRule):
    """A test rule that reads the whole sorted distribution."""

    def __call__(self, keys, logits, candidates, undecided, info):
        return undecided, jnp.zeros_like(undecided)


@dataclasses.dataclass(frozen=True)
class TailMass:
    """A test score that reads the whole distribution."""

    def __call__(self, logits, candidates):
        return jnp.sort(SC.probabilities(logits), axis=-1)[..., :-5].sum(-1)


@dataclasses.dataclass(frozen=True)
class StopNever(E.EarlyStopping):
    def __call__(self, logits, previous, current, free, previous_argmax=None):
        return jnp.zeros(previous.shape[:1], bool)


def test_sampler_refuses_what_it_cannot_chunk():
    with pytest.raises(ValueError, match="SortedTopRule"):
        uniform_sampler(selection=SortedTopRule(), vocab_chunk=16)
    with pytest.raises(ValueError, match="TailMass"):
        uniform_sampler(selection=S.TopK(score=TailMass()), vocab_chunk=16)
    with pytest.raises(ValueError, match="StopNever"):
        uniform_sampler(early_stopping=E.Chained((E.TokenStability(), StopNever())), vocab_chunk=16)
    views = PermutationViews(positions=(tuple(range(CANVAS)),), tokens=(tuple(range(VOCAB)),))
    with pytest.raises(ValueError, match="views"):
        uniform_sampler(views=views, vocab_chunk=16)
    with pytest.raises(ValueError, match="multiple of BlockedInverseCdf.block"):
        uniform_sampler(draw=D.BlockedInverseCdf(8), vocab_chunk=20)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="vocab_chunk must be an int"):
            uniform_sampler(vocab_chunk=bad)
    rbg_keys = jax.random.split(jax.random.key(0, impl="rbg"), 2)
    with pytest.raises(ValueError, match="threefry2x32"):  # another PRNG's Gumbel stream is not reproduced
        VC.summarise(VC.BiasedLogits(jnp.zeros((2, 3, 8)), jnp.zeros(8)), (1.0,), 4, gumbel_keys=rbg_keys)
    uniform_sampler(selection=SortedTopRule())  # unchunked, any rule goes
    uniform_sampler(draw=D.BlockedInverseCdf(8), vocab_chunk=100)  # one chunk covers the vocabulary
    for rule in (S.EntropyBound(), S.Ancestral(), S.ConfidenceThreshold(), S.TopK(score=SC.Margin())):
        assert rule.chunkable()
    assert RM.ReMDMCap().chunkable() and E.transformers_early_stopping().chunkable()


def test_config_key_sets_the_chunk():
    config = cli.parse_config_overrides(recipes.base_config(), ["--config.sampler.vocab_chunk=4096"])
    process = builders.build_process(config, 64)
    assert builders.build_sampler(config, process).vocab_chunk == 4096
    assert builders.build_sampler(recipes.base_config(), process).vocab_chunk == 0
    assert recipes.sampler_report(config)["vocab_chunk"] == 4096


def test_compiled_step_holds_no_extra_vocabulary_sized_temporary():
    """XLA's buffer assignment for a whole denoising loop (vocabulary 8,192, batch 4, canvas 32): with chunks of 256
    the temporaries are the model call's own (its logits) plus less than half a logits array; without, the step adds
    over one and a half logits arrays of float32 temporaries (shaped logits, softmaxes, Gumbel noise)."""
    v, b, c = 8192, 4, 32
    cfg = TransformerConfig.from_dict(dict(presets.tiny(vocab_size=v, moe=False), self_conditioning=True))
    model = T.Transformer(cfg)
    params = jax.eval_shape(lambda: T.init_params(model, jax.random.key(0)))
    cache = jax.eval_shape(lambda: attention.init_cache(cfg, b, 16))
    tokens = jax.ShapeDtypeStruct((b, c), jnp.int32)
    sc = jax.ShapeDtypeStruct((b, c, cfg.embed_dim), jnp.float32)
    logits_bytes = b * c * v * 4

    def temp(fn, *args):
        return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes

    model_call = temp(lambda p, k, t, s: canvas_logits(model, p, k, t, s), params, cache, tokens, sc) + logits_bytes
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), b))
    loop_args = (params, cache, tokens, keys, jax.ShapeDtypeStruct((b, c), bool), jax.ShapeDtypeStruct((b,), bool))
    loops = {}
    for chunk in (0, 256):
        sampler = DiffusionSampler.diffusiongemma(v, num_steps=4, canvas_length=c, vocab_chunk=chunk)
        loops[chunk] = temp(functools.partial(_denoise, model, sampler=sampler, return_trajectory=False), *loop_args)
    assert loops[256] < model_call + 0.5 * logits_bytes, (loops, model_call, logits_bytes)
    assert loops[0] > loops[256] + 1.5 * logits_bytes, (loops, logits_bytes)


def test_chunks_of_one_id_decode_like_the_whole_vocabulary(model_and_params):
    """The smallest chunk (one id, 64 chunks) and a one-token prompt: the same tokens as the whole vocabulary."""
    model, params = model_and_params
    sampler = uniform_sampler(temperature=TEMP.ConstantTemperature(1e-3), num_steps=2, vocab_chunk=1)
    out = generate(model, params, [[BOS_ID]], sampler=sampler, key=0, max_new_tokens=CANVAS)
    ref = generate(model, params, [[BOS_ID]], sampler=sampler.replace(vocab_chunk=0), key=0, max_new_tokens=CANVAS)
    np.testing.assert_array_equal(out.tokens, ref.tokens)


def test_aot_report_compiles_the_canvas_loop_at_batch_with_and_without_chunks():
    """`aot.programs.memory_at_batch` on a tiny model (vocabulary 4,096, canvas 32, batch 8 over an 8-device mesh):
    every decode program compiles, the chunked canvas loop holds fewer temporaries for the same arguments, and the
    markdown table has a line per batch."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 (simulated) devices; tests/conftest.py sets XLA_FLAGS")
    settings = aot_layout.AotSettings(
        model=dict(presets.tiny(vocab_size=4096), self_conditioning=True),
        mesh=dict(data=1, fsdp=2, expert=4, tensor=1),
        canvas=32,
        cache_len=64,
        append_len=32,
        compiler_options=dict(aot_layout.NO_LICM, xla_backend_optimization_level=0),
    )
    emitted = []
    summary = aot_programs.memory_at_batch(settings, [8], [0, 256], emit=emitted.append, num_steps=2)
    names = [(r["program"], r.get("vocab_chunk")) for r in emitted]
    assert names == [
        ("canvas_denoise", None),
        ("canvas_sample", 0),
        ("canvas_sample", 256),
        ("append_32", None),
        ("decode_1", None),
    ]
    rows = {(r["program"], r["vocab_chunk"]): r for r in summary["rows"]}
    off, on = rows[("canvas_sample", 0)], rows[("canvas_sample", 256)]
    assert on["argument_bytes"] == off["argument_bytes"]
    assert off["temp_bytes"] - on["temp_bytes"] > summary["logits_bytes_per_row"]  # 8 rows, one per device
    table = aot_programs.memory_table(summary).splitlines()
    assert len(table) == 3 and table[2].startswith("| 8 |") and "vocab_chunk 256" in table[0]
