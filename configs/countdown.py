"""Countdown in place: masking diffusion over [prompt; completion], the prompt fixed (the task of d1, Zhao et al. 2025).

  python -m hackable_diffusion.train --config configs/countdown.py --workdir runs/countdown
  python -m hackable_diffusion.evaluate --workdir runs/countdown --num_problems=1000 --problem_seed=7

The problem "3,7,25,50=75" is a prompt of 20 tokens and the answer "3*25" then EOS a completion of 24; a
4.54M-parameter bidirectional transformer (6 global layers, d 256) learns the completion by unweighted masked CE on
100,000 generated problems (3 or 4 numbers in 1-99, a target in 1-99 reached with all of them; the rows also hold
numbers up to 100 and targets up to 1000: --config.data.target_max=999); answers are decoded by top-probability
margin, one token per pass. Batch 64, lr 2e-3 -> 1e-4 after 100 warm-up steps, EMA 0.999, 2,000 steps.

Measured on a 2-core CPU shared with two to three other jobs (results/rl/README.md, "Countdown"): generating the
100,000 problems takes about 7 min alone (cached in $HACKABLE_DIFFUSION_CACHE/countdown afterwards); the 2,000 steps
ran in 1 h 53 min at 0.3-0.6 steps/s; the EMA weights answer 9.4% of 955 held-out problems exactly (17.8% with 3
numbers, 1.4% with 4), against 30.2% for configs/countdown_ar.py at the same compute. Trained again with this file
(55 min, most of it sharing the CPU), the EMA weights answer 6.2% (10.7% / 1.8%), and 4.3% decoded left to right
(`--config.sampler.selection.rule=left_to_right`).
"""

from hackable_diffusion.tasks.countdown import recipes


def get_config():
    return recipes.countdown_config(layout="in_place", steps=2000, batch_size=64)
