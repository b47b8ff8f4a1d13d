"""Hackable Diffusion: a JAX/Flax toolbox for block text-diffusion language models (DiffusionGemma kind).

Sub-packages:
  models/     Gemma-4-style MoE transformer, KV cache, diffusion LM head (self-conditioning).
  diffusion/  schedules, noise processes (masking, uniform), ELBO and training losses, training objectives.
  sampling/   canvas denoising loop, selection rules, logit constraints and views, block and AR generation.
  data/       tokenizers, grain text pipelines, corpora.
  training/   train state and step, optimizers, checkpoints, sharding, metrics, the training loop.
  tasks/      what a run learns and how it is scored: text (likelihood, samples, SFT data) and Sudoku (data,
              layouts, the rules and symmetries, the solver, its metrics).
  aot/        ahead-of-time compilation of full-size shapes on abstract devices.
Beside them: builders.py (config -> objects), experiment.py (a run's objects), pretrained.py (loading weights),
recipes.py (config builders), and the commands train, sample, evaluate, sft, convert.
"""

__version__ = "0.1.0"
