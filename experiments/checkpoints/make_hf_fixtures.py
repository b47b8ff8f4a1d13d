"""Builds the Hugging Face parity fixtures under tests/fixtures/ from the real `transformers` implementation.

  pip install -e '.[interop]'        # transformers==5.23.0 + torch: not a dependency of the package or of CI
  python experiments/checkpoints/make_hf_fixtures.py [--out tests/fixtures]
  python experiments/checkpoints/make_hf_fixtures.py --verify_export DIR  # load a directory the toolbox exported, compare logits

Writes two tiny random checkpoints with `save_pretrained` and the arrays their reference forward passes produce:

- `hf_diffusiongemma/`: a `DiffusionGemmaForBlockDiffusion` (MoE 4 experts top-2, 5 local + 1 global layers, K=V
  global layer with its own head dim and KV heads, proportional RoPE, soft-cap, a tiny vision tower that text use
  ignores), sliding window 6. Weights are redrawn so that activations are O(1) and nothing is trivially 1: norms,
  `layer_scalar`, router scales and per-expert scales all differ from one. `arrays.npz` holds, for a prompt of 10
  tokens and a canvas of 8 (prompt + canvas > window, where the two decoder-window conventions differ): the encoder's
  causal logits (tied head + soft-cap), the decoder's canvas logits without and with `self_conditioning_logits`; the
  same with the window raised to 64 (> prompt + canvas: the conventions agree), plus the KV cache after the prompt
  and a right-padded batch; and the sampler pieces of `generation_diffusion_gemma` on fixed inputs (entropy-bound
  accept mask, linear temperature, stable-and-confident stop).
- `hf_gemma4/`: a text-only `Gemma4ForCausalLM` (MoE block, K=V global layer, window 4) and its causal logits over
  a 12-token sequence (`arrays.npz`).

Every array comes from transformers itself, in float32, with `attn_implementation="eager"`; the toolbox's tests load
the directories through its public API and compare at atol = rtol = 1e-4.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

VOCAB, D, FFN, LAYERS, HEADS, KV, HEAD = 96, 32, 48, 6, 4, 2, 8
GLOBAL_HEAD, GLOBAL_KV, EXPERTS, TOP_K, EXPERT_HIDDEN = 16, 1, 4, 2, 16
WINDOW, WIDE_WINDOW, PROMPT, CANVAS = 6, 64, 10, 8
TEXT_SHAPE = dict(  # the text stack of both fixtures, in transformers' config names
    vocab_size=VOCAB,
    hidden_size=D,
    intermediate_size=FFN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV,
    head_dim=HEAD,
    global_head_dim=GLOBAL_HEAD,
    num_global_key_value_heads=GLOBAL_KV,
    num_experts=EXPERTS,
    top_k_experts=TOP_K,
    moe_intermediate_size=EXPERT_HIDDEN,
    max_position_embeddings=256,
)


def diffusiongemma_config(window: int):
    from transformers import DiffusionGemmaConfig

    text = dict(TEXT_SHAPE, sliding_window=window)
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        position_embedding_size=64,
        patch_size=4,
    )
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    return config


def redraw(model, seed: int) -> None:
    """O(1) activations and no parameter left at a trivial value (ones, zeros)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            shape = tensor.shape
            if name.endswith("layer_scalar"):
                # one value per layer, the same for the encoder and the decoder copy (they are one parameter)
                layer = int(name.split(".layers.")[1].split(".")[0])
                value = torch.tensor([0.7 + 0.1 * layer])
            elif "norm" in name or name.endswith("router.scale") or name.endswith("per_expert_scale"):
                value = 1.0 + 0.3 * torch.randn(shape, generator=gen)
            elif "embed_tokens" in name or name == "lm_head.weight":
                value = 0.6 * torch.randn(shape, generator=gen)
            elif tensor.ndim >= 2:
                fan_in = shape[-1]
                value = torch.randn(shape, generator=gen) / fan_in**0.5
            else:
                value = 0.1 * torch.randn(shape, generator=gen)
            tensor.copy_(value.to(tensor.dtype))
    model.tie_weights()


def soft_capped(model, hidden):
    import torch

    with torch.no_grad():
        logits = model.lm_head(hidden)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 at least, float64 kept
        cap = model.config.get_text_config().final_logit_softcapping
        return torch.tanh(logits / cap) * cap


