"""The structure-prior hook of the backbone (`models/structure.py`) with a structure no task ships: a registered
structure is embedded and biases attention under its own parameter names, sharded by the generic rules."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.models import partitioning, presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.structure import register_structure, shared_units


@dataclasses.dataclass(frozen=True)
class Phase:
    """Positions modulo `period`: one unit with `period` values."""

    period: int
    name: ClassVar[str] = "phase"
    units: ClassVar[tuple[str, ...]] = ("phase",)

    @property
    def sizes(self):
        return (self.period,)

    def unit_indices(self, positions):
        return (jnp.mod(positions, self.period),)


register_structure("phase", lambda argument: Phase(int(argument)))


def test_a_registered_structure_is_embedded_and_biases_attention_under_its_own_names():
    shape = dict(presets.tiny(vocab_size=16, moe=False), structure="phase:4", structure_embeddings=True)
    model = T.Transformer(TransformerConfig.from_dict(dict(shape, structure_attention_bias=3.0)))
    params = T.init_params(model, jax.random.key(0))
    assert params["phase_embedding"]["phase"].shape == (4, model.cfg.embed_dim)
    biases = [
        (jax.tree_util.keystr(p), v)
        for p, v in jax.tree_util.tree_flatten_with_path(params)[0]
        if "phase_bias" in jax.tree_util.keystr(p)
    ]
    assert biases, "every attention layer has the structure's bias"
    heads = model.cfg.num_heads
    first = np.asarray(biases[0][1]).reshape(-1, 1, heads)[0, 0]
    np.testing.assert_array_equal(first, [3.0 if h % 2 == 0 else 0.0 for h in range(heads)])  # unit, none, unit...
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", k)) for k in path]
        assert len(partitioning.logical_axes(names, leaf.shape)) == leaf.ndim

    rel = np.asarray(shared_units(Phase(4), jnp.arange(8)[None], jnp.arange(8)[None]))[0, 0]
    np.testing.assert_array_equal(rel, np.equal.outer(np.arange(8) % 4, np.arange(8) % 4))
    tokens = jax.random.randint(jax.random.key(1), (1, 8), 4, 16)
    plain = T.Transformer(TransformerConfig.from_dict(presets.tiny(vocab_size=16, moe=False)))
    without = {k: v for k, v in params.items() if k != "phase_embedding"}
    assert not np.allclose(T.forward(model, params, tokens)[0], T.forward(plain, without, tokens)[0])


def test_a_structure_nobody_registered_is_refused_by_name():
    with pytest.raises(ValueError, match="no structure 'spiral' is registered"):
        TransformerConfig.from_dict(dict(presets.tiny(), structure="spiral:3", structure_embeddings=True))
