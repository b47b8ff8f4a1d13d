"""A Gemma-4 checkpoint made into a DiffusionGemma one: adapt, train, export, and check the export in transformers.

  python experiments/checkpoints/gemma4_to_diffusiongemma.py [--source tests/fixtures/hf_gemma4] [--steps 20] \
      [--workdir runs/gemma4_to_dg] [--out results/text/gemma4_to_diffusiongemma.json]

The source must be a Gemma-4 the toolbox holds and DiffusionGemma can express. transformers' `Gemma4TextConfig`
defaults are not that; a user who builds a Gemma-4 with transformers sets, before `save_pretrained`:
`enable_moe_block=True` with `num_experts`, `top_k_experts`, `moe_intermediate_size` (default False: a dense block,
which is not the toolbox's layout), `hidden_size_per_layer_input=0` (default 256: per-layer input embeddings, not
implemented), `attention_k_eq_v=True` (default False; DiffusionGemma's global layers share one K=V projection) and
`final_logit_softcapping=30.0` (default None; DiffusionGemma always soft-caps, and a null value loads in transformers
and then fails in its forward). `source_problems` lists every one of them before anything is trained, and the
experiment stops on them with the values to set (the toolbox's loader and `convert` would refuse each later, one at a
time). The run trains with `model.decoder_window=cache_tail`, transformers' decoder window, which `convert` requires
of a DiffusionGemma export (docs/checkpoints.md).

0. The adaptation itself, at learning rate 0 (`--lr0_steps` steps, peak and end learning rates 0): the exported
   DiffusionGemma's encoder must give the source Gemma-4's causal logits (every weight loaded, none changed; the
   self-conditioner only feeds the decoder). Compared through the toolbox's `load_hf` of both directories and, when
   this interpreter has transformers, `Gemma4ForCausalLM` on the source against `DiffusionGemmaForBlockDiffusion`'s
   encoder on the export. A trained run cannot show this: its weights moved.
1. `train` starts a uniform-noise block-diffusion run (DiffusionGemma's recipe: canvas cross-entropy, the encoder's AR
   loss, self-conditioning) from the Gemma-4 Hugging Face directory `--source` (`config.init.kind = "hf"`): every
   Gemma-4 weight is loaded, the self-conditioner is the one new parameter group (listed in init_report.json), the
   tokenizer is the checkpoint's own. It trains `--steps` steps on tiny Shakespeare (canvases of 8, sequences of 32).
2. `convert` writes the run as a Hugging Face DiffusionGemma directory (`--workdir` + `_hf`).
3. The toolbox loads that directory back (`hf:`, transformers' decoder-window convention) and writes
   `toolbox_logits.npz` beside it: the encoder's causal logits over a 10-token prompt and the decoder's canvas logits
   over an 8-token canvas against the prompt's KV cache (null self-conditioning signal).
4. When `transformers` is installed (not a dependency: `pip install -e '.[interop]'`),
   `experiments/checkpoints/make_hf_fixtures.py --verify_export` loads the directory with `DiffusionGemmaForBlockDiffusion` and
   compares.
5. `python -m hackable_diffusion.sample --workdir hf:DIR` samples from the exported directory (its tokenizer is the
   checkpoint's own, carried over by `convert`).
Prints and writes one JSON line: the init table's counts, the losses at the first and last step, the largest logit
differences and the sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys

import numpy as np

PROMPT, CANVAS = 10, 8


def source_problems(source: str) -> list[str]:
    """What a Gemma-4 `config.json` must change to become a DiffusionGemma here, as `field=value (why)`; [] if
    nothing."""
    from hackable_diffusion.checkpoints import hf as hf_ckpt
    from hackable_diffusion.checkpoints import hf_files

    hf = hf_files.read_config(source)
    text = dict(hf.get("text_config") or hf)
    problems = []
    if hf.get("model_type") not in ("gemma4", hf_ckpt.GEMMA4_TEXT):
        problems.append(f"model_type={hf.get('model_type')!r} (a Gemma-4 checkpoint: gemma4 or gemma4_text)")
    if not text.get("enable_moe_block") or not text.get("num_experts"):
        problems.append("enable_moe_block=True with num_experts, top_k_experts, moe_intermediate_size (the MoE block)")
    if text.get("hidden_size_per_layer_input"):
        problems.append("hidden_size_per_layer_input=0 (per-layer input embeddings are not implemented)")
    if not text.get("attention_k_eq_v"):
        problems.append("attention_k_eq_v=True (DiffusionGemma's global layers share one K=V projection)")
    if text.get("final_logit_softcapping") is None:
        problems.append("final_logit_softcapping=30.0 (DiffusionGemma always soft-caps its logits)")
    return problems


def adapted_config(source: str, steps: int, peak_lr: float = 1e-3):
    from hackable_diffusion import recipes
    from hackable_diffusion.checkpoints import base_weights

    c = recipes.text_config("shakespeare", "uniform", steps=steps, seq_len=32, batch_size=8, canvas_len=8)
    c.data.tokenizer = "pretrained"
    c.init = recipes.init_section("hf", source)
    base = base_weights.load_base(c)
    c.model.update(dict(dataclasses.asdict(base.model.cfg), self_conditioning=True))  # Gemma-4 + a self-conditioner
    c.model.decoder_window = "cache_tail"  # transformers' decoder window: the export decodes as the run trained
    c.optimizer.peak_lr, c.optimizer.warmup_steps = peak_lr, min(5, steps)
    if peak_lr == 0:
        c.optimizer.end_lr = 0.0
    c.train.log_every = max(1, steps // 4)
    c.train.eval_every = 0
    c.train.checkpoint_every = steps
    c.sampler.canvas_len = CANVAS
    c.sampler.num_steps = 4
    c.sampler.max_new_tokens = 16
    return c


def toolbox_logits(directory: pathlib.Path, seed: int = 0) -> dict[str, np.ndarray]:
    import jax.numpy as jnp

    from hackable_diffusion.checkpoints import hf as hf_ckpt
    from hackable_diffusion.models import transformer as T
    from hackable_diffusion.sampling.prompts import prefill

    checkpoint = hf_ckpt.load_hf(directory, decoder_window="cache_tail", dtype="float32")
    model, params = T.Transformer(checkpoint.config), checkpoint.params
    rng = np.random.default_rng(seed)
    vocab = checkpoint.config.vocab_size
    prompt = rng.integers(4, vocab, (1, PROMPT)).astype(np.int32)
    canvas = rng.integers(4, vocab, (1, CANVAS)).astype(np.int32)
    encoder, _ = T.forward(model, params, jnp.asarray(prompt), causal=True)
    _, cache = prefill(model, params, jnp.asarray(prompt), jnp.ones(prompt.shape, bool), cache_length=PROMPT + CANVAS)
    null = T.model_method(model, params, "null_sc_signal", canvas.shape)
    logits, _ = T.decode_block(model, params, jnp.asarray(canvas), cache, sc_signal=null)
    return {
        "prompt": prompt,
        "canvas": canvas,
        "encoder_logits": np.asarray(encoder, np.float32),
        "canvas_logits": np.asarray(logits, np.float32),
    }


def encoder_equals_source(source: str, workdir: pathlib.Path, steps: int) -> dict:
    """Step 0: adapt at learning rate 0, export, and compare the DiffusionGemma encoder with the source Gemma-4."""
    import jax.numpy as jnp

    from hackable_diffusion import convert, train
    from hackable_diffusion.checkpoints import hf as hf_ckpt
    from hackable_diffusion.models import transformer as T

    train.run(adapted_config(source, steps, peak_lr=0.0), str(workdir), sample_at_end=False)
    exported = workdir.with_name(workdir.name + "_hf")
    convert.convert(str(workdir), str(exported), overwrite=True)
    gemma4, diffusion = hf_ckpt.load_hf(source, dtype="float32"), hf_ckpt.load_hf(exported, dtype="float32")
    prompt = np.random.default_rng(0).integers(4, gemma4.config.vocab_size, (2, 3 * PROMPT)).astype(np.int32)
    ours = {
        name: np.asarray(T.forward(T.Transformer(c.config), c.params, jnp.asarray(prompt), causal=True)[0], np.float64)
        for name, c in (("gemma4", gemma4), ("diffusiongemma", diffusion))
    }
    out = {
        "lr0_steps": steps,
        "lr0_prompt_length": int(prompt.shape[1]),
        "lr0_toolbox_encoder_vs_source_max_abs_diff": float(np.abs(ours["gemma4"] - ours["diffusiongemma"]).max()),
    }
    try:
        import torch
        from transformers import DiffusionGemmaForBlockDiffusion, Gemma4ForCausalLM
    except ImportError:
        out["lr0_transformers"] = "not run: transformers is not installed here (pip install -e '.[interop]')"
        return out
    kwargs = dict(attn_implementation="eager", experts_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        tokens = torch.tensor(prompt, dtype=torch.long)
        source_logits = Gemma4ForCausalLM.from_pretrained(source, **kwargs).eval()(input_ids=tokens).logits.double()
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(exported, **kwargs).eval()
        hidden = model.model.encoder(input_ids=tokens).last_hidden_state
        cap = model.config.get_text_config().final_logit_softcapping
        encoder = (torch.tanh(model.lm_head(hidden).float() / cap) * cap).double()
    out["lr0_transformers_encoder_vs_source_max_abs_diff"] = float((encoder - source_logits).abs().max())
    out["lr0_transformers_vs_toolbox_max_abs_diff"] = float(np.abs(encoder.numpy() - ours["gemma4"]).max())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="tests/fixtures/hf_gemma4")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workdir", default="runs/gemma4_to_dg")
    parser.add_argument("--out", default="results/text/gemma4_to_diffusiongemma.json")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that has transformers, if another")
    parser.add_argument("--lr0_steps", type=int, default=2, help="steps of the learning-rate-0 check (0: skip it)")
    args = parser.parse_args()

    from hackable_diffusion import cli, convert, train

    cli.quiet_library_logs()
    problems = source_problems(args.source)
    if problems:
        raise SystemExit(f"error: {args.source} cannot become a DiffusionGemma here; set in its config: {problems}")
    workdir = pathlib.Path(args.workdir)
    lr0 = {}
    if args.lr0_steps:
        lr0 = encoder_equals_source(args.source, workdir.with_name(workdir.name + "_lr0"), args.lr0_steps)
        print(cli.json_line(lr0), flush=True)
    train.run(adapted_config(args.source, args.steps), str(workdir), sample_at_end=False)
    report = json.loads((workdir / "init_report.json").read_text())
    metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if m.get("split") == "train"]
    exported = workdir.with_name(workdir.name + "_hf")
    convert.convert(str(workdir), str(exported), overwrite=True)
    np.savez(exported / "toolbox_logits.npz", **toolbox_logits(exported))
    result = {
        "source": args.source,
        "steps": args.steps,
        "loaded_parameters": len(report.get("loaded", [])),
        "new_parameters": [row[0] if isinstance(row, list) else row for row in report.get("new", [])],
        "first_logged_loss": losses[0] if losses else None,
        "last_logged_loss": losses[-1] if losses else None,
        "exported": str(exported),
        **lr0,
    }
    check = subprocess.run(
        [args.python, "experiments/checkpoints/make_hf_fixtures.py", "--verify_export", str(exported)],
        capture_output=True,
        text=True,
    )
    if check.returncode == 0:
        result.update(json.loads(check.stdout.strip().splitlines()[-1]))
    else:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        result["verify_export"] = f"not run: {last} (pip install -e '.[interop]', or --python)"
    sample = subprocess.run(
        [sys.executable, "-m", "hackable_diffusion.sample", "--workdir", f"hf:{exported}", "--prompt", "ROMEO:",
         "--max_new_tokens", "16", "--seed", "0"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    lines = [line for line in sample.stdout.strip().splitlines() if line.strip()]
    result["sample_hf_dir"] = lines[-1] if sample.returncode == 0 and lines else f"failed: {sample.stderr[-300:]}"
    result["command"] = cli.argparse_command("experiments/checkpoints/gemma4_to_diffusiongemma.py", args)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(cli.json_line(result), flush=True)


if __name__ == "__main__":
    main()
