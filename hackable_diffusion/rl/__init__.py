"""Reinforcement learning from verifiable rewards for diffusion and autoregressive runs.

  python -m hackable_diffusion.rl --config configs/rl_sudoku.py --workdir runs/rl_sudoku

A run starts from weights named by `config.init` (a toolbox run, a params directory, a gemma tree or a Hugging Face
directory), full or LoRA (`config.lora.rank`), and improves them from the task's reward (`Task.reward`): rollouts
from the run's own jitted sampler (`rollouts.RolloutStream`), group-relative advantages (`advantages`), and one of
five policy objectives (`objectives`: d1's diffu-GRPO, wd1, an ELBO policy gradient, GRPO with exact AR log-probs,
expert iteration on a search's verified completions).
The run directory is an ordinary training run's (`training.loop.train`: orbax checkpoints with exact resume, the
rollout state included; SIGINT/SIGTERM safe; a workdir lock; metrics.jsonl and TensorBoard), so `evaluate` and
`sample` read it like any other. See docs/rl.md.
"""
