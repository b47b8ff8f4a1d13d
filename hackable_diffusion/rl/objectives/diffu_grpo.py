"""diffu-GRPO, d1 (Zhao et al. 2025): GRPO's clipped surrogate with the mean-field one-pass log-probs.

The log-probs are `scorers.MeanFieldScorer`'s (one forward with the completion masked, d1's estimator), the prompt
randomly masked with a fresh mask for each of the mu inner updates (`rl.prompt_mask_prob`, d1's 0.15), or
`scorers.TrajectoryScorer`'s per-pass log-probs (TraceRL, `rl.scorer='trajectory'`). The loss, as d1's code computes
it: the sum over the batch's completion tokens of -min(r A, clip(r) A) + beta k3, divided by their count (tied
groups in the batch with A = 0, their tokens counted). With `rl.stop_at_eos` (Countdown in place) the scored
completion ends at its first EOS, included, as d1 cuts LLaDA's; every position the sampler wrote stays masked in the
scoring pass (`masked`, d1's forward_process masks the whole completion), so the cut leaks no length.

Differs from d1: the normalising count is the whole batch's (d1: each device's micro-batch, the results then
averaged; RL refuses `train.grad_accum_steps` > 1, whose strided micro-batches would split it); the reference's
log-probs are precomputed once per rollout and inner update (same mask); an in-place run without `rl.stop_at_eos`
scores every position it sampled, its PAD tail included.
"""

from __future__ import annotations

import dataclasses

from hackable_diffusion.rl.objectives.base import register
from hackable_diffusion.rl.objectives.clipped import ClippedSurrogate
from hackable_diffusion.rl.scorers import MeanFieldScorer, TrajectoryScorer


@register
@dataclasses.dataclass(frozen=True)
class DiffuGRPO(ClippedSurrogate):
    """d1's diffu-GRPO: clipped ratio of mean-field one-pass log-probs, prompt masked afresh per inner update (or of
    the trajectory scorer's per-pass log-probs); d1's token normalisation by default. Differs from d1: normalised over
    the whole batch, not per device micro-batch; an in-place run without `rl.stop_at_eos` scores its PAD tail (module
    docstring)."""

    scorer: MeanFieldScorer | TrajectoryScorer

    name = "diffu_grpo"
    run_kinds = ("diffusion",)
    trajectory_scorer = True
