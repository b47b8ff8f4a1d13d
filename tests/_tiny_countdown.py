"""A tiny Countdown config shared by the task and RL tests (a few thousand parameters, problems cached in tmp_path)."""

from hackable_diffusion.models import presets
from hackable_diffusion.tasks.countdown.recipes import countdown_config
from hackable_diffusion.tasks.countdown.vocab import VOCAB_SIZE


def tiny_countdown_config(tmp_path, layout="in_place", steps=2):
    c = countdown_config(
        model=presets.tiny(vocab_size=VOCAB_SIZE, moe=False), layout=layout, steps=steps, batch_size=8, num_train=64
    )
    c.data.num_eval = 16
    c.data.cache_dir = str(tmp_path / "cache")
    c.optimizer.warmup_steps = 1
    c.train.log_every = 1
    c.train.eval_every = steps
    c.train.checkpoint_every = steps
    c.train.peak_flops = 1e12
    c.eval.num_batches = 1
    c.eval.batch_size = 8
    c.eval.num_problems = 8
    c.sampler.num_steps = 4
    return c
