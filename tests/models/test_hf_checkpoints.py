"""Hugging Face checkpoints: parity with `transformers` on tiny checkpoints it saved (tests/fixtures/hf_*, made by
experiments/checkpoints/make_hf_fixtures.py), the two decoder-window conventions, the config mapping and its refusals, strict
loading, sharded loading, saving and bit-exact round trips, the tokenizers, and the sampler pieces."""

from hackable_diffusion import sft
import dataclasses
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.checkpoints import hf as H
from hackable_diffusion.checkpoints import hf_files
from hackable_diffusion.checkpoints.hf_mapping import HFRule
from hackable_diffusion.data.tokenizers import PretrainedTokenizer
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling import early_stopping as E
from hackable_diffusion.sampling import selection as S
from hackable_diffusion.sampling import selection_base as SB
from hackable_diffusion.sampling.prompts import pad_prompts, prefill
from hackable_diffusion.sampling.temperature import AnnealedTemperature

DATA = pathlib.Path(__file__).parents[1] / "fixtures"
DG, G4 = DATA / "hf_diffusiongemma", DATA / "hf_gemma4"
TOL = dict(atol=1e-4, rtol=1e-4)
# Canvas logits pass the cache, the self-conditioner and six layers again in float32: transformers' own eager and sdpa
# attention paths differ by 8e-5 on them, the toolbox by up to 1.9e-4 (encoder logits: 1.5e-5).
CANVAS_TOL = dict(atol=2e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def arrays():
    return dict(np.load(DG / "arrays.npz"))


def encoder_and_canvas_logits(checkpoint, arrays, window=None):
    """(encoder causal logits, canvas logits, canvas logits with self-conditioning) through the public API."""
    cfg = checkpoint.config if window is None else checkpoint.config.replace(sliding_window=window)
    model, params = T.Transformer(cfg), checkpoint.params
    prompt, canvas = jnp.asarray(arrays["prompt"]), jnp.asarray(arrays["canvas"])
    encoder, _ = T.forward(model, params, prompt, causal=True)
    _, cache = prefill(model, params, prompt, jnp.ones(prompt.shape, bool), cache_length=prompt.shape[1] + 8)
    null = T.model_method(model, params, "null_sc_signal", canvas.shape)
    plain, _ = T.decode_block(model, params, canvas, cache, sc_signal=null)
    sc = T.model_method(model, params, "sc_signal", jnp.asarray(arrays["sc_logits"]))
    with_sc, _ = T.decode_block(model, params, canvas, cache, sc_signal=sc)
    return np.asarray(encoder), np.asarray(plain), np.asarray(with_sc)


@pytest.fixture(scope="module")
def per_token():
    return H.load_hf(DG)


@pytest.fixture(scope="module")
def cache_tail():
    return H.load_hf(DG, decoder_window="cache_tail")


def test_window_smaller_than_prompt_and_canvas_cache_tail_reproduces_transformers(cache_tail, arrays):
    encoder, plain, with_sc = encoder_and_canvas_logits(cache_tail, arrays)
    np.testing.assert_allclose(encoder, arrays["encoder_logits"], **TOL)
    np.testing.assert_allclose(plain, arrays["canvas_logits"], **CANVAS_TOL)
    np.testing.assert_allclose(with_sc, arrays["canvas_logits_sc"], **CANVAS_TOL)


@pytest.mark.slow
def test_window_smaller_than_prompt_and_canvas_the_gemma_convention_differs_in_the_decoder_only(per_token, arrays):
    """The gemma library's per-token window over cache and canvas: the same causal (encoder) logits, other canvas
    logits (docs/reference.md §6)."""
    assert per_token.config.decoder_window == "per_token"
    encoder, plain, with_sc = encoder_and_canvas_logits(per_token, arrays)
    np.testing.assert_allclose(encoder, arrays["encoder_logits"], **TOL)
    assert np.abs(plain - arrays["canvas_logits"]).max() > 1.0
    assert np.abs(with_sc - arrays["canvas_logits_sc"]).max() > 1.0


@pytest.mark.slow
@pytest.mark.parametrize("convention", ["per_token", "cache_tail"])
def test_window_larger_than_prompt_and_canvas_both_conventions_equal_transformers(convention, arrays):
    checkpoint = H.load_hf(DG, decoder_window=convention)
    encoder, plain, with_sc = encoder_and_canvas_logits(checkpoint, arrays, window=64)
    np.testing.assert_allclose(encoder, arrays["encoder_logits_wide"], **TOL)
    np.testing.assert_allclose(plain, arrays["canvas_logits_wide"], **CANVAS_TOL)
    np.testing.assert_allclose(with_sc, arrays["canvas_logits_sc_wide"], **CANVAS_TOL)


@pytest.mark.slow
def test_kv_cache_after_the_prompt_equals_transformers(per_token, arrays):
    cfg = per_token.config.replace(sliding_window=64)
    model, prompt = T.Transformer(cfg), jnp.asarray(arrays["prompt"])
    _, cache = prefill(model, per_token.params, prompt, jnp.ones(prompt.shape, bool), cache_length=prompt.shape[1])
    pattern = len(cfg.layer_pattern)
    for layer in range(cfg.num_layers):
        group, block = divmod(layer, pattern)
        for name in ("k", "v"):
            ours = np.asarray(cache.layers[block][name][group])  # (b, slots, kv heads, head dim)
            theirs = arrays[f"cache_{name}_{layer}"].transpose(0, 2, 1, 3)  # (b, kv heads, slots, head dim)
            np.testing.assert_allclose(ours, theirs, **TOL, err_msg=f"layer {layer} {name}")


@pytest.mark.slow
def test_right_padded_batch_equals_transformers(per_token, arrays):
    cfg = per_token.config.replace(sliding_window=64)
    model, params = T.Transformer(cfg), per_token.params
    lengths = arrays["padded_lengths"]
    rows = [arrays["padded_prompt"][i, :n].tolist() for i, n in enumerate(lengths)]
    prompt, prompt_mask = pad_prompts(rows)
    logits, cache = prefill(model, params, prompt, prompt_mask, cache_length=prompt.shape[1] + 8)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(np.asarray(logits)[i, :n], arrays["padded_encoder_logits"][i, :n], **TOL)
    canvas = jnp.asarray(arrays["canvas"])
    null = T.model_method(model, params, "null_sc_signal", canvas.shape)
    plain, _ = T.decode_block(model, params, canvas, cache, sc_signal=null)
    np.testing.assert_allclose(np.asarray(plain), arrays["padded_canvas_logits"], **CANVAS_TOL)


def test_gemma4_causal_lm_logits_equal_transformers():
    checkpoint = H.load_hf(G4)
    cfg = checkpoint.config
    assert (cfg.self_conditioning, cfg.k_eq_v_global, cfg.sliding_window) == (False, True, 4)
    fixture = np.load(G4 / "arrays.npz")
    logits, _ = T.forward(T.Transformer(cfg), checkpoint.params, jnp.asarray(fixture["tokens"]), causal=True)
    np.testing.assert_allclose(np.asarray(logits), fixture["logits"], **TOL)


def test_a_wrong_mapping_row_breaks_parity(arrays):
    """Swap the two dense-FFN norms' Hugging Face names (the crossed naming the table exists for): parity fails."""
    rules = []
    for rule in H.RULES:
        if rule.toolbox.endswith("pre_ffw2_norm/scale"):
            rule = dataclasses.replace(rule, hf=("layers.{n}.pre_feedforward_layernorm_2.weight",))
        elif rule.toolbox.endswith("pre_ffw_norm/scale"):
            rule = dataclasses.replace(rule, hf=("layers.{n}.pre_feedforward_layernorm.weight",))
        rules.append(rule)
    wrong = H.load_hf(DG, decoder_window="cache_tail", rules=rules)
    encoder, _, _ = encoder_and_canvas_logits(wrong, arrays)
    assert np.abs(encoder - arrays["encoder_logits"]).max() > 1e-2


def test_config_mapping_round_trip_and_defaults():
    hf = json.loads((DG / "config.json").read_text())
    cfg, info = H.config_from_hf(hf, dispatch="sorted")
    assert info.model_type == "diffusion_gemma" and info.canvas_length == 8 and info.eos_token_ids == (1,)
    assert cfg.layer_pattern == ("local",) * 5 + ("global",) and cfg.num_layers == 6
    assert (cfg.global_attn_head_dim, cfg.global_kv_heads, cfg.head_dim, cfg.num_kv_heads) == (16, 1, 8, 2)
    assert cfg.rope_global_proportion == 0.25 and cfg.rope_global_base == 1e6 and cfg.final_logit_softcap == 30.0
    assert cfg.self_conditioning and cfg.k_eq_v_global and cfg.decoder_window == "per_token"
    assert cfg.moe.capacity_factor == cfg.moe.num_experts / cfg.moe.top_k  # dropless: a slot for every assignment
    back, _ = H.config_from_hf(H.config_to_hf(cfg, canvas_length=8), dispatch="sorted")
    assert back == cfg


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("hidden_activation", "silu", "gated GELU"),
        ("attention_bias", True, "no bias"),
        ("use_bidirectional_attention", "all", "causal"),
        ("tie_word_embeddings", False, "tied"),
        ("num_experts", None, "MoE block"),
        ("hidden_size_per_layer_input", 8, "per-layer input embeddings"),
        ("layer_types", ["linear_attention"] * 6, "Gemma-4"),
    ],
)
def test_inexpressible_config_fields_are_refused_by_name(field, value, message):
    hf = json.loads((DG / "config.json").read_text())
    hf["text_config"][field] = value
    with pytest.raises(ValueError, match=rf"{field}.*{message}"):
        H.config_from_hf(hf)


