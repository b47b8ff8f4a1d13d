"""shakespeare / masking: MD4/MDLM continuous-time ELBO with masking noise over block canvases of 64 (BD3-LM structure); tiny Shakespeare, character level; the ~5.9M-parameter dense `presets.mini` backbone (FFN hidden 1024).

  python -m hackable_diffusion.train --config configs/shakespeare_masking.py --workdir runs/shakespeare_masking

The three shakespeare configs share the backbone shape, sequence length (256), batch (8) and number of steps (800: 1.64M tokens), so they
see the same tokens; only the process and objective differ (hackable_diffusion/recipes.py: text_experiment).
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.text_experiment("shakespeare", "masking", moe=False)
