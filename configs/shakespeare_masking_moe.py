"""shakespeare / masking_moe: MD4/MDLM continuous-time ELBO with masking noise over block canvases of 64 (BD3-LM
structure); tiny Shakespeare, character level; the `presets.mini` MoE backbone (dense FFN 512 + 8 experts top-2 of
hidden 256: the dense model's active parameters), capacity factor 1.25.

  python -m hackable_diffusion.train --config configs/shakespeare_masking_moe.py --workdir runs/shakespeare_masking_moe

Validation ELBO 3.422 bits/char (dense twin 3.310); trained dropless (--config.model.moe.capacity_factor=4.0) 3.357
(results/text/README.md). The three shakespeare configs see the same 1.64M tokens; only the process and objective
differ (hackable_diffusion/recipes.py: text_experiment).
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.text_experiment("shakespeare", "masking", moe=True)
