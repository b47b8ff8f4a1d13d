"""Countdown left to right: the backbone of configs/countdown.py made causal over [prompt; completion].

  python -m hackable_diffusion.train --config configs/countdown_ar.py --workdir runs/countdown_ar
  python -m hackable_diffusion.evaluate --workdir runs/countdown_ar --num_problems=1000 --problem_seed=7

Next-token CE on the answer's tokens and its EOS; answers are decoded greedily with the KV cache after the prompt.
The same problems, batch, learning rate, EMA and steps as the in-place recipe (not measured here).
"""

from hackable_diffusion.tasks.countdown import recipes


def get_config():
    return recipes.countdown_config(layout="ar", steps=3000, batch_size=64)
