"""The loss objects (`diffusion/training_losses.py`): each equals the function it wraps, MaskedCE refuses a process
other than masking and bad weights, the factory lists its choices, and the likelihood metric follows the loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.diffusion import elbos as L
from hackable_diffusion.diffusion import training_losses as TL
from hackable_diffusion.diffusion.processes import MaskingProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule

B, LEN, V = 3, 5, 7
MASKING = MaskingProcess(vocab_size=V, schedule=LinearSchedule(), mask_id=V - 1)
UNIFORM = UniformProcess(vocab_size=V, schedule=LinearSchedule())


def _pass(process, seed=0):
    k_x, k_c, k_l, k_m = jax.random.split(jax.random.key(seed), 4)
    x0 = jax.random.randint(k_x, (B, LEN), 0, V - 1)
    t = jnp.array([0.3, 0.6, 0.9])
    xt, _ = process.corrupt(k_c, x0, t)
    logits = jax.random.normal(k_l, (B, LEN, V))
    loss_mask = jax.random.bernoulli(k_m, 0.8, (B, LEN)).at[:, 0].set(True)
    elbo = L.process_elbo(logits, x0, xt, t, process, loss_mask)
    return logits, x0, xt, loss_mask, elbo


@pytest.mark.slow
@pytest.mark.parametrize("process", [MASKING, UNIFORM], ids=["masking", "uniform"])
def test_each_loss_equals_the_function_it_wraps(process):
    logits, x0, xt, mask, elbo = _pass(process)
    np.testing.assert_allclose(TL.Elbo()(process, logits, x0, xt, mask, elbo), elbo / mask.sum(-1), rtol=1e-6)
    np.testing.assert_allclose(
        TL.CanvasCE()(process, logits, x0, xt, mask, elbo), L.canvas_cross_entropy(logits, x0, mask), rtol=1e-6
    )
    per_example, count = TL.ArCE()(logits, x0, mask)
    want, want_count = L.autoregressive_cross_entropy(logits, x0, mask)
    np.testing.assert_allclose(per_example, want, rtol=1e-6)
    np.testing.assert_array_equal(count, want_count)


def test_masked_ce_reweights_only_when_asked_and_needs_the_masking_process():
    logits, x0, xt, mask, elbo = _pass(MASKING, seed=1)
    plain = TL.MaskedCE()(MASKING, logits, x0, xt, mask, elbo)
    np.testing.assert_allclose(plain, L.masked_token_cross_entropy(logits, x0, xt, V - 1, mask), rtol=1e-6)
    assert TL.MaskedCE().token_reweight is None and TL.MaskedCE(0.25, 1.0).token_reweight == (0.25, 1.0)
    np.testing.assert_allclose(
        TL.MaskedCE(0.25, 1.0)(MASKING, logits, x0, xt, mask, elbo),
        L.masked_token_cross_entropy(logits, x0, xt, V - 1, mask, (0.25, 1.0)),
        rtol=1e-6,
    )
    TL.MaskedCE().check(MASKING)
    with pytest.raises(ValueError, match="needs the masking process"):
        TL.MaskedCE().check(UNIFORM)
    for alpha, gamma in [(0.0, 1.0), (1.0, -0.5)]:
        with pytest.raises(ValueError, match="alpha > 0 and gamma >= 0"):
            TL.MaskedCE(alpha, gamma)


def test_factory_and_likelihood_metric():
    assert TL.make_diffusion_loss("elbo") == TL.Elbo()
    assert TL.make_diffusion_loss("masked_ce", gamma=2.0) == TL.MaskedCE(gamma=2.0)
    assert TL.make_diffusion_loss("canvas_ce") == TL.CanvasCE()
    with pytest.raises(
        ValueError, match=r"unknown diffusion loss 'ce'; choose one of \['canvas_ce', 'elbo', 'masked_ce'\]"
    ):
        TL.make_diffusion_loss("ce")
    assert {TL.Elbo.likelihood_metric, TL.CanvasCE.likelihood_metric} == {"elbo_bits_per_token"}
    assert TL.ArCE.likelihood_metric == "nll_bits_per_token"
