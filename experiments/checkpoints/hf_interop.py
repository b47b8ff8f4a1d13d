"""Trained toolbox runs exported to Hugging Face and loaded by `transformers`: the same logits, and its `generate` runs.

  pip install -e '.[interop]'             # transformers==5.23.0 + torch, never a dependency of the package or CI
  python experiments/checkpoints/hf_interop.py [--out results/checkpoints/hf_interop.jsonl] [--workdir /tmp/hf_interop]

Trains tiny runs for a few steps, one per exportable kind: uniform noise + self-conditioning (DiffusionGemma's recipe)
-> `DiffusionGemmaForBlockDiffusion`, block masking diffusion (no self-conditioner) -> `Gemma4ForCausalLM`, each with
the character tokenizer and with SentencePiece. The DiffusionGemma runs train with `model.decoder_window=cache_tail`,
transformers' decoder window (docs/checkpoints.md), so that transformers decodes their canvases as they were trained.
Each run is exported with `python -m hackable_diffusion.convert`'s `convert`, then:

- transformers loads it (`from_pretrained`, `output_loading_info`): no missing, unexpected or mis-shaped keys;
- logits against the run's own model (`toolbox.load_params`): the encoder's causal logits, and (DiffusionGemma) the
  canvas logits without and with `self_conditioning_logits`, for a prompt whose prompt + canvas fits in the sliding
  window and one past it; the toolbox's own `load_hf` of the export is compared as well;
- transformers' own `generate` runs on a prompt (DiffusionGemma: its entropy-bound sampler, one canvas; Gemma-4:
  greedy decoding).

One JSON line per case goes to `--out`; a case passes when every difference is within 1e-4 and `generate` ran. One more
case shows what `--allow_decoder_window_mismatch` costs: the DiffusionGemma char run with `per_token` recorded, whose
canvas logits past the window differ in transformers (it is reported, not required to agree).

The reference is transformers in float32 with eager attention and its per-expert loop (`experts_implementation=
"eager"`). `tests/models/test_hf_export.py` runs `check_export` on the suite's tiny runs when transformers is
importable.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import time

import numpy as np

TOLERANCE = 1e-4
WINDOW, CANVAS, SEQ_LEN = 16, 8, 32


# ----------------------------------------------------------------------------------------------------------------
# Runs


def run_config(process: str, tokenizer: str, decoder_window: str, *, steps: int = 2, window: int = WINDOW):
    """A tiny text run: `presets.tiny` (MoE, one local + one global layer) with `window`, `decoder_window`, and the
    char tokenizer or a 256-piece SentencePiece model fitted on tiny Shakespeare."""
    from hackable_diffusion import recipes
    from hackable_diffusion.models import presets

    model = dict(presets.tiny(), sliding_window=window, decoder_window=decoder_window)
    c = recipes.text_config(
        "shakespeare", process, model=model, steps=steps, seq_len=SEQ_LEN, batch_size=8, canvas_len=CANVAS
    )
    if tokenizer == "spm":
        c.data.tokenizer, c.data.vocab_size = "spm", 256
    c.optimizer.warmup_steps = 1
    c.train.log_every = steps
    c.train.eval_every = 0
    c.train.checkpoint_every = steps
    c.eval.num_batches = 1
    c.eval.batch_size = 8
    c.sampler.num_steps = 4
    c.sampler.canvas_len = CANVAS
    return c


def train_run(config, workdir: pathlib.Path) -> pathlib.Path:
    import contextlib
    import io

    from hackable_diffusion import train

    with contextlib.redirect_stdout(io.StringIO()):
        train.run(config, str(workdir), sample_at_end=False)
    return workdir


def with_decoder_window(run: pathlib.Path, decoder_window: str, out: pathlib.Path) -> pathlib.Path:
    """A copy of `run` whose config records another `model.decoder_window` (the same weights)."""
    shutil.copytree(run, out)
    config = json.loads((out / "config.json").read_text())
    config["model"]["decoder_window"] = decoder_window
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


# ----------------------------------------------------------------------------------------------------------------
# Logits


def inputs(vocab: int, prompt_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of 2: prompt ids (content ids), a canvas over the whole vocabulary, self-conditioning logits."""
    rng = np.random.default_rng(seed)
    return {
        "prompt": rng.integers(4, vocab, (2, prompt_len)).astype(np.int32),
        "canvas": rng.integers(0, vocab, (2, CANVAS)).astype(np.int32),
        "sc_logits": (3.0 * rng.standard_normal((2, CANVAS, vocab))).astype(np.float32),
    }


