"""LoRA: targeting, scaling, fused == on-the-fly, frozen base under training, checkpoints, sharding, SFT end to end."""

from hackable_diffusion import sft
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from hackable_diffusion import run_config
from hackable_diffusion.checkpoints import gemma as gc
from hackable_diffusion.diffusion.objectives import AutoregressiveObjective
from hackable_diffusion.models import lora as L
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.training import checkpointing, optimizers, sharding
from hackable_diffusion.training.train_state import TrainState, make_train_step

BLOCK_WEIGHTS = ("attn/attn_vec_einsum", "attn/q_einsum", "mlp2/gating_einsum", "mlp2/linear", "moe/router_logits")
EXPERTS = ("moe/gating_einsum", "moe/linear")


FAST = {"xla_backend_optimization_level": 0}  # ~2.5x faster CPU compiles for these tiny programs


def _cfg(moe: bool = True) -> TransformerConfig:
    shape = presets.tiny(moe=moe)
    shape.update(self_conditioning=True, num_layers=4)  # 2 scanned groups of (local, global)
    if moe:
        shape["moe"]["dispatch"] = "dense"  # every expert on every token: the cheapest program to compile
    return TransformerConfig.from_dict(shape)


def _random_params(cfg: TransformerConfig, seed: int):
    """Random params shaped like init_params (abstract init, no compile); weights ~ N(0, 0.2^2), scales near 1."""
    rng = np.random.default_rng(seed)
    flat = {}
    for path, s in gc.toolbox_shapes(cfg).items():
        base = 1.0 if (path.endswith("scale") or path.endswith("skip_scale")) else 0.0
        flat[path] = (base + 0.2 * rng.standard_normal(s.shape)).astype(np.float32)
    return gc.unflatten_tree(flat)


def _with_random_b(lora, seed: int):
    rng = np.random.default_rng(seed)
    flat = gc.flatten_tree(lora)
    return gc.unflatten_tree(
        {p: (rng.standard_normal(v.shape).astype(np.float32) if p.endswith("lora_b") else v) for p, v in flat.items()}
    )


def _bits_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    )


@pytest.fixture(scope="module")
def cfg():
    return _cfg()


@pytest.fixture(scope="module")
def params(cfg):
    return _random_params(cfg, 0)


def test_targets_select_exactly_the_expected_leaves(params):
    blocks = [f"layers/block_{i}/{w}" for i in (0, 1) for w in BLOCK_WEIGHTS]
    kv = ["layers/block_0/attn/kv_einsum", "layers/block_1/attn/k_einsum"]  # local kv, global K=V
    sc = ["self_conditioner/ffw/gating_einsum", "self_conditioner/ffw/linear"]
    default = sorted(blocks + kv + sc)
    assert L.LoRA().targeted_paths(params) == default
    assert L.LoRA(targets=L.ALL_LINEAR).targeted_paths(params) == default
    experts = [f"layers/block_{i}/{w}" for i in (0, 1) for w in EXPERTS]
    assert L.LoRA(include_experts=True).targeted_paths(params) == sorted(default + experts)
    assert L.LoRA(targets=(r"block_1/attn/q_einsum$",)).targeted_paths(params) == ["layers/block_1/attn/q_einsum"]
    assert L.LoRA(targets=(r"^self_conditioner/",)).targeted_paths(params) == sc
    assert L.LoRA(targets=(r"router",), include_experts=True).targeted_paths(params) == sorted(
        ["layers/block_0/moe/router_logits", "layers/block_1/moe/router_logits"] + experts
    )
    # Experts are only adapted with include_experts, whatever the regexes say.
    assert L.LoRA(targets=(r"moe/",)).targeted_paths(params) == [
        "layers/block_0/moe/router_logits",
        "layers/block_1/moe/router_logits",
    ]
    with pytest.raises(ValueError, match="only expert weights; set include_experts=True"):
        L.LoRA(targets=(r"moe/linear$",)).targeted_paths(params)
    with pytest.raises(ValueError, match=r"LoRA target 'q_einsm' selects no adaptable weight"):
        L.LoRA(targets=("q_einsm",)).targeted_paths(params)
    with pytest.raises(ValueError, match="tuple of regexes"):
        L.LoRA(targets="q_einsum")
    dense = _random_params(_cfg(moe=False), 1)
    with pytest.raises(ValueError, match="no MoE expert weights"):
        L.LoRA(include_experts=True).targeted_paths(dense)


