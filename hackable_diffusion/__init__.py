"""Hackable Diffusion: a JAX/Flax toolbox for block text-diffusion language models (DiffusionGemma kind).

Sub-packages:
  models/     Gemma-4-style MoE transformer, KV cache, diffusion LM head (self-conditioning).
  diffusion/  schedules, noise processes (masking, uniform), ELBO losses, training objectives.
  sampling/   canvas denoising loop, selection rules, block-autoregressive and AR generation.
  data/       tokenizers, grain text pipelines, Sudoku generator/solver.
  training/   train state and step, optimizers, checkpoints, sharding, metrics.
  evals/      likelihood, Sudoku, throughput.
"""

__version__ = "0.1.0"
