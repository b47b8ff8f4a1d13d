"""Few-step distillation of the looped Sudoku model (configs/sudoku_hard.py): a 3-pass student from the 12-pass
one-attempt sampler (top-probability margin, the rules as a logit constraint).

  python -m hackable_diffusion.train --config configs/sudoku_hard.py --workdir runs/sudoku_hard
  python -m hackable_diffusion.distill --config configs/distill_sudoku.py --workdir runs/distill_sudoku
  python -m hackable_diffusion.evaluate --workdir runs/distill_sudoku --givens=22,28 --num_puzzles=500 \
      --puzzle_seed=22 --solver_class=search

Teacher prompts are the teacher run's own training puzzles (its data section, seed 0); the held-out sets use other
generator seeds; only the trajectories that end on the puzzle's solution are kept (`distill.keep="correct"`).
`:consistency` distils the near-greedy trajectories instead (every state maps to the end grid).
"""

from hackable_diffusion import recipes
from hackable_diffusion.tasks.sudoku import recipes as sudoku_recipes


def get_config(method: str = "trajectory"):
    c = sudoku_recipes.sudoku_in_place_config(steps=1600, depth_loops=2)
    c.solver.rules = True
    c = recipes.distill_sections(
        c, checkpoint="runs/sudoku_hard", method=method or "trajectory", teacher_steps=12, student_steps=3,
        steps=300, batch_size=32, pool_size=4096, peak_lr=5e-5,
    )  # fmt: skip
    c.distill.keep = "correct"  # learn the teacher's solved grids only (its wrong ones carry no signal worth copying)
    return c
