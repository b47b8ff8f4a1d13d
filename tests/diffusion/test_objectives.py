"""Objective tests: block-diffusion / SFT causality, equality with the sampler's cache structure, AR baseline."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion import builders, recipes
from hackable_diffusion.data.sft_canvases import CanvasChunker, collate_examples
from hackable_diffusion.diffusion import objectives as O
from hackable_diffusion.diffusion.processes import MaskingProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule, UniformTimeSampler
from hackable_diffusion.diffusion.training_losses import MaskedCE
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig

V = 32
FULLY_NOISED = UniformTimeSampler(1.0 - 1e-7, 1.0)  # alpha(t) ~ eps: x_t is (almost surely) all MASK


def tiny_model(**overrides):
    shape = presets.tiny(vocab_size=V)
    shape["moe"] = dict(shape["moe"], capacity_factor=2.0)
    shape.update(overrides)
    model = T.Transformer(TransformerConfig.from_dict(shape))
    return model, T.init_params(model, jax.random.key(0))


def masking():
    return MaskingProcess(vocab_size=V, schedule=LinearSchedule(), mask_id=3)


@pytest.mark.slow
def test_block_pretrain_canvas_sees_only_earlier_clean_canvases():
    model, params = tiny_model()
    obj = O.DiffusionPretrainObjective(model, masking(), time_sampler=FULLY_NOISED, canvas_len=4)
    x0 = jax.random.randint(jax.random.key(1), (2, 12), 4, V)
    rng = jax.random.key(2)

    def canvas_logits(tokens):
        # Recompute the decoder logits of the objective through its pieces (xt is all MASK at t ~ 1).
        b, l = tokens.shape
        cache = init_cache(model.cfg, b, l)
        _, cache = T.append(model, params, tokens, cache)
        xt = jnp.full_like(tokens, 3)
        canvas_of = jnp.arange(l) // 4
        prefix = jnp.broadcast_to((canvas_of[:, None] > canvas_of[None, :])[None], (b, l, l))
        self_mask = jnp.broadcast_to((canvas_of[:, None] == canvas_of[None, :])[None], (b, l, l))
        logits, _ = T.decode_block(
            model,
            params,
            xt,
            cache,
            prefix_mask=prefix,
            self_mask=self_mask,
            positions=T.positions_from_mask(jnp.ones((b, l), bool)),
        )
        return logits

    base = canvas_logits(x0)
    changed = canvas_logits(x0.at[:, 4:].set((x0[:, 4:] + 1) % (V - 4) + 4))  # canvases 1 and 2 change
    np.testing.assert_array_equal(changed[:, :4], base[:, :4])  # canvas 0 never sees clean canvas >= 0
    assert np.abs(changed[:, 8:] - base[:, 8:]).max() > 1e-5  # canvas 2 sees clean canvas 1

    # The objective's loss equals the same structure: its canvas k equals a sampler-style decode against a cache
    # holding exactly the clean canvases < k.
    for k in range(3):
        cache = init_cache(model.cfg, 2, 12)
        if k:
            _, cache = T.append(model, params, x0[:, : 4 * k], cache)
        sampler_view, _ = T.decode_block(model, params, jnp.full((2, 4), 3), cache)
        np.testing.assert_allclose(sampler_view, base[:, 4 * k : 4 * k + 4], atol=3e-5)

    loss, metrics = jax.jit(obj)(params, {"tokens": x0}, rng)
    assert np.isfinite(loss) and metrics["elbo_bits_per_token"] > 0


def sft_batch(prompts, responses, n=2, c=4, p=6):
    chunker = CanvasChunker(prompt_len=p, num_canvases=n, canvas_len=c)
    return {k: jnp.asarray(v) for k, v in collate_examples([chunker(a, b) for a, b in zip(prompts, responses)]).items()}


@pytest.mark.slow
def test_sft_noisy_canvas_ignores_its_own_and_later_clean_canvases():
    model, params = tiny_model(self_conditioning=True)
    obj = O.CanvasSFTObjective(model, masking(), canvas_len=4, time_sampler=FULLY_NOISED, self_condition_prob=0.0)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    responses = [[13, 14, 15, 16, 17, 18], [19, 20, 21, 22, 23]]
    batch = sft_batch(prompts, responses)
    selected = jnp.array([1, 1])
    rng = jax.random.key(3)
    base = obj.pieces(params, batch, rng, selected)
    assert np.all(np.asarray(base["xt"]) == 3)

    later = dict(batch, canvas=batch["canvas"].at[:, 4:].set(24))  # clean canvas 1 (the selected one) changes
    changed = obj.pieces(params, later, rng, selected)
    np.testing.assert_array_equal(changed["logits"], base["logits"])
    earlier = dict(batch, canvas=batch["canvas"].at[:, :4].set(25))  # clean canvas 0 changes: it is visible
    seen = obj.pieces(params, earlier, rng, selected)
    assert np.abs(seen["logits"] - base["logits"]).max() > 1e-5

    # Canvas 0 selected: changing canvas 0 or 1 never changes its logits, nor its loss when the target is kept.
    sel0 = jnp.array([0, 0])
    a = obj.pieces(params, batch, rng, sel0)
    b = obj.pieces(params, later, rng, sel0)
    np.testing.assert_array_equal(a["logits"], b["logits"])

    # Prompt slots of the cache hold exactly the prompt's causal KV: nothing noisy was written over them.
    cache = init_cache(model.cfg, 2, 6 + 8)
    _, prompt_only = T.append(model, params, batch["prompt"], cache, token_mask=batch["prompt_mask"])
    for layer_new, layer_ref in zip(base["cache"].layers, prompt_only.layers):
        for name in ("k", "v"):
            np.testing.assert_allclose(layer_new[name][:, :, :6], layer_ref[name][:, :, :6], atol=1e-5)
    np.testing.assert_array_equal(base["seq"][:, :6], batch["prompt"])
    # Positions of the selected canvas continue each row's real prompt tokens (BOS + prompt) + s * C.
    np.testing.assert_array_equal(base["positions"][:, 0], [4 + 4, 6 + 4])

    loss, metrics = jax.jit(obj)(params, batch, rng)
    assert np.isfinite(loss) and metrics["encoder_ar_loss"] > 0


@pytest.mark.slow
def test_sft_with_uniform_noise_and_self_conditioning_runs_and_has_gradients():
    model, params = tiny_model(self_conditioning=True)
    obj = O.CanvasSFTObjective(
        model, UniformProcess(vocab_size=V, schedule=LinearSchedule(), excluded_ids=(0, 1, 2, 3)), canvas_len=4
    )
    batch = sft_batch([[5, 6]], [[7, 8, 9, 10, 11]])
    grads = jax.grad(lambda p: obj(p, batch, jax.random.key(0))[0])(params)
    assert float(jnp.abs(grads["self_conditioner"]["ffw"]["linear"]).sum()) > 0
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


@pytest.mark.slow
def test_one_canvas_pretrain_and_ar_objectives():
    model, params = tiny_model()
    x0 = jax.random.randint(jax.random.key(1), (4, 8), 4, V)
    loss, m = jax.jit(O.DiffusionPretrainObjective(model, masking()))(params, {"tokens": x0}, jax.random.key(0))
    assert np.isfinite(loss) and m["elbo_bits_per_token"] > 0
    ar_loss, ar = jax.jit(O.AutoregressiveObjective(model))(params, {"tokens": x0}, jax.random.key(0))
    logits, _ = T.forward(model, params, x0)
    logp = jax.nn.log_softmax(logits[:, :-1], -1)
    want = -jnp.mean(jnp.take_along_axis(logp, x0[:, 1:, None], -1))
    np.testing.assert_allclose(ar["ar_loss"], want, rtol=1e-5)
    np.testing.assert_allclose(ar["nll_bits_per_token"], want / np.log(2), rtol=1e-5)


@pytest.mark.slow
def test_masked_ce_loss_is_the_pooled_masked_cross_entropy_and_needs_masking():
    model, params = tiny_model()
    x0 = jax.random.randint(jax.random.key(1), (4, 8), 4, V)
    objective = O.DiffusionPretrainObjective(model, masking(), loss=MaskedCE())
    loss, m = objective(params, {"tokens": x0}, jax.random.key(0))
    # Same rng split as the objective: times, then the corruption.
    t_key, noise_key, _ = jax.random.split(jax.random.key(0), 3)
    t = objective.time_sampler(t_key, 4)
    xt, _ = masking().corrupt(noise_key, x0, t, fixed=jnp.zeros((4, 8), bool))
    logits, _ = T.forward(model, params, xt, causal=False)
    logp = jax.nn.log_softmax(logits.at[..., 3].set(-jnp.inf), -1)
    nll = -jnp.take_along_axis(logp, x0[..., None], -1)[..., 0]
    masked = xt == 3
    np.testing.assert_allclose(loss, jnp.sum(jnp.where(masked, nll, 0.0)) / jnp.sum(masked), rtol=1e-5)
    assert m["elbo_bits_per_token"] > 0  # the ELBO is still reported
    with pytest.raises(ValueError, match="masking process"):  # caught when the objective is built
        O.DiffusionPretrainObjective(model, UniformProcess(vocab_size=V, schedule=LinearSchedule()), loss=MaskedCE())
    # MGDM token reweighting: every masked position's CE times alpha (1 - p)^gamma; only with masked_ce.
    reweighted = O.DiffusionPretrainObjective(model, masking(), loss=MaskedCE(alpha=0.25, gamma=1.0))
    loss_rw, _ = reweighted(params, {"tokens": x0}, jax.random.key(0))
    weight = 0.25 * (1 - jnp.exp(-nll))
    np.testing.assert_allclose(loss_rw, jnp.sum(jnp.where(masked, weight * nll, 0.0)) / jnp.sum(masked), rtol=1e-5)
    config = recipes.text_config("shakespeare", "masking")
    config.diffusion.token_reweight_alpha = 0.25
    with pytest.raises(ValueError, match="token_reweight_alpha/gamma weigh masked_ce"):  # a config asks for it
        builders.build_loss(config)
    config.diffusion.loss = "masked_ce"
    assert builders.build_loss(config) == MaskedCE(alpha=0.25, gamma=0.0)