@pytest.fixture(scope="module")
def adapted(params):
    """rank 2, alpha 6 (scale 3) on every weight, experts included; B set to random values."""
    adapter = L.LoRA(rank=2, alpha=6.0, include_experts=True)
    init = jax.device_get(jax.jit(adapter.init)(params, jax.random.key(0)))
    merge = jax.jit(adapter.merge)
    lora = _with_random_b(init, 1)
    return adapter, init, jax.device_get(merge(params, init)), lora, jax.device_get(merge(params, lora))


def test_zero_b_is_the_base_and_delta_is_scaled_product(params, adapted):
    adapter, init, merged_init, lora, merged = adapted
    assert adapter.scale == 3.0 and L.LoRA(rank=4).scale == 1.0  # alpha=None: the reference (no scaling)
    for (p, a), (_, b) in zip(gc.flatten_tree(params).items(), gc.flatten_tree(merged_init).items()):
        assert _bits_equal(a, b), p
    a_q = np.asarray(init["layers"]["block_0"]["attn"]["q_einsum"]["lora_a"])
    assert a_q.shape == (2, 32, 2) and np.abs(a_q).max() <= 32**-0.5  # +-1/sqrt(fan_in = D)
    s = 3.0

    def check(path, equation):
        names = path.split("/")
        base, fused = gc.flatten_tree(params)[path], gc.flatten_tree(merged)[path]
        a, b = np.asarray(L._get(lora, names)["lora_a"]), np.asarray(L._get(lora, names)["lora_b"])
        np.testing.assert_allclose(fused - base, s * np.einsum(equation, a, b), rtol=1e-5, atol=1e-6)

    # Closed-form layouts (g = scanned group, e = expert, r = rank).
    check("layers/block_0/attn/q_einsum", "gdr,grnh->gndh")
    check("layers/block_0/attn/kv_einsum", "gdr,grckh->gckdh")
    check("layers/block_1/attn/k_einsum", "gdr,grkh->gkdh")
    check("layers/block_1/attn/attn_vec_einsum", "gnhr,grd->gnhd")
    check("layers/block_0/moe/router_logits", "gdr,gre->gde")
    check("layers/block_1/moe/gating_einsum", "gedr,gerjf->gejfd")
    check("layers/block_0/moe/linear", "gefr,gerd->gefd")
    check("self_conditioner/ffw/gating_einsum", "dr,rjf->jfd")
    check("self_conditioner/ffw/linear", "fr,rd->fd")
    untouched = "layers/block_0/pre_attention_norm/scale"
    assert _bits_equal(gc.flatten_tree(params)[untouched], gc.flatten_tree(merged)[untouched])

    doubled = jax.device_get(jax.jit(L.LoRA(rank=2, alpha=12.0, include_experts=True).merge)(params, lora))
    for path in adapter.targeted_paths(params):
        base = gc.flatten_tree(params)[path]
        np.testing.assert_allclose(
            gc.flatten_tree(doubled)[path] - base, 2 * (gc.flatten_tree(merged)[path] - base), rtol=1e-5, atol=1e-6
        )


