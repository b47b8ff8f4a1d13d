"""Sudoku left to right: the backbone of configs/sudoku.py made causal, over [puzzle; solution].

  python -m hackable_diffusion.train --config configs/sudoku_ar.py --workdir runs/sudoku_ar
  python -m hackable_diffusion.evaluate --task sudoku --workdir runs/sudoku_ar --data generated:30-36:1000:7

Same data (generated unique puzzles, 24-50 givens) and the same 4.5M-parameter shape with row/column/box embeddings.
The loss is the next-token cross-entropy on the 81 solution cells (the prompt's cells are context only); solving
prefills the puzzle and decodes 81 cells greedily with the KV cache (Ye et al. 2024's AR baseline, without a
solver-chosen cell order). Budget: equal wall time with configs/sudoku.py, not equal examples: a row here is 162
tokens, causal, so 1300 steps of 32 (41.6k puzzles) take about as long as the in-place model's 3000 steps of 32.
The shared backbone gained the row/column/box attention bias in session 7 (`model.grid_attention_bias=4`, causal
here too); the stored AR run (session 3) predates it: `--config.model.grid_attention_bias=0` reproduces it.
"""

from hackable_diffusion import recipes


def get_config():
    c = recipes.sudoku_config(steps=1300, batch_size=32, layout="ar")
    c.optimizer.peak_lr = 2e-3
    c.optimizer.end_lr = 1e-4
    c.optimizer.warmup_steps = 100
    c.train.log_every = 50
    c.train.eval_every = 500
    c.train.checkpoint_every = 500
    return c
