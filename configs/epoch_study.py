"""The data-constrained epoch study (Prabhudesai et al. 2025, "Diffusion beats autoregressive in data-constrained
settings"): one small model trained for many epochs over tiny Shakespeare as AR, as block masking from scratch, and
as block masking adapted from the AR run, to see whether and when diffusion overtakes AR as the data repeats.

  python experiments/epoch_study.py --root runs/epoch_study --epochs 1,2,4,8,16,32,64

The argument picks the run: "ar", "masking" or "adapted" (masking with the token shift, started from the AR run's
weights, `--config.init.checkpoint` = the AR workdir; the study script sets it). The quickstart's backbone and batch
(the 1.37M-parameter MoE, 16 x 128 characters, canvases of 32), a constant learning rate after a short warm-up so that
a run extended from one epoch count to the next trains exactly as one long run would, no weight decay, no EMA. The
study script raises `train.num_steps` stage by stage and evaluates after each.
"""

from hackable_diffusion import recipes

KINDS = ("ar", "masking", "adapted")


def get_config(kind: str = "ar"):
    if kind not in KINDS:
        raise ValueError(f"configs/epoch_study.py takes one of {KINDS}, got {kind!r}.")
    c = recipes.quickstart_config("none" if kind == "ar" else "masking")
    c = recipes.constant_lr_schedule(c, 2e-3, 490, warmup=30, log_every=50, eval_every=0, checkpoint_every=490)
    if kind == "adapted":
        c.init = recipes.init_section("toolbox", "runs/epoch_study/ar")
        c.diffusion.token_shift = True
    return c
