"""Sudoku in place: masking diffusion over the 81 cells, givens fixed (Ye et al. 2024; Kim et al. 2025).

  python -m hackable_diffusion.train --config configs/sudoku.py --workdir runs/sudoku
  python -m hackable_diffusion.evaluate --workdir runs/sudoku --givens=30,36 --num_puzzles=1000 --puzzle_seed=7

A 4.54M-parameter bidirectional transformer (6 global layers, d 256) with learned row/column/box embeddings and a
row/column/box attention bias; unweighted CE over the masked blanks; batch 32, lr 2e-3, EMA 0.999; 4,800 steps take
about 53 min on a 2-core CPU. Solved by top-probability margin in 12 passes: 93.3% exact on 1,000 held-out puzzles
with 30-36 givens. Every ablation behind these choices: results/sudoku/README.md.
"""

from hackable_diffusion.tasks.sudoku import recipes


def get_config():
    # batch 32, masked_ce, lr 2e-3 -> 1e-4 (100 warm-up steps), EMA 0.999, eval and checkpoints every 500 steps
    return recipes.sudoku_in_place_config(steps=4800)
