"""Prints one JSON line with the total and active parameter counts of a model config (no allocation).

python experiments/speed/param_count.py --config configs/models/diffusiongemma_26b_a4b.py
"""

import json

from absl import app
from ml_collections import config_flags

from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.param_count import count_params

_CONFIG = config_flags.DEFINE_config_file("config", None, "A model config file (configs/models/*.py).")


def main(argv):
    del argv
    cfg = _CONFIG.value
    model_cfg = TransformerConfig.from_dict(cfg.to_dict().get("model", cfg.to_dict()))
    counts = count_params(model_cfg)
    counts["total_params_billions"] = round(counts["total_params"] / 1e9, 4)
    counts["active_params_billions"] = round(counts["active_params_per_token"] / 1e9, 4)
    print(json.dumps(counts))


if __name__ == "__main__":
    app.run(main)
