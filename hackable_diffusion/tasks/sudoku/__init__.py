"""The Sudoku task: DiffusionGemma's puzzle benchmark as a task of the toolbox.

| module | what it holds |
|---|---|
| `task` | the `Task` the experiment asks for data, evaluation and reports, and its capabilities (`tasks/capabilities.py`) |
| `recipes` | the config builders of the Sudoku runs and their `config.solver` section |
| `vocab`, `layouts`, `csv_io`, `data` | tokens, sequence layouts, puzzle files, the cached training data |
| `generator`, `exact_solver` | seeded unique-solution puzzles and the exact (rules + depth-first) solver |
| `difficulty`, `hard_puzzles` | guess counts as difficulty (bands, accuracy per band) and seeded hard puzzle sets |
| `grids`, `rules`, `symmetry` | grid helpers, the rules as a logit constraint, the symmetry views |
| `inference`, `search` | the model's solver loop (sampler, repairs, restarts) and the model-steered backtracking search |
| `metrics`, `held_out`, `evaluation` | DiffusionGemma's Sudoku metrics; a run's scores on held-out puzzles; the evaluate command |
| `lm_eval_requests` | lm-eval's puzzle requests (`hd_sudoku_solve`) answered by the run's solver |
| `structure` | the grid as the backbone's structure prior (`model.structure="grid:9"`), registered on import |
"""

from hackable_diffusion.tasks.sudoku import structure as _structure  # noqa: F401  (registers "grid")
