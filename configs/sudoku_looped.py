"""Sudoku in place with looped depth: configs/sudoku.py with its 6 layers applied twice per pass, same weights.

  python -m hackable_diffusion.train --config configs/sudoku_looped.py --workdir runs/sudoku_loop2
  python -m hackable_diffusion.evaluate --workdir runs/sudoku_loop2 --givens=30,36 \
      --num_puzzles=1000 --puzzle_seed=7 --config.sampler.num_steps=12 --config.sampler.selection.also_above=0.99 \
      --config.solver.rules=True --config.solver.parallel_attempts=8

Universal-transformer depth (Dehghani et al. 2019): twice the compute per pass for the same 4.54M parameters, so an
hour of a 2-core CPU holds 2,300 steps. The toolbox's best Sudoku recipe: with the rules, sure cells and 8 parallel
attempts it solves 99.7% of 1,000 held-out 30-36-givens puzzles in <= 12 passes (results/sudoku/README.md).
"""

from hackable_diffusion.tasks.sudoku import recipes


def get_config():
    return recipes.sudoku_in_place_config(steps=2300, depth_loops=2)
