"""The MoE twin of `small.py`: 8 experts top-2 beside a halved dense FFN, equal active parameters."""

import ml_collections

from hackable_diffusion.models import presets


def get_config():
    return ml_collections.ConfigDict(presets.small(moe=True))
