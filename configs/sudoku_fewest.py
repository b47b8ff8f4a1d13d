"""Sudoku hard on the fewest-candidates rule: a curriculum over its guess bands, one fine-tuning stage per band.

  python -m hackable_diffusion.train --config configs/sudoku_fewest.py:1 --workdir runs/sudoku_fewest_1
  python -m hackable_diffusion.train --config configs/sudoku_fewest.py:2 --workdir runs/sudoku_fewest_2
  python -m hackable_diffusion.train --config configs/sudoku_fewest.py:3 --workdir runs/sudoku_fewest_3
  python experiments/sudoku/sudoku_budget_curve.py --workdir runs/sudoku_fewest_3 \
      --data runs/sudoku_hard_fewest30/heldout.csv --pass_budget 1024 --label fewest_3

A puzzle's guess count under the plain rule (first blank, naked singles) follows the cell order; under the fewest
rule (Norvig's: naked and hidden singles, branch on the cell with the fewest candidates) it is what the published
hardest puzzles are hard for (top95's 17-23-givens part: a median of 47.5 guesses, against 1 for the plain-rule
">= 100" set). Stage k starts from stage k-1's run (stage 1 from `runs/sudoku_extreme_ft`, the recipe
configs/sudoku_hard.py then configs/sudoku_extreme.py:finetune; `init.checkpoint` moves it) and trains
600 steps at a peak learning rate of 5e-4 on configs/sudoku_hard.py's 20,000 puzzles (22-40 givens, every row under
a random symmetry) plus generated puzzles of one band of fewest-rule guesses (`hard_puzzles.generate_hard_dataset`,
cached; `data.hard_climb` hill-climb moves per grid reach the bands random removal rarely does):

  stage 1: 1-9 guesses, 17-26 givens        stage 2: 10-29 guesses, 17-23 givens
  stage 3: >= 30 guesses, 17-23 givens (the held-out set's band)

Each band has its own generator seed (10 + stage), none the held-out set's (1): the held-out puzzles are other
puzzles, and `evaluate` / `sudoku_budget_curve.py` drop any held-out puzzle the training set holds (reported as
`dropped_as_in_training`). The model and optimiser are configs/sudoku_hard.py's (looped 4.54M parameters).
"""

from hackable_diffusion.tasks.sudoku import recipes

STAGES = {  # stage: (minimum fewest-rule guesses, maximum (0: none), givens range, climb moves, puzzles generated)
    1: (1, 9, (17, 26), 100, 5000),
    2: (10, 29, (17, 23), 300, 5000),
    3: (30, 0, (17, 23), 300, 5000),
}


def get_config(stage: str = "1"):
    if stage not in {str(k) for k in STAGES}:
        raise ValueError(
            f"configs/sudoku_fewest.py takes a stage {sorted(STAGES)}, got {stage!r}: e.g. --config "
            "configs/sudoku_fewest.py:1"
        )
    k = int(stage)
    min_guesses, max_guesses, givens, climb, count = STAGES[k]
    c = recipes.sudoku_in_place_config(steps=600, depth_loops=2)
    c.data.num_train = 20_000
    c.data.givens_min, c.data.givens_max = 22, 40
    c.data.augment_symmetry = True
    c.data.hard_count = count
    c.data.hard_rule = "fewest"
    c.data.hard_givens_min, c.data.hard_givens_max = givens
    c.data.hard_min_guesses, c.data.hard_max_guesses = min_guesses, max_guesses
    c.data.hard_climb = climb
    c.data.hard_seed = 10 + k
    c.init.kind = "toolbox"
    c.init.checkpoint = "runs/sudoku_extreme_ft" if k == 1 else f"runs/sudoku_fewest_{k - 1}"
    c.optimizer.peak_lr, c.optimizer.warmup_steps = 5e-4, 50
    return c
