"""Quantized checkpoints: ModelOpt NVFP4 and FP8 (compressed-tensors) Hugging Face directories read by `load_hf`, and
the toolbox's own NVFP4 runs (`quantize --format nvfp4`).

The fixtures are written here from the formats' published descriptions by an independent NumPy packer (ml_dtypes'
float4_e2m1fn and float8_e4m3fn casts, the E2M1 table written out below), never by the code under test: the tensors
of the tiny transformers-saved checkpoints (tests/fixtures/hf_*) are quantized, written as safetensors with a
config.json `quantization_config`, loaded with `load_hf`, and compared with (a) the same reference values written
unquantized and loaded the same way (bit for bit) and (b) the unquantized model's logits."""

import dataclasses
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from hackable_diffusion.checkpoints import hf as H
from hackable_diffusion.checkpoints import hf_files
from hackable_diffusion.checkpoints import quantized_formats as QF
from hackable_diffusion.checkpoints import quantized_runs
from hackable_diffusion.models import presets
from hackable_diffusion.models import quantize as Q
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig

DATA = pathlib.Path(__file__).parents[1] / "fixtures"
DG, G4 = DATA / "hf_diffusiongemma", DATA / "hf_gemma4"
# FP4 E2M1 (OCP Microscaling Formats v1.0): codes 0-7 positive, bit 3 the sign; code 8 is -0.0.
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)
F4, F8 = ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e4m3fn


# ----------------------------------------------------------------------------------------------------------------
# The independent packers: published layout, NumPy only.


def nvfp4_pack(w: np.ndarray):
    """ModelOpt's NVFP4 of a (..., out, in) weight: (packed uint8 (.., out, in/2), e4m3 block scales (.., out, in/16),
    float32 second scale per matrix (() or (E,)), the exact dequantized float32 reference)."""
    w = w.astype(np.float32)
    amax = np.abs(w).max(axis=(-2, -1))
    second = (amax / np.float32(6 * 448)).astype(np.float32)
    blocks = w.reshape(*w.shape[:-1], -1, 16)
    block_scale = (np.abs(blocks).max(-1) / np.float32(6) / second[..., None, None]).astype(F8)
    step = block_scale.astype(np.float32)[..., None] * second[..., None, None, None]
    codes = ((blocks / step).astype(F4).view(np.uint8) & 0xF).reshape(w.shape)  # round to nearest even, saturating
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)  # the even element in the low nibble
    scale = np.repeat(block_scale.astype(np.float64), 16, axis=-1) * np.asarray(second, np.float64)[..., None, None]
    return packed, block_scale, second, (E2M1[codes] * scale).astype(np.float32)


