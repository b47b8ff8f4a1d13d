"""Few-step distillation of the looped Sudoku model (configs/sudoku_hard.py): a 3-pass student from the 12-pass
one-attempt sampler (the teacher run's own: top-probability margin at temperature 0.1; `--config.solver.rules=True`
adds the rules as a logit constraint).

  python -m hackable_diffusion.train --config configs/sudoku_hard.py --workdir runs/sudoku_hard
  python -m hackable_diffusion.distill --config configs/distill_sudoku.py --workdir runs/distill_sudoku
  python -m hackable_diffusion.evaluate --workdir runs/distill_sudoku --givens=22,28 --num_puzzles=500 \
      --puzzle_seed=22 --solver_class=search

The teacher run's data, diffusion, sampler and solver sections replace this file's (command-line `--config.*` values
apply after them). Teacher prompts are the teacher run's own training puzzles (its data section, seed 0); the held-out
sets use other generator seeds; only the trajectories that end on the puzzle's solution are kept
(`distill.keep="correct"`). 200 steps of 8 puzzles (24 student rows each) from 2,048 kept trajectories.
`:consistency` distils the near-greedy trajectories instead (every state maps to the end grid).
"""

from hackable_diffusion import recipes
from hackable_diffusion.distill import settings as distill_settings
from hackable_diffusion.tasks.sudoku import recipes as sudoku_recipes


def get_config(method: str = "trajectory"):
    c = sudoku_recipes.sudoku_in_place_config(steps=1600, depth_loops=2)
    c = distill_settings.distill_sections(
        c, checkpoint="runs/sudoku_hard", method=method or "trajectory", teacher_steps=12, student_steps=3,
        steps=200, batch_size=8, pool_size=2048, peak_lr=5e-5,
    )  # fmt: skip
    c.distill.keep = "correct"  # learn the teacher's solved grids only (its wrong ones carry no signal worth copying)
    return c
