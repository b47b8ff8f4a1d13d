"""Sudoku left to right: the backbone of configs/sudoku.py made causal, over [puzzle; solution].

  python -m hackable_diffusion.train --config configs/sudoku_ar.py --workdir runs/sudoku_ar
  python -m hackable_diffusion.evaluate --task sudoku --workdir runs/sudoku_ar --data generated:30-36:1000:7

Same data (generated unique puzzles, 24-50 givens) and the same 4.5M-parameter shape with row/column/box embeddings.
The loss is the next-token cross-entropy on the 81 solution cells (the prompt's cells are context only); solving
prefills the puzzle and decodes 81 cells greedily with the KV cache (Ye et al. 2024's AR baseline, without a
solver-chosen cell order).
"""

from hackable_diffusion import recipes


def get_config():
    c = recipes.sudoku_config(steps=200, batch_size=64, layout="ar")
    c.optimizer.peak_lr = 1e-3
    c.optimizer.end_lr = 1e-4
    c.optimizer.warmup_steps = 20
    c.train.log_every = 25
    c.train.eval_every = 100
    c.train.checkpoint_every = 100
    return c
