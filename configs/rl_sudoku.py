"""RL from verifiable rewards on Sudoku, from the configs/sudoku_hard.py run (docs/rl.md, results/rl/README.md).

  python -m hackable_diffusion.train --config configs/sudoku_hard.py --workdir runs/sudoku_hard
  python -m hackable_diffusion.rl --config configs/rl_sudoku.py --workdir runs/rl_sudoku
  python -m hackable_diffusion.evaluate --workdir runs/rl_sudoku --givens=17,25 --num_puzzles=600 --puzzle_seed=17 \
      --solver_class=search --config.solver.rules=True --config.sampler.selection.also_above=0.99

Rollouts are the one-attempt 12-pass sampler the evaluation uses (top-probability margin, the rules as a logit
constraint, every cell at margin >= 0.99 decided at once), tokens drawn at temperature 0.7 so the G = 8 completions
of a puzzle differ (at temperature 1 the step-500 checkpoint solved none of 64 rollouts: no group had a signal); the
reward is the exact checker (1 for the solution, else 0). The shaped partial credit (`--config.rl.shaped_reward=True`)
is off: under the rules constraint nearly every wrong grid earns about the same credit, and dividing by the group's
std (`--config.rl.advantage_scale=std`, the default when that was measured; r - mean, d1's, is the default now)
turned that noise into unit-size advantages (results/rl/README.md). Prompts: 2,000 generated unique puzzles
with 22-28 givens (generator seed 3: neither the starting run's training seed 0 nor the held-out sets' 7, 8, 17, 22).
`--config.rl.objective=wd1|elbo` swaps the objective; `--config.lora.rank=8` trains adapters only;
`--config.rl.scorer=trajectory` scores each cell at the pass that wrote it (TraceRL; docs/rl.md).

`configs/rl_sudoku.py:expert_iteration`: expert iteration (docs/rl.md): rollouts from the recipe's paced search on 4
symmetric copies (one completion per puzzle: the search draws no tokens), the policy trained with the starting run's
loss (unweighted masked CE) on the grids the checker accepts, each rollout of 64 puzzles reused for 4 steps with fresh
noise, at the starting run's final learning rate (1e-4). The run's held-out evaluation is off (it would run the
search); evaluate the one-attempt sampler with `--config.solver.search=False --config.solver.parallel_attempts=1
--config.solver.search_paced=False`.
"""

from hackable_diffusion import recipes
from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.tasks.sudoku import recipes as sudoku_recipes


def get_config(objective: str = "diffu_grpo"):
    c = sudoku_recipes.sudoku_in_place_config(steps=1600, depth_loops=2)
    c.data.num_train = 2_000
    c.data.givens_min, c.data.givens_max = 22, 28
    c.data.generator_seed = 3
    c.sampler.selection.also_above = 0.99  # sure cells
    c.solver.rules = True
    c.eval.num_puzzles = 128
    c.eval.batch_size = 128
    c = rl_settings.rl_sections(c, checkpoint="runs/sudoku_hard", objective=objective, steps=100, peak_lr=5e-5)
    c.rl.temperature = 0.7
    if objective == "expert_iteration":
        c.solver.search, c.solver.search_paced = True, True
        c.solver.pass_budget, c.solver.parallel_attempts = 12, 4
        c.rl.prompts_per_rollout, c.rl.group_size, c.rl.inner_updates = 64, 1, 4
        c.rl.prompt_mask_prob, c.rl.expert_iteration.draws = 0.0, 1
        c.optimizer.peak_lr = c.optimizer.end_lr = 1e-4
        c.train.num_steps = 200
        c.train.eval_every = 0
    return c