def toolbox_logits(model, params, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The encoder's causal logits over the prompt, and the canvas logits after it (with the null and a given
    self-conditioning signal when the model has a self-conditioner), through the toolbox's public run modes."""
    import jax.numpy as jnp

    from hackable_diffusion.models import transformer as T
    from hackable_diffusion.sampling.prompts import prefill

    prompt, canvas = jnp.asarray(batch["prompt"]), jnp.asarray(batch["canvas"])
    out = {"encoder": T.forward(model, params, prompt, causal=True)[0]}
    mask = jnp.ones(prompt.shape, bool)
    _, cache = prefill(model, params, prompt, mask, cache_length=prompt.shape[1] + canvas.shape[1])
    if model.cfg.self_conditioning:
        null = T.model_method(model, params, "null_sc_signal", canvas.shape)
        out["canvas"] = T.decode_block(model, params, canvas, cache, sc_signal=null)[0]
        signal = T.model_method(model, params, "sc_signal", jnp.asarray(batch["sc_logits"]))
        out["canvas_sc"] = T.decode_block(model, params, canvas, cache, sc_signal=signal)[0]
    else:
        out["canvas"] = T.decode_block(model, params, canvas, cache)[0]
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def run_model(run: pathlib.Path):
    """(model, params) of a run, as `sample` and `evaluate` load it: a trained run's latest checkpoint (EMA weights
    when kept), or the `fused_params/` an SFT run (or `init_run`) writes."""
    from hackable_diffusion import experiment
    from hackable_diffusion.checkpoints import toolbox

    exp = experiment.from_workdir(str(run))
    if (run / toolbox.FUSED_DIR).is_dir():
        return exp.model, toolbox.load_params_directory(run / toolbox.FUSED_DIR)
    params, _ = toolbox.load_params(exp, str(run))
    return exp.model, params