def fp8_pack(w: np.ndarray, strategy: str, block=(8, 8)):
    """compressed-tensors' FP8 of a (..., out, in) weight: (float8_e4m3fn weight, float32 scale, exact reference)."""
    w = w.astype(np.float32)
    if strategy == "tensor":
        scale = np.abs(w).max(axis=(-2, -1), keepdims=True) / np.float32(448)
        stored = scale.reshape(-1) if w.ndim == 2 else scale.reshape(w.shape[:-2])
    elif strategy == "channel":
        scale = stored = np.abs(w).max(axis=-1, keepdims=True) / np.float32(448)
    else:
        b0, b1 = block
        padded = np.pad(np.abs(w), [(0, 0)] * (w.ndim - 2) + [(0, -w.shape[-2] % b0), (0, -w.shape[-1] % b1)])
        tiles = padded.reshape(*w.shape[:-2], padded.shape[-2] // b0, b0, padded.shape[-1] // b1, b1)
        stored = tiles.max(axis=(-3, -1)) / np.float32(448)
        scale = np.repeat(np.repeat(stored, b0, -2), b1, -1)[..., : w.shape[-2], : w.shape[-1]]
    stored = stored.astype(np.float32)
    q = (w / scale.astype(np.float32)).astype(F8)
    return q, stored, (q.astype(np.float64) * scale.astype(np.float32).astype(np.float64)).astype(np.float32)


def is_linear_weight(name: str) -> bool:
    return name.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj")) and "router" not in name


def scale_name(name: str, kind: str) -> str:
    return (name[: -len("weight")] if name.endswith(".weight") else name + "_") + kind


def unfuse_experts(tensors):
    """The fused expert parameters split into one linear layer per expert, as quantizers store them:
    experts.{e}.gate_proj / up_proj (He, D) and experts.{e}.down_proj (D, He)."""
    out = {}
    for name, w in tensors.items():
        stack = name.rsplit(".", 1)[0]
        if name.endswith("experts.gate_up_proj"):
            half = w.shape[1] // 2
            for e in range(w.shape[0]):
                out[f"{stack}.{e}.gate_proj.weight"], out[f"{stack}.{e}.up_proj.weight"] = w[e, :half], w[e, half:]
        elif name.endswith("experts.down_proj"):
            out.update({f"{stack}.{e}.down_proj.weight": w[e] for e in range(w.shape[0])})
        else:
            out[name] = w
    return out


def fuse_experts(tensors, source_names):
    """The inverse of `unfuse_experts` for the names of `source_names`."""
    out = {n: w for n, w in tensors.items() if ".experts." not in n or n in source_names}
    for name in source_names:
        stack, count = name.rsplit(".", 1)[0], 0
        while f"{stack}.{count}.down_proj.weight" in tensors:
            count += 1
        if name.endswith("experts.gate_up_proj"):
            halves = [[tensors[f"{stack}.{e}.{p}_proj.weight"] for p in ("gate", "up")] for e in range(count)]
            out[name] = np.stack([np.concatenate(pair) for pair in halves])
        elif name.endswith("experts.down_proj"):
            out[name] = np.stack([tensors[f"{stack}.{e}.down_proj.weight"] for e in range(count)])
    return out


def write_quantized(source, target, fmt, *, strategy="channel", ignore=(), extra_config=None, per_expert=False):
    """Writes `source` quantized to `fmt` ("nvfp4" or "fp8") into `target` and the same reference values unquantized
    into `target`_ref; returns {tensor name: reference}. per_expert: the experts stored one linear layer each."""
    original = hf_files.read_all_tensors(source)
    tensors, refs, plain = unfuse_experts(original) if per_expert else original, {}, {}
    out = {}
    for name, w in tensors.items():
        module = name[: -len(".weight")] if name.endswith(".weight") else name
        if not is_linear_weight(name) or module in ignore:
            out[name] = plain[name] = w
            continue
        if fmt == "nvfp4":
            packed, block_scale, second, ref = nvfp4_pack(w)
            out[name], out[scale_name(name, "weight_scale")] = packed, block_scale
            out[scale_name(name, "weight_scale_2")] = np.asarray(second, np.float32)  # () or (E,)
            out[scale_name(name, "input_scale")] = np.asarray(0.5, np.float32)  # an activation scale: not a weight
        else:
            out[name], out[scale_name(name, "weight_scale")], ref = fp8_pack(w, strategy)
        refs[name] = plain[name] = ref
    config = json.loads((source / "config.json").read_text())
    if fmt == "nvfp4":
        quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head", *ignore]}
    else:
        weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
        if strategy == "block":
            weights["block_structure"] = [8, 8]
        quant = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
            "ignore": ["lm_head", *ignore],
            "quantization_status": "compressed",
        }
    config["quantization_config"] = dict(quant, **(extra_config or {}))
    if per_expert:
        plain = fuse_experts(plain, set(original))
    for directory, weights, cfg in ((target, out, config), (target.with_name(target.name + "_ref"), plain, None)):
        directory.mkdir()
        save_file(weights, str(directory / "model.safetensors"))
        cfg = cfg or {k: v for k, v in config.items() if k != "quantization_config"}
        (directory / "config.json").write_text(json.dumps(cfg))
    return refs


