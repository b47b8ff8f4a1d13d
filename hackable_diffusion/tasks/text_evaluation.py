"""What `python -m hackable_diffusion.evaluate` measures on a text run: the validation likelihood and, on request,
samples with their generative perplexity.

The likelihood is the exact NLL of an autoregressive run or the ELBO of a diffusion run (Monte-Carlo over noise
levels; `repeats` passes with fresh noise give a standard error of the mean), in bits per token, per character
(Shakespeare) or perplexity per word (PTB). Samples come from the run's own sampler; `scorer_workdir` names an
autoregressive run that scores them (generative perplexity and the samples' unigram entropy, `tasks.text`).

The diversity of a set of samples (token ids of the scorer's tokenizer, characters on Shakespeare) beyond unigram
entropy, which barely moves when a sampler repeats character pairs at the same character frequencies:
  * `ngram_entropy_bits`: the entropy of the empirical distribution of the n-grams within each sample, pooled over
    the samples (no n-gram crosses from one sample into the next);
  * `distinct_n`: distinct-n (Li et al., 2016, "A Diversity-Promoting Objective Function for Neural Conversation
    Models"), the number of distinct n-grams over all samples divided by the number of n-grams. Li et al. divide by
    the number of generated tokens; the two differ by n - 1 per sample;
  * `repetition_rate`: seq-rep-n (Welleck et al., 2020, "Neural Text Generation with Unlikelihood Training"), per
    sample 1 - |distinct n-grams| / |n-grams|, i.e. the share of its n-grams that repeat an earlier n-gram of the
    same sample, averaged over the samples that have at least one n-gram; n = 4 as there. The papers count word or
    subword n-grams; on characters short n-grams repeat in any text (" the"), so compare against the scorer's own
    samples or a teacher, not against zero.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Hashable, Sequence

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


def ngrams(sample: Sequence[Hashable], n: int) -> list[tuple]:
    """The n-grams of one sample (tokens or characters), in order: len(sample) - n + 1 of them, none if shorter."""
    if n < 1:
        raise ValueError(f"n-gram order n={n} must be >= 1 (1: single tokens, 2: adjacent pairs, ...).")
    return [tuple(sample[i : i + n]) for i in range(len(sample) - n + 1)]


def ngram_entropy_bits(samples: Sequence[Sequence[Hashable]], n: int) -> float:
    """Entropy in bits of the empirical distribution of the n-grams within each sample, pooled over the samples;
    0.0 when there are none."""
    counts = Counter(g for sample in samples for g in ngrams(sample, n))
    total = sum(counts.values())
    return float(-sum(c / total * math.log2(c / total) for c in counts.values())) if total else 0.0


def distinct_n(samples: Sequence[Sequence[Hashable]], n: int) -> float:
    """Distinct-n: distinct n-grams over all samples / all n-grams of the samples (1.0: no n-gram occurs twice);
    0.0 when there are none."""
    grams = [g for sample in samples for g in ngrams(sample, n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(samples: Sequence[Sequence[Hashable]], n: int = 4) -> float:
    """seq-rep-n: the share of a sample's n-grams that repeat an earlier n-gram of the same sample
    (1 - distinct / all), averaged over the samples with at least one n-gram; 0.0 when none has one."""
    rates = [1 - len(set(grams)) / len(grams) for grams in (ngrams(s, n) for s in samples) if grams]
    return float(sum(rates) / len(rates)) if rates else 0.0


def diversity(samples: Sequence[Sequence[Hashable]]) -> dict[str, float]:
    """The diversity figures of generated samples that `experiments/distill/steps_frontier.py` records beside the unigram
    entropy of `text.generative_perplexity`: bigram and trigram entropy, distinct-2 and -3, seq-rep-4."""
    return {
        "gen_bigram_entropy_bits": ngram_entropy_bits(samples, 2),
        "gen_trigram_entropy_bits": ngram_entropy_bits(samples, 3),
        "gen_distinct_2": distinct_n(samples, 2),
        "gen_distinct_3": distinct_n(samples, 3),
        "gen_seq_rep_4": repetition_rate(samples, 4),
    }


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