def diffusiongemma_arrays(model, arrays: dict, suffix: str) -> None:
    """Encoder causal logits, canvas logits without and with self-conditioning, for one prompt batch."""
    import torch
    from transformers import DynamicCache

    rng = np.random.default_rng(1)
    prompt = torch.tensor(rng.integers(4, VOCAB, (2, PROMPT)))
    canvas = torch.tensor(rng.integers(0, VOCAB, (2, CANVAS)))
    sc_logits = torch.tensor(rng.standard_normal((2, CANVAS, VOCAB)).astype(np.float32) * 3.0)
    text_config = model.config.get_text_config()
    with torch.no_grad():
        cache = DynamicCache(config=text_config)
        out = model.model.encoder(input_ids=prompt, past_key_values=cache)
        arrays["prompt"] = prompt.numpy()
        arrays["canvas"] = canvas.numpy()
        arrays["sc_logits"] = sc_logits.numpy()
        arrays[f"encoder_logits{suffix}"] = soft_capped(model, out.last_hidden_state).numpy()
        plain = model(past_key_values=out.past_key_values, decoder_input_ids=canvas).logits
        with_sc = model(
            past_key_values=out.past_key_values, decoder_input_ids=canvas, self_conditioning_logits=sc_logits
        ).logits
        arrays[f"canvas_logits{suffix}"] = plain.numpy()
        arrays[f"canvas_logits_sc{suffix}"] = with_sc.numpy()
        if suffix == "_wide":  # the cache holds every prompt token only when the window covers the prompt
            for layer, cache_layer in enumerate(out.past_key_values.layers):
                arrays[f"cache_k_{layer}"] = cache_layer.keys.numpy()  # (b, kv heads, prompt, head dim)
                arrays[f"cache_v_{layer}"] = cache_layer.values.numpy()


def padded_arrays(model, arrays: dict) -> None:
    """A right-padded batch: row 1's prompt is 3 tokens shorter; canvas positions continue its real length."""
    import torch
    from transformers import DynamicCache

    prompt = torch.tensor(arrays["prompt"]).clone()
    lengths = torch.tensor([PROMPT, PROMPT - 3])
    mask = torch.arange(PROMPT)[None, :] < lengths[:, None]
    prompt[~mask] = 0
    canvas = torch.tensor(arrays["canvas"])
    with torch.no_grad():
        cache = DynamicCache(config=model.config.get_text_config())
        out = model.model.encoder(input_ids=prompt, attention_mask=mask.long(), past_key_values=cache)
        decoder_mask = torch.cat([mask, torch.ones(2, CANVAS, dtype=torch.bool)], dim=1).long()
        positions = lengths[:, None] + torch.arange(CANVAS)[None, :]
        logits = model(
            past_key_values=out.past_key_values,
            decoder_input_ids=canvas,
            decoder_attention_mask=decoder_mask,
            decoder_position_ids=positions,
        ).logits
    arrays["padded_prompt"] = prompt.numpy()
    arrays["padded_lengths"] = lengths.numpy()
    arrays["padded_encoder_logits"] = soft_capped(model, out.last_hidden_state).numpy()
    arrays["padded_canvas_logits"] = logits.numpy()


def sampler_arrays(arrays: dict) -> None:
    """The generation pieces of transformers' DiffusionGemma on fixed inputs."""
    import torch
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        EntropyBoundSampler,
        EntropyBoundSamplerConfig,
        LinearTemperatureScheduleLogitsProcessor,
        StableAndConfidentStoppingCriteria,
    )

    rng = np.random.default_rng(2)
    scales = np.array([0.2, 1.0, 4.0, 12.0], np.float32)[:, None, None]  # from near-uniform to near-one-hot rows
    logits = torch.tensor(rng.standard_normal((4, 16, 24)).astype(np.float32) * scales)
    sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=0.1), 16, 24, 48)
    current = torch.tensor(rng.integers(0, 24, (4, 16)))
    denoised = torch.tensor(rng.integers(0, 24, (4, 16)))
    sampler.accept_canvas(current, denoised, logits, cur_step=10)
    arrays["eb_logits"] = logits.numpy()
    arrays["eb_accept"] = sampler.accepted_token_mask.numpy()
    processor = LinearTemperatureScheduleLogitsProcessor(t_min=0.4, t_max=0.8, max_denoising_steps=48)
    ones = torch.ones(1, 1)
    arrays["temperature_steps_remaining"] = np.arange(48, 0, -1)
    arrays["temperature"] = np.array([float(1.0 / processor(None, ones, cur_step=s)) for s in range(48, 0, -1)])
    stop = StableAndConfidentStoppingCriteria(stability_threshold=1, confidence_threshold=0.005)
    argmaxes = rng.integers(0, 24, (5, 3, 6))
    argmaxes[2:, 0] = argmaxes[1, 0]  # row 0 stable from step 2 on, row 1 from step 3 on, row 2 never
    argmaxes[3:, 1] = argmaxes[2, 1]
    onehot = np.eye(24, dtype=np.float32)[argmaxes]
    logits = 30.0 * onehot  # confident: entropy far below 0.005 ...
    logits[:, 2] = rng.standard_normal((5, 6, 24)).astype(np.float32) + 8.0 * onehot[:, 2]  # ... except row 2
    logits[4, 0] = 3.0 * onehot[4, 0]  # and row 0 at the last step
    flags = [stop(torch.tensor(a), torch.tensor(x)).numpy() for a, x in zip(argmaxes, logits)]
    arrays["stop_argmax"], arrays["stop_logits"], arrays["stop_flags"] = argmaxes, logits, np.stack(flags)