def logits(tokens, *checkpoints):
    """The causal logits of each checkpoint (they share the config, so one compiled program, the one
    test_hf_checkpoints compiles for the same fixture)."""
    model = T.Transformer(checkpoints[0].config)
    return [np.asarray(T.forward(model, c.params, tokens, causal=True)[0]) for c in checkpoints]


def relative(x, want):
    return float(np.sqrt(np.mean((x - want) ** 2)) / np.sqrt(np.mean(want**2)))


# ----------------------------------------------------------------------------------------------------------------
# The formats' edge cases.


def test_e2m1_code_table_negative_zero_nibble_order_and_block_boundaries():
    """Every 4-bit code in both nibbles; two blocks of 16 with different e4m3 scales meeting between elements 15 and
    16; a second scale; -0.0 stays negative."""
    codes = np.concatenate([np.arange(16), np.arange(16)[::-1]]).astype(np.uint8)  # one row of 32 elements
    codes = np.stack([codes, np.roll(codes, 1)])  # a second row: each code in the other nibble
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    block_scale = np.array([[1.0, 2.0], [0.5, 448.0]], F8)
    out = QF.dequantize_nvfp4(packed, block_scale, np.float32(0.25))
    want = E2M1[codes] * np.repeat(block_scale.astype(np.float64), 16, axis=1) * 0.25
    np.testing.assert_array_equal(out, want.astype(np.float32))
    assert out.dtype == np.float32
    assert out[0, 15] == -6 * 1.0 * 0.25 and out[0, 16] == -6 * 2.0 * 0.25  # the last of block 0, the first of 1
    negative_zero = codes == 8
    assert negative_zero.sum() == 4 and np.all(np.signbit(out[negative_zero])) and np.all(out[negative_zero] == 0)
    assert not np.any(np.signbit(out[codes == 0]))
    with pytest.raises(ValueError, match=r"weight_scale of shape \(2, 2\)"):
        QF.dequantize_nvfp4(packed, block_scale[:, :1], np.float32(1))


def test_second_scales_per_tensor_per_expert_and_per_fused_half():
    """A fused expert parameter (E, out, in) has one second scale per expert (E,), or per expert and gate / up half
    (E, 2); a shape that fits neither is named."""
    codes = np.full((2, 4, 16), 2, np.uint8)  # every element 1.0
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    ones = np.ones((2, 4, 1), F8)
    per_expert = QF.dequantize_nvfp4(packed, ones, np.array([2.0, 3.0], np.float32))
    np.testing.assert_array_equal(per_expert[:, :, 0], [[2, 2, 2, 2], [3, 3, 3, 3]])
    halves = QF.dequantize_nvfp4(packed, ones, np.array([[2.0, 5.0], [3.0, 7.0]], np.float32))
    np.testing.assert_array_equal(halves[:, :, 0], [[2, 2, 5, 5], [3, 3, 7, 7]])
    np.testing.assert_array_equal(QF.dequantize_nvfp4(packed, ones, np.array([4.0], np.float32)), np.full(codes.shape, 4))
    with pytest.raises(ValueError, match=r"weight_scale_2 has the shape \(3,\)"):
        QF.dequantize_nvfp4(packed, ones, np.ones(3, np.float32))


