"""The text task's scores and generation: language modelling on a packed corpus (tiny Shakespeare, Penn Treebank).
The `Task` itself is `text_task.TextTask`; `text_evaluation.py` is what `evaluate` runs on a text run.

Data and tokenizers come from `data.text` (nanoGPT's Shakespeare split, Mikolov's PTB). Scores: the validation
likelihood in bits per token, per character (Shakespeare) or perplexity per word (PTB) — the exact NLL of an
autoregressive run, the ELBO of a diffusion run with its Monte-Carlo standard error over batches; samples from the
run's sampler; and their generative perplexity under an autoregressive scorer run (with the unigram entropy of the
samples, which exposes a collapsed, repetitive sampler that a low perplexity alone would hide).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion import builders
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, NEVER_GENERATED
from hackable_diffusion.diffusion.training_losses import ArCE
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling import autoregressive as ar_lib
from hackable_diffusion.sampling import generate as gen_lib
from hackable_diffusion.sampling.prompts import GenerationResult

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


def is_sft(config: ml_collections.ConfigDict) -> bool:
    """A fine-tuning run on prompt -> response examples (`python -m hackable_diffusion.sft`)."""
    return config.diffusion.get("objective") == "sft" and "sft" in config


def sample_texts(
    exp: Experiment,
    params,
    prompts: list[str],
    *,
    seed: int = 0,
    max_new_tokens: int | None = None,
    return_trajectory: bool = False,
) -> tuple[list[str], GenerationResult]:
    """Generates a continuation of each prompt with the experiment's sampler (diffusion) or AR decoding;
    `return_trajectory` keeps every denoising step's canvas (diffusion)."""
    s = exp.config.sampler
    max_new = max_new_tokens or s.max_new_tokens
    ids = [[BOS_ID] + exp.tokenizer.encode(p) for p in prompts]
    trained = int(exp.config.data.get("seq_len") or 0)
    longest = max(len(row) for row in ids)
    if trained and longest + max_new > 2 * trained:
        print(
            f"warning: prompt ({longest} tokens) + {max_new} new tokens is far longer than the {trained}-token "
            "sequences the model was trained on; positions it never saw may degrade the output.",
            flush=True,
        )
    if not exp.is_autoregressive:  # whole canvases
        canvas = builders.build_sampler(exp.config, exp.process).canvas_length
        max_new = int(math.ceil(max_new / canvas) * canvas)
    result = generate_tokens(exp, params, ids, key=seed, max_new_tokens=max_new, return_trajectory=return_trajectory)
    texts = [exp.tokenizer.decode(np.asarray(row)) for row in result.tokens]
    return texts, result


def generate_tokens(
    exp: Experiment,
    params,
    prompts,
    *,
    key,
    max_new_tokens: int,
    prompt_mask=None,
    return_trajectory: bool = False,
) -> GenerationResult:
    """The run's own decoding after token-id prompts: its diffusion sampler (`config.sampler`, stopping at EOS), or
    cached AR decoding at `sampler.ar_temperature` for an autoregressive run. `prompts`/`prompt_mask`/`key` are
    `sampling.generate`'s."""
    unused = tuple(range(exp.tokenizer.vocab_size, exp.model.cfg.vocab_size))  # padded ids no text decodes
    forbidden = NEVER_GENERATED + unused
    if exp.is_autoregressive:
        return ar_lib.generate_ar(
            exp.model,
            params,
            prompts,
            prompt_mask=prompt_mask,
            key=key,
            max_new_tokens=max_new_tokens,
            sampling=ar_lib.ARSampling(temperature=exp.config.sampler.ar_temperature),
            forbidden_tokens=forbidden,
        )
    return gen_lib.generate(
        exp.model,
        params,
        prompts,
        prompt_mask=prompt_mask,
        sampler=builders.build_sampler(exp.config, exp.process, forbidden_tokens=forbidden),
        key=key,
        max_new_tokens=max_new_tokens,
        stop_tokens=(EOS_ID,),
        return_trajectory=return_trajectory,
    )