# Each weight as the model uses it (x @ W, unstacked) and the same map with LoRA on the fly: (x @ A) @ B.
_ON_THE_FLY = {
    "moe/gating_einsum": ("ebd,egfd->ebgf", "ebd,edr->ebr", "ebr,ergf->ebgf", lambda w: (w.shape[0], 3, w.shape[3])),
    "moe/linear": ("ebf,efd->ebd", "ebf,efr->ebr", "ebr,erd->ebd", lambda w: (w.shape[0], 3, w.shape[1])),
    "attn/q_einsum": ("bd,ndh->bnh", "bd,dr->br", "br,rnh->bnh", lambda w: (3, w.shape[1])),
    "attn/kv_einsum": ("bd,ckdh->bckh", "bd,dr->br", "br,rckh->bckh", lambda w: (3, w.shape[2])),
    "attn/k_einsum": ("bd,kdh->bkh", "bd,dr->br", "br,rkh->bkh", lambda w: (3, w.shape[1])),
    "attn/attn_vec_einsum": ("bnh,nhd->bd", "bnh,nhr->br", "br,rd->bd", lambda w: (3, w.shape[0], w.shape[1])),
    "gating_einsum": ("bd,gfd->bgf", "bd,dr->br", "br,rgf->bgf", lambda w: (3, w.shape[2])),
    "linear": ("bf,fd->bd", "bf,fr->br", "br,rd->bd", lambda w: (3, w.shape[0])),
    "moe/router_logits": ("bd,de->be", "bd,dr->br", "br,re->be", lambda w: (3, w.shape[0])),
}


def test_fused_weight_equals_lora_on_the_fly(params, adapted):
    adapter, _, _, lora, merged = adapted
    flat_base, flat_fused = gc.flatten_tree(params), gc.flatten_tree(merged)
    rng = np.random.default_rng(4)
    for path in adapter.targeted_paths(params):
        names = path.split("/")
        kind = next(k for k in _ON_THE_FLY if path.endswith("/" + k))  # dict order: specific kinds first
        eq, eq_a, eq_b, x_shape = _ON_THE_FLY[kind]
        pick = (lambda v: v[1]) if names[0] == "layers" else (lambda v: v)  # group 1 of a scanned weight
        w, fused = pick(np.asarray(flat_base[path])), pick(np.asarray(flat_fused[path]))
        pair = L._get(lora, names)
        a, b = pick(np.asarray(pair["lora_a"])), pick(np.asarray(pair["lora_b"]))
        x = rng.standard_normal(x_shape(w)).astype(np.float32)
        on_the_fly = np.einsum(eq, x, w) + adapter.scale * np.einsum(eq_b, np.einsum(eq_a, x, a), b)
        np.testing.assert_allclose(np.einsum(eq, x, fused), on_the_fly, rtol=2e-5, atol=2e-5, err_msg=path)


@pytest.fixture(scope="module")
def trained(cfg, params):
    """Four AdamW steps on {"base", "lora"} with the base frozen by the optimizer mask (experts adapted too)."""
    model = T.Transformer(cfg)
    adapter = L.LoRA(rank=2, alpha=4.0, include_experts=True)
    opt_cfg = ml_collections.ConfigDict(
        dict(name="adamw", peak_lr=1e-2, end_lr=1e-3, warmup_steps=0, total_steps=10, weight_decay=0.01, clip_norm=1.0)
    )
    optimizer = optimizers.make_optimizer(opt_cfg, L.trainable_mask)
    loss_fn = L.lora_loss_fn(adapter, AutoregressiveObjective(model))
    step = jax.jit(make_train_step(loss_fn, optimizer, trainable_mask=L.trainable_mask), compiler_options=FAST)
    lora = jax.jit(adapter.init)(params, jax.random.key(5))
    state = TrainState.create({"base": jax.tree.map(jnp.asarray, params), "lora": lora}, optimizer, jax.random.key(6))
    batch = {"tokens": jnp.asarray(np.random.default_rng(7).integers(4, cfg.vocab_size, (4, 12)), jnp.int32)}
    losses = []
    for _ in range(4):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return model, adapter, jax.device_get(state), losses


