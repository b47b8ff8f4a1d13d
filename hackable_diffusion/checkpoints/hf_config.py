"""Hugging Face `config.json` <-> `TransformerConfig` for DiffusionGemma (`diffusion_gemma`) and Gemma-4 (`gemma4`,
`gemma4_text`), and the `generation_config.json` fields of the toolbox's sampler.

Follows the config classes of `transformers` 5.23 (`configuration_diffusion_gemma.py`, `configuration_gemma4.py`).
Config fields the toolbox cannot express (another activation, attention bias, per-layer input embeddings, KV sharing,
double-wide MLPs, a dense Gemma-4 block without experts, untied embeddings, bidirectional text attention, RoPE
scaling) are refused by name, never dropped. The weights are `hf.py`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from hackable_diffusion.models.config import MoEConfig, TransformerConfig

DIFFUSION_GEMMA = "diffusion_gemma"
GEMMA4_TEXT = "gemma4_text"
MODEL_TYPES = (DIFFUSION_GEMMA, "gemma4", GEMMA4_TEXT)
LAYER_TYPES = {"sliding_attention": "local", "full_attention": "global"}


@dataclasses.dataclass(frozen=True)
class HFModelInfo:
    """What a Hugging Face directory says beyond the model shape."""

    model_type: str
    canvas_length: int | None = None  # DiffusionGemma's block length
    generation: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # generation_config.json
    eos_token_ids: tuple[int, ...] = (1,)
    dtype: str = "float32"
    vision_config: Mapping[str, Any] | None = None


def _refuse(field: str, value: Any, why: str) -> None:
    raise ValueError(f"config.json field {field}={value!r} cannot be expressed by the toolbox: {why}.")


def _layer_pattern(layer_types: Sequence[str]) -> tuple[str, ...]:
    """The shortest repeating pattern of `layer_types` (the toolbox scans one pattern group at a time)."""
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        _refuse("layer_types", unknown, f"only {sorted(LAYER_TYPES)} exist in Gemma-4")
    types = [LAYER_TYPES[t] for t in layer_types]
    for period in range(1, len(types) + 1):
        if len(types) % period == 0 and types == types[:period] * (len(types) // period):
            return tuple(types[:period])
    raise AssertionError("unreachable: the whole list is always a period")


def config_from_hf(
    hf: Mapping[str, Any],
    *,
    dtype: str | None = None,
    dispatch: str | None = None,
    decoder_window: str | None = None,
) -> tuple[TransformerConfig, HFModelInfo]:
    """A `config.json` (dict) of a DiffusionGemma or Gemma-4 checkpoint -> (TransformerConfig, HFModelInfo).

    dtype: parameter and compute dtype (None: the checkpoint's). dispatch: the MoE dispatch (None: dropless, "ragged"
    on an accelerator, "sorted" with capacity E / k on a CPU). decoder_window: "per_token" (gemma library) or
    "cache_tail" (transformers), see TransformerConfig.decoder_window; None: the `decoder_window` config.json records
    (a checkpoint the toolbox exported), else "per_token"."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.json model_type={model_type!r} is not one of {MODEL_TYPES}.")
    text = dict(hf.get("text_config") or hf) if model_type != GEMMA4_TEXT else dict(hf)
    checks = {
        "hidden_activation": ("gelu_pytorch_tanh", "the toolbox's FFNs are gated GELU (tanh)"),
        "attention_bias": (False, "the toolbox's projections have no bias"),
        "use_double_wide_mlp": (False, "double-wide MLPs are not implemented"),
        "num_kv_shared_layers": (0, "KV sharing across layers is not implemented"),
        "use_bidirectional_attention": (None, "the text stack must be causal (its KV cache feeds the canvases)"),
        "tie_word_embeddings": (True, "the head is tied to the embedding"),
    }
    for field, (allowed, why) in checks.items():
        if text.get(field, allowed) != allowed and not (
            field == "use_bidirectional_attention" and text[field] == "vision"
        ):
            _refuse(f"text_config.{field}", text.get(field), why)
    if text.get("hidden_size_per_layer_input"):
        _refuse(
            "text_config.hidden_size_per_layer_input",
            text["hidden_size_per_layer_input"],
            "per-layer input embeddings are not implemented (set 0)",
        )
    if model_type != DIFFUSION_GEMMA and not text.get("enable_moe_block", False):
        _refuse(
            "text_config.enable_moe_block",
            text.get("enable_moe_block"),
            "a dense Gemma-4 block (one FFN with two "
            "norms) is not the toolbox's layout, which keeps the dense FFN beside experts",
        )
    if not text.get("num_experts") or not text.get("top_k_experts") or not text.get("moe_intermediate_size"):
        _refuse(
            "text_config.num_experts",
            text.get("num_experts"),
            "the model needs its MoE block (num_experts, top_k_experts, moe_intermediate_size)",
        )
    layer_types = list(text["layer_types"])
    if len(layer_types) != text["num_hidden_layers"]:
        _refuse(
            "text_config.layer_types", len(layer_types), f"it must list num_hidden_layers={text['num_hidden_layers']}"
        )
    pattern = _layer_pattern(layer_types)

    per_layer = {int(k): dict(v) for k, v in (text.get("per_layer_config") or {}).items()}
    head_dim, kv_heads = int(text["head_dim"]), int(text["num_key_value_heads"])
    global_dims = set()
    for index, kind in enumerate(layer_types):
        override = per_layer.get(index, {})
        dims = (int(override.get("head_dim", head_dim)), int(override.get("num_key_value_heads", kv_heads)))
        if kind == "sliding_attention" and dims != (head_dim, kv_heads):
            _refuse(f"text_config.per_layer_config[{index}]", override, "sliding layers share one head shape")
        if kind == "full_attention":
            global_dims.add(dims)
    if len(global_dims) > 1:
        _refuse("text_config.per_layer_config", sorted(global_dims), "global layers share one head shape")
    global_head_dim, global_kv_heads = global_dims.pop() if global_dims else (head_dim, kv_heads)

    rope = text.get("rope_parameters") or {}
    local_rope, global_rope = dict(rope.get("sliding_attention", {})), dict(rope.get("full_attention", {}))
    if local_rope.get("rope_type", "default") != "default" or local_rope.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse("text_config.rope_parameters.sliding_attention", local_rope, "local layers rotate the whole head")
    if global_rope.get("rope_type", "default") not in ("default", "proportional"):
        _refuse("text_config.rope_parameters.full_attention", global_rope, "only default or proportional RoPE")
    if global_rope.get("rope_type", "default") == "default" and global_rope.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse("text_config.rope_parameters.full_attention", global_rope, "partial default RoPE changes the head size")
    for name, params in (("sliding_attention", local_rope), ("full_attention", global_rope)):
        if params.get("factor", 1.0) != 1.0 or any(
            k in params for k in ("rope_scaling", "original_max_position_embeddings")
        ):
            _refuse(f"text_config.rope_parameters.{name}", params, "RoPE scaling is not implemented")

    if decoder_window is None:  # the convention a toolbox export records; transformers' own files record none
        decoder_window = str(hf.get("decoder_window") or text.get("decoder_window") or "per_token")
    k_eq_v = True if model_type == DIFFUSION_GEMMA else bool(text.get("attention_k_eq_v", False))
    num_experts, top_k = int(text["num_experts"]), int(text["top_k_experts"])
    if dispatch is None:
        dispatch = "ragged" if jax.default_backend() != "cpu" else "sorted"
    moe = MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        hidden_dim=int(text["moe_intermediate_size"]),
        dispatch=dispatch,
        capacity_factor=num_experts / top_k,  # sorted: a slot for every assignment, nothing dropped
        load_balance_weight=0.0,
        router_z_weight=0.0,
    )
    checkpoint_dtype = str(hf.get("dtype") or hf.get("torch_dtype") or text.get("dtype") or "float32")
    dtype = dtype or checkpoint_dtype
    cfg = TransformerConfig(
        vocab_size=int(text["vocab_size"]),
        embed_dim=int(text["hidden_size"]),
        num_layers=int(text["num_hidden_layers"]),
        num_heads=int(text["num_attention_heads"]),
        head_dim=head_dim,
        num_kv_heads=kv_heads,
        ffw_hidden=int(text["intermediate_size"]),
        moe=moe,
        layer_pattern=pattern,
        sliding_window=int(text["sliding_window"]),
        decoder_window=decoder_window,
        global_head_dim=global_head_dim,
        global_num_kv_heads=global_kv_heads,
        k_eq_v_global=k_eq_v,
        rope_local_base=float(local_rope.get("rope_theta", 10_000.0)),
        rope_local_proportion=1.0,
        rope_global_base=float(global_rope.get("rope_theta", 1_000_000.0)),
        rope_global_proportion=float(global_rope.get("partial_rotary_factor", 1.0)),
        qk_norm=True,
        v_norm=True,
        scale_queries=False,
        # DiffusionGemma's text config declares the soft-cap as a class constant (30), so config.json may omit it
        final_logit_softcap=text.get("final_logit_softcapping", 30.0 if model_type == DIFFUSION_GEMMA else None),
        norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        param_dtype=dtype,
        compute_dtype=dtype,
        self_conditioning=model_type == DIFFUSION_GEMMA,
    )
    eos = text.get("eos_token_id", 1)
    info = HFModelInfo(
        model_type=model_type,
        canvas_length=hf.get("canvas_length") if model_type == DIFFUSION_GEMMA else None,
        eos_token_ids=tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),),
        dtype=checkpoint_dtype,
        vision_config=hf.get("vision_config"),
    )
    return cfg, info


