"""The Countdown task: reach a target with arithmetic over a few given numbers (d1, Zhao et al. 2025; TinyZero).

| module | what it holds |
|---|---|
| `task` | the `Task` the experiment asks for data, evaluation and reports, and the hooks of reinforcement learning |
| `recipes` | the config builders of the Countdown runs |
| `vocab`, `layouts`, `data` | the character vocabulary, the two row layouts and their objectives, the cached rows |
| `problems`, `exact_solver`, `expressions` | seeded solvable problems, the exhaustive solver, the exact verifier |
| `inference`, `rewards`, `held_out`, `evaluation` | answers from a model, rewards and exact-answer rates, a run's held-out scores, the evaluate command |
"""
