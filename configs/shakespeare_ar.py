"""shakespeare / ar: the autoregressive baseline: next-token cross-entropy, causal; tiny Shakespeare, character level; the ~19M-active-parameter dense (FFN hidden 1536) backbone.

  python -m hackable_diffusion.train --config configs/shakespeare_ar.py --workdir runs/shakespeare_ar

The three shakespeare configs share the backbone shape, sequence length (256), batch (16) and number of steps, so they
see the same tokens; only the process and objective differ (hackable_diffusion/recipes.py: text_experiment).
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.text_experiment("shakespeare", "none", moe=False)
