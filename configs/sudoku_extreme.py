"""Sudoku up the difficulty axis: configs/sudoku_hard.py plus generated puzzles that need 10-99 exact-solver guesses.

  python -m hackable_diffusion.train --config configs/sudoku_extreme.py --workdir runs/sudoku_extreme
  python -m hackable_diffusion.evaluate --workdir runs/sudoku_extreme --data runs/sudoku_hard_sets/heldout.csv \
      --solver_class=search --config.solver.rules=True --config.solver.search=True --config.solver.pass_budget=64 \
      --config.solver.parallel_attempts=4

The training set is configs/sudoku_hard.py's (20,000 puzzles with 22-40 givens, every row under a random Sudoku
symmetry) plus the cached hard set of `experiments/sudoku/sudoku_hard_sets.py` (20,000 puzzles with 22-36 givens and at
least 10 guesses of the plain depth-first rule), of which only those with at most 99 guesses are kept: the model
trains on the bands 0-99 and is tested on the held-out set's >= 100 (results/sudoku, "Difficulty and hard puzzles").
The same looped 4.54M-parameter model and optimiser, 1,600 steps.

`configs/sudoku_extreme.py:finetune` starts instead from the configs/sudoku_hard.py run (`init.checkpoint`, default
runs/sudoku_hard; its EMA weights) and trains 600 steps on the same data at a lower peak learning rate (5e-4):

  python -m hackable_diffusion.train --config configs/sudoku_extreme.py:finetune --workdir runs/sudoku_extreme_ft
"""

from hackable_diffusion.tasks.sudoku import recipes


def get_config(variant: str = ""):
    if variant not in ("", "finetune"):
        raise ValueError(f"configs/sudoku_extreme.py takes no argument or 'finetune', got {variant!r}.")
    c = recipes.sudoku_in_place_config(steps=1600, depth_loops=2)
    c.data.num_train = 20_000
    c.data.givens_min, c.data.givens_max = 22, 40
    c.data.augment_symmetry = True
    c.data.hard_count = 20_000
    c.data.hard_givens_min, c.data.hard_givens_max = 22, 36
    c.data.hard_min_guesses, c.data.hard_max_guesses = 10, 99
    if variant == "finetune":
        c.init.kind, c.init.checkpoint = "toolbox", "runs/sudoku_hard"
        c.train.num_steps = 600
        c.optimizer.peak_lr, c.optimizer.warmup_steps = 5e-4, 50
    return c
