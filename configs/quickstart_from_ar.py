"""The quickstart's masking model adapted from its AR twin: the adaptation ablation at the quickstart's size.

  python -m hackable_diffusion.train --config configs/quickstart_ar.py --workdir runs/quickstart_ar
  python -m hackable_diffusion.train --config configs/quickstart_from_ar.py --workdir runs/quickstart_from_ar
  python -m hackable_diffusion.train --config configs/quickstart_from_ar.py:token_shift --workdir runs/qs_from_ar_shift

configs/quickstart.py's model, data and canvases of 32, started from runs/quickstart_ar's weights and trained for a
quarter of that run's training FLOPs (38 steps of block masking, 2 passes each, against 300 AR steps), with
`recipes.from_ar_run`'s schedules (canvas curriculum, attention annealing, a decaying AR loss). The argument picks the
variant: "" (schedules), "token_shift" (schedules + the token shift), "plain" (neither: the plain objective from the AR
weights), "plain_token_shift" (the token shift alone).
"""

from hackable_diffusion import recipes

VARIANTS = {
    "": dict(schedules=True, token_shift=False),
    "token_shift": dict(schedules=True, token_shift=True),
    "plain": dict(schedules=False, token_shift=False),
    "plain_token_shift": dict(schedules=False, token_shift=True),
}


def get_config(variant: str = ""):
    if variant not in VARIANTS:
        raise ValueError(f"configs/quickstart_from_ar.py takes one of {sorted(VARIANTS)}, got {variant!r}.")
    c = recipes.quickstart_config("masking")
    ar_steps = int(c.train.num_steps)
    c = recipes.from_ar_run(c, "runs/quickstart_ar", ar_steps, **VARIANTS[variant])
    c.train.log_every = 5
    return c
