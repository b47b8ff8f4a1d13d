"""Few-step distillation of the tiny-Shakespeare uniform run (DiffusionGemma's recipe): a 4-step student from the
16-step teacher by discrete consistency distillation (DUO's idea; docs/distillation.md).

  python -m hackable_diffusion.train --config configs/shakespeare_uniform.py --workdir runs/shakespeare_uniform
  python -m hackable_diffusion.distill --config configs/distill_shakespeare_uniform.py --workdir runs/distill_uniform \
      --config.sampler.selection.min_count=even
  python experiments/steps_frontier.py --teacher runs/shakespeare_uniform --ar runs/shakespeare_ar --min_count even \
      --students runs/distill_uniform:consistency --cooled 0.6/0.3,0.5/0.25

A uniform run has no absorbing state: the sampler re-noises every position its rule does not accept, so the only
methods that apply are the ones that do not read a path's committed tokens (`consistency`; `trajectory` and
`reverse_kl` refuse a uniform run). The teacher draws near-greedily from a noise canvas, so the noise carries the
samples' randomness. The student keeps the teacher's self-conditioner and trains it as pretraining did (a second pass
fed the first pass's belief on half the rows), since its sampler feeds each step's belief to the next. The student
inherits the teacher's sampler, whose entropy-bound rule has no floor: at 4 steps per canvas give it
`--config.sampler.selection.min_count=even`, as the measured student was (results/text/README.md, "Few-step decoding").
"""

from hackable_diffusion import recipes


def get_config(method: str = "consistency"):
    c = recipes.text_experiment("shakespeare", "uniform")
    c = recipes.distill_sections(
        c, checkpoint="runs/shakespeare_uniform", method=method or "consistency", teacher_steps=16, student_steps=4,
        steps=200, batch_size=16, pool_size=1024, peak_lr=3e-4,
    )  # fmt: skip
    c.distill.self_condition_prob = 0.5
    return c
