"""Tiny text configs shared by the end-to-end tests (a few thousand parameters, a handful of steps)."""

from hackable_diffusion import recipes
from hackable_diffusion.models import presets

TRAIN_OUTPUT = "train_output.txt"  # what training printed, kept beside each shared run (conftest.trained_text_runs)


def tiny_text_config(process="uniform", steps=6, moe=True):
    c = recipes.text_config(
        "shakespeare", process, model=presets.tiny(moe=moe), steps=steps, seq_len=32, batch_size=8, canvas_len=8
    )
    c.optimizer.warmup_steps = 2
    c.train.log_every = 3
    c.train.eval_every = 3
    c.train.checkpoint_every = 3
    c.eval.num_batches = 1
    c.eval.batch_size = 8
    c.sampler.num_steps = 4
    c.sampler.canvas_len = 8
    c.sampler.max_new_tokens = 16
    return c
