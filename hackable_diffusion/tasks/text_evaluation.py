"""What `python -m hackable_diffusion.evaluate` measures on a text run: the validation likelihood and, on request,
samples with their generative perplexity.

The likelihood is the exact NLL of an autoregressive run or the ELBO of a diffusion run (Monte-Carlo over noise
levels; `repeats` passes with fresh noise give a standard error of the mean), in bits per token, per character
(Shakespeare) or perplexity per word (PTB). Samples come from the run's own sampler; `scorer_workdir` names an
autoregressive run that scores them (generative perplexity and the samples' unigram entropy, `tasks.text`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from absl import flags

from hackable_diffusion.data.tokenizers import BOS_ID
from hackable_diffusion.recipes import sampler_report
from hackable_diffusion.tasks import text

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment

@dataclasses.dataclass(frozen=True)
class Likelihood:
    """Validation likelihood of a text run, optionally with `num_samples` samples scored by an AR run."""

    num_batches: int = 0  # 0 = the whole split
    batch_size: int = 0  # 0 = config.eval.batch_size
    repeats: int = 1
    num_samples: int = 0
    scorer_workdir: str | None = None
    max_new_tokens: int = 0  # 0 = config.sampler.max_new_tokens

    def __post_init__(self):
        for name in ("num_batches", "batch_size", "num_samples", "max_new_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name}={getattr(self, name)} must be >= 0 (0: {ZERO_MEANS[name]}).")
        if self.repeats < 1:
            raise ValueError(f"--repeats={self.repeats} must be >= 1.")

    def __call__(self, exp: Experiment, params: Any, *, seed: int, load_run: Callable[[str], tuple]) -> dict:
        start = time.perf_counter()
        runs = [
            text.evaluate_likelihood(
                exp, params, num_batches=self.num_batches or None, seed=seed + r, batch_size=self.batch_size or None
            )
            for r in range(self.repeats)
        ]
        out: dict[str, Any] = {
            "model": "autoregressive" if exp.is_autoregressive else f"diffusion/{exp.config.diffusion.process}",
            "bound": "exact NLL" if exp.is_autoregressive else "ELBO (upper bound on NLL)",
        }
        for key in runs[0]:
            out[key] = float(np.mean([r[key] for r in runs]))
        if len(runs) > 1:
            per_token = np.asarray([r["bits_per_token"] for r in runs])
            out["bits_per_token_se"] = float(per_token.std(ddof=1) / np.sqrt(len(runs)))
        out["bits_per_token_se_relative"] = out["bits_per_token_se"] / out["bits_per_token"]
        out["eval_seconds"] = time.perf_counter() - start
        if self.num_samples:
            out.update(self.samples(exp, params, seed=seed, load_run=load_run))
        return out

    def samples(self, exp: Experiment, params: Any, *, seed: int, load_run: Callable[[str], tuple]) -> dict:
        prompts = [exp.config.sampler.prompt] * self.num_samples
        start = time.perf_counter()
        texts, result = text.sample_texts(exp, params, prompts, seed=seed, max_new_tokens=self.max_new_tokens or None)
        out: dict[str, Any] = {
            "samples": [p + t for p, t in zip(prompts, texts)],
            "sample_forward_passes": result.forward_passes,
            "sample_tokens": int(np.sum(result.lengths)),
            "sample_seconds_incl_compile": time.perf_counter() - start,
        }
        if result.steps is not None:
            used = np.asarray(result.steps)
            out["mean_steps_per_canvas"] = float(used[used > 0].mean()) if (used > 0).any() else 0.0
        if not exp.is_autoregressive:
            out["sampler"] = sampler_report(exp.config)
        if self.scorer_workdir:
            scorer, scorer_params = load_run(self.scorer_workdir)
            # Re-encode the text with the scorer's tokenizer: the two runs need not share token ids.
            prompt_ids = [[BOS_ID] + scorer.tokenizer.encode(p) for p in prompts]
            cont_ids = [scorer.tokenizer.encode(t) for t in texts]
            out["scorer_workdir"] = self.scorer_workdir
            out.update(text.generative_perplexity(scorer, scorer_params, prompt_ids, cont_ids))
        return out


ZERO_MEANS = {  # what 0 means for each count flag
    "num_batches": "the whole split",
    "batch_size": "config.eval.batch_size",
    "num_samples": "no samples",
    "max_new_tokens": "config.sampler.max_new_tokens",
}


def define_flags(flag_values: flags.FlagValues) -> None:
    """The flags `evaluate` takes for a text run."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_integer("num_batches", 0, "text: validation batches (0 = the whole split).", **fv)
    flags.DEFINE_integer("repeats", 1, "text: Monte-Carlo passes over the split (diffusion ELBO).", **fv)
    flags.DEFINE_integer("num_samples", 0, "text: also generate and print this many samples.", **fv)
    flags.DEFINE_string("scorer_workdir", None, "text: an autoregressive run that scores the samples.", **fv)
    flags.DEFINE_integer("max_new_tokens", 0, "text: tokens per sample (0 = config.sampler.max_new_tokens).", **fv)


def from_flags(flag_values: flags.FlagValues) -> Likelihood:
    """The evaluation the flags describe (`batch_size` is a flag of `evaluate` itself)."""
    f = flag_values
    return Likelihood(
        num_batches=f.num_batches,
        batch_size=f.batch_size,
        repeats=f.repeats,
        num_samples=f.num_samples,
        scorer_workdir=f.scorer_workdir,
        max_new_tokens=f.max_new_tokens,
    )
