"""ptb / uniform adapted from the autoregressive run: configs/ptb_uniform.py's model and recipe, started
from the weights of runs/ptb_ar (configs/ptb_ar.py) and trained for 25% of the AR run's training FLOPs
(67 steps of 3 passes each, against 800 AR steps: AR + adaptation cost 1.25 AR runs) with the adaptation schedules on
(hackable_diffusion/recipes.py: from_ar_run): attention annealed from causal to the diffusion mask (DiffuLLaMA), LLaDA
2.0's warm-up / stable / decay of the canvas size (4 -> 16 -> the whole sequence -> 64) and a decaying encoder AR loss.
First the AR run, then the adaptation:

  python -m hackable_diffusion.train --config configs/ptb_ar.py --workdir runs/ptb_ar
  python -m hackable_diffusion.train --config configs/ptb_uniform_from_ar.py \\
      --workdir runs/ptb_uniform_from_ar

(`--init_from toolbox:runs/ptb_ar` on the second command sets the same source.) docs/training.md "Adapting an AR
model" describes the schedules and their keys (`config.adaptation`).
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.adaptation_experiment("ptb", "uniform")
