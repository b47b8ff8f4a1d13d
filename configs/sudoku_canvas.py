"""Sudoku as DiffusionGemma lays it out: the puzzle is a causal prompt, the solution one 81-cell canvas.

  python -m hackable_diffusion.train --config configs/sudoku_canvas.py --workdir runs/sudoku_canvas
  python -m hackable_diffusion.evaluate --workdir runs/sudoku_canvas --givens=30,36 --num_puzzles=1000 --puzzle_seed=7

The backbone of configs/sudoku.py; the encoder pass over [puzzle; solution] fills the KV cache and the decoder
denoises the solution canvas against it; masking noise with the masked CE (uniform noise with DiffusionGemma's canvas
CE: --config.diffusion.process=uniform --config.diffusion.loss=canvas_ce). In an hour on one core, masking solved
23.3% and uniform 0.9% of the 1,000 30-36-givens puzzles (results/sudoku/README.md); no EMA (680 steps are too few).
"""

from hackable_diffusion.tasks.sudoku import recipes


def get_config():
    # On one core of a 2-core CPU this layout runs at 0.21-0.22 steps/s, so 680 steps of 32 fit an hour.
    c = recipes.sudoku_config(steps=680, batch_size=32, layout="canvas", process="masking")
    c.diffusion.loss = "masked_ce"  # as configs/sudoku.py; the uniform override switches to canvas_ce
    c.optimizer.peak_lr = 2e-3
    c.optimizer.end_lr = 1e-4
    c.optimizer.warmup_steps = 50
    # No EMA: after 680 steps a 0.999 average would still hold half of the initial weights (0.999**680 = 0.51).
    c.train.ema_decay = 0.0
    c.train.log_every = 20
    c.train.eval_every = 340
    c.train.checkpoint_every = 100
    return c