def test_the_toolbox_nvfp4_codes_and_scales_equal_the_independent_packer():
    """models/quantize.py's NVFP4 (what `quantize --format nvfp4` stores) is the published format: the same packed
    bytes, e4m3 block scales and second scale as the NumPy packer, ties to even included."""
    w = np.array(jax.random.normal(jax.random.key(0), (24, 64)) * jnp.linspace(0.01, 2.0, 64))
    assert np.abs(w).max() < 10.5
    # amax 10.5 = 2688 / 256: the second scale is 2^-8, a block of amax 6 gets the e4m3 scale 256, a step of exactly 1,
    # so these are E2M1's midpoints, each a tie that goes to the even code, and -0.0
    w[1, 0] = 10.5
    w[0, :16] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, 6.0, -6.0, -2.5, -0.25, 0, 0, 0, 0]
    packed, block_scale, second, ref = nvfp4_pack(w)
    ours = Q.quantize_nvfp4_leaf(jnp.asarray(w), -1)
    np.testing.assert_array_equal(np.asarray(ours[0]), packed)
    np.testing.assert_array_equal(np.asarray(ours[1]).view(np.uint8), block_scale.view(np.uint8))
    assert float(ours[2]) == float(second)
    np.testing.assert_array_equal(np.asarray(Q.dequantize_nvfp4_leaf(*ours, -1, jnp.float32)), ref)
    assert float(second) == 2.0**-8 and block_scale[0, 0].astype(np.float32) == 256
    np.testing.assert_array_equal(ref[0, :12], [0, 1, 1, 2, 2, 4, 4, -0.0, 6, -6, -2, -0.0])
    assert np.signbit(ref[0, 7]) and np.signbit(ref[0, 11])
    np.testing.assert_array_equal(Q.e2m1_codes(jnp.asarray(E2M1)), np.arange(16))  # the table is its own codes


# ----------------------------------------------------------------------------------------------------------------
# Published checkpoints, loaded.


def test_nvfp4_checkpoint_loads_exactly_and_its_logits_stay_within_the_quantization_error(tmp_path):
    """Gemma-4 with every linear layer (attention, dense FFN, the fused experts) in ModelOpt's NVFP4, one layer on
    the ignore list: the loaded weights equal the reference bit for bit, the ignored one is the stored float, the
    input scales are dropped, and the logits move by about what the weights did."""
    ignored = "model.layers.2.self_attn.q_proj"
    refs = write_quantized(G4, tmp_path / "nvfp4", "nvfp4", ignore=(ignored,))
    assert ignored + ".weight" not in refs and "model.layers.0.experts.gate_up_proj" in refs
    loaded, reference, full = H.load_hf(tmp_path / "nvfp4"), H.load_hf(tmp_path / "nvfp4_ref"), H.load_hf(G4)
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(loaded.params)[0]}
    for path, want in jax.tree_util.tree_flatten_with_path(reference.params)[0]:
        np.testing.assert_array_equal(flat[jax.tree_util.keystr(path)], want, err_msg=jax.tree_util.keystr(path))
    q_einsum = np.asarray(loaded.params["layers"]["block_2"]["attn"]["q_einsum"][0])
    np.testing.assert_array_equal(q_einsum, np.asarray(full.params["layers"]["block_2"]["attn"]["q_einsum"][0]))

    # weights: E2M1 rounds within a quarter of the value or half a block step (|x| < 1 step), plus e4m3 saturation
    original = hf_files.read_all_tensors(G4)
    for name, ref in refs.items():
        w = original[name]
        step = np.repeat(np.abs(w).reshape(*w.shape[:-1], -1, 16).max(-1), 16, -1) / 6
        assert np.all(np.abs(ref - w) <= 0.25 * np.abs(w) + 0.25 * step * (1 + 2**-3) + 1e-7), name
    nvfp4_weights = np.mean([relative(ref, original[n]) for n, ref in refs.items()])
    assert 0.05 < nvfp4_weights < 0.15  # NVFP4's ~9% on Gaussian-like weights

    # logits: a random-weight model amplifies any weight error (here 5 to 11x), so the bound is the amplification of
    # the same model under FP8 (per channel, ~2.5% weight error): NVFP4's logits error is its weight error times that
    fp8_refs = write_quantized(G4, tmp_path / "fp8", "fp8")
    fp8_weights = np.mean([relative(ref, original[n]) for n, ref in fp8_refs.items()])
    tokens = jnp.asarray(np.load(G4 / "arrays.npz")["tokens"])
    rounded_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(np.float32), full.params)
    bf16 = dataclasses.replace(full, params=rounded_params)
    want, nvfp4, fp8, rounded = logits(tokens, full, loaded, H.load_hf(tmp_path / "fp8"), bf16)
    # FP8 as in test_quantize: e4m3 rounds 2^4 times coarser than bf16 (2^-9 relative)
    assert 0 < relative(rounded, want) < relative(fp8, want) < 32 * relative(rounded, want)
    gain_fp8 = relative(fp8, want) / fp8_weights  # the logits error per unit of weight error (about 11 here)
    # larger perturbations are amplified less (the softcap, the norms), so FP8's gain bounds NVFP4's from above
    assert relative(fp8, want) < relative(nvfp4, want) <= gain_fp8 * nvfp4_weights, (relative(nvfp4, want), gain_fp8)