def _refuse_export(cfg: TransformerConfig, model_type: str) -> None:
    problems = {
        "moe": (cfg.moe is None, "Hugging Face's Gemma-4 MoE layout needs experts beside the dense FFN"),
        "qk_norm": (not cfg.qk_norm, "Gemma-4 always norms q and k"),
        "v_norm": (not cfg.v_norm, "Gemma-4 always norms v"),
        "scale_queries": (cfg.scale_queries, "Gemma-4 has no 1/sqrt(d) factor"),
        "rope_local_proportion": (cfg.rope_local_proportion != 1.0, "local layers rotate the whole head"),
        "structure": (bool(cfg.structure), "no Hugging Face layer holds a structure prior (models/structure.py)"),
        "depth_loops": (cfg.depth_loops != 1, "looped depth is not a Hugging Face architecture"),
        "self_conditioning": (
            cfg.self_conditioning != (model_type == DIFFUSION_GEMMA),
            "DiffusionGemma needs its self-conditioner and Gemma-4 has none",
        ),
        "k_eq_v_global": (
            model_type == DIFFUSION_GEMMA and not cfg.k_eq_v_global,
            "DiffusionGemma's global layers share one K=V projection",
        ),
        "final_logit_softcap": (
            model_type == DIFFUSION_GEMMA and cfg.final_logit_softcap is None,
            "transformers' DiffusionGemma always soft-caps its logits (a null final_logit_softcapping loads, then its "
            "forward fails); train with model.final_logit_softcap set (30.0 is the release's), or export as "
            f"{GEMMA4_TEXT}",
        ),
    }
    for field, (bad, why) in problems.items():
        if bad:
            raise ValueError(f"model.{field}={getattr(cfg, field)!r} cannot be exported as {model_type}: {why}.")


