"""About 20M parameters: the CPU-trainable shape (dense; `small_moe.py` has equal active parameters)."""

import ml_collections

from hackable_diffusion.models import presets


def get_config():
    return ml_collections.ConfigDict(presets.small())