@pytest.mark.parametrize("strategy", ["channel", "tensor", "block"])
def test_fp8_compressed_tensors_checkpoint_loads_exactly_and_logits_stay_close(tmp_path, strategy):
    """DiffusionGemma (its encoder copies of layer_scalar included) in compressed-tensors FP8 per channel, per tensor
    and in 8x8 blocks: the loaded weights equal the reference bit for bit, and differ from the unquantized ones by
    e4m3's rounding (FP8's logits: the NVFP4 test)."""
    refs = write_quantized(DG, tmp_path / "fp8", "fp8", strategy=strategy)
    assert "model.decoder.layers.0.experts.down_proj" in refs
    loaded, reference, full = H.load_hf(tmp_path / "fp8"), H.load_hf(tmp_path / "fp8_ref"), H.load_hf(DG)
    for a, b, c in zip(*(jax.tree.leaves(x.params) for x in (loaded, reference, full)), strict=True):
        np.testing.assert_array_equal(a, b)
        # e4m3 has 3 mantissa bits: within 2^-4 of the value, or half its smallest subnormal step (2^-10 * scale)
        assert np.all(np.abs(a - c) <= 2.0**-4 * np.abs(c) + 2.0**-10 * np.abs(c).max() / 448 * 8)
    assert sum(not np.array_equal(a, c) for a, c in zip(*(jax.tree.leaves(x.params) for x in (loaded, full)))) >= 5


def test_unknown_quant_method_and_inconsistent_checkpoints_are_one_line_errors(tmp_path):
    write_quantized(G4, tmp_path / "awq", "fp8", extra_config={"quant_method": "awq"})
    with pytest.raises(ValueError, match=r"quant_method 'awq' is not supported; the toolbox reads 'modelopt'") as err:
        H.load_hf(tmp_path / "awq")
    assert "\n" not in str(err.value) and "compressed-tensors" in str(err.value)
    write_quantized(G4, tmp_path / "mx", "nvfp4", extra_config={"quant_algo": "MXFP4"})
    with pytest.raises(ValueError, match="quant_algo 'MXFP4' is not supported"):
        H.load_hf(tmp_path / "mx")

    # a packed weight whose module is on the ignore list cannot be read unquantized
    write_quantized(G4, tmp_path / "ignored", "nvfp4", extra_config={"ignore": ["model.layers.1.mlp*"]})
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.down_proj.weight is stored as U8 .* ignore list"):
        H.load_hf(tmp_path / "ignored")
    # a missing second scale is named
    directory = tmp_path / "nvfp4"
    write_quantized(G4, directory, "nvfp4")
    stored = {}
    header, _ = QF._header(directory / "model.safetensors")
    for name in header:
        if name != "__metadata__" and name != "model.layers.3.self_attn.o_proj.weight_scale_2":
            stored[name] = QF.read_stored(directory / "model.safetensors", name)
    save_file(stored, str(directory / "model.safetensors"))
    with pytest.raises(ValueError, match="o_proj.weight has a weight_scale but no .*weight_scale_2"):
        H.load_hf(directory)


