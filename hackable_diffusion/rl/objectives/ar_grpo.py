"""GRPO with exact token log-probs: d1's loss (`clipped.ClippedSurrogate`) on a causal run of the same backbone.

The baseline the diffusion objectives are measured against: `scorers.AutoregressiveScorer` gives each completion
token's exact log-prob; the completion ends at its first EOS (included), as in d1 and TRL (`Task.policy_rows`).

Differs from GRPO's paper (Shao et al. 2024): its token normalisation is d1's/TRL's and its advantages r - mean
(the paper's per-row mean and std-scaled advantages are `rl.loss_normalization="row_mean"` and
`rl.advantage_scale="std"`).
"""

from __future__ import annotations

import dataclasses

from hackable_diffusion.rl.objectives.base import register
from hackable_diffusion.rl.objectives.clipped import ClippedSurrogate
from hackable_diffusion.rl.scorers import AutoregressiveScorer


@register
@dataclasses.dataclass(frozen=True)
class ArGRPO(ClippedSurrogate):
    """d1's loss with exact causal log-probs (the autoregressive baseline on the same backbone), the completion ending
    at its first EOS. Differs from GRPO's paper: d1's token normalisation and r - mean advantages by default
    (`normalization="row_mean"` and `rl.advantage_scale="std"` are the paper's)."""

    scorer: AutoregressiveScorer

    name = "ar_grpo"
    run_kinds = ("autoregressive",)
