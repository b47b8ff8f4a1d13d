"""ptb / uniform: DiffusionGemma's recipe: uniform noise, canvas CE + encoder AR loss, self-conditioning, block canvases of 64; Penn Treebank, a 2048-piece sentencepiece BPE vocabulary trained by the toolbox on the training split; the ~5.9M-parameter dense `presets.mini` backbone (FFN hidden 1024).

  python -m hackable_diffusion.train --config configs/ptb_uniform.py --workdir runs/ptb_uniform

The three ptb configs share the backbone shape, sequence length (256), batch (8) and number of steps (800: 1.64M tokens), so they
see the same tokens; only the process and objective differ (hackable_diffusion/recipes.py: text_experiment).
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.text_experiment("ptb", "uniform", moe=False)