def gemma4_fixture(out: pathlib.Path) -> None:
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(
        **TEXT_SHAPE,
        attention_k_eq_v=True,
        sliding_window=4,
        enable_moe_block=True,
        hidden_size_per_layer_input=0,
        final_logit_softcapping=30.0,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(config).eval()
    redraw(model, seed=3)
    tokens = torch.tensor(np.random.default_rng(4).integers(4, VOCAB, (2, 12)))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
    model.save_pretrained(out / "hf_gemma4")
    np.savez_compressed(out / "hf_gemma4" / "arrays.npz", tokens=tokens.numpy(), logits=logits.numpy())


TEXT = "the quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun " * 40


def write_tokenizers(out: pathlib.Path) -> None:
    """A sentencepiece `tokenizer.model` for the DiffusionGemma directory and a `tokenizer.json` (the tokenizers
    library) for the Gemma-4 one, both with Gemma's special ids (PAD 0, EOS 1, BOS 2, UNK 3) and VOCAB entries."""
    import io

    import sentencepiece as spm
    import tokenizers

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT.split("  ") or [TEXT]),
        model_writer=model,
        vocab_size=VOCAB,
        model_type="bpe",
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        character_coverage=1.0,
    )
    (out / "hf_diffusiongemma" / "tokenizer.model").write_bytes(model.getvalue())
    words = sorted(set(TEXT.split()))
    vocab = {name: i for i, name in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", *words])}
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    word_level.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    word_level.add_special_tokens(["<pad>", "<eos>", "<bos>", "<unk>"])
    word_level.save(str(out / "hf_gemma4" / "tokenizer.json"))


def make(out: pathlib.Path) -> None:
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(diffusiongemma_config(WINDOW)).eval()
    redraw(model, seed=0)
    arrays: dict[str, np.ndarray] = {}
    diffusiongemma_arrays(model, arrays, suffix="")
    wide = DiffusionGemmaForBlockDiffusion(diffusiongemma_config(WIDE_WINDOW)).eval()
    wide.load_state_dict(model.state_dict())
    diffusiongemma_arrays(wide, arrays, suffix="_wide")
    padded_arrays(wide, arrays)
    sampler_arrays(arrays)
    model.save_pretrained(out / "hf_diffusiongemma")
    np.savez_compressed(out / "hf_diffusiongemma" / "arrays.npz", **arrays)
    gemma4_fixture(out)
    write_tokenizers(out)
    sizes = {f"{p.parent.name}/{p.name}": p.stat().st_size for p in sorted(out.glob("hf_*/*"))}
    print(json.dumps({"wrote": str(out), "bytes": sum(sizes.values()), "files": sizes}))


def verify_export(directory: pathlib.Path) -> None:
    """Loads a toolbox-exported DiffusionGemma directory in transformers and compares its encoder and canvas logits
    with the toolbox's own (`toolbox_logits.npz` written beside it by the export). The reference is transformers with
    its per-expert loop (`experts_implementation="eager"`) in float32; the same model in float64 shows how much of the
    difference is float32 rounding, and transformers' default grouped-matmul expert kernel is reported beside it."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache

    expected = np.load(directory / "toolbox_logits.npz")

    def logits(dtype, experts: str) -> tuple[np.ndarray, np.ndarray]:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(
            directory, attn_implementation="eager", experts_implementation=experts
        )
        model = model.eval().to(dtype)
        with torch.no_grad():
            cache = DynamicCache(config=model.config.get_text_config())
            out = model.model.encoder(input_ids=torch.tensor(expected["prompt"]), past_key_values=cache)
            encoder = soft_capped(model, out.last_hidden_state)
            canvas = model(past_key_values=out.past_key_values, decoder_input_ids=torch.tensor(expected["canvas"]))
        return encoder.double().numpy(), canvas.logits.double().numpy()

    def max_diff(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.abs(a - b).max())

    encoder, canvas = logits(torch.float32, "eager")
    encoder64, canvas64 = logits(torch.float64, "eager")
    _, canvas_grouped = logits(torch.float32, "grouped_mm")
    print(
        json.dumps(
            {
                "verified": str(directory),
                "encoder_max_abs_diff": max_diff(encoder, expected["encoder_logits"]),
                "canvas_max_abs_diff": max_diff(canvas, expected["canvas_logits"]),
                "canvas_max_abs_diff_vs_float64": max_diff(canvas64, expected["canvas_logits"]),
                "transformers_float32_vs_float64": max_diff(canvas, canvas64),
                "canvas_max_abs_diff_grouped_mm": max_diff(canvas_grouped, expected["canvas_logits"]),
                "max_abs_canvas_logit": float(np.abs(canvas64).max()),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures")
    parser.add_argument("--verify_export", default="", help="a directory exported by the toolbox to load and check")
    args = parser.parse_args()
    if args.verify_export:
        verify_export(pathlib.Path(args.verify_export))
    else:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        make(out)


if __name__ == "__main__":
    main()
