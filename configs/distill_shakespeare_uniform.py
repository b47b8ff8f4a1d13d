"""Few-step distillation of the tiny-Shakespeare uniform run (DiffusionGemma's recipe): a 4-step student from the
16-step teacher, by default by fixed-order distillation (`fixed_order`; docs/distillation.md).

  python -m hackable_diffusion.train --config configs/shakespeare_uniform.py --workdir runs/shakespeare_uniform
  python -m hackable_diffusion.distill --config configs/distill_shakespeare_uniform.py --workdir runs/distill_uniform \
      --config.sampler.selection.min_count=even
  python experiments/steps_frontier.py --teacher runs/shakespeare_uniform --ar runs/shakespeare_ar --min_count even \
      --students runs/distill_uniform:fixed_order --cooled 0.6/0.3,0.5/0.25

A uniform run has no absorbing state: the reference sampler re-noises every position its rule does not accept and
re-draws the accepted ones at the next step. `fixed_order` (the default) trains the student on the teacher's final
canvases in the `dilated` order and saves it with a sampler that keeps what each step decided (`sampler.commit`),
re-noising only the rest; the teacher keeps its own rule (`--config.sampler.selection.min_count=even` gives its
entropy bound a floor, as the measured teacher had). `:consistency` is DUO's idea instead: the near-greedy teacher's
end canvas as the target at every free position, the student sampled with the reference sampler. With
`--config.distill.student_process=masking` the fixed-order student is a masking model of the uniform teacher (the
best 4-step student of this teacher measured). Either way the student keeps the teacher's self-conditioner and trains
it as pretraining did (a second pass fed the first pass's belief on half the rows), since its sampler feeds each
step's belief to the next. The path methods (`trajectory`, `reverse_kl`) refuse a uniform run. Measured in results/text/README.md ("Few-step decoding", "The uniform process").
"""

from hackable_diffusion import recipes


def get_config(method: str = "fixed_order"):
    method = method or "fixed_order"
    pool, steps = (4096, 600) if method == "fixed_order" else (1024, 200)
    c = recipes.distill_sections(
        recipes.text_experiment("shakespeare", "uniform"), checkpoint="runs/shakespeare_uniform", method=method,
        teacher_steps=16, student_steps=4, steps=steps, batch_size=16, pool_size=pool, peak_lr=3e-4,
    )  # fmt: skip
    c.distill.self_condition_prob = 0.5
    return c