def config_to_hf(
    cfg: TransformerConfig,
    *,
    model_type: str = DIFFUSION_GEMMA,
    canvas_length: int = 256,
    dtype: str | None = None,
    vision_config: Mapping[str, Any] | None = None,
    max_position_embeddings: int = 131_072,
) -> dict[str, Any]:
    """The `config.json` dict of `cfg` as a DiffusionGemma or text-only Gemma-4 checkpoint (inverse of
    `config_from_hf` for every field the toolbox holds).

    max_position_embeddings: the context the model was trained for (a toolbox run's `data.seq_len`; the released
    model's 131,072 by default). `cfg.decoder_window` is recorded as `decoder_window` (a key transformers keeps and
    ignores), so that `config_from_hf` gives the toolbox the window convention the model was trained with."""
    if model_type not in (DIFFUSION_GEMMA, GEMMA4_TEXT):
        raise ValueError(f"model_type={model_type!r} must be {DIFFUSION_GEMMA!r} or {GEMMA4_TEXT!r}.")
    _refuse_export(cfg, model_type)
    types = ["sliding_attention" if t == "local" else "full_attention" for t in cfg.layer_types()]
    rope_global = {"rope_type": "proportional", "partial_rotary_factor": cfg.rope_global_proportion}
    text = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.embed_dim,
        "intermediate_size": cfg.ffw_hidden,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": cfg.norm_eps,
        "layer_types": types,
        "sliding_window": cfg.sliding_window,
        "per_layer_config": {
            str(i): {"head_dim": cfg.global_attn_head_dim, "num_key_value_heads": cfg.global_kv_heads}
            for i, t in enumerate(types)
            if t == "full_attention"
        },
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_base},
            "full_attention": dict(rope_global, rope_theta=cfg.rope_global_base),
        },
        "num_experts": cfg.moe.num_experts,
        "top_k_experts": cfg.moe.top_k,
        "moe_intermediate_size": cfg.moe.hidden_dim,
        "final_logit_softcapping": cfg.final_logit_softcap,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "max_position_embeddings": int(max_position_embeddings),
        "use_bidirectional_attention": None,
        "decoder_window": cfg.decoder_window,
    }
    dtype = dtype or cfg.param_dtype
    if model_type == GEMMA4_TEXT:
        return dict(
            text,
            model_type=GEMMA4_TEXT,
            architectures=["Gemma4ForCausalLM"],
            attention_k_eq_v=cfg.k_eq_v_global,
            enable_moe_block=True,
            hidden_size_per_layer_input=0,
            num_kv_shared_layers=0,
            use_double_wide_mlp=False,
            dtype=dtype,
        )
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "model_type": DIFFUSION_GEMMA,
        "canvas_length": canvas_length,
        "tie_word_embeddings": True,
        "dtype": dtype,
        "decoder_window": cfg.decoder_window,
        "text_config": dict(text, model_type="diffusion_gemma_text"),
        # The vision tower is not used for text; without one from a source checkpoint a one-layer stand-in is declared.
        "vision_config": dict(vision_config or MINIMAL_VISION_CONFIG),
    }


