"""The `rl` config section and the RL config made from a task's training config (`rl_sections`), next to the code
that reads them (`rl/command.py`; docs/rl.md lists every key and the paper each default follows). The keys every
objective shares sit in `config.rl`; each registered objective's own settings are its section `config.rl.<name>`
(`objectives.base.PolicyObjective.settings`: its dataclass fields at their defaults, e.g. `config.rl.wd1.psi`)."""

from __future__ import annotations

import ml_collections

from hackable_diffusion import recipes
from hackable_diffusion.rl.objectives import OBJECTIVES


def rl_sections(
    config: ml_collections.ConfigDict,
    *,
    checkpoint: str,
    objective: str = "diffu_grpo",
    steps: int = 200,
    lora_rank: int = 0,
    peak_lr: float = 1e-5,
) -> ml_collections.ConfigDict:
    """`config` (a task's training config) made an RL config for `python -m hackable_diffusion.rl`: the starting
    weights (`init`, a toolbox run by default), `lora` (rank 0: full), the `rl` section (docs/rl.md), a constant
    learning rate after a short warm-up, no EMA."""
    c = recipes.from_weights(config, checkpoint, lora_rank)
    c.rl = ml_collections.ConfigDict(
        dict(
            objective=objective,  # a name in objectives.OBJECTIVES: "diffu_grpo" | "wd1" | "elbo" | "ar_grpo" |
            # "expert_iteration"; its own settings are config.rl.<objective> (below)
            prompts_per_rollout=8,  # K prompts per rollout
            group_size=8,  # G completions per prompt (expert_iteration: 1 is enough)
            inner_updates=2,  # mu optimizer steps per rollout batch (d1, wd1: 12; 2 here: each rollout costs a sampler
            # run, and on CPU more updates per rollout mostly train further off-policy for the same wall time)
            prompt_mask_prob=0.15,  # diffu-GRPO / wd1: each prompt token masked with this probability (0 for AR runs;
            # d1, wd1: 0.15)
            advantage_scale="none",  # "none": r - mean per group (d1, wd1); "std": (r - mean) / std (GRPO's paper)
            loss_normalization="paper",  # "paper": each objective's paper (docs/rl.md); "row_mean": per-row token
            # means, then their mean over every row, tied groups included (GRPO's paper; diffu_grpo, ar_grpo, wd1)
            kl_beta=0.0,  # weight of the k3 KL to the starting weights (d1: 0.04; wd1's trainer: none, 0); > 0 costs a
            # reference pass per inner update and, full fine-tuning, a second copy of the weights
            shaped_reward=False,  # the task's partial credit (Sudoku: rewards.py) on top of exact = 1
            temperature=1.0,  # rollouts draw tokens at this temperature (d1, wd1: 0.9; 1 here: the scorers score the
            # temperature-1 policy, so at 1 the rollouts are the scored policy's own samples)
            dynamic_sampling=0,  # DAPO's dynamic sampling: up to this many extra draws of K x G per rollout until K
            # groups have rewards that differ (tied groups carry no signal); 0: off, one draw, every group kept
            scorer="mean_field",  # diffu_grpo / wd1 log-probs: "mean_field" (d1's one pass) or "trajectory" (TraceRL:
            # each token scored at the sampler pass that wrote it; Sudoku in place)
            trajectory_passes_per_forward=1,  # trajectory: sampler passes scored per forward (TraceRL's shrinkage)
            skip_uninformative_steps=False,  # True: a step whose batch has no informative group (expert iteration: no
            # accepted completion) leaves the weights, optimizer state and EMA untouched (the step counter still
            # advances); False: the optimizer steps anyway
            stop_at_eos=config.get("data", {}).get("task") == "countdown",  # in place: score a completion up to its
            # first EOS, the tail kept masked (d1); False scores the PAD tail too. AR rows always end at the EOS;
            # Sudoku has none (True refused)
        )
    )
    for name, cls in OBJECTIVES.items():  # e.g. rl.diffu_grpo.clip_eps (d1: 0.5; TRL, GRPO's paper: 0.2), rl.wd1.psi
        c.rl[name] = ml_collections.ConfigDict(cls.settings())
    return recipes.constant_lr_schedule(c, peak_lr, steps, warmup=10, log_every=5, eval_every=50, checkpoint_every=25)
