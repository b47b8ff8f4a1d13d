"""Few-step distillation of a diffusion run's canvas sampler.

  python -m hackable_diffusion.distill --config configs/distill_shakespeare_masking.py --workdir runs/distill

A k-step student learns from an N-step teacher's trajectories (`teacher.py`: the toolbox's jitted sampler, cached in
the run directory) by one of two methods (`methods.py`: SDTT-style trajectory distillation for masking runs, DUO-style
consistency distillation for masking and uniform runs), with the loss of `student_loss.py`, or on its own samples by
the reverse KL to the teacher's ELBO (`reverse_kl.py`, DiDi-Instruct's idea; masking runs); `command.py` is the run
(teacher = `config.init`, full or LoRA, an ordinary training run directory). See docs/distillation.md.
"""
