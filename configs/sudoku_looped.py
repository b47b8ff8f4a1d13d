"""Sudoku in place with looped depth: configs/sudoku.py's recipe, its 6 layers applied twice per pass with the same
weights (`model.depth_loops=2`; universal-transformer depth, Dehghani et al. 2019), trained for 2,300 steps.

  python -m hackable_diffusion.train --config configs/sudoku_looped.py --workdir runs/sudoku_loop2
  python -m hackable_diffusion.evaluate --task sudoku --workdir runs/sudoku_loop2 --data generated:24-29:1000:8 \
      --sampler=num_steps=12 '--sampler=selection_kwargs={"also_above": 0.99}' --sampler=constraint=sudoku

Why: of the single-loop model's failures, most sat in puzzles the exact solver finishes with singles (the model
committed to a wrong digit it was sure of) or that need a guess, i.e. constraint propagation deeper than 6 layers
carry in one pass. Looping doubles the compute per pass for the same 4.54M parameters, so the hour holds half the
steps: 2,300 x 32 puzzles (73.6k) at 0.6-0.75 steps/s on both cores, 58.8 min with the evaluations every 500 steps
(session 19), against configs/sudoku.py's 4,800 steps (153.6k puzzles, 53 min, session 7). Held-out ELBO 0.048
bits per blank at the end (configs/sudoku.py: 0.073-0.075). On the issue's sets (session 19, EMA, <= 12 passes):
margin 12 on generated:30-36:1000:7 94.7% (configs/sudoku.py: 93.3%); margin + rules + sure cells >= 0.99 on
generated:24-29:1000:8 63.8% (59.9%), on the 1,000-puzzle Kaggle subset 30.6% (26.9%). README "Session 19".
The forward passes per puzzle are the same; each costs twice the FLOPs, so puzzles/s is about half.
Session 20 (a retrained checkpoint): with `--sampler=parallel_attempts=8` on top of rules + sure cells, 99.7% of
generated:30-36:1000:7 at <= 12 passes (38 network evaluations per puzzle; 93.7% with one attempt). README "Session 20".
"""

from hackable_diffusion import recipes


def get_config():
    return recipes.sudoku_in_place_config(steps=2300, depth_loops=2)
