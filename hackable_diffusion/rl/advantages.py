"""Group-relative advantages (GRPO, Shao et al. 2024 "DeepSeekMath"; the std-free variant of Dr. GRPO, Liu et al. 2025).

G completions of one prompt form a group; a completion's advantage is its reward minus the group's mean, divided by
the group's standard deviation (`scale="std"`) or not (`scale="none"`). A group whose rewards all tie carries no
signal (every advantage is 0, and with `std` a 0/0): it is marked invalid so the objectives skip it, as d1 and the
GRPO trainers do, instead of spending its rows on a zero gradient with a normalisation that counts them.
`select_informative_groups` picks a rollout batch's groups out of several draws (dynamic sampling, DAPO: Yu et al.
2025), informative (not tied) groups first.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Float, Int

SCALES = ("std", "none")


def informative_groups(rewards: Float[np.ndarray, "k g"]) -> Bool[np.ndarray, " k"]:
    """Whether each group's (row's) rewards differ somewhere; a tied group (and a group of one) has no group-relative
    signal."""
    r = np.asarray(rewards, np.float64)
    if r.ndim != 2 or r.shape[1] < 1:
        raise ValueError(f"rewards must be (prompts, completions per prompt), got shape {r.shape}.")
    return (r.max(axis=1) - r.min(axis=1)) > 0


def group_advantages(
    rewards: Float[np.ndarray, "k g"], *, scale: str = "std", eps: float = 1e-6
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
