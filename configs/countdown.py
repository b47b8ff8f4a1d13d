"""Countdown in place: masking diffusion over [prompt; completion], the prompt fixed (the task of d1, Zhao et al. 2025).

  python -m hackable_diffusion.train --config configs/countdown.py --workdir runs/countdown
  python -m hackable_diffusion.evaluate --workdir runs/countdown --num_problems=1000 --problem_seed=7

The problem "3,7,25,50=75" is a prompt of 20 tokens and the answer "3*25" then EOS a completion of 24; a
4.54M-parameter bidirectional transformer (6 global layers, d 256) learns the completion by unweighted masked CE on
100,000 generated problems (3 or 4 numbers in 1-99, a target in 1-99 reached with all of them; the rows also hold
numbers up to 100 and targets up to 1000: --config.data.target_max=999); answers are decoded by top-probability
margin, one token per pass. Batch 64, lr 2e-3 -> 1e-4 after 100 warm-up steps, EMA 0.999, 3,000 steps.

Measured on a 2-core CPU while another training job shared it: generating the 100,000 problems took 7 min (cached in
$HACKABLE_DIFFUSION_CACHE/countdown afterwards) and training ran at 0.53 steps/s. A 600-step probe (20,000 problems,
EMA 0.995) answered 5 of 256 held-out problems exactly with its EMA weights (2.0%: 3.8% with 3 numbers, 0% with 4);
with targets up to 999 (100,000 problems, EMA 0.999) a 600-step probe's raw weights answered 1 of 63. The full
3,000-step run was not measured.
"""

from hackable_diffusion.tasks.countdown import recipes


def get_config():
    return recipes.countdown_config(layout="in_place", steps=3000, batch_size=64)