def init_run(config, workdir: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """A run directory without training: the config, the tokenizer fitted as training fits it, and the model's
    initial weights as `fused_params/` (the layout an SFT run exports from)."""
    import jax

    from hackable_diffusion import experiment, run_config
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.models import transformer as T

    exp = experiment.build(config, str(workdir))
    run_config.save_config(config, workdir / "config.json")
    toolbox.save_params(T.init_params(exp.model, jax.random.key(seed)), workdir / toolbox.FUSED_DIR)
    return workdir


def prompt_lengths(cfg) -> dict[str, int]:
    """Prompt lengths whose prompt + canvas fits in the sliding window ("within", when one does) and passes it."""
    lengths = {"past": cfg.sliding_window + 4}
    if cfg.sliding_window > CANVAS:
        lengths["within"] = cfg.sliding_window - CANVAS
    return lengths


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


# ----------------------------------------------------------------------------------------------------------------
# transformers


def load_transformers(directory: pathlib.Path):
    """The exported directory through transformers (float32, eager attention and experts) and its loading report."""
    import torch
    from transformers import AutoConfig, DiffusionGemmaForBlockDiffusion, Gemma4ForCausalLM

    config = AutoConfig.from_pretrained(directory)
    cls = DiffusionGemmaForBlockDiffusion if config.model_type == "diffusion_gemma" else Gemma4ForCausalLM
    model, info = cls.from_pretrained(
        directory,
        attn_implementation="eager",
        experts_implementation="eager",
        dtype=torch.float32,
        output_loading_info=True,
    )
    return model.eval(), {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs"}


def transformers_logits(model, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    prompt = torch.tensor(batch["prompt"], dtype=torch.long)
    with torch.no_grad():
        if model.config.model_type != "diffusion_gemma":
            return {"encoder": model(input_ids=prompt).logits.double().numpy()}
        from transformers import DynamicCache

        out = model.model.encoder(input_ids=prompt, past_key_values=DynamicCache(config=model.config.get_text_config()))
        logits = model.lm_head(out.last_hidden_state).float()
        cap = model.config.get_text_config().final_logit_softcapping
        canvas = torch.tensor(batch["canvas"], dtype=torch.long)
        plain = model(past_key_values=out.past_key_values, decoder_input_ids=canvas).logits
        sc = torch.tensor(batch["sc_logits"])
        with_sc = model(past_key_values=out.past_key_values, decoder_input_ids=canvas, self_conditioning_logits=sc)
        return {
            "encoder": (torch.tanh(logits / cap) * cap).double().numpy(),
            "canvas": plain.double().numpy(),
            "canvas_sc": with_sc.logits.double().numpy(),
        }


def transformers_generate(model, vocab: int) -> list[int]:
    """transformers' own `generate` on a 6-token prompt: DiffusionGemma's sampler (one canvas), Gemma-4 greedy."""
    import torch

    torch.manual_seed(0)
    prompt = torch.tensor(np.random.default_rng(7).integers(4, vocab, (1, 6)), dtype=torch.long)
    with torch.no_grad():
        if model.config.model_type == "diffusion_gemma":
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=CANVAS)
        else:
            out = model.generate(prompt, max_new_tokens=4, do_sample=False)
    sequences = out.sequences if hasattr(out, "sequences") else out
    return sequences[0].tolist()


# ----------------------------------------------------------------------------------------------------------------
# The check


def check_export(run: pathlib.Path, export: pathlib.Path, *, with_transformers: bool = True) -> dict:
    """Compares an exported directory with the run it came from: config.json against the tensors, the tokenizer, the
    toolbox's `load_hf`, and (with_transformers) transformers' loading report, logits and `generate`. Returns the
    record; `record["ok"]` says whether every difference is within TOLERANCE and generate ran."""
    from hackable_diffusion.checkpoints import hf as hf_ckpt
    from hackable_diffusion.checkpoints import hf_files
    from hackable_diffusion.data import tokenizers as tok_lib
    from hackable_diffusion.models import transformer as T

    model, params = run_model(run)
    loaded = hf_ckpt.load_hf(export)
    hf_config = hf_files.read_config(export)
    text = hf_config.get("text_config", hf_config)
    shapes = hf_files.tensor_shapes(hf_files.weight_files(export))
    stack = hf_ckpt.TEXT_STACK[hf_config["model_type"]]
    record = {
        "model_type": hf_config["model_type"],
        "decoder_window": hf_config.get("decoder_window"),
        "vocab_size": text["vocab_size"],
        "embedding_shape": list(shapes[stack + "embed_tokens.weight"]),
        "max_position_embeddings": text["max_position_embeddings"],
        "sliding_window": text["sliding_window"],
    }
    tokenizer = tok_lib.PretrainedTokenizer.from_directory(export)
    run_tokenizer = tok_lib.load_tokenizer(run / "tokenizer")
    sample = "ROMEO:\nWhat light through yonder window breaks?"
    record["tokenizer"] = tokenizer.model_file.name
    record["tokenizer_same_ids"] = tokenizer.encode(sample) == run_tokenizer.encode(sample)
    hf_model = info = None
    if with_transformers:
        hf_model, info = load_transformers(export)
        record["loading_info"] = info
    diffs: dict[str, float] = {}
    for where, length in prompt_lengths(model.cfg).items():
        batch = inputs(model.cfg.vocab_size, length)
        ours = toolbox_logits(model, params, batch)
        via_load_hf = toolbox_logits(T.Transformer(loaded.config), loaded.params, batch)
        for name, value in ours.items():
            diffs[f"load_hf_{name}_{where}"] = max_diff(via_load_hf[name], value)
        if hf_model is not None:
            theirs = transformers_logits(hf_model, batch)
            for name, value in theirs.items():
                diffs[f"transformers_{name}_{where}"] = max_diff(value, ours[name])
    record["prompt_lengths"] = prompt_lengths(model.cfg)
    record["max_abs_diff"] = diffs
    if hf_model is not None:
        start = time.time()
        record["generated"] = transformers_generate(hf_model, model.cfg.vocab_size)
        record["generate_s"] = round(time.time() - start, 2)
    loading_clean = info is None or not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    record["ok"] = bool(
        record["vocab_size"] == record["embedding_shape"][0] == model.cfg.vocab_size
        and record["tokenizer_same_ids"]
        and loading_clean
        and all(v <= TOLERANCE for v in diffs.values())
        and (hf_model is None or len(record["generated"]) > 6)
    )
    return record


CASES = (  # name, process, tokenizer, decoder_window the run trains with
    ("diffusiongemma_char", "uniform", "char", "cache_tail"),
    ("diffusiongemma_spm", "uniform", "spm", "cache_tail"),
    ("gemma4_char", "masking", "char", "per_token"),
    ("gemma4_spm", "masking", "spm", "per_token"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/checkpoints/hf_interop.jsonl")
    parser.add_argument("--workdir", default="/tmp/hf_interop")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    import transformers

    root = pathlib.Path(args.workdir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    from hackable_diffusion import convert

    records = []
    for name, process, tokenizer, window in CASES:
        run = train_run(run_config(process, tokenizer, window, steps=args.steps), root / name)
        convert.convert(str(run), str(root / f"{name}_hf"))
        records.append(dict(case=name, steps=args.steps, **check_export(run, root / f"{name}_hf")))
        if name == "diffusiongemma_char":  # what exporting a per_token run anyway costs in transformers
            other = with_decoder_window(run, "per_token", root / f"{name}_per_token")
            convert.convert(str(other), str(root / f"{name}_per_token_hf"), allow_decoder_window_mismatch=True)
            record = check_export(other, root / f"{name}_per_token_hf")
            record["ok"] = None  # documents the mismatch; not expected to agree past the window
            records.append(dict(case=f"{name}_per_token_allowed", steps=args.steps, **record))
        print(json.dumps(records[-1]), flush=True)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    versions = {"transformers": transformers.__version__, "torch": __import__("torch").__version__}
    with out.open("w") as f:
        for record in records:
            f.write(json.dumps(dict(record, **versions), sort_keys=True) + "\n")
    failed = [r["case"] for r in records if r["ok"] is False]
    print(json.dumps({"wrote": str(out), "cases": len(records), "failed": failed}))


if __name__ == "__main__":
    main()
