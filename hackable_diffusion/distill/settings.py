"""The `distill` config section and the distillation config made from a task's training config
(`distill_sections`), next to the code that reads them (`distill/command.py`, `distill/methods.py`;
docs/distillation.md lists every key)."""

from __future__ import annotations

import ml_collections

from hackable_diffusion import recipes
from hackable_diffusion.distill.methods import method_settings


def distill_sections(
    config: ml_collections.ConfigDict,
    *,
    checkpoint: str,
    method: str = "trajectory",
    teacher_steps: int = 16,
    student_steps: int = 4,
    steps: int = 300,
    batch_size: int = 16,
    pool_size: int = 2048,
    lora_rank: int = 0,
    peak_lr: float = 1e-4,
) -> ml_collections.ConfigDict:
    """`config` (a task's training config) made a distillation config for `python -m hackable_diffusion.distill`:
    the teacher (`init`, a toolbox run by default, whose data, diffusion, sampler and solver sections the student
    inherits at run time), `lora` (rank 0: full), the `distill` section (docs/distillation.md), a constant learning
    rate after a short warm-up, no EMA."""
    c = recipes.from_weights(config, checkpoint, lora_rank)
    c.distill = ml_collections.ConfigDict(
        dict(
            method=method,  # "trajectory" (SDTT-style, masking) | "consistency" (DUO-style) | "reverse_kl" (on-policy)
            teacher_steps=teacher_steps,  # N: the teacher's steps per canvas
            student_steps=student_steps,  # k: the student's (must divide N)
            rest_weight=0.0,  # trajectory: weight of the teacher's final token at positions decided later
            pool_size=pool_size,  # teacher trajectories made once and cached in the run directory
            batch_size=batch_size,  # canvases per step (each gives k student rows); reverse_kl: prompts per step
            greedy_temperature=1e-4,  # consistency: the teacher's near-greedy temperature
            self_condition_prob=0.0,  # a model with a self-conditioner: its second pass, as pretraining
            keep="all",  # "correct": only trajectories ending on the training row's canvas (a puzzle's solution)
            group_size=4,  # reverse_kl: student samples per prompt (leave-one-out baseline)
            elbo_draws=4,  # reverse_kl: the teacher's ELBO estimate, passes per sample
            target_sharpness=1.0,  # reverse_kl: beta, the student aims at p_teacher^beta
            target_temperature=0.0,  # reverse_kl: the teacher's logits / tau in its ELBO (0: the sampler's T(t))
            shared_noise=False,  # reverse_kl: a prompt's samples share their ELBO draws' noise (common random numbers)
            exact_entropy=False,  # reverse_kl: the student's log q terms by their exact conditional expectations
            student_process="",  # fixed_order: "masking" or "uniform" for a student of another process ("": the same)
            student_temperature="",  # "MAX/MIN^EXPONENT": the student's saved sampling schedule ("": the teacher's)
        )
    )
    for key, default in method_settings().items():  # a method's field not set above: its class default
        if key not in c.distill and default is not None:
            c.distill[key] = default
    return recipes.constant_lr_schedule(c, peak_lr, steps, warmup=20, log_every=10, eval_every=0, checkpoint_every=50)