def test_rope_scaling_and_dense_gemma4_are_refused():
    hf = json.loads((DG / "config.json").read_text())
    hf["text_config"]["rope_parameters"]["full_attention"]["factor"] = 8.0
    with pytest.raises(ValueError, match="RoPE scaling"):
        H.config_from_hf(hf)
    g4 = json.loads((G4 / "config.json").read_text())
    g4["enable_moe_block"] = False
    with pytest.raises(ValueError, match="enable_moe_block"):
        H.config_from_hf(g4)


def copy_fixture(tmp_path) -> pathlib.Path:
    out = tmp_path / "ckpt"
    shutil.copytree(DG, out)
    return out


def rewrite(path: pathlib.Path, change) -> None:
    tensors = hf_files.read_all_tensors(path)
    change(tensors)
    from safetensors.numpy import save_file

    save_file(tensors, str(path / hf_files.SINGLE_FILE), metadata={"format": "pt"})


def test_missing_unexpected_and_disagreeing_tensors_fail_by_name(tmp_path):
    path = copy_fixture(tmp_path)
    rewrite(path, lambda t: t.pop("model.decoder.layers.3.router.scale"))
    with pytest.raises(ValueError, match=r"lacks 1 text tensor.*layers\.3\.router\.scale"):
        H.load_hf(path)
    path = copy_fixture(tmp_path / "b")
    rewrite(path, lambda t: t.update({"model.decoder.layers.0.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(ValueError, match=r"no place for.*layers\.0\.extra\.weight"):
        H.load_hf(path)
    assert H.load_hf(path, ignore_unexpected=True).config.num_layers == 6
    path = copy_fixture(tmp_path / "c")
    rewrite(path, lambda t: t.update({"model.encoder.language_model.layers.2.layer_scalar": np.ones(1, np.float32)}))
    with pytest.raises(ValueError, match=r"encoder\.language_model\.layers\.2\.layer_scalar differs from"):
        H.load_hf(path)


def test_vision_tower_is_skipped_and_counted(per_token):
    files = hf_files.weight_files(DG)
    assert per_token.skipped_tensors == sum("vision" in name for name in files) > 0


def test_sharded_load_equals_the_host_load(per_token):
    devices = np.array(jax.devices()[:8]).reshape(2, 2, 2, 1)
    mesh = jax.sharding.Mesh(devices, ("data", "fsdp", "expert", "tensor"))
    sharded = H.load_hf(DG, mesh=mesh)
    flat_host, flat_sharded = H.flatten_tree(per_token.params), H.flatten_tree(sharded.params)
    assert sorted(flat_host) == sorted(flat_sharded)
    spread = 0
    for path, host in flat_host.items():
        array = flat_sharded[path]
        assert isinstance(array, jax.Array) and array.shape == host.shape
        np.testing.assert_array_equal(np.asarray(array), host, err_msg=path)
        spread += not array.sharding.is_fully_replicated
    assert spread > 0  # some leaves are really split over the mesh


def test_save_then_load_is_bit_exact_and_the_directory_matches_transformers_layout(per_token, tmp_path):
    out = H.save_hf(tmp_path / "out", per_token.config, per_token.params, canvas_length=8, source=DG)
    theirs, ours = hf_files.read_all_tensors(DG), hf_files.read_all_tensors(out)
    assert sorted(theirs) == sorted(ours)  # text, encoder layer_scalar copies and the carried-over vision tower
    for name, value in theirs.items():
        assert value.dtype == ours[name].dtype and np.array_equal(value.view(np.uint8), ours[name].view(np.uint8)), name
    assert (out / "tokenizer.model").is_file()
    again = H.load_hf(out)
    for path, value in H.flatten_tree(per_token.params).items():
        assert np.array_equal(np.asarray(value), H.flatten_tree(again.params)[path]), path
    generation = json.loads((out / hf_files.GENERATION_CONFIG_FILE).read_text())
    assert generation["max_denoising_steps"] == 48 and generation["sampler_config"]["entropy_bound"] == 0.1


def test_shards_and_index_when_a_checkpoint_exceeds_the_shard_size(per_token, tmp_path):
    out = H.save_hf(tmp_path / "sharded", per_token.config, per_token.params, canvas_length=8, max_shard_bytes=60_000)
    index = json.loads((out / hf_files.INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert not (out / hf_files.SINGLE_FILE).exists()
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in hf_files.read_all_tensors(out).values())
    reloaded = H.load_hf(out)
    for path, value in H.flatten_tree(per_token.params).items():
        assert np.array_equal(H.flatten_tree(reloaded.params)[path], np.asarray(value)), path


def test_export_refuses_what_hugging_face_cannot_hold(per_token):
    with pytest.raises(ValueError, match="depth_loops"):
        H.config_to_hf(per_token.config.replace(depth_loops=2))
    with pytest.raises(ValueError, match="self_conditioning"):
        H.config_to_hf(per_token.config, model_type="gemma4_text")


def test_tokenizers_of_both_kinds():
    spm_tok = PretrainedTokenizer.from_directory(DG)  # tokenizer.model, sentencepiece
    json_tok = PretrainedTokenizer.from_directory(G4)  # tokenizer.json, the tokenizers library
    for tok in (spm_tok, json_tok):
        ids = tok.encode("the lazy dog sleeps")
        assert min(ids) >= 4 and tok.decode(ids) == "the lazy dog sleeps"
        assert tok.decode([2, *ids, 1, *ids]) == "the lazy dog sleeps"  # BOS skipped, stops at EOS
    assert spm_tok.vocab_size == 96


def test_entropy_bound_accept_mask_equals_transformers(arrays):
    logits = jnp.asarray(arrays["eb_logits"])
    b, c, _ = logits.shape
    info = SB.StepInfo.at(0, 48, LinearSchedule(), jnp.ones((b, c), bool), False)
    accept, _ = S.EntropyBound(0.1)(
        jax.random.split(jax.random.key(0), b), logits, jnp.zeros((b, c), jnp.int32), jnp.ones((b, c), bool), info
    )
    np.testing.assert_array_equal(np.asarray(accept), arrays["eb_accept"])


def test_annealed_temperature_equals_transformers_linear_schedule(arrays):
    temperature = AnnealedTemperature(0.4, 0.8, 1.0)
    remaining = arrays["temperature_steps_remaining"]  # transformers counts the steps left; step i has 48 - i
    ours = np.asarray(temperature(jnp.asarray(remaining / 48.0)))
    np.testing.assert_allclose(ours, arrays["temperature"], rtol=1e-6)


def test_transformers_early_stopping_equals_stable_and_confident(arrays):
    """StableAndConfidentStoppingCriteria(1, 0.005) step by step: the argmax equals the previous step's AND the mean
    entropy is below 0.005 (strictly)."""
    rule = E.transformers_early_stopping()
    previous = jnp.full(arrays["stop_argmax"].shape[1:], -1, jnp.int32)
    for step, (argmax, logits) in enumerate(zip(arrays["stop_argmax"], arrays["stop_logits"])):
        logits, free = jnp.asarray(logits), jnp.ones(argmax.shape, bool)
        assert np.array_equal(np.asarray(jnp.argmax(logits, axis=-1)), argmax)
        stop = rule(logits, jnp.asarray(argmax), jnp.asarray(argmax), free, previous)
        np.testing.assert_array_equal(np.asarray(stop), arrays["stop_flags"][step], err_msg=f"step {step}")
        previous = jnp.asarray(argmax)
    assert arrays["stop_flags"].any() and not arrays["stop_flags"].all()


@pytest.mark.slow
def test_lora_sft_from_a_hugging_face_directory_exports_a_directory_that_loads_back(tmp_path):
    """`sft --init_from hf:DIR`: LoRA with the router frozen, a few steps, the merged weights exported as a Hugging
    Face directory that loads back bit for bit, with the logits of the merged toolbox model."""
    from hackable_diffusion import recipes, sft

    config = sft.sft_config(
        init_kind="hf",
        checkpoint=str(DG),
        lora_rank=2,
        lora_alpha=4.0,
        steps=2,
        batch_size=2,
        prompt_len=16,
        num_canvases=1,
        canvas_len=8,
    )
    config.sft.update(max_examples=16, eval_examples=2, num_devices=1)
    config.train.update(log_every=1, eval_every=0, checkpoint_every=2, fast_compile=True)
    config.optimizer.warmup_steps = 1
    config.mesh.data = 1
    config.lora.freeze_router = True
    config.output.update(save_hf=True, save_lora=False)
    result = sft.run_sft(config, str(tmp_path / "sft"))
    base = H.load_hf(DG)
    assert result.model.cfg == base.config
    assert not any("router" in p for p in H.flatten_tree(result.state.params["lora"]))
    fused = H.flatten_tree(result.fused_params)
    for path, value in H.flatten_tree(base.params).items():
        changed = not np.array_equal(np.asarray(fused[path]), value)
        assert changed == (
            "q_einsum" in path
            or "kv_einsum" in path
            or "k_einsum" in path
            or "attn_vec" in path
            or "mlp2/" in path
            or "self_conditioner/ffw" in path
        ), path
    exported = H.load_hf(tmp_path / "sft" / sft.HF_DIR)
    assert exported.config == base.config
    for path, value in fused.items():
        assert np.array_equal(H.flatten_tree(exported.params)[path], np.asarray(value)), path
    assert (tmp_path / "sft" / sft.HF_DIR / "tokenizer.model").is_file()


def test_mapping_rules_are_frozen_and_hashable():
    rule = HFRule("embed/embedding", ("model.embed_tokens.weight",))
    hash(rule)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.toolbox = "other"