MINIMAL_VISION_CONFIG = {
    "model_type": "gemma4_vision",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "position_embedding_size": 64,
    "patch_size": 4,
}


def minimal_vision_shapes(embed_dim: int) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of the one-layer stand-in vision tower `MINIMAL_VISION_CONFIG` declares, as transformers
    5.23's DiffusionGemma builds it (names under `model.encoder.`). An export without a source vision tower writes
    them (zeros: text never reads them), so that `from_pretrained` reports no missing keys."""
    v = MINIMAL_VISION_CONFIG
    h, i, head = v["hidden_size"], v["intermediate_size"], v["head_dim"]
    q, kv = v["num_attention_heads"] * head, v["num_key_value_heads"] * head
    layer = "vision_tower.encoder.layers.0."
    shapes = {
        "vision_tower.patch_embedder.position_embedding_table": (2, v["position_embedding_size"], h),
        "vision_tower.patch_embedder.input_proj.weight": (h, 3 * v["patch_size"] ** 2),
        layer + "self_attn.q_proj.linear.weight": (q, h),
        layer + "self_attn.k_proj.linear.weight": (kv, h),
        layer + "self_attn.v_proj.linear.weight": (kv, h),
        layer + "self_attn.o_proj.linear.weight": (h, q),
        layer + "self_attn.q_norm.weight": (head,),
        layer + "self_attn.k_norm.weight": (head,),
        layer + "mlp.gate_proj.linear.weight": (i, h),
        layer + "mlp.up_proj.linear.weight": (i, h),
        layer + "mlp.down_proj.linear.weight": (h, i),
        "embed_vision.embedding_projection.weight": (embed_dim, h),
    }
    norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
    for norm in norms:
        shapes[layer + norm + ".weight"] = (h,)
    return {"model.encoder." + name: shape for name, shape in shapes.items()}


def generation_config_from_sampler(sampler: Mapping[str, Any]) -> dict[str, Any]:
    """`generation_config.json` fields for the toolbox's sampler defaults where transformers has a field for them."""
    out: dict[str, Any] = {"max_denoising_steps": int(sampler.get("num_steps", 48))}
    selection = dict(sampler.get("selection") or {"rule": "entropy_bound"})  # config.sampler.selection
    if selection.get("rule") == "entropy_bound":
        out["sampler_config"] = {
            "entropy_bound": float(selection.get("gamma") or 0.1),
            "_cls_name": "EntropyBoundSamplerConfig",
        }
    if "min_temperature" in sampler:
        out["t_min"], out["t_max"] = float(sampler["min_temperature"]), float(sampler["max_temperature"])
    stopping = sampler.get("early_stopping", "diffusiongemma")  # a rule section, or a name in older configs
    if (stopping.get("rule") if isinstance(stopping, Mapping) else stopping) == "diffusiongemma":
        out["stability_threshold"], out["confidence_threshold"] = 1, 0.005
    return out


SPECIAL_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def generation_config(
    model_type: str,
    *,
    sampler: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
    source_model_type: str | None = None,
    special_tokens: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The `generation_config.json` of an exported checkpoint, or None when there is nothing to say (then no file is
    written; transformers falls back to its defaults and the config's token ids).

    sampler: the run's `config.sampler` (a toolbox run or an SFT export); source: the source checkpoint's own
    generation_config.json (a Hugging Face -> Hugging Face conversion), used when there is no sampler and the source
    is of the same family. DiffusionGemma: `generation_config_from_sampler` of the run's sampler, else the source's
    set fields over the toolbox's defaults (which are the reference's). Gemma-4: the run's autoregressive sampling
    (`sampler.ar_temperature`: greedy at 0, else pure temperature sampling, top-k off) with the special token ids, else
    the source's file as it is, else None."""
    if model_type == DIFFUSION_GEMMA:
        if sampler is not None:
            return generation_config_from_sampler(sampler)
        out = generation_config_from_sampler({})
        if source and source_model_type == DIFFUSION_GEMMA:
            out.update({k: v for k, v in source.items() if v is not None and k != "transformers_version"})
        return out
    if sampler is not None and sampler.get("ar_temperature") is not None:
        temperature = float(sampler["ar_temperature"])
        out = dict(special_tokens or {})
        if temperature > 0:
            out.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            out.update(do_sample=False)
        return out
    if source and source_model_type in ("gemma4", GEMMA4_TEXT):
        return dict(source)
    return None
