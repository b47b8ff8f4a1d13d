"""Property-based check (hypothesis) of LoRA merging (`models/lora.py`): merged weights equal the unmerged adapter
path for random ranks, scales, expert targets and seeds."""

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig

VOCAB = 48


@pytest.fixture(scope="module")
def moe_params():
    model = T.Transformer(TransformerConfig.from_dict(dict(presets.tiny(vocab_size=VOCAB), self_conditioning=True)))
    return jax.device_get(jax.jit(lambda k: T.init_params(model, k))(jax.random.key(1)))


@pytest.mark.slow
@given(
    rank=st.sampled_from([1, 2, 3]),
    alpha=st.floats(0.5, 16.0),
    experts=st.booleans(),
    seed=st.integers(0, 999),
)
def test_lora_merged_weights_equal_the_unmerged_adapter_path(moe_params, rank, alpha, experts, seed):
    """For every adapted weight (attention, FFNs, router, self-conditioner, experts): x @ merged == x @ W + scale *
    (x @ A) @ B, for random ranks, scales and adapter values."""
    from test_lora import _ON_THE_FLY

    adapter = lora_lib.LoRA(rank=rank, alpha=alpha, include_experts=experts)
    shapes = jax.eval_shape(adapter.init, moe_params, jax.random.key(0))
    rng = np.random.default_rng(seed)
    adapters = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32) * 0.3, shapes)
    merged = jax.device_get(adapter.merge(moe_params, adapters))
    for path in adapter.targeted_paths(moe_params):
        names = path.split("/")
        eq, eq_a, eq_b, x_shape = _ON_THE_FLY[next(k for k in _ON_THE_FLY if path.endswith("/" + k))]
        pick = (lambda v: v[0]) if names[0] == "layers" else (lambda v: v)
        w, fused = pick(np.asarray(lora_lib._get(moe_params, names))), pick(np.asarray(lora_lib._get(merged, names)))
        pair = lora_lib._get(adapters, names)
        a, b = pick(np.asarray(pair["lora_a"])), pick(np.asarray(pair["lora_b"]))
        x = rng.standard_normal(x_shape(w)).astype(np.float32)
        unmerged = np.einsum(eq, x, w) + adapter.scale * np.einsum(eq_b, np.einsum(eq_a, x, a), b)
        np.testing.assert_allclose(np.einsum(eq, x, fused), unmerged, rtol=1e-4, atol=1e-4, err_msg=path)
