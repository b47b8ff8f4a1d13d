"""The data-constrained epoch study (Prabhudesai et al. 2025, "Diffusion beats autoregressive in data-constrained
settings"): one small model trained for many epochs over tiny Shakespeare as AR, as block masking from scratch, and
as block masking adapted from the AR run, to see whether and when diffusion overtakes AR as the data repeats.

  python experiments/likelihood/epoch_study.py --root runs/epoch_study --epochs 1,2,4,8,16,32,64

The argument picks the run, "ar", "masking" or "adapted" (masking with the token shift, started from the AR run's
weights, `--config.init.checkpoint` = the AR workdir; the study script sets it), and optionally the size after a comma
(`ar,mini`). "quickstart" (the default): the quickstart's backbone and batch (the 1.37M-parameter MoE, 16 x 128
characters, canvases of 32). "mini": the text comparison's dense `presets.mini` backbone (~5M parameters) and batch
(8 x 256 characters, canvases of 64), large enough for tiny Shakespeare to overfit within hours on a CPU. Both: a
constant learning rate after a short warm-up so that a run extended from one epoch count to the next trains exactly
as one long run would, no weight decay, no EMA. The study script raises `train.num_steps` stage by stage and
evaluates after each. `--config.data.train_fraction=0.1` trains on the first 10% of the training split (the same
vocabulary and validation split): fewer unique tokens, so the runs reach their validation minimum in fewer steps.
"""

from hackable_diffusion import recipes
from hackable_diffusion.models import presets

KINDS = ("ar", "masking", "adapted")
SIZES = ("quickstart", "mini")


def get_config(arg: str = "ar"):
    kind, _, size = arg.partition(",")
    size = size or "quickstart"
    if kind not in KINDS or size not in SIZES:
        raise ValueError(f"configs/epoch_study.py takes KIND[,SIZE], KIND in {KINDS}, SIZE in {SIZES}; got {arg!r}.")
    process = "none" if kind == "ar" else "masking"
    if size == "mini":
        c = recipes.text_config(
            "shakespeare", process, model=presets.mini(), steps=490, seq_len=256, batch_size=8, canvas_len=64
        )
    else:
        c = recipes.quickstart_config(process)
    c = recipes.constant_lr_schedule(c, 2e-3, 490, warmup=30, log_every=50, eval_every=0, checkpoint_every=490)
    if kind == "adapted":
        c.init = recipes.init_section("toolbox", "runs/epoch_study/ar")
        c.diffusion.token_shift = True
    return c
