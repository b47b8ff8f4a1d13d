"""ptb / uniform: DiffusionGemma's recipe: uniform noise, canvas CE + encoder AR loss, self-conditioning, block canvases of 64; Penn Treebank, a 2048-piece sentencepiece BPE vocabulary trained by the toolbox on the training split; the ~19M-active-parameter dense (FFN hidden 1536) backbone.

  python -m hackable_diffusion.train --config configs/ptb_uniform.py --workdir runs/ptb_uniform

The three ptb configs share the backbone shape, sequence length (256), batch (16) and number of steps, so they
see the same tokens; only the process and objective differ (hackable_diffusion/recipes.py: text_config).
"""

from hackable_diffusion import recipes
from hackable_diffusion.models import presets


def get_config():
    c = recipes.text_config(
        "ptb", "uniform", model=presets.small(moe=False), steps=3000, seq_len=256, batch_size=16, canvas_len=64
    )
    c.optimizer.peak_lr = 1e-3
    c.optimizer.end_lr = 1e-4
    c.optimizer.warmup_steps = 200
    c.train.eval_every = 500
    c.train.checkpoint_every = 500
    c.sampler.canvas_len = 64
    c.sampler.num_steps = 64
    return c