@pytest.mark.slow
def test_training_updates_only_lora(trained, params):
    _, adapter, state, losses = trained
    for path, leaf in gc.flatten_tree(params).items():
        assert _bits_equal(gc.flatten_tree(state.params["base"])[path], leaf), path
    b = state.params["lora"]["layers"]["block_1"]["moe"]["gating_einsum"]["lora_b"]
    assert np.abs(b).max() > 0  # B left zero => no gradient reached the adapters (experts included)
    assert losses[-1] < losses[0]
    assert int(state.step) == 4
    # No optimizer state for the frozen base: every moment has the shape of a LoRA factor.
    lora_shapes = {tuple(x.shape) for x in jax.tree.leaves(state.params["lora"])}
    moments = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
    assert moments and all(tuple(x.shape) in lora_shapes for x in moments)
    assert len(moments) == 2 * len(jax.tree.leaves(state.params["lora"]))


@pytest.mark.slow
def test_lora_state_checkpoint_round_trip_and_fused_logits(trained, tmp_path):
    from hackable_diffusion.checkpoints import toolbox

    model, adapter, state, _ = trained
    checkpointer = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    checkpointer.save(4, state)
    restored = checkpointer.restore(4, checkpointing.abstract_like(jax.device_put(state)))
    checkpointer.close()
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert _bits_equal(a, b)

    fused = jax.device_get(jax.jit(adapter.merge)(restored.params["base"], restored.params["lora"]))
    toolbox.save_params(fused, tmp_path / "fused")
    reloaded = toolbox.load_params_directory(tmp_path / "fused")
    tokens = jnp.asarray(np.random.default_rng(8).integers(4, model.cfg.vocab_size, (2, 10)), jnp.int32)
    logits = jax.jit(
        lambda fused, state: (
            T.forward(model, fused, tokens)[0],  # sampling: fused weights
            T.forward(model, adapter.merge(state["base"], state["lora"]), tokens)[0],
            T.forward(model, state["base"], tokens)[0],
        ),
        compiler_options=FAST,
    )
    logits_fused, logits_training, logits_base = map(np.asarray, logits(reloaded, restored.params))
    np.testing.assert_allclose(logits_fused, logits_training, rtol=1e-5, atol=1e-5)
    assert np.abs(logits_fused - logits_base).max() > 1e-3  # the adapters act


@pytest.mark.slow
def test_logical_axes_shard_lora_like_its_weight(trained):
    _, _, state, _ = trained
    names = ("lora", "layers", "block_0", "moe", "gating_einsum")
    assert L.logical_axes(names + ("lora_a",), (2, 4, 32, 2)) == ("layers", "experts", "embed", "lora_rank")
    assert L.logical_axes(names + ("lora_b",), (2, 4, 2, 2, 16)) == (
        "layers",
        "experts",
        "lora_rank",
        None,
        "expert_mlp",
    )
    assert L.logical_axes(("base", "layers", "block_0", "attn", "q_einsum"), (2, 4, 32, 8)) == (
        "layers",
        "heads",
        "embed",
        "head_dim",
    )
    mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "expert": 2, "tensor": 2})
    shardings = sharding.param_shardings(state.params, L.logical_axes, mesh)
    spec = shardings["lora"]["layers"]["block_0"]["moe"]["gating_einsum"]["lora_a"].spec
    assert tuple(spec) == (None, "expert", "fsdp", None)
    assert sharding.replicated_expert_params(state.params, shardings, L.logical_axes) == []


