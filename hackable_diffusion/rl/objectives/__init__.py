"""Policy objectives for RL from verifiable rewards: one file each, found by name (`OBJECTIVES`).

* `diffu_grpo.DiffuGRPO` — d1's diffu-GRPO: GRPO's clipped surrogate on mean-field one-pass log-probs.
* `ar_grpo.ArGRPO` — the same loss with exact causal log-probs: the autoregressive baseline.
* `wd1.WD1` — wd1's ratio-free weighted likelihood with negative-sample unlearning.
* `elbo.ElboPolicyGradient` — REINFORCE with the masking ELBO in place of log pi (VRPO's and SPG's spirit).
* `expert_iteration.ExpertIteration` — maximum likelihood of a search's verified completions (ExIt, ReST-EM).

Each file names its paper and where it differs; `base.py` holds what they share (the registry, the reductions, the k3
KL). To add an objective, add one file here: a frozen dataclass subclassing `base.PolicyObjective`, decorated with
`@register`; every module of this package is imported below, so its name is valid for `config.rl.objective` and its
own fields become the section `config.rl.<name>` (docs/architecture.md, "Add an RL objective").
"""

from __future__ import annotations

import importlib
import pkgutil

from hackable_diffusion.rl.objectives.base import (  # noqa: F401  (the shared pieces, re-exported)
    NORMALIZATIONS,
    OBJECTIVES,
    RUN_ARGUMENTS,
    Metrics,
    PolicyObjective,
    RunPieces,
    all_rows_kl,
    batch_token_mean,
    k3_kl,
    mean_over_noise_draws,
    objective_class,
    reference_k3,
    reference_kl,
    register,
    resolve_normalization,
    rollout_metrics,
    row_means,
    score,
    token_kl,
    valid_mean,
)

for _module in pkgutil.iter_modules(__path__):  # every objective file registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")

from hackable_diffusion.rl.objectives.ar_grpo import ArGRPO  # noqa: E402
from hackable_diffusion.rl.objectives.diffu_grpo import DiffuGRPO  # noqa: E402
from hackable_diffusion.rl.objectives.elbo import ElboPolicyGradient  # noqa: E402
from hackable_diffusion.rl.objectives.expert_iteration import ExpertIteration  # noqa: E402
from hackable_diffusion.rl.objectives.wd1 import WD1  # noqa: E402
