"""A tiny shape for tests and smoke runs (all architectural features on)."""

import ml_collections

from hackable_diffusion.models import presets


def get_config():
    return ml_collections.ConfigDict(presets.tiny())
