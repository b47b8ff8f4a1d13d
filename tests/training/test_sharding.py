"""Meshes and parameter shardings (`training/sharding.py`)."""

from __future__ import annotations

import _toy_train_worker as toy
import jax
import jax.numpy as jnp
import pytest
from _training_helpers import (
    _mesh,
)
from jax.sharding import PartitionSpec as P

from hackable_diffusion.training import sharding


def test_mesh_errors_and_fill():
    assert dict(_mesh(data=-1, tensor=2).shape) == dict(data=4, fsdp=1, expert=1, tensor=2)
    with pytest.raises(ValueError, match="has 6 devices but there are 8"):
        _mesh(data=3, tensor=2)
    with pytest.raises(ValueError, match=r"at most one mesh axis may be -1.*\['data', 'tensor'\]"):
        _mesh(data=-1, tensor=-1)
    with pytest.raises(ValueError, match="unknown mesh axes"):
        sharding.make_mesh(dict(data=8, model=1))
    mesh = _mesh(fsdp=2, expert=4)
    with pytest.raises(
        ValueError, match="dimension 'experts' of size 6 is not divisible by mesh axis 'expert' of size 4"
    ):
        sharding.logical_to_spec(("experts", "embed"), sharding.DEFAULT_RULES, mesh, (6, 8))
    assert sharding.logical_to_spec(
        ("experts", "embed"), sharding.DEFAULT_RULES, mesh, (6, 8), drop_indivisible=True
    ) == P(None, "fsdp")
    with pytest.raises(ValueError, match="logical axis 'widgets' has no rule"):
        sharding.logical_to_spec(("widgets",), sharding.DEFAULT_RULES, mesh, (8,))
    with pytest.raises(ValueError, match="mesh axis 'fsdp' is used by both"):
        sharding.logical_to_spec(("embed", "embed"), sharding.DEFAULT_RULES, mesh, (8, 8))
    # batch -> (data, fsdp): keeps the prefix that divides when allowed to drop.
    mesh2 = _mesh(data=2, fsdp=2, tensor=2)
    assert sharding.logical_to_spec(("batch", None), sharding.DEFAULT_RULES, mesh2, (8, 3)) == P(("data", "fsdp"), None)
    assert sharding.logical_to_spec(("batch",), sharding.DEFAULT_RULES, mesh2, (2,), drop_indivisible=True) == P("data")


def test_param_shardings_cover_every_param_and_expert_check():
    params = jax.eval_shape(toy.init_fn, jax.random.key(0))
    mesh = _mesh(fsdp=2, expert=2, tensor=2)
    shardings = sharding.param_shardings(params, toy.logical_axes_fn, mesh)
    assert shardings["experts"]["w_in"].spec == P("expert", "fsdp", "tensor")
    assert shardings["embed"].spec == P("tensor", "fsdp")
    assert sharding.replicated_expert_params(params, shardings, toy.logical_axes_fn) == []
    rules = dict(sharding.DEFAULT_RULES, experts=None)
    bad = sharding.param_shardings(params, toy.logical_axes_fn, mesh, rules)
    assert sharding.replicated_expert_params(params, bad, toy.logical_axes_fn) == ["experts/w_in", "experts/w_out"]
    params_extra = dict(params, mystery=jax.ShapeDtypeStruct((4,), jnp.float32))
    with pytest.raises(ValueError, match="no logical axes for parameter 'mystery'"):
        sharding.param_shardings(params_extra, toy.logical_axes_fn, mesh)
