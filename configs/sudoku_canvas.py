"""Sudoku as DiffusionGemma does it: the puzzle is a causal prompt, the solution one 81-cell canvas.

  python -m hackable_diffusion.train --config configs/sudoku_canvas.py --workdir runs/sudoku_canvas
  python -m hackable_diffusion.train --config configs/sudoku_canvas.py --workdir runs/sudoku_canvas_uniform \
      --config.diffusion.process=uniform --config.diffusion.loss=canvas_ce \
      --config.diffusion.excluded_ids='(0,1,2,3)' --config.sampler.selection=entropy_bound
  python -m hackable_diffusion.evaluate --task sudoku --workdir runs/sudoku_canvas --data generated:30-36:1000:7

The backbone of configs/sudoku.py (with the same row/column/box embeddings; cell = position mod 81, so prompt cell i
and canvas cell i share them). Training: `CanvasSFTObjective` through `experiment.SudokuCanvasObjective`, the encoder
pass over [puzzle; solution] writes the KV cache and the decoder denoises the solution canvas against the puzzle's
slots. Unlike DiffusionGemma there is no encoder AR loss (it would mostly teach the model to predict the puzzle's
random givens) and no self-conditioning. At solving time the givens are also held in the canvas (infilling,
`--sampler=fix_givens=False` to let the model copy them). Default process: masking (see README for uniform vs masking).
"""

from hackable_diffusion import recipes


def get_config():
    c = recipes.sudoku_config(steps=60, batch_size=64, layout="canvas", process="masking")
    c.optimizer.peak_lr = 1e-3
    c.optimizer.end_lr = 1e-4
    c.optimizer.warmup_steps = 10
    c.train.log_every = 25
    c.train.eval_every = 30
    c.train.checkpoint_every = 30
    return c
