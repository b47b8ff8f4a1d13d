"""Tests for hackable_diffusion.models.moe: dispatch equivalence (values and gradients), capacity dropping,
router semantics, auxiliary losses, padding and bf16."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.models import moe

T, D, H, E, K = 64, 32, 48, 4, 2


def _params(key, num_experts=E, hidden=H, dim=D):
    kg, kl, kr, ks, kp = jax.random.split(key, 5)
    return {
        "gating": jax.random.normal(kg, (num_experts, 2, hidden, dim)) * dim**-0.5,
        "linear": jax.random.normal(kl, (num_experts, hidden, dim)) * hidden**-0.5,
        "per_expert_scale": 1.0 + 0.5 * jax.random.uniform(ks, (num_experts,)),
    }


def _reference_token(x_t, ids_t, w_t, params):
    """Slow per-token loop, written independently of the module: sum_j w_j * scale_e * FFN_e(x_t)."""
    out = np.zeros_like(x_t)
    for e, w in zip(ids_t, w_t):
        if e >= params["gating"].shape[0]:
            continue
        g = np.asarray(params["gating"][e, 0]) @ x_t
        u = np.asarray(params["gating"][e, 1]) @ x_t
        act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u
        out += w * float(params["per_expert_scale"][e]) * (act @ np.asarray(params["linear"][e]))
    return out


def _moe_module(dispatch, **kw):
    return moe.MoEFeedForward(num_experts=E, top_k=K, hidden_dim=H, dispatch=dispatch, **kw)


def _random_routing(key, num_tokens=T, num_experts=E, top_k=K):
    kr, kw = jax.random.split(key)
    scores = jax.random.uniform(kr, (num_tokens, num_experts))
    _, ids = jax.lax.top_k(scores, top_k)
    w = jax.random.uniform(kw, (num_tokens, top_k)) + 0.1
    return ids.astype(jnp.int32), w / w.sum(-1, keepdims=True)


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


# ------------------------------------------------------------------------------------------------ dispatch level


@pytest.mark.parametrize("name", ["dense", "sorted", "ragged"])
def test_dispatch_matches_per_token_reference(name):
    params = _params(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (T, D))
    ids, w = _random_routing(jax.random.key(2))
    dispatch = moe.SortedDispatch(capacity_factor=float(E)) if name == "sorted" else moe.DISPATCHES[name]()
    y, dropped = jax.jit(dispatch)(x, ids, w, params["gating"], params["linear"], params["per_expert_scale"])
    ref = np.stack([_reference_token(np.asarray(x[t]), np.asarray(ids[t]), np.asarray(w[t]), params) for t in range(T)])
    assert int(dropped) == 0
    assert _rel_err(y, ref) < 1e-5


@functools.partial(jax.jit, static_argnums=0)
def _dispatch_grads(dispatch, x, ids, w, params, target):
    def loss(x, w, p):
        y, _ = dispatch(x, ids, w, p["gating"], p["linear"], p["per_expert_scale"])
        return jnp.sum(jnp.square(y - target))

    return jax.grad(loss, argnums=(0, 1, 2))(x, w, params)


@pytest.mark.parametrize("name", ["sorted", "ragged"])
def test_dispatch_gradients_match_dense(name):
    params = _params(jax.random.key(3))
    x = jax.random.normal(jax.random.key(4), (T, D))
    ids, w = _random_routing(jax.random.key(5))
    target = jax.random.normal(jax.random.key(6), (T, D))
    other = moe.SortedDispatch(capacity_factor=float(E)) if name == "sorted" else moe.RaggedDispatch()
    g_ref = _dispatch_grads(moe.DenseDispatch(), x, ids, w, params, target)
    g_got = _dispatch_grads(other, x, ids, w, params, target)
    for ref, got in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_got)):
        assert _rel_err(got, ref) < 1e-5


def test_sorted_drops_exactly_the_overflow():
    # Hand-made routing: first choices -> expert 0 for every token, second choices -> expert (t % 3) + 1.
    # Capacity factor 0.5 gives C = ceil(0.5 * T * K / E) = 16 slots per expert.
    # Expert 0 receives T = 64 first choices: the first 16 tokens are kept, 48 are dropped.
    # Experts 1..3 receive 22, 21, 21 second choices: 6 + 5 + 5 = 16 dropped (the last tokens of each).
    params = _params(jax.random.key(7))
    x = jax.random.normal(jax.random.key(8), (T, D))
    t = jnp.arange(T)
    ids = jnp.stack([jnp.zeros(T, jnp.int32), (t % 3 + 1).astype(jnp.int32)], axis=1)
    w = jnp.stack([jnp.full(T, 0.7), jnp.full(T, 0.3)], axis=1)
    dispatch = moe.SortedDispatch(capacity_factor=0.5)
    assert moe.expert_capacity(T, K, E, 0.5) == 16
    y, dropped = jax.jit(dispatch)(x, ids, w, params["gating"], params["linear"], params["per_expert_scale"])
    assert int(dropped) == 48 + 16

    # Expected: keep an assignment iff it is among the first 16 (in token order) routed to its expert.
    kept = np.zeros((T, K), bool)
    seen = np.zeros(E, int)
    for j in range(K):  # choice-major priority
        for tok in range(T):
            e = int(ids[tok, j])
            kept[tok, j] = seen[e] < 16
            seen[e] += 1
    assert kept.sum() == T * K - 64
    w_kept = np.where(kept, np.asarray(w), 0.0)
    ref = np.stack([_reference_token(np.asarray(x[i]), np.asarray(ids[i]), w_kept[i], params) for i in range(T)])
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-6)
    # Tokens with both assignments dropped give exactly zero.
    both_dropped = ~kept.any(axis=1)
    assert both_dropped.sum() > 0
    assert np.all(np.asarray(y)[both_dropped] == 0.0)


def test_sorted_first_choices_have_priority_over_second_choices():
    # All 2*T assignments target experts 0 and 1; capacity exactly T per expert would keep everything, so use
    # C = T/2: with choice-major priority, expert 0's slots go to the first T/2 first choices.
    ids = jnp.stack([jnp.zeros(T, jnp.int32), jnp.ones(T, jnp.int32)], axis=1)
    ids = ids.at[T // 2 :].set(ids[T // 2 :, ::-1])  # second half: first choice 1, second choice 0
    params = _params(jax.random.key(9))
    x = jax.random.normal(jax.random.key(10), (T, D))
    w = jnp.full((T, K), 0.5)
    cf = (T // 2) * E / (T * K)
    assert moe.expert_capacity(T, K, E, cf) == T // 2
    y, dropped = jax.jit(moe.SortedDispatch(capacity_factor=cf))(
        x, ids, w, params["gating"], params["linear"], params["per_expert_scale"]
    )
    # Each expert receives T/2 first choices and T/2 second choices: all first choices kept, all seconds dropped.
    assert int(dropped) == T
    w_kept = np.asarray(w).copy()
    w_kept[:, 1] = 0.0
    ref = np.stack([_reference_token(np.asarray(x[i]), np.asarray(ids[i]), w_kept[i], params) for i in range(T)])
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-6)


def test_padding_expert_id_is_ignored_by_every_dispatch():
    params = _params(jax.random.key(11))
    x = jax.random.normal(jax.random.key(12), (T, D))
    ids, w = _random_routing(jax.random.key(13))
    pad = jnp.arange(T) % 5 == 0
    ids_p = jnp.where(pad[:, None], E, ids)
    w_p = jnp.where(pad[:, None], 0.0, w)
    outs = {}
    for name, dispatch in [
        ("dense", moe.DenseDispatch()),
        ("sorted", moe.SortedDispatch(1.0)),
        ("ragged", moe.RaggedDispatch()),
    ]:
        y, dropped = jax.jit(dispatch)(x, ids_p, w_p, params["gating"], params["linear"], params["per_expert_scale"])
        assert np.all(np.asarray(y)[np.asarray(pad)] == 0.0)
        outs[name] = (np.asarray(y), int(dropped))
    # Sorted with capacity factor 1.0: the padded assignments must not take slots, so the count of drops equals
    # the overflow among the real assignments only.
    real_ids = np.asarray(ids)[~np.asarray(pad)]
    cap = moe.expert_capacity(T, K, E, 1.0)
    expected_drops = sum(max(0, int((real_ids == e).sum()) - cap) for e in range(E))
    assert outs["sorted"][1] == expected_drops
    assert _rel_err(outs["ragged"][0], outs["dense"][0]) < 1e-5


def test_gather_rows_gradient_is_the_transpose():
    src = jax.random.normal(jax.random.key(14), (5, 3))
    index = jnp.array([[2, 5], [0, 2], [4, 5]])  # 5 = empty
    inverse = jnp.array([[2, 6], [6, 6], [0, 3], [6, 6], [4, 6]])  # positions i with index[i] == j, pad 6
    g = jax.random.normal(jax.random.key(15), (3, 2, 3))
    _, vjp = jax.vjp(lambda s: moe.gather_rows(s, index, inverse), src)
    _, vjp_ref = jax.vjp(lambda s: jnp.take(s, index, axis=0, mode="fill", fill_value=0), src)
    np.testing.assert_allclose(vjp(g)[0], vjp_ref(g)[0], rtol=1e-6)


def test_dispatch_rejects_bad_shapes():
    params = _params(jax.random.key(0))
    x = jnp.zeros((T, D))
    ids, w = _random_routing(jax.random.key(1))
    with pytest.raises(ValueError, match="expert_ids and weights"):
        moe.SortedDispatch()(x, ids, w[:, :1], params["gating"], params["linear"], params["per_expert_scale"])
    with pytest.raises(ValueError, match="gating"):
        moe.DenseDispatch()(x[:, :-1], ids, w, params["gating"], params["linear"], params["per_expert_scale"])
    with pytest.raises(ValueError, match="capacity_factor"):
        moe.expert_capacity(T, K, E, 0.0)


# ------------------------------------------------------------------------------------------------ module level


def _module_inputs(key, batch=2, length=T // 2):
    kx, kr = jax.random.split(key)
    return jax.random.normal(kx, (batch, length, D)), jax.random.normal(kr, (batch, length, D))


@functools.partial(jax.jit, static_argnums=0)
def _apply(module, variables, x, r, mask=None):
    """One compiled program per (module config, shapes), shared by the tests (flax modules hash by config)."""
    return module.apply(variables, x, r, mask)


@functools.lru_cache(maxsize=None)
def _scaled_variables():
    """Params for every module config of these tests (all share shapes), with the router enlarged so that routing
    is decisive (no near-ties between the top-k and the rest) and distinct expert scales."""
    x, r = _module_inputs(jax.random.key(0))
    variables = jax.jit(_moe_module("sorted").init)(jax.random.key(20), x, r)
    p = dict(variables["params"])
    p["router_logits"] = jax.random.normal(jax.random.key(21), p["router_logits"].shape) * 3.0
    p["per_expert_scale"] = 1.0 + 0.3 * jnp.arange(E, dtype=jnp.float32)
    return {"params": p}


def test_module_parameter_tree():
    x, r = _module_inputs(jax.random.key(0))
    variables = jax.jit(_moe_module("sorted").init)(jax.random.key(1), x, r)
    shapes = jax.tree.map(jnp.shape, variables["params"])
    assert shapes == {
        "router_logits": (D, E),
        "router_scale": (D,),
        "per_expert_scale": (E,),
        "gating_einsum": (E, 2, H, D),
        "linear": (E, H, D),
    }
    np.testing.assert_array_equal(variables["params"]["router_scale"], np.ones(D))
    np.testing.assert_array_equal(variables["params"]["per_expert_scale"], np.ones(E))


@functools.partial(jax.jit, static_argnums=0)
def _module_grads(module, x, r, variables, target):
    def loss(x, r, v):
        y, aux = module.apply(v, x, r)
        return jnp.sum(jnp.square(y - target)) + aux["moe_load_balance_loss"] + aux["moe_router_z_loss"], y

    return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(x, r, variables)


@pytest.mark.parametrize("name", ["sorted", "ragged"])
def test_module_values_and_gradients_match_dense(name):
    x, r = _module_inputs(jax.random.key(2))
    target = jax.random.normal(jax.random.key(3), x.shape)
    variables = _scaled_variables()
    kw = dict(load_balance_weight=0.1, router_z_weight=0.01)
    g_ref, y_ref = _module_grads(_moe_module("dense", **kw), x, r, variables, target)
    cf = {"capacity_factor": float(E)} if name == "sorted" else {}
    g_got, y_got = _module_grads(_moe_module(name, **kw, **cf), x, r, variables, target)
    assert _rel_err(y_got, y_ref) < 1e-5
    ref_leaves = jax.tree_util.tree_leaves_with_path(g_ref)
    got_leaves = jax.tree.leaves(g_got)
    for (path, ref), got in zip(ref_leaves, got_leaves):
        assert _rel_err(got, ref) < 1e-5, jax.tree_util.keystr(path)
    # The router receives a gradient through the routing weights.
    assert float(jnp.linalg.norm(g_got[2]["params"]["router_logits"])) > 0


def test_router_weights_and_top_k():
    kx, kw, ks = jax.random.split(jax.random.key(30), 3)
    h = jax.random.normal(kx, (T, D)) * 3.0 + 1.0
    w_router = jax.random.normal(kw, (D, E))
    scale = 1.0 + jax.random.uniform(ks, (D,))
    logits, probs, ids, weights = moe.route(h, w_router, scale, K)
    # Closed form of the router input.
    hn = np.asarray(h, np.float64)
    hn = hn / np.sqrt(np.mean(hn**2, -1, keepdims=True) + 1e-6) * D**-0.5 * np.asarray(scale)
    np.testing.assert_allclose(logits, hn @ np.asarray(w_router), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    p = np.asarray(probs)
    for t in range(T):
        expected = np.argsort(-p[t])[:K]
        assert set(np.asarray(ids[t]).tolist()) == set(expected.tolist())
        np.testing.assert_allclose(weights[t], p[t, ids[t]] / p[t, ids[t]].sum(), rtol=1e-6)
    assert ids.dtype == jnp.int32


def test_per_expert_scale_multiplies_that_experts_contribution():
    x, r = _module_inputs(jax.random.key(31))
    module = _moe_module("sorted", capacity_factor=float(E))
    variables = _scaled_variables()
    y0, _ = _apply(module, variables, x, r)
    p = dict(variables["params"])
    p["per_expert_scale"] = variables["params"]["per_expert_scale"].at[1].multiply(3.0)
    y1, _ = _apply(module, {"params": p}, x, r)
    # Contribution of expert 1 alone: zero every other expert's scale.
    p_only = dict(variables["params"])
    p_only["per_expert_scale"] = jnp.zeros(E).at[1].set(variables["params"]["per_expert_scale"][1])
    c1, _ = _apply(module, {"params": p_only}, x, r)
    assert float(jnp.abs(c1).max()) > 0
    np.testing.assert_allclose(y1, y0 + 2.0 * c1, rtol=1e-5, atol=1e-5)


def test_load_balance_and_z_loss_formulas_with_padding():
    x, r = _module_inputs(jax.random.key(32))
    mask = jnp.ones(x.shape[:2], bool).at[0, -7:].set(False).at[1, :3].set(False)
    lb_w, z_w = 0.3, 0.02
    module = _moe_module("sorted", load_balance_weight=lb_w, router_z_weight=z_w)
    variables = _scaled_variables()
    _, aux = _apply(module, variables, x, r, mask)
    assert set(aux) == {"moe_load_balance_loss", "moe_router_z_loss", "moe_dropped_fraction"}
    assert all(v.shape == () for v in aux.values())

    p = variables["params"]
    logits, probs, ids, _ = moe.route(r.reshape(-1, D), p["router_logits"], p["router_scale"], K)
    real = np.asarray(mask).reshape(-1)
    ids_r, probs_r, logits_r = np.asarray(ids)[real], np.asarray(probs, np.float64)[real], np.asarray(logits)[real]
    f = np.array([(ids_r == e).sum() for e in range(E)]) / (real.sum() * K)
    P = probs_r.mean(0)
    np.testing.assert_allclose(aux["moe_load_balance_loss"], lb_w * E * np.sum(f * P), rtol=1e-5)
    lse = np.log(np.exp(logits_r.astype(np.float64)).sum(-1))
    np.testing.assert_allclose(aux["moe_router_z_loss"], z_w * np.mean(lse**2), rtol=1e-5)
    # Defaults: both losses off.
    _, aux0 = _apply(_moe_module("sorted"), variables, x, r, mask)
    assert float(aux0["moe_load_balance_loss"]) == 0.0 and float(aux0["moe_router_z_loss"]) == 0.0


def test_load_balance_loss_hand_made_example():
    # Uniform router probabilities (zero router weights): P_e = 1/E for every e, so the loss is
    # E * sum_e f_e / E = sum_e f_e = 1 whatever the (tie-broken) routing is.
    x, r = _module_inputs(jax.random.key(33))
    module = _moe_module("dense", load_balance_weight=1.0)
    p = dict(_scaled_variables()["params"])
    p["router_scale"] = jnp.ones(D)
    p["router_logits"] = jnp.zeros((D, E))
    _, aux = _apply(module, {"params": p}, x, r)
    np.testing.assert_allclose(aux["moe_load_balance_loss"], 1.0, rtol=1e-6)
    # Constant router input (normalised to D**-0.5 per entry) and logits (100, 50, 0, 0) * sqrt(D): every token
    # picks experts 0 and 1, so f = (1/2, 1/2, 0, 0) and P = (1, 0, 0, 0) up to exp(-280): loss = E / 2.
    r_const = jnp.ones_like(r)
    p["router_logits"] = jnp.zeros((D, E)).at[:, 0].set(100.0).at[:, 1].set(50.0)
    _, aux = _apply(module, {"params": p}, x, r_const)
    np.testing.assert_allclose(aux["moe_load_balance_loss"], E * 0.5, rtol=1e-5)


def test_token_mask_pads_do_not_affect_real_tokens():
    x, r = _module_inputs(jax.random.key(34))
    mask = jnp.ones(x.shape[:2], bool).at[:, -9:].set(False)
    # Capacity factor 1.0 so that capacity is contended: pads must not take slots.
    module = _moe_module("sorted", capacity_factor=1.0)
    variables = _scaled_variables()
    y1, aux1 = _apply(module, variables, x, r, mask)
    noise_x, noise_r = _module_inputs(jax.random.key(35))
    pad = ~mask[..., None]
    x2, r2 = jnp.where(pad, noise_x * 10, x), jnp.where(pad, noise_r * 10, r)
    x2, r2 = x2.at[0, -1].set(jnp.nan), r2.at[1, -1].set(jnp.inf)  # even non-finite pads must not leak
    y2, aux2 = _apply(module, variables, x2, r2, mask)
    np.testing.assert_array_equal(np.asarray(y1)[np.asarray(mask)], np.asarray(y2)[np.asarray(mask)])
    assert np.all(np.asarray(y1)[~np.asarray(mask)] == 0.0)
    assert np.all(np.asarray(y2)[~np.asarray(mask)] == 0.0)
    for key in aux1:
        np.testing.assert_allclose(aux1[key], aux2[key], rtol=1e-6)
    # With no mask, the same real tokens may lose slots to the (former) pads: drops can only grow.
    _, aux_nomask = _apply(module, variables, x, r)
    num_real = int(mask.sum())
    drops_masked = float(aux1["moe_dropped_fraction"]) * num_real * K
    drops_unmasked = float(aux_nomask["moe_dropped_fraction"]) * x.shape[0] * x.shape[1] * K
    assert drops_unmasked >= drops_masked - 1e-3


def test_dropped_fraction_is_zero_for_dropless_and_counts_for_sorted():
    x, r = _module_inputs(jax.random.key(36))
    variables = _scaled_variables()
    for name in ["dense", "ragged"]:
        _, aux = _apply(_moe_module(name), variables, x, r)
        assert float(aux["moe_dropped_fraction"]) == 0.0
    p = variables["params"]
    _, _, ids, _ = moe.route(r.reshape(-1, D), p["router_logits"], p["router_scale"], K)
    cf = 0.5
    cap = moe.expert_capacity(T, K, E, cf)
    counts = np.bincount(np.asarray(ids).reshape(-1), minlength=E)
    expected = np.maximum(counts - cap, 0).sum() / (T * K)
    assert expected > 0
    _, aux = _apply(_moe_module("sorted", capacity_factor=cf), variables, x, r)
    np.testing.assert_allclose(aux["moe_dropped_fraction"], expected, rtol=1e-6)


def test_bf16_compute_is_close_to_f32():
    x, r = _module_inputs(jax.random.key(37))
    variables = _scaled_variables()
    y32, _ = _apply(_moe_module("sorted", capacity_factor=float(E)), variables, x, r)
    for name in ["sorted", "ragged", "dense"]:
        cf = {"capacity_factor": float(E)} if name == "sorted" else {}
        y16, aux = _apply(_moe_module(name, dtype=jnp.bfloat16, **cf), variables, x, r)
        assert y16.dtype == jnp.float32  # cast back to x's dtype
        assert np.all(np.isfinite(np.asarray(y16)))
        assert _rel_err(y16, y32) < 3e-2, name


def test_module_rejects_bad_configuration():
    x, r = _module_inputs(jax.random.key(38))
    with pytest.raises(ValueError, match="Unknown MoE dispatch"):
        _moe_module("megablox").init(jax.random.key(0), x, r)
    with pytest.raises(ValueError, match="top_k"):
        moe.MoEFeedForward(num_experts=E, top_k=E + 1, hidden_dim=H).init(jax.random.key(0), x, r)
    with pytest.raises(ValueError, match="router_input"):
        _moe_module("sorted").init(jax.random.key(0), x, r[:, :-1])
    with pytest.raises(ValueError, match="token_mask"):
        _moe_module("sorted").init(jax.random.key(0), x, r, jnp.ones((2, 3), bool))
    assert math.isclose(moe.expert_capacity(10, 2, 4, 1.25), 7)


def test_batched_and_unrolled_expert_paths_agree(monkeypatch):
    params = _params(jax.random.key(40))
    x = jax.random.normal(jax.random.key(41), (T, D))
    ids, w = _random_routing(jax.random.key(42))

    def value_and_grads():
        def loss(x, p):
            y, _ = moe.SortedDispatch(float(E))(x, ids, w, p["gating"], p["linear"], p["per_expert_scale"])
            return jnp.sum(jnp.sin(y)), y

        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(x, params)

    grads_unrolled, y_unrolled = value_and_grads()
    monkeypatch.setattr(moe, "_UNROLL_MAX_EXPERTS", 1)
    grads_batched, y_batched = value_and_grads()
    assert _rel_err(y_batched, y_unrolled) < 1e-6
    for a, b in zip(jax.tree.leaves(grads_batched), jax.tree.leaves(grads_unrolled)):
        assert _rel_err(a, b) < 1e-6


def test_gated_gelu_gradient_matches_autodiff():
    a = jax.random.normal(jax.random.key(43), (7, 5)) * 3
    b = jax.random.normal(jax.random.key(44), (7, 5))
    g = jax.random.normal(jax.random.key(45), (7, 5))
    _, vjp = jax.vjp(moe.gated_gelu, a, b)
    _, vjp_ref = jax.vjp(lambda a, b: jax.nn.gelu(a, approximate=True) * b, a, b)
    for got, ref in zip(vjp(g), vjp_ref(g)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_moe_routing_drops_more_when_every_canvas_input_is_the_mask_token(tmp_path):
    """`noise_level_analysis.routing_at_levels` on a tiny masking MoE at initialisation, capacity T*k/E per expert: clean text
    spreads over the experts, while at t = 1 the canvas inputs are all [MASK], route alike and overflow."""
    from _tiny_configs import tiny_text_config
    from noise_level_analysis import routing_at_levels

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.models import transformer as T

    config = tiny_text_config("masking", moe=True)
    config.model.moe.capacity_factor = 1.0
    exp = exp_lib.build(config, str(tmp_path))
    params = T.init_params(exp.model, jax.random.key(0))
    records = routing_at_levels(exp, params, [0.0, 1.0], num_batches=2)
    assert [r["noise_level"] for r in records] == [0.0, 1.0]
    clean, masked = (r["moe_dropped_fraction"] for r in records)
    assert 0.0 <= clean < 1.0 and 0.0 <= masked < 1.0
    assert masked > clean + 0.1, records
    # The same weights with E / k slots per expert (every expert can take every token) drop nothing, and the loss at
    # t = 1 moves: what `--capacity_factor` measures.
    moe_config = config.model.moe
    moe_config.capacity_factor = moe_config.num_experts / moe_config.top_k
    dropless = routing_at_levels(exp_lib.build(config, str(tmp_path)), params, [1.0], num_batches=2)[0]
    assert dropless["moe_dropped_fraction"] == 0.0
    assert abs(dropless["diffusion_loss"] - records[1]["diffusion_loss"]) > 1e-4, (dropless, records[1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        routing_at_levels(exp, params, [1.5], num_batches=1)
