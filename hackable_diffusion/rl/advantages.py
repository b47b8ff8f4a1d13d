"""Group-relative advantages (GRPO, Shao et al. 2024 "DeepSeekMath"; the std-free variant of Dr. GRPO, Liu et al. 2025).

G completions of one prompt form a group; a completion's advantage is its reward minus the group's mean
(`scale="none"`, the default: what d1 and wd1 compute, and Dr. GRPO's argument against the division), or that divided
by the group's population standard deviation (`scale="std"`: GRPO as Shao et al. 2024 write it; TRL divides by the
sample standard deviation). A group whose rewards all tie carries no signal (every advantage is 0, and with `std` a
0/0): its advantages are 0 and it is marked invalid (`valid`), which the `groups_used` metric, wd1's
`rl.wd1.zero_tied_groups` and the `rl.skip_uninformative_steps` option read (its rows stay in the normalisation of
the d1, GRPO and wd1 losses, with A = 0; the ELBO policy gradient averages over valid rows).
`select_informative_groups` picks a rollout batch's groups out of several draws (dynamic sampling, DAPO: Yu et al.
2025), informative (not tied) groups first.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Float, Int

SCALES = ("none", "std")  # the first is the default (d1, wd1)


def informative_groups(rewards: Float[np.ndarray, "k g"]) -> Bool[np.ndarray, " k"]:
    """Whether each group's (row's) rewards differ somewhere; a tied group (and a group of one) has no group-relative
    signal."""
    r = np.asarray(rewards, np.float64)
    if r.ndim != 2 or r.shape[1] < 1:
        raise ValueError(f"rewards must be (prompts, completions per prompt), got shape {r.shape}.")
    return (r.max(axis=1) - r.min(axis=1)) > 0


def group_advantages(
    rewards: Float[np.ndarray, "k g"], *, scale: str = "none", eps: float = 1e-6
) -> tuple[Float[np.ndarray, "k g"], Bool[np.ndarray, " k"]]:
    """(advantages, valid groups) of rewards laid out one group (prompt) per row; tied groups get 0 and valid=False."""
    if scale not in SCALES:
        raise ValueError(f"advantage scale {scale!r} must be one of {SCALES}.")
    valid = informative_groups(rewards)
    r = np.asarray(rewards, np.float64)
    centred = r - r.mean(axis=1, keepdims=True)
    spread = r.std(axis=1, keepdims=True)
    adv = centred / (spread + eps) if scale == "std" else centred
    return np.where(valid[:, None], adv, 0.0).astype(np.float32), valid


def select_informative_groups(rewards: Float[np.ndarray, "n g"], keep: int) -> Int[np.ndarray, " keep"]:
    """The `keep` groups (rows of `rewards`, in draw order) a rollout batch holds: the first `keep` informative
    (not tied) groups; when fewer were drawn, every informative group and, to fill the batch, the first tied groups.
    Returned ascending, so the batch keeps draw order (one draw of `keep` groups: every group, as drawn)."""
    informative = informative_groups(rewards)
    if not 1 <= keep <= len(informative):
        raise ValueError(f"cannot keep {keep} groups out of {len(informative)} drawn; keep must lie in [1, drawn].")
    chosen = np.flatnonzero(informative)[:keep]
    filler = np.flatnonzero(~informative)[: keep - len(chosen)]
    return np.sort(np.concatenate([chosen, filler]))
