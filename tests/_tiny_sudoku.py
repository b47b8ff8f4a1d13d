"""A tiny Sudoku config shared by the task tests (a few thousand parameters, generated puzzles cached in tmp_path)."""

from hackable_diffusion.models import presets
from hackable_diffusion.tasks.sudoku.recipes import sudoku_config
from hackable_diffusion.tasks.sudoku.structure import grid_prior


def tiny_sudoku_config(layout, process="masking", tmp_path=None):
    model = dict(presets.tiny(vocab_size=13, moe=False), **grid_prior(9))
    c = sudoku_config(model=model, steps=4, batch_size=8, num_train=64, layout=layout, process=process)
    c.data.num_eval = 8
    c.data.givens_min, c.data.givens_max = 30, 40
    c.data.cache_dir = str(tmp_path / "cache")
    c.sampler.num_steps = 5
    return c


def train_tiny_sudoku_run(tmp_path, name="run"):
    """(config, run directory) of a tiny in-place Sudoku run trained for 4 steps with one checkpoint (the starting run
    of the RL tests and the workdir the refusal tests keep intact; one config, so the compilation cache is shared)."""
    from hackable_diffusion import train

    config = tiny_sudoku_config("in_place", tmp_path=tmp_path)
    config.optimizer.warmup_steps = 2
    config.train.checkpoint_every, config.train.eval_every = 4, 0
    train.run(config, str(tmp_path / name), sample_at_end=False)
    return config, tmp_path / name
