"""Fixtures of the sampling tests: one tiny random model with sharpened predictions, shared by every module."""

import jax
import pytest
from _tiny_sampling import VOCAB

from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig


@pytest.fixture(scope="module")
def model_and_params():
    cfg = TransformerConfig.from_dict(dict(presets.tiny(vocab_size=VOCAB, moe=False), self_conditioning=True))
    model = T.Transformer(cfg)
    params = jax.jit(lambda key: T.init_params(model, key))(jax.random.key(0))
    # Sharper predictions than a fresh init, so entropies and confidences are not all near their maxima.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * 8.0 if "embedder" in jax.tree_util.keystr(path) else x, params
    )
    return model, params
