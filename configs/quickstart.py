"""Quickstart: DiffusionGemma's recipe on tiny Shakespeare, small enough to train and sample in minutes on a CPU.

  python -m hackable_diffusion.train --config configs/quickstart.py --workdir runs/quickstart

Uniform ("multinomial") noise, block canvases of 32 characters read through the causal encoder's KV cache,
canvas cross-entropy + encoder AR loss, self-conditioning; sampled with the entropy-bound sampler.
"""

from hackable_diffusion import recipes
from hackable_diffusion.models import presets


def get_config():
  c = recipes.text_config("shakespeare", "uniform", model=presets.quickstart(), steps=300, seq_len=128,
                          batch_size=16, canvas_len=32)
  c.optimizer.peak_lr = 3e-3
  c.optimizer.warmup_steps = 30
  c.train.log_every = 25
  c.train.eval_every = 150
  c.train.checkpoint_every = 100
  c.eval.num_batches = 4
  c.sampler.num_steps = 32
  c.sampler.max_new_tokens = 128
  return c
