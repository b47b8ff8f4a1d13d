"""Sudoku as DiffusionGemma does it: the puzzle is a causal prompt, the solution one 81-cell canvas.

  python -m hackable_diffusion.train --config configs/sudoku_canvas.py --workdir runs/sudoku_canvas
  python -m hackable_diffusion.train --config configs/sudoku_canvas.py --workdir runs/sudoku_canvas_uniform \
      --config.diffusion.process=uniform --config.diffusion.loss=canvas_ce \
      --config.diffusion.excluded_ids='(0,1,2,3)'
  python -m hackable_diffusion.evaluate --task sudoku --workdir runs/sudoku_canvas --data generated:30-36:1000:7

The backbone of configs/sudoku.py (with the same row/column/box embeddings; cell = position mod 81, so prompt cell i
and canvas cell i share them). Training: `CanvasSFTObjective` through `experiment.SudokuCanvasObjective`, the encoder
pass over [puzzle; solution] writes the KV cache and the decoder denoises the solution canvas against the puzzle's
slots. Unlike DiffusionGemma there is no encoder AR loss (it would mostly teach the model to predict the puzzle's
random givens) and no self-conditioning. At solving time the givens are also held in the canvas (infilling,
`--sampler=fix_givens=False` to let the model copy them). Loss: masking with `masked_ce` as configs/sudoku.py,
uniform with DiffusionGemma's canvas CE; both are solved with top-probability margin in 12 steps (+ 1 prefill pass).

Uniform vs masking (session 6; both trained side by side, one core each, 680 steps x 32 puzzles = 21.8k examples,
54.5 minutes; raw weights — those runs kept a 0.999 EMA, which after 680 steps still holds half the initial weights,
so the recipe now keeps none; `evaluate --weights raw` gives the same weights as this recipe):
  evaluate --task sudoku --weights raw --data generated:30-36:1000:7 (margin, 12 steps):
    masking 23.3% exact grids, 80.8% of blanks; uniform 0.9%, 70.3% (DiffusionGemma's entropy-bound sampler,
    gamma 0.1, temperature 0.8 -> 0.4: 0.0%, 57.6%). Masking is the better process here, by 22 points.
The canvas layout runs at 0.21 steps/s per core, a quarter of the in-place model's rate, so in the same hour it sees a
seventh of the in-place model's 153.6k examples (which reach 87.3% on the same set). Those runs predate the shared
backbone's row/column/box attention bias (session 7, `model.grid_attention_bias=4`; keys in the prompt's cache get it
from their positions): `--config.model.grid_attention_bias=0` reproduces them.
"""

from hackable_diffusion import recipes


def get_config():
    # Both processes side by side, one core each (session 6): 0.21-0.22 steps/s, so 680 steps of 32 fit the hour.
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
