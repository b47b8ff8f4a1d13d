"""Few-step distillation of the tiny-Shakespeare masking run: a 4-step student from the 16-step teacher.

  python -m hackable_diffusion.train --config configs/shakespeare_masking.py --workdir runs/shakespeare_masking
  python -m hackable_diffusion.distill --config configs/distill_shakespeare_masking.py --workdir runs/distill
  python -m hackable_diffusion.distill --config configs/distill_shakespeare_masking.py:consistency \
      --workdir runs/distill_consistency
  python -m hackable_diffusion.distill --config configs/distill_shakespeare_masking.py:reverse_kl \
      --workdir runs/distill_reverse_kl --config.sampler.selection.min_count=even --config.distill.shared_noise=True
  python experiments/distill/steps_frontier.py --teacher runs/shakespeare_masking --ar runs/shakespeare_ar \
      --students runs/distill:trajectory,runs/distill_consistency:consistency

The student inherits the teacher run's data, diffusion recipe and sampler (docs/distillation.md); its config.json
samples at `distill.student_steps`. `--config.distill.student_steps=2` (any divisor of teacher_steps) makes another
point of the frontier; `--init_from toolbox:RUN` names another teacher. `reverse_kl` trains on the student's own
samples (16 prompts x 4 per step) at 3e-4, the rate measured in results/text/README.md ("Few-step decoding"); the
learning rates of the other two are the recipe's. The student inherits the teacher's sampler, whose entropy-bound
rule has no floor: at 4 steps per canvas give it `--config.sampler.selection.min_count=even`, or better the dilated
order, `--config.sampler.selection.rule=dilated`, with which teacher and trajectory student meet the 16-step
teacher's quality at 4 steps (results/text/README.md, "The dilated order: the bar met at 4 steps").
"""

from hackable_diffusion import recipes
from hackable_diffusion.distill import settings as distill_settings


def get_config(method: str = "trajectory"):
    c = recipes.text_experiment("shakespeare", "masking")
    return distill_settings.distill_sections(
        c, checkpoint="runs/shakespeare_masking", method=method or "trajectory", teacher_steps=16, student_steps=4,
        steps=500, batch_size=16, pool_size=4096, peak_lr=3e-4 if method == "reverse_kl" else 1e-4,
    )  # fmt: skip
