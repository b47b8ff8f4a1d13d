"""Evaluation entry point.

  python -m hackable_diffusion.evaluate --workdir runs/NAME --task likelihood [--num_batches 0] [--num_samples 4]

`likelihood`: validation bits per token, bits per character (Shakespeare) or perplexity per word (PTB): the exact
NLL for an autoregressive run, the ELBO bound (Monte-Carlo over noise levels, standard error printed) for a
diffusion run; optionally a few samples. Prints one JSON line.
"""

from __future__ import annotations

import json
import time

from absl import app, flags

from hackable_diffusion import cli

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "A training workdir.")
  flags.DEFINE_enum("task", "likelihood", ["likelihood"], "What to evaluate.")
  flags.DEFINE_integer("num_batches", 0, "Validation batches (0 = the whole split).")
  flags.DEFINE_integer("batch_size", 0, "Evaluation batch size (0 = config.eval.batch_size).")
  flags.DEFINE_integer("repeats", 1, "Monte-Carlo passes over the split (diffusion ELBO).")
  flags.DEFINE_integer("num_samples", 0, "Also generate and print this many samples.")
  flags.DEFINE_integer("seed", 0, "Seed for the noise levels and samples.")


def likelihood(workdir: str, *, num_batches: int = 0, batch_size: int = 0, repeats: int = 1, seed: int = 0,
               num_samples: int = 0) -> dict:
  import numpy as np

  from hackable_diffusion import experiment as exp_lib

  exp = exp_lib.from_workdir(workdir)
  params, step = exp_lib.load_params(exp, workdir)
  start = time.perf_counter()
  runs = [exp_lib.evaluate_likelihood(exp, params, num_batches=num_batches or None, seed=seed + r,
                                      batch_size=batch_size or None) for r in range(max(repeats, 1))]
  out = {"task": "likelihood", "workdir": workdir, "checkpoint_step": step,
         "model": "autoregressive" if exp.is_autoregressive else f"diffusion/{exp.config.diffusion.process}",
         "bound": "exact NLL" if exp.is_autoregressive else "ELBO (upper bound on NLL)"}
  for key in runs[0]:
    values = np.asarray([r[key] for r in runs], dtype=float)
    out[key] = float(values.mean())
  if len(runs) > 1:
    per_token = np.asarray([r["bits_per_token"] for r in runs])
    out["bits_per_token_se"] = float(per_token.std(ddof=1) / np.sqrt(len(runs)))
  out["bits_per_token_se_relative"] = out["bits_per_token_se"] / out["bits_per_token"]
  out["eval_seconds"] = time.perf_counter() - start
  if num_samples:
    prompts = [exp.config.sampler.prompt] * num_samples
    texts, result = exp_lib.sample_texts(exp, params, prompts, seed=seed)
    out["samples"] = [p + t for p, t in zip(prompts, texts)]
    out["sample_forward_passes"] = result.forward_passes
  return out


def main(argv):
  del argv
  if FLAGS.workdir is None:
    raise app.UsageError("--workdir is required.")
  cli.quiet_library_logs()
  result = likelihood(FLAGS.workdir, num_batches=FLAGS.num_batches, batch_size=FLAGS.batch_size,
                      repeats=FLAGS.repeats, seed=FLAGS.seed, num_samples=FLAGS.num_samples)
  print(json.dumps(result))


if __name__ == "__main__":
  define_flags()
  app.run(main)
