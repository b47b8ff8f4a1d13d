"""Countdown left to right: the backbone of configs/countdown.py made causal over [prompt; completion].

  python -m hackable_diffusion.train --config configs/countdown_ar.py --workdir runs/countdown_ar
  python -m hackable_diffusion.evaluate --workdir runs/countdown_ar --num_problems=1000 --problem_seed=7

Next-token CE on the answer's tokens and its EOS; answers are decoded greedily with the KV cache after the prompt.
The same problems, batch, learning rate, EMA and steps as the in-place recipe, so the same training FLOPs. Measured
(results/rl/README.md, "Countdown"): 30.2% of 955 held-out problems exact (52.2% with 3 numbers, 9.0% with 4).
"""

from hackable_diffusion.tasks.countdown import recipes


def get_config():
    return recipes.countdown_config(layout="ar", steps=2000, batch_size=64)