def test_experts_stored_one_linear_layer_each_are_fused_back(tmp_path):
    """ModelOpt quantizes Gemma-4's experts after splitting them into one linear layer per expert
    (experts.{e}.gate_proj, up_proj, down_proj): the loader stacks them into the fused parameters, bit for bit; a
    missing expert is named."""
    refs = write_quantized(G4, tmp_path / "nvfp4", "nvfp4", per_expert=True)
    assert "model.layers.0.experts.3.up_proj.weight" in refs and "model.layers.0.experts.gate_up_proj" not in refs
    loaded, reference = H.load_hf(tmp_path / "nvfp4"), H.load_hf(tmp_path / "nvfp4_ref")
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(reference.params), strict=True):
        np.testing.assert_array_equal(a, b)
    moe = loaded.params["layers"]["block_0"]["moe"]["gating_einsum"]
    np.testing.assert_array_equal(moe[0, 3, 1], refs["model.layers.0.experts.3.up_proj.weight"])  # (E, 2, He, D)

    file = tmp_path / "nvfp4" / "model.safetensors"
    header, _ = QF._header(file)
    kept = {n: QF.read_stored(file, n) for n in header if n != "__metadata__" and ".experts.2.down_proj" not in n}
    save_file(kept, str(file))
    with pytest.raises(ValueError, match=r"lacks 1 of their weights, first \['model.layers.0.experts.2.down_proj"):
        H.load_hf(tmp_path / "nvfp4")


def test_legacy_hf_quant_config_json_is_read(tmp_path):
    """ModelOpt's older layout: no quantization_config in config.json, hf_quant_config.json beside it."""
    write_quantized(G4, tmp_path / "nvfp4", "nvfp4")
    config = json.loads((tmp_path / "nvfp4" / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "nvfp4" / "config.json").write_text(json.dumps(config))
    quantization = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16}
    quantization["exclude_modules"] = ["lm_head"]
    legacy = {"producer": {"name": "modelopt", "version": "0.39.0"}, "quantization": quantization}
    (tmp_path / "nvfp4" / "hf_quant_config.json").write_text(json.dumps(legacy))
    loaded, reference = H.load_hf(tmp_path / "nvfp4"), H.load_hf(tmp_path / "nvfp4_ref")
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(reference.params), strict=True):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------------------------------------
# The toolbox's NVFP4 runs.


