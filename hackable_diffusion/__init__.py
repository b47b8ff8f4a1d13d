"""Hackable Diffusion: a JAX/Flax toolbox for block text-diffusion language models (DiffusionGemma kind).

Sub-packages:
  models/     Gemma-4-style MoE transformer, KV cache, diffusion LM head (self-conditioning).
  diffusion/  schedules, noise processes (masking, uniform), ELBO and training losses, training objectives.
  sampling/   canvas denoising loop, selection rules, logit constraints and views, block and AR generation.
  data/       tokenizers, grain text pipelines, corpora.
  training/   train state and step, optimizers, checkpoints, sharding, metrics, the training loop.
  checkpoints/ every checkpoint format: Hugging Face directories, gemma-library trees, the toolbox's runs, FP8 runs,
              the base weights of fine-tuning.
  tasks/      what a run learns and how it is scored: text (likelihood, samples, SFT data), Sudoku (data, layouts,
              the rules and symmetries, the solver and search, its metrics) and Countdown (generator, verifier,
              layouts).
  rl/         RL from verifiable rewards: rollouts, advantages, objectives, scorers, the `rl` command.
  distill/    few-step distillation of a teacher's sampler into a student.
  evals/      the lm-evaluation-harness adapter and offline tasks.
  serve/      the OpenAI-compatible server.
Beside them: builders.py (config -> objects), experiment.py (a run's objects), run_config.py (a run's saved config),
recipes.py (config builders), cli.py (flag parsing), finetune.py (the one fine-tuning runner of sft, rl and distill),
and the commands train, sample, evaluate, sft, convert, quantize.
"""

__version__ = "0.1.0"
