"""RL from the exact verifier on Countdown, from a configs/countdown.py run (masking) or a configs/countdown_ar.py run.

  python -m hackable_diffusion.train --config configs/countdown.py --workdir runs/countdown
  python -m hackable_diffusion.rl --config configs/rl_countdown.py --workdir runs/rl_countdown
  python -m hackable_diffusion.rl --config configs/rl_countdown.py:ar --workdir runs/rl_countdown_ar
  python -m hackable_diffusion.evaluate --workdir runs/rl_countdown --num_problems=1000 --problem_seed=7

`:ar` starts from runs/countdown_ar with GRPO on exact causal log-probs (no prompt masking); the default is
diffu-GRPO on the masking run. Rollouts: the run's own sampler at temperature 0.7, K = 8 problems x G = 8 answers,
two updates per rollout; reward 1 for an expression that reaches the target with the given numbers, else 0.
Measured after 100 steps (3,200 completions; results/rl/README.md, "Countdown"), 955 held-out problems: AR 30.2% ->
31.4% with the paper's estimator, below continued SFT's 35.1% at equal training FLOPs (experiments/rl/rl_vs_sft.py);
masking 9.4% -> 9.5% (diffu-GRPO) and 10.3% (`--config.rl.objective=wd1`), neither distinguishable from no change.
"""

from hackable_diffusion import recipes
from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.tasks.countdown import recipes as countdown_recipes


def get_config(layout: str = "in_place"):
    if layout not in ("in_place", "ar"):
        raise ValueError(f"configs/rl_countdown.py:LAYOUT takes in_place or ar, got {layout!r}.")
    c = countdown_recipes.countdown_config(layout=layout, steps=2000, batch_size=64)
    start = "runs/countdown" if layout == "in_place" else "runs/countdown_ar"
    c = rl_settings.rl_sections(
        c, checkpoint=start, objective="diffu_grpo" if layout == "in_place" else "ar_grpo", steps=100, peak_lr=1e-4
    )
    c.rl.temperature = 0.7
    if layout == "ar":
        c.rl.prompt_mask_prob = 0.0
    return c