def generative_perplexity(
    scorer: Experiment,
    params,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    batch_size: int = 16,
) -> dict[str, float]:
    """Generative perplexity: the NLL of generated `continuations` under an autoregressive `scorer` run, conditioned
    on their `prompts` (token ids of the scorer's tokenizer, BOS included in the prompt), counted on the
    continuation tokens only (up to and including the first EOS). Returns nats/bits per token, the perplexity and the
    unigram entropy of the continuations (a collapsed, repetitive sampler scores a low perplexity *and* a low
    entropy)."""
    if not scorer.is_autoregressive:
        raise ValueError("generative_perplexity needs an autoregressive scorer run (config.diffusion.process='none').")
    if len(prompts) != len(continuations) or not prompts:
        raise ValueError(f"need as many prompts as continuations (>= 1), got {len(prompts)} and {len(continuations)}.")
    rows, targets = [], []
    for prompt, cont in zip(prompts, continuations):
        cont = list(cont)
        if EOS_ID in cont:
            cont = cont[: cont.index(EOS_ID) + 1]
        rows.append(list(prompt) + cont)
        targets.append([False] * len(prompt) + [True] * len(cont))
    width = max(len(r) for r in rows)
    tokens = np.zeros((len(rows), width), np.int32)
    target = np.zeros((len(rows), width), bool)
    for i, (row, tgt) in enumerate(zip(rows, targets)):
        tokens[i, : len(row)], target[i, : len(row)] = row, tgt

    @jax.jit
    def score(p, tok, tgt):
        logits, _ = T.forward(scorer.model, p, tok, token_mask=tok != 0, causal=True)
        per_example, count = ArCE()(logits, tok, tgt)
        return per_example * count, count

    nats, count = 0.0, 0
    for start in range(0, len(rows), batch_size):
        tok, tgt = tokens[start : start + batch_size], target[start : start + batch_size]
        pad = batch_size - len(tok)
        if pad:  # one compiled shape: pad with empty rows (no targets)
            tok = np.concatenate([tok, np.zeros((pad, width), np.int32)])
            tgt = np.concatenate([tgt, np.zeros((pad, width), bool)])
        total, n = score(params, jnp.asarray(tok), jnp.asarray(tgt))
        nats += float(np.sum(total))
        count += int(np.sum(n))
    counts = np.bincount(tokens[target], minlength=scorer.tokenizer.vocab_size).astype(float)
    probs = counts[counts > 0] / counts.sum()
    per_token = nats / max(count, 1)
    return {
        "gen_nats_per_token": per_token,
        "gen_bits_per_token": per_token / math.log(2),
        "gen_ppl": float(math.exp(per_token)),
        "gen_tokens": count,
        "gen_unigram_entropy_bits": float(-(probs * np.log2(probs)).sum()),
    }


def evaluate_likelihood(
    exp: Experiment, params, *, num_batches: int | None = None, seed: int = 0, batch_size: int | None = None
) -> dict[str, float]:
    """Validation NLL (AR) or ELBO (diffusion) in bits per token, per character (Shakespeare) or perplexity per word
    (PTB), with the Monte-Carlo standard error over batches (diffusion)."""
    batch_size = batch_size or exp.config.eval.batch_size
    batches = text_lib.make_eval_batches(exp.data.eval_sequences, batch_size)
    if num_batches:
        batches = batches[:num_batches]
    key_name = exp.objective.loss.likelihood_metric
    fn = jax.jit(exp.objective)
    bits, tokens = [], []
    for i, batch in enumerate(batches):
        _, metrics = fn(params, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.key(seed * 100003 + i))
        n = float(np.sum(batch["weights"] > 0))
        bits.append(float(metrics[key_name]) * n)
        tokens.append(n)
    bits, tokens = np.asarray(bits), np.asarray(tokens)
    per_token = bits.sum() / tokens.sum()
    per_batch = bits / tokens
    se = float(np.std(per_batch, ddof=1) / np.sqrt(len(per_batch))) if len(per_batch) > 1 else float("nan")
    out = {"bits_per_token": float(per_token), "bits_per_token_se": se, "eval_tokens": int(tokens.sum())}
    full = exp.data.eval_num_tokens
    covered = tokens.sum() / max(full, 1)
    if exp.data.eval_num_chars:
        out["bits_per_char"] = float(per_token * full / exp.data.eval_num_chars)
    if exp.data.eval_num_words:
        out["ppl_per_word"] = float(2 ** (per_token * full / exp.data.eval_num_words))
    out["fraction_of_split"] = float(covered)
    return out
