"""Quantized Hugging Face checkpoints, dequantized on loading: NVIDIA ModelOpt's NVFP4 export and FP8
(compressed-tensors, as vLLM serves it; ModelOpt's per-tensor FP8 has the same tensors).

`load_hf` (checkpoints/hf.py) reads a directory whose config.json has a `quantization_config` (or, ModelOpt's older
layout, a `hf_quant_config.json` beside it) through `dequantizing_view`: every quantized weight is read with its
scales and handed to the weight mapping as the float32 tensor it stands for, so the rest of the loader (names,
shapes, tied copies, sharding) is the same as for a BF16 checkpoint. Weights only: activation scales (`input_scale`)
and KV-cache scales (`k_scale`, `v_scale`) are dropped, because the toolbox computes in its compute dtype.

The formats, as published (facts only; no code of these projects is used)
------------------------------------------------------------------------
NVFP4, ModelOpt's export (`quant_method: "modelopt"`, `quant_algo: "NVFP4"`; `"W4A16_NVFP4"` stores the same weights):
- config: config.json `quantization_config` = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
  "ignore": [module patterns], "kv_cache_scheme": ...}; the older hf_quant_config.json = {"producer": {"name":
  "modelopt", ...}, "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": ...,
  "exclude_modules": [module patterns]}}. The patterns are shell wildcards over module names ("lm_head",
  "model.layers.30.self_attn*"). Sources: vLLM `model_executor/layers/quantization/modelopt.py`
  (`ModelOptQuantConfigBase.from_config`, `is_layer_excluded`: "ignore" in config.json, "exclude_modules" in
  hf_quant_config.json, fnmatch wildcards); vLLM pull request 28076 ("the exclude modules are wildcards");
  nvidia/DeepSeek-R1-NVFP4's hf_quant_config.json on the Hugging Face Hub.
- tensors of a linear layer `P` (weight (out, in) in torch's layout): `P.weight` uint8 (out, in / 2), two E2M1 codes
  per byte along the input dimension; `P.weight_scale` float8_e4m3fn (out, in / 16), one scale per block of 16
  consecutive input elements; `P.weight_scale_2` float32, one per tensor (a scalar or shape (1,)), amax / (6 * 448);
  `P.input_scale` float32 scalar (activations; unused here). Sources: vLLM `ModelOptNvFp4LinearMethod.create_weights`
  and `ModelOptNvFp4W4A16LinearMethod` ("weight_scale_2 fp32 per-tensor global scale = amax / (6.0 * 448.0)").
  A fused 3-d expert parameter `X` (E, out, in) is stored as `X` uint8 (E, out, in / 2), `X_weight_scale`
  float8_e4m3fn (E, out, in / 16) and `X_weight_scale_2` float32 (E,), one per expert (checkpoint headers quoted in
  public tools that read ModelOpt MoE exports, e.g. `moe.experts.gate_up_proj_weight_scale_2 F32 [384]`); a
  (E, k) second scale is read as one per expert and per k equal parts of `out` (a fused gate/up pair).
- packing and values: the even element in the low nibble, the odd element in the high nibble; a value decodes as
  e2m1 * e4m3 * fp32. Source: NVIDIA NeMo AutoModel, `nemo_automodel.components.quantization.nvfp4` ("the even column
  in the low nibble, the following odd column in the high nibble ... a value decodes as e2m1 * e4m3 * fp32").
  E2M1 (1 sign, 2 exponent, 1 mantissa bit): codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8-15 their negatives
  (code 8 is -0.0); no infinity or NaN. Sources: OCP Microscaling Formats (MX) v1.0 specification, FP4 E2M1; Intel
  Neural Compressor's NVFP4 page (E2M1 elements, block 16, UE4M3 block scale, FP32 tensor scale).

FP8, compressed-tensors (`quant_method: "compressed-tensors"`, `format: "float-quantized"`):
- config: `quantization_config` = {"quant_method": "compressed-tensors", "format": "float-quantized",
  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy":
  "tensor" | "channel" | "block", "block_structure": [128, 128] (block only), "symmetric": true, "dynamic": false},
  "input_activations": ...}}, "ignore": ["lm_head", "re:.*mlp.gate$"], "quantization_status": "compressed"}; an ignore
  entry is a module name, or a regular expression after "re:". Sources: llm-compressor recipes and examples (ignore
  lists with "re:"), checkpoints' config.json on the Hub (neuralmagic/*-FP8, nm-testing/*), vLLM
  `compressed_tensors/utils.py` (`should_ignore_layer`).
- tensors of a linear layer `P`: `P.weight` float8_e4m3fn (out, in); `P.weight_scale` float32 (or bf16): shape (1,) or
  () per tensor, (out, 1) per channel, (ceil(out / b0), ceil(in / b1)) per block; optional `P.input_scale`. The weight
  is weight_fp8 * weight_scale. ModelOpt's `quant_algo: "FP8"` stores the same tensors with a per-tensor scale.

Deliberate choices
------------------
- Exact: a dequantized value is the exact product of the stored factors (at most 2 + 4 + 24 significant bits for
  NVFP4, 4 + 24 for FP8, exact in float64) rounded once to float32. ModelOpt's and vLLM's dequantization multiply in
  float32 or bf16 twice, so theirs can differ from this in the last bit.
- The data decides which tensors are quantized (a weight with a `weight_scale` beside it); the ignore list is checked:
  a tensor of an ignored module is read exactly as stored (scales beside it, if an exporter wrote any, are dropped, as
  vLLM does) and one stored packed or in FP8 is an error, since it cannot be read unquantized.
- Any other `quant_method` or `quant_algo` (AWQ, GPTQ, MXFP4, compressed-tensors' own NVFP4 packing, int8, ModelOpt
  MIXED_PRECISION) stops with one line naming what is supported.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import os
import pathlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import ml_dtypes
import numpy as np
from jaxtyping import Float, UInt8

from hackable_diffusion.models.quantize import E2M1_TABLE, NVFP4_BLOCK

LEGACY_MODELOPT_FILE = "hf_quant_config.json"
SUPPORTED = (
    "'modelopt' (quant_algo NVFP4, W4A16_NVFP4 or FP8) and 'compressed-tensors' (format float-quantized: "
    "float8_e4m3fn weights with per-tensor, per-channel or block scales)"
)
NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
DROPPED_SUFFIXES = ("input_scale", "k_scale", "v_scale")  # activation and KV-cache scales: not weights


@dataclasses.dataclass(frozen=True)
class QuantizationScheme:
    """What a checkpoint's quantization config says: `kind` "nvfp4" or "fp8", the block size of NVFP4, the modules
    left unquantized, and (compressed-tensors) the weight strategy and block shape."""

    method: str  # "modelopt" | "compressed-tensors"
    kind: str  # "nvfp4" | "fp8"
    group_size: int = NVFP4_BLOCK
    ignore: tuple[str, ...] = ()
    strategy: str = "tensor"
    block_structure: tuple[int, int] | None = None

    def ignores(self, module: str) -> bool:
        """Whether `module` is on the ignore list (ModelOpt: shell wildcards; compressed-tensors: exact names, or
        regular expressions after "re:")."""
        for pattern in self.ignore:
            if self.method == "compressed-tensors":
                if pattern.startswith("re:") and re.match(pattern[3:], module):
                    return True
                if pattern == module:
                    return True
            elif fnmatch.fnmatchcase(module, pattern):
                return True
        return False


def _unsupported(where: str, what: str) -> ValueError:
    return ValueError(
        f"{where}: {what} is not supported; the toolbox reads {SUPPORTED}: use the BF16 checkpoint, or dequantize "
        "this one with the tool that made it."
    )


def read_scheme(path: str | os.PathLike, config: Mapping[str, Any]) -> QuantizationScheme | None:
    """The quantization scheme of a checkpoint directory (None: not quantized); an unsupported one is a ValueError of
    one line naming the supported ones."""
    path = pathlib.Path(path)
    quant = config.get("quantization_config")
    where = f"{path / 'config.json'} quantization_config"
    if quant is None and (path / LEGACY_MODELOPT_FILE).is_file():
        quant = json.loads((path / LEGACY_MODELOPT_FILE).read_text())
        quant = dict(quant, quant_method=str(quant.get("producer", {}).get("name", "modelopt")))
        where = str(path / LEGACY_MODELOPT_FILE)
    if quant is None:
        return None
    if not isinstance(quant, Mapping):
        raise ValueError(f"{where} is a JSON {type(quant).__name__}, not an object: repair config.json.")
    method = str(quant.get("quant_method", "")).lower()
    if method == "modelopt":
        inner = quant.get("quantization") if isinstance(quant.get("quantization"), Mapping) else quant
        algo = str(inner.get("quant_algo", "")).upper()
        ignore = inner.get("exclude_modules", inner.get("ignore")) or []
        group = int(inner.get("group_size") or NVFP4_BLOCK)
        if algo in NVFP4_ALGOS:
            if group != NVFP4_BLOCK:
                raise _unsupported(where, f"NVFP4 with group_size={group} (NVFP4 blocks are 16)")
            return QuantizationScheme("modelopt", "nvfp4", group, tuple(ignore))
        if algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"):  # a float32 weight_scale per tensor or per output channel
            return QuantizationScheme("modelopt", "fp8", group, tuple(ignore))
        raise _unsupported(where, f"quant_method 'modelopt' with quant_algo {algo or None!r}")
    if method == "compressed-tensors":
        fmt = quant.get("format")
        groups = quant.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, Mapping)]
        strategies = sorted({str(w.get("strategy", "tensor")) for w in weights})
        floats = all(w.get("type") == "float" and int(w.get("num_bits", 0)) == 8 for w in weights)
        if fmt not in ("float-quantized", "naive-quantized") or not weights or not floats:
            raise _unsupported(where, f"compressed-tensors format {fmt!r} with weights {weights}")
        if not set(strategies) <= {"tensor", "channel", "block"}:
            raise _unsupported(where, f"compressed-tensors FP8 with weight strategy {strategies}")
        blocks = {tuple(w.get("block_structure") or ()) for w in weights if w.get("strategy") == "block"}
        if len(blocks) > 1 or () in blocks or any(len(b) != 2 for b in blocks):
            raise _unsupported(where, f"compressed-tensors FP8 with the block shapes {sorted(blocks)}")
        return QuantizationScheme(
            "compressed-tensors",
            "fp8",
            ignore=tuple(quant.get("ignore") or ()),
            strategy=",".join(strategies),
            block_structure=blocks.pop() if blocks else None,
        )
    raise _unsupported(where, f"quant_method {quant.get('quant_method')!r}")


# ----------------------------------------------------------------------------------------------------------------
# Reading the stored tensors (safetensors' numpy reader has no float8), and the dequantization.

_DTYPES = {
    "U8": np.uint8,
    "I8": np.int8,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
}


def _header(file: pathlib.Path) -> tuple[dict, int]:
    """(header, offset of the data) of a safetensors file, parsed once per file version."""
    stat = os.stat(file)
    return _parsed_header(os.fspath(file), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _parsed_header(file: str, mtime_ns: int, size: int) -> tuple[dict, int]:
    del mtime_ns, size  # the cache key: a rewritten file is parsed again
    with open(file, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(length)), 8 + length


def read_stored(file: pathlib.Path, name: str) -> np.ndarray:
    """One tensor of a safetensors file in its stored dtype (float8_e4m3fn included), the file closed again."""
    header, start = _header(file)
    entry = header[name]
    if entry["dtype"] not in _DTYPES:
        raise ValueError(f"{name} in {file} is stored as {entry['dtype']}, which a quantized checkpoint does not use.")
    begin, end = entry["data_offsets"]
    with open(file, "rb") as f:
        f.seek(start + begin)
        data = f.read(end - begin)
    return np.frombuffer(data, dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def unpack_e2m1(packed: UInt8[np.ndarray, "*lead half"]) -> UInt8[np.ndarray, "*lead full"]:
    """The 4-bit codes of packed bytes along the last axis: element 2i from the low nibble, 2i + 1 from the high."""
    return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def _global(scale: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A second (per-tensor) scale broadcast over a (..., out, in) weight: one value, one per leading index (per
    expert), or per leading index and per k equal parts of `out`."""
    scale = np.asarray(scale, np.float64)
    lead, out = shape[:-2], shape[-2]
    if scale.size == 1:
        return scale.reshape(())
    if scale.shape == lead:
        return scale.reshape(*lead, 1, 1)
    if scale.ndim == len(lead) + 1 and scale.shape[:-1] == lead and out % scale.shape[-1] == 0:
        k = scale.shape[-1]
        return np.repeat(scale, out // k, axis=-1).reshape(*lead, out, 1)
    raise ValueError(f"{name} has the shape {scale.shape}, which is no per-tensor scale of a weight {shape}.")


def dequantize_nvfp4(
    packed: UInt8[np.ndarray, "*lead out half"],
    block_scale: Float[np.ndarray, "*lead out blocks"],
    global_scale: np.ndarray,
    *,
    name: str = "weight",
    group_size: int = NVFP4_BLOCK,
) -> Float[np.ndarray, "*lead out full"]:
    """e2m1 * block scale * global scale of a ModelOpt NVFP4 weight, as float32 (exact, rounded once)."""
    if packed.dtype != np.uint8:
        raise ValueError(f"{name} is {packed.dtype}, not the uint8 of packed NVFP4 codes.")
    if block_scale.dtype != ml_dtypes.float8_e4m3fn:
        raise ValueError(f"{name}'s weight_scale is {block_scale.dtype}, not float8_e4m3fn.")
    full = 2 * packed.shape[-1]
    if full % group_size or block_scale.shape != (*packed.shape[:-1], full // group_size):
        raise ValueError(
            f"{name} {packed.shape} (packed, {full} input elements) needs a weight_scale of shape "
            f"{(*packed.shape[:-1], full // group_size)}, one per block of {group_size}; it has {block_scale.shape}."
        )
    values = np.asarray(E2M1_TABLE, np.float64)[unpack_e2m1(packed)]
    blocks = np.repeat(block_scale.astype(np.float64), group_size, axis=-1)
    return (values * blocks * _global(global_scale, values.shape, f"{name}'s weight_scale_2")).astype(np.float32)


def dequantize_fp8(
    weight: Float[np.ndarray, "*lead out inp"],
    scale: np.ndarray,
    *,
    name: str = "weight",
    block_structure: tuple[int, int] | None = None,
) -> Float[np.ndarray, "*lead out inp"]:
    """weight * scale of an FP8 weight (per tensor, per channel (.., out, 1), per leading index, or per block of
    `block_structure`), as float32 (exact, rounded once)."""
    if weight.dtype != ml_dtypes.float8_e4m3fn:
        raise ValueError(f"{name} is {weight.dtype}, not the float8_e4m3fn of an FP8 weight.")
    scale = np.asarray(scale, np.float64)
    blocks = None
    if block_structure is not None:
        b0, b1 = block_structure
        blocks = (*weight.shape[:-2], -(-weight.shape[-2] // b0), -(-weight.shape[-1] // b1))
    if scale.size == 1:
        scale = scale.reshape(())
    elif scale.ndim == weight.ndim and all(s in (1, w) for s, w in zip(scale.shape, weight.shape)):
        pass  # per channel (.., out, 1), or per expert (E, 1, 1)
    elif scale.shape == weight.shape[:-2]:  # one per expert
        scale = scale.reshape(*scale.shape, 1, 1)
    elif blocks is not None and scale.shape == blocks:
        scale = np.repeat(np.repeat(scale, b0, axis=-2), b1, axis=-1)[..., : weight.shape[-2], : weight.shape[-1]]
    else:
        raise ValueError(f"{name}'s weight_scale has the shape {scale.shape}, which does not fit {weight.shape}.")
    return (weight.astype(np.float64) * scale).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# The view load_hf reads through.


def _scale_names(name: str) -> dict[str, str]:
    """The names of the tensors stored beside weight `name`: "P.weight" -> "P.weight_scale", ...; a parameter that
    is not called weight (a fused expert tensor "X") -> "X_weight_scale", ..."""
    base = name[: -len("weight")] if name.endswith(".weight") else name + "_"
    return {key: base + key for key in ("weight_scale", "weight_scale_2", "input_scale")}


def _module(name: str) -> str:
    return name[: -len(".weight")] if name.endswith(".weight") else name


@dataclasses.dataclass(frozen=True)
class DequantizingView(Mapping):
    """{tensor name: safetensors file} of a quantized checkpoint as load_hf sees it: the scale tensors are gone, and
    `read_tensor(name)` returns a quantized weight dequantized to float32 (any other tensor as stored)."""

    files: Mapping[str, pathlib.Path]
    scheme: QuantizationScheme
    read_plain: Callable[[Mapping[str, pathlib.Path], str], np.ndarray]
    quantized: Mapping[str, dict[str, str]]  # weight name -> its scale tensors' names
    names: tuple[str, ...]
    fused: Mapping[str, tuple[tuple[str, ...], ...]] = dataclasses.field(default_factory=dict)  # see `_fuse_experts`
    _known: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_known", frozenset(self.names))

    def __getitem__(self, name: str) -> pathlib.Path:
        if name not in self._known:
            raise KeyError(name)
        return self.files[self.fused[name][0][0]] if name in self.fused else self.files[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def read_tensor(self, name: str) -> np.ndarray:
        if name in self.fused:  # per-expert tensors stacked (gate and up concatenated) into the fused parameter
            return np.stack([np.concatenate([self.read_tensor(n) for n in names]) for names in self.fused[name]])
        scales = self.quantized.get(name)
        if scales is None:
            return self.read_plain(self.files, name)
        weight = read_stored(self.files[name], name)
        scale = read_stored(self.files[scales["weight_scale"]], scales["weight_scale"])
        if self.scheme.kind == "nvfp4":
            second = scales.get("weight_scale_2")
            if second not in self.files:
                raise ValueError(f"{name} has a weight_scale but no {second}: the NVFP4 checkpoint is incomplete.")
            return dequantize_nvfp4(
                weight, scale, read_stored(self.files[second], second), name=name, group_size=self.scheme.group_size
            )
        return dequantize_fp8(weight, scale, name=name, block_structure=self.scheme.block_structure)


def dequantizing_view(
    path: str | os.PathLike,
    config: Mapping[str, Any],
    files: Mapping[str, pathlib.Path],
    read_plain: Callable[[Mapping[str, pathlib.Path], str], np.ndarray],
) -> Mapping[str, pathlib.Path]:
    """`files` itself for an unquantized checkpoint; for a quantized one, the `DequantizingView` load_hf reads."""
    scheme = read_scheme(path, config)
    if scheme is None:
        return files
    quantized, hidden = {}, set()
    stored_dtypes = {}
    for file in sorted(set(files.values())):
        header, _ = _header(file)
        stored_dtypes.update({n: e["dtype"] for n, e in header.items() if n != "__metadata__"})
    for name in files:
        scales = _scale_names(name)
        if scales["weight_scale"] not in files or name in hidden:
            continue
        hidden.update(n for n in scales.values() if n in files)
        if scheme.ignores(_module(name)):
            continue  # an ignored module: read as stored, its stray scales dropped
        quantized[name] = {k: v for k, v in scales.items() if k != "input_scale"}
    hidden.update(n for n in files if n.rsplit(".", 1)[-1] in DROPPED_SUFFIXES or n.endswith("_input_scale"))
    packed_dtype = "U8" if scheme.kind == "nvfp4" else "F8_E4M3"
    for name in files:
        if name in quantized or name in hidden or stored_dtypes.get(name) not in ("U8", "F8_E4M3"):
            continue
        why = "is on the ignore list of the quantization config" if scheme.ignores(_module(name)) else "has no scales"
        raise ValueError(
            f"{name} is stored as {stored_dtypes[name]} (the {packed_dtype} of a quantized weight) but {why}, so it "
            "cannot be read: the checkpoint is inconsistent; export it again."
        )
    fused = _fuse_experts([n for n in files if n not in hidden])
    hidden.update(n for parts in fused.values() for names in parts for n in names)
    names = tuple(n for n in files if n not in hidden) + tuple(fused)
    return DequantizingView(files, scheme, read_plain, quantized, names, fused)


_EXPERT = re.compile(r"^(?P<stack>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def _fuse_experts(names: list[str]) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Quantizers unfuse Gemma-4's 3-d expert parameters into one linear layer per expert (ModelOpt and vLLM name them
    `experts.{e}.gate_proj` / `up_proj` / `down_proj`): {fused name: per expert, the tensors it concatenates}, i.e.
    `experts.gate_up_proj` (E, 2 He, D) = [gate_e; up_e] and `experts.down_proj` (E, D, He) = down_e."""
    stacks: dict[str, dict[tuple[str, int], str]] = {}
    for name in names:
        match = _EXPERT.match(name)
        if match:
            stacks.setdefault(match["stack"], {})[match["proj"], int(match["expert"])] = name
    fused = {}
    for stack, parts in stacks.items():
        count = 1 + max(e for _, e in parts)
        missing = [f"{stack}.{e}.{p}.weight" for e in range(count) for p in _PROJ if (p, e) not in parts]
        if missing:
            raise ValueError(
                f"{stack} stores its experts one by one but lacks {len(missing)} of their weights, first "
                f"{missing[:3]}: the checkpoint is incomplete."
            )
        fused[stack + ".gate_up_proj"] = tuple((parts["gate_proj", e], parts["up_proj", e]) for e in range(count))
        fused[stack + ".down_proj"] = tuple((parts["down_proj", e],) for e in range(count))
    return fused


_PROJ = ("gate_proj", "up_proj", "down_proj")
