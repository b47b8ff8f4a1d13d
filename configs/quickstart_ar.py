"""The autoregressive run of the quickstart's size: the scorer of the quickstart's samples (generative perplexity,
e.g. in experiments/distill/steps_frontier.py) and its AR baseline.

  python -m hackable_diffusion.train --config configs/quickstart_ar.py --workdir runs/quickstart_ar

The same backbone, data, sequence length, batch and steps as configs/quickstart.py; next-token cross-entropy.
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.quickstart_config("none")
