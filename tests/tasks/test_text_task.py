"""The text task (`tasks/text.py`): generative perplexity counts the continuation tokens only, under an autoregressive
scorer, and refuses a diffusion one."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion import experiment
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.tasks import text
from hackable_diffusion.tasks.text_task import TextTask


@pytest.mark.slow
def test_generative_perplexity_counts_continuations_only():
    from hackable_diffusion.data.tokenizers import CharTokenizer

    cfg = TransformerConfig.from_dict(presets.tiny(vocab_size=16, moe=False))
    model = T.Transformer(cfg)
    params = T.init_params(model, jax.random.key(3))
    scorer = experiment.Experiment(
        config=None,
        model=model,
        process=None,
        objective=None,
        tokenizer=CharTokenizer(tuple("abcdefghijkl")),
        data=None,
        task=TextTask(),
    )
    prompts, conts = [[2, 5, 6], [2, 7]], [[8, 9, 10, 1, 11], [4, 5]]
    out = text.generative_perplexity(scorer, params, prompts, conts, batch_size=4)
    nats, count = 0.0, 0
    for p, c in zip(prompts, conts):
        c = c[: c.index(1) + 1] if 1 in c else c  # up to and including EOS
        seq = jnp.asarray([p + c])
        logits, _ = T.forward(model, params, seq, causal=True)
        logp = jax.nn.log_softmax(logits[0, :-1], axis=-1)
        for i in range(len(p), len(p) + len(c)):
            nats -= float(logp[i - 1, seq[0, i]])
            count += 1
    assert out["gen_tokens"] == count == 6
    np.testing.assert_allclose(out["gen_nats_per_token"], nats / count, rtol=1e-5)
    np.testing.assert_allclose(out["gen_ppl"], np.exp(nats / count), rtol=1e-5)
    with pytest.raises(ValueError, match="autoregressive scorer"):
        text.generative_perplexity(dataclasses.replace(scorer, process=object()), params, prompts, conts)