@pytest.mark.slow
def test_sft_end_to_end_from_a_toolbox_checkpoint(tmp_path):
    """A tiny LoRA SFT run from a saved toolbox run: base untouched, adapters trained, fused params written, resume."""
    from hackable_diffusion import recipes, sft
    from hackable_diffusion.checkpoints import base_weights, toolbox
    from hackable_diffusion.data import text as text_lib
    from hackable_diffusion.data.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.fit(text_lib.load_shakespeare("train"))
    shape = presets.tiny(vocab_size=tokenizer.vocab_size, moe=False)
    shape["self_conditioning"] = True
    cfg = TransformerConfig.from_dict(shape)
    params = _random_params(cfg, 9)
    pre = tmp_path / "pretrain"
    tokenizer.save(pre / "tokenizer")
    source_diffusion = {
        "process": "uniform",
        "excluded_ids": (0, 1, 2, 3),
        "self_condition_prob": 0.0,
        "objective": "pretrain",
        "canvas_len": 32,
    }
    run_config.save_config(ml_collections.ConfigDict({"model": shape, "diffusion": source_diffusion}), pre / "config.json")
    saver = checkpointing.Checkpointer(str(pre / "checkpoints"), async_save=False)
    saver.save(7, TrainState.create(params, optax.sgd(0.1), jax.random.key(0)))
    saver.close()

    config = sft.sft_config(
        model=presets.tiny(),
        init_kind="toolbox",
        checkpoint=str(pre),
        lora_rank=2,
        lora_alpha=4.0,
        steps=2,
        batch_size=2,
        prompt_len=16,
        num_canvases=2,
        canvas_len=8,
    )
    config.sft.update(max_examples=32, eval_examples=2, num_devices=1)
    config.train.update(log_every=1, eval_every=0, checkpoint_every=2, fast_compile=True)
    config.optimizer.warmup_steps = 1
    config.mesh.data = 1
    config.output.save_gemma = True
    work = tmp_path / "sft"
    result = sft.run_sft(config, str(work))

    assert result.model.cfg == cfg
    base, lora = result.state.params["base"], result.state.params["lora"]
    for path, leaf in gc.flatten_tree(params).items():
        assert _bits_equal(gc.flatten_tree(base)[path], leaf), path
    assert max(float(np.abs(x).max()) for p, x in gc.flatten_tree(lora).items() if p.endswith("lora_b")) > 0
    fused = toolbox.load_params_directory(work / toolbox.FUSED_DIR)
    expected = jax.device_get(result.adapter.merge(base, lora))
    for path, leaf in gc.flatten_tree(expected).items():
        assert _bits_equal(gc.flatten_tree(fused)[path], leaf), path
    q = ("layers", "block_0", "attn", "q_einsum")
    assert not np.array_equal(L._get(fused, q), L._get(params, q))
    gemma = gc.load_gemma_checkpoint(work / sft.GEMMA_DIR, cfg)
    for path, leaf in gc.flatten_tree(expected).items():
        assert _bits_equal(gc.flatten_tree(gemma)[path], leaf), path
    saved = json.loads((work / "config.json").read_text())
    assert saved["model"]["vocab_size"] == tokenizer.vocab_size and (work / "tokenizer" / "tokenizer.json").is_file()
    # The source run's diffusion recipe is inherited (self_condition_prob), the SFT objective and canvas kept.
    assert saved["diffusion"]["self_condition_prob"] == 0.0 and saved["diffusion"]["objective"] == "sft"
    assert saved["diffusion"]["canvas_len"] == 8

    again = sft.run_sft(config, str(work))  # resumes at the last step: nothing to train, same adapters
    for a, b in zip(jax.tree.leaves(lora), jax.tree.leaves(again.state.params["lora"])):
        assert _bits_equal(a, b)

    # The fused weights start the next fine-tuning; the LoRA run's own checkpoints point there.
    chained = config.copy_and_resolve_references()
    chained.init.update(kind="params", checkpoint=str(work / toolbox.FUSED_DIR))
    start = base_weights.load_base(chained)
    assert start.model.cfg == cfg and start.tokenizer.vocab_size == tokenizer.vocab_size
    for path, leaf in gc.flatten_tree(expected).items():
        assert _bits_equal(gc.flatten_tree(start.params)[path], leaf), path
    with pytest.raises(ValueError, match="is a LoRA fine-tuning run"):
        toolbox.load_toolbox_params(work)
