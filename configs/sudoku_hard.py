"""Sudoku for puzzles that need search: configs/sudoku_looped.py trained on harder puzzles under the symmetry group.

  python -m hackable_diffusion.train --config configs/sudoku_hard.py --workdir runs/sudoku_hard
  python -m hackable_diffusion.evaluate --workdir runs/sudoku_hard --givens=17,25 --num_puzzles=600 \
      --puzzle_seed=17 --solver_class=search --config.solver.rules=True --config.solver.search=True \
      --config.solver.pass_budget=12 --config.solver.search_paced=True --config.solver.parallel_attempts=4

The second command is the recipe of results/sudoku/README.md "Best figures on puzzles that need guessing": the
model-steered search at the pace of a 12-pass budget on 4 symmetric copies of each puzzle (69.2% of the 299
search-class puzzles of that set at step 1,600, 10.1 passes and 40.5 network evaluations per puzzle).

The same looped 4.54M-parameter model and optimiser as configs/sudoku_looped.py; two data changes, as
recursive-reasoning models train on hard Sudoku (TRM: 1k puzzles under heavy augmentation):
- 20,000 unique puzzles with 22-40 givens (mean 31.0; 19% need a guess for the exact solver) instead of
  200,000 with 24-50 (mean 37, a tenth need a guess). Generating them took 4.5 min on the 2-core CPU (cached).
- every training row mapped by its own random element of the Sudoku group (band/stack/row/column permutations,
  transposition, digit relabelling; `data.augment_symmetry`), so 1,600 steps x 32 rows are ~51,200 distinct puzzles
  drawn from 20,000 orbits. 1,600 steps: the compute of the step-1,500 checkpoint the search results used.
"""

from hackable_diffusion.tasks.sudoku import recipes


def get_config():
    c = recipes.sudoku_in_place_config(steps=1600, depth_loops=2)
    c.data.num_train = 20_000
    c.data.givens_min, c.data.givens_max = 22, 40
    c.data.augment_symmetry = True
    return c
