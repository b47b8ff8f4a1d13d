"""The exact DiffusionGemma / Gemma-4 26B-A4B shape (docs/reference.md §1)."""

import ml_collections

from hackable_diffusion.models import presets


def get_config():
    return ml_collections.ConfigDict(presets.diffusiongemma_26b_a4b())
