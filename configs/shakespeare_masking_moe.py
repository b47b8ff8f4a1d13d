"""shakespeare / masking_moe: MD4/MDLM continuous-time ELBO with masking noise over block canvases of 64 (BD3-LM structure); tiny Shakespeare, character level; the `presets.mini` MoE backbone (dense FFN 512 + 8 experts top-2 of hidden 256: the dense model's active parameters).

  python -m hackable_diffusion.train --config configs/shakespeare_masking_moe.py --workdir runs/shakespeare_masking_moe

Capacity: this file keeps the preset's factor 1.25 (validation ELBO 3.422 bits/char, session 15). Trained dropless
(`--config.model.moe.capacity_factor=4.0` = E / k, session 16) it reached 3.357, against the dense twin's 3.310. A batch at one noise
level routes unevenly and overflows (50% of assignments dropped at t = 1), yet the dropless-trained weights lose at most
0.017 nats at any level when run at 1.25: the drops cost in training (README "Session 16: the uniform MoE, and dropless
training"). One run each, so no default change yet.

The three shakespeare configs share the backbone shape, sequence length (256), batch (8) and number of steps (800: 1.64M tokens), so they
see the same tokens; only the process and objective differ (hackable_diffusion/recipes.py: text_experiment).
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.text_experiment("shakespeare", "masking", moe=True)
