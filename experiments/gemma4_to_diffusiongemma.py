"""A Gemma-4 checkpoint made into a DiffusionGemma one: adapt, train, export, and check the export in transformers.

  python experiments/gemma4_to_diffusiongemma.py [--source tests/fixtures/hf_gemma4] [--steps 20] \
      [--workdir runs/gemma4_to_dg] [--out results/text/gemma4_to_diffusiongemma.json]

1. `train` starts a uniform-noise block-diffusion run (DiffusionGemma's recipe: canvas cross-entropy, the encoder's AR
   loss, self-conditioning) from the Gemma-4 Hugging Face directory `--source` (`config.init.kind = "hf"`): every
   Gemma-4 weight is loaded, the self-conditioner is the one new parameter group (listed in init_report.json), the
   tokenizer is the checkpoint's own. It trains `--steps` steps on tiny Shakespeare (canvases of 8, sequences of 32).
2. `convert` writes the run as a Hugging Face DiffusionGemma directory (`--workdir` + `_hf`).
3. The toolbox loads that directory back (`hf:`, transformers' decoder-window convention) and writes
   `toolbox_logits.npz` beside it: the encoder's causal logits over a 10-token prompt and the decoder's canvas logits
   over an 8-token canvas against the prompt's KV cache (null self-conditioning signal).
4. When `transformers` is installed (not a dependency: `pip install transformers==5.23.0 torch safetensors`),
   `experiments/make_hf_fixtures.py --verify_export` loads the directory with `DiffusionGemmaForBlockDiffusion` and
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


def adapted_config(source: str, steps: int):
    from hackable_diffusion import recipes
    from hackable_diffusion.checkpoints import base_weights

    c = recipes.text_config("shakespeare", "uniform", steps=steps, seq_len=32, batch_size=8, canvas_len=8)
    c.data.tokenizer = "pretrained"
    c.init = recipes.init_section("hf", source)
    base = base_weights.load_base(c)
    c.model.update(dict(dataclasses.asdict(base.model.cfg), self_conditioning=True))  # Gemma-4 + a self-conditioner
    c.optimizer.peak_lr, c.optimizer.warmup_steps = 1e-3, min(5, steps)
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
    from hackable_diffusion.sampling.generate import prefill

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="tests/fixtures/hf_gemma4")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workdir", default="runs/gemma4_to_dg")
    parser.add_argument("--out", default="results/text/gemma4_to_diffusiongemma.json")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that has transformers, if another")
    args = parser.parse_args()

    from hackable_diffusion import cli, convert, train

    cli.quiet_library_logs()
    workdir = pathlib.Path(args.workdir)
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
    }
    check = subprocess.run(
        [args.python, "experiments/make_hf_fixtures.py", "--verify_export", str(exported)],
        capture_output=True,
        text=True,
    )
    if check.returncode == 0:
        result.update(json.loads(check.stdout.strip().splitlines()[-1]))
    else:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        result["verify_export"] = f"not run: {last} (install transformers==5.23.0 torch safetensors, or --python)"
    sample = subprocess.run(
        [sys.executable, "-m", "hackable_diffusion.sample", "--workdir", f"hf:{exported}", "--prompt", "ROMEO:",
         "--max_new_tokens", "16", "--seed", "0"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    lines = [line for line in sample.stdout.strip().splitlines() if line.strip()]
    result["sample_hf_dir"] = lines[-1] if sample.returncode == 0 and lines else f"failed: {sample.stderr[-300:]}"
    result["command"] = cli.argparse_command("experiments/gemma4_to_diffusiongemma.py", args)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(cli.json_line(result), flush=True)


if __name__ == "__main__":
    main()
