"""Prints one JSON line with the total and active parameter counts of a model config (no allocation).

python experiments/speed/param_count.py --config configs/models/diffusiongemma_26b_a4b.py
python experiments/speed/param_count.py --config configs/quickstart.py --config.model.vocab_size=69  # with overrides
"""

import argparse
import json

from hackable_diffusion import cli
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.param_count import count_params


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a model config file (configs/models/*.py) or a run config")
    args, overrides = parser.parse_known_args()
    unknown = [a for a in overrides if not a.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    cfg = cli.parse_config_overrides(cli.load_config_file(args.config), overrides).to_dict()
    counts = count_params(TransformerConfig.from_dict(cfg.get("model", cfg)))
    counts["total_params_billions"] = round(counts["total_params"] / 1e9, 4)
    counts["active_params_billions"] = round(counts["active_params_per_token"] / 1e9, 4)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