def test_nvfp4_params_go_wherever_params_go_and_round_trip_on_disk(tmp_path):
    """Which leaves are NVFP4 (matmul weights whose blocked axis is a multiple of 16), the storage (about 4.5 bits
    per quantized weight), forward on `NVFP4Params` equal to forward on the weights dequantized outside (a dense
    model), and `save_nvfp4` / `load_nvfp4` bit for bit."""
    cfg = TransformerConfig.from_dict(dict(presets.tiny(vocab_size=64, moe=True), k_eq_v_global=False))
    model = T.Transformer(cfg)
    params = jax.eval_shape(lambda: T.init_params(model, jax.random.key(1)))  # shapes only
    quantized = jax.eval_shape(Q.quantize_nvfp4, params)
    blocks = jax.tree_util.tree_flatten_with_path(quantized.block_scales, is_leaf=lambda x: x is None)[0]
    flat = {jax.tree_util.keystr(p): b for p, b in blocks}
    assert flat["['layers']['block_0']['moe']['gating_einsum']"].shape == (1, 4, 2, 16, 2)  # D=32: 2 blocks
    assert flat["['layers']['block_0']['mlp2']['linear']"].shape == (1, 3, 32)  # F=48 contracted: 3 blocks
    assert flat["['layers']['block_0']['attn']['attn_vec_einsum']"] is None  # H=8: not a multiple of 16, kept
    assert flat["['layers']['block_0']['pre_attention_norm']['scale']"] is None
    kept = sum(x.size for p, x in jax.tree_util.tree_flatten_with_path(params)[0] if Q.nvfp4_axis(p, x) is None)
    quantized_elements = sum(x.size for x in jax.tree.leaves(params)) - kept
    bits = (Q.nbytes(quantized) - 4 * kept) * 8 / quantized_elements
    assert 4.5 <= bits < 4.6, bits  # 4 bits + an 8-bit scale per 16 + a float32 per leaf

    model = T.Transformer(TransformerConfig.from_dict(presets.tiny(vocab_size=64, moe=False)))  # test_quantize's
    quantized = jax.jit(Q.quantize_nvfp4)(T.init_params(model, jax.random.key(1)))
    tokens = jax.random.randint(jax.random.key(2), (2, 6), 4, 64)
    outside = jax.jit(lambda q: q.dequantize(jnp.float32))(quantized)
    np.testing.assert_allclose(T.forward(model, quantized, tokens)[0], T.forward(model, outside, tokens)[0], atol=1e-6)
    loaded = quantized_runs.load_nvfp4(quantized_runs.save_nvfp4(quantized, tmp_path / "nvfp4"))
    assert jax.tree.structure(loaded) == jax.tree.structure(quantized)
    for a, b in zip(jax.tree.leaves(quantized), jax.tree.leaves(loaded), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.slow
def test_quantize_command_nvfp4_round_trip(trained_text_runs, tmp_path):
    """`quantize --format nvfp4` writes a run that loads as NVFP4Params, scores close to its source and next to the
    FP8 run, and converts to the dequantized weights; rewriting it as FP8 drops the NVFP4 weights."""
    from hackable_diffusion import evaluate
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.quantize import quantize_run
    from hackable_diffusion.tasks.text_evaluation import Likelihood

    source, out = str(trained_text_runs["none"]), tmp_path / "ar_nvfp4"
    record = quantize_run(source, str(out), format="nvfp4")
    assert record["format"] == "nvfp4" and record["bytes_after"] < 0.25 * record["bytes_before"]
    assert json.loads((out / "config.json").read_text())["model"]["weight_dtype"] == "nvfp4"
    exp = exp_lib.from_workdir(str(out))
    params, step = toolbox.load_params(exp, str(out))
    assert isinstance(params, Q.NVFP4Params) and step == record["step"]
    raw, _ = toolbox.load_params(exp_lib.from_workdir(source), source)
    np.testing.assert_array_equal(
        jax.tree.leaves(params.values)[0], jax.tree.leaves(Q.quantize_nvfp4(raw).values)[0]
    )
    full = evaluate.run(source, Likelihood(num_batches=2, batch_size=8))
    nvfp4 = evaluate.run(str(out), Likelihood(num_batches=2, batch_size=8))
    assert nvfp4["bits_per_token"] != full["bits_per_token"]
    np.testing.assert_allclose(nvfp4["bits_per_token"], full["bits_per_token"], rtol=0.05)

    from hackable_diffusion.convert import load_source

    cfg, weights, _ = load_source(out, "workdir")
    assert cfg.weight_dtype is None and not isinstance(weights, Q.NVFP4Params)
    quantize_run(source, str(out), format="fp8")
    assert (out / "fp8_params").is_dir() and not (out / "nvfp4_params").exists()
    shutil.rmtree(out)


def test_nvfp4_weight_memory_of_the_26b_a4b_is_4_5_bits_per_matmul_weight():
    """aot.costs.weight_memory (experiments/speed/aot_26b.py --weight_memory): NVFP4 stores each matmul weight in 4 bits
    plus an 8-bit scale per 16, the norms and scales stay bf16; DiffusionGemma 26B-A4B's weights fit 14.2 GB."""
    from aot import costs

    cfg = TransformerConfig.from_dict(presets.diffusiongemma_26b_a4b())
    sizes = costs.param_sizes(cfg)
    matmul = sizes.layer_matmul + sizes.experts + sizes.embed + sizes.sc_matmul
    bf16, fp8, nvfp4 = (costs.weight_memory(cfg, w, sizes) for w in ("bf16", "fp8", "nvfp4"))
    assert bf16 - nvfp4 == matmul * (2 - 4.5 / 8) and bf16 - fp8 == matmul
    assert 14.0e9 < nvfp4 < 14.5e9 and 50e9 < bf16 < 51e9, (nvfp4, bf16)
    with pytest.raises(ValueError, match="not one of"):
        costs.weight_memory(cfg, "int4", sizes)
