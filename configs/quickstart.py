"""Quickstart: block masked diffusion on tiny Shakespeare, small enough to train and sample in minutes on a CPU.

  python -m hackable_diffusion.train --config configs/quickstart.py --workdir runs/quickstart

A 1.37M-parameter Gemma-4-style MoE model; canvases of 32 characters, each denoised bidirectionally against the causal
encoder's KV cache of the clean canvases before it (BD3-LM / DiffusionGemma structure); MD4/MDLM ELBO; sampled with
the entropy-bound rule (EB-Sampler / DiffusionGemma), canvas after canvas.

Masking rather than DiffusionGemma's uniform noise: the uniform sampler re-randomises every position it does not
accept, and a model this small accepts few, so minutes of training leave its samples mostly noise.
"""

from hackable_diffusion import recipes
from hackable_diffusion.models import presets


def get_config():
    c = recipes.text_config(
        "shakespeare", "masking", model=presets.quickstart(), steps=300, seq_len=128, batch_size=16, canvas_len=32
    )
    c.optimizer.peak_lr = 3e-3
    c.optimizer.warmup_steps = 30
    c.train.log_every = 25
    c.train.eval_every = 150
    c.train.checkpoint_every = 100
    c.eval.num_batches = 4
    c.sampler.num_steps = 32
    c.sampler.max_new_tokens = 128
    return c
