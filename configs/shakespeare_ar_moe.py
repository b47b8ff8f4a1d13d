"""shakespeare / ar_moe: the autoregressive baseline: next-token cross-entropy, causal; tiny Shakespeare, character level; the `presets.mini` MoE backbone (dense FFN 512 + 8 experts top-2 of hidden 256: the dense model's active parameters).

  python -m hackable_diffusion.train --config configs/shakespeare_ar_moe.py --workdir runs/shakespeare_ar_moe

The three shakespeare configs share the backbone shape, sequence length (256), batch (8) and number of steps (800: 1.64M tokens), so they
see the same tokens; only the process and objective differ (hackable_diffusion/recipes.py: text_experiment).
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.text_experiment("shakespeare", "none", moe=True)
