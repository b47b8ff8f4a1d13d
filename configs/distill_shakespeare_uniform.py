"""Few-step distillation of the tiny-Shakespeare uniform run (DiffusionGemma's recipe): a 4-step student from the
16-step teacher by fixed-order distillation (`fixed_order`; docs/distillation.md).

  python -m hackable_diffusion.train --config configs/shakespeare_uniform.py --workdir runs/shakespeare_uniform
  python -m hackable_diffusion.distill --config configs/distill_shakespeare_uniform.py --workdir runs/distill_uniform \
      --config.sampler.selection.min_count=even
  python experiments/distill/steps_frontier.py --teacher runs/shakespeare_uniform --ar runs/shakespeare_ar --min_count even \
      --students runs/distill_uniform:masking_student --steps 1,2,4,16

The default (`masking_student`, the best 4-step student of this teacher measured) trains a masking model of the
uniform teacher on 12,288 of the teacher's final canvases in the `dilated` order (`distill.student_process=masking`:
the same network learns the mask token's embedding), 2,000 steps at a constant 1e-3, and saves it with a hot-first
sampling schedule (`distill.student_temperature=1.6/0.2^0.25`: 1.6 at the first step, 0.61 / 0.42 / 0.30 at the next
three) while the teacher's trajectories keep its own schedule and rule
(`--config.sampler.selection.min_count=even` gives its entropy bound a floor, as the measured teacher had). `:uniform_student` keeps the teacher's process: the student
samples with `sampler.commit` (decided tokens stay, the rest is re-noised each step). `:consistency` is DUO's idea
instead: the near-greedy teacher's end canvas as the target at every free position, the student sampled with the
reference sampler. Every student keeps the teacher's self-conditioner and trains it as pretraining did (a second pass
fed the first pass's belief on half the rows), since its sampler feeds each step's belief to the next. The path
methods (`trajectory`, `reverse_kl`) refuse a uniform run. Measured in results/text/README.md ("Few-step decoding",
"The uniform process").
"""

from hackable_diffusion import recipes
from hackable_diffusion.distill import settings as distill_settings

VARIANTS = ("masking_student", "uniform_student", "consistency")


def get_config(variant: str = "masking_student"):
    variant = variant or "masking_student"
    if variant not in VARIANTS:
        raise ValueError(f"configs/distill_shakespeare_uniform.py:{variant}: choose one of {VARIANTS}.")
    method = "consistency" if variant == "consistency" else "fixed_order"
    pool, steps, lr = {"masking_student": (12288, 2000, 1e-3), "uniform_student": (4096, 600, 3e-4)}.get(
        variant, (1024, 200, 3e-4)
    )
    c = distill_settings.distill_sections(
        recipes.text_experiment("shakespeare", "uniform"), checkpoint="runs/shakespeare_uniform", method=method,
        teacher_steps=16, student_steps=4, steps=steps, batch_size=16, pool_size=pool, peak_lr=lr,
    )  # fmt: skip
    c.distill.self_condition_prob = 0.5
    if variant == "masking_student":
        c.distill.student_process = "masking"
        c.distill.student_temperature = "1.6/0.2^0.25"  # 1.6 at the first of 4 steps, then 0.61 / 0.42 / 0.30
    return c
