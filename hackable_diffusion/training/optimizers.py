"""Optimizers and learning-rate schedules built from a config.

References:
    * AdamW: Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (ICLR 2019), via `optax.adamw`.
    * Adafactor: Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost" (ICML 2018),
        via `optax.adafactor`.
    * Linear warmup + cosine decay: Loshchilov & Hutter, "SGDR" (ICLR 2017), as used by most LM recipes.

Deliberate choices:
    * Weight decay is applied only to parameters with two or more dimensions (matrices, embeddings, expert
        stacks); norm scales and biases are not decayed, the common LM practice.
    * Adafactor is used as a plain adaptive optimizer with the config's learning rate: relative step sizes
        (`multiply_by_parameter_scale`) and Adafactor's own update clipping are off, so `peak_lr` means the same
        thing for both optimizers and clipping is the shared global-norm clip. `b1 > 0` turns on momentum; `b2` and
        `eps` are Adam-only (Adafactor keeps its t^-0.8 second-moment decay and eps=1e-30).
    * Frozen parameters (`trainable_mask`) get `optax.set_to_zero()` through `optax.multi_transform`: their updates
        are exact zeros, so they stay bit-identical, they carry no optimizer state, and they do not enter the global
        gradient norm used for clipping.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

_REQUIRED_FIELDS = ("name", "peak_lr", "end_lr", "warmup_steps", "total_steps", "weight_decay", "clip_norm")


def _field(cfg: ml_collections.ConfigDict, name: str, default: Any = None) -> Any:
    if name in cfg:
        return cfg[name]
    if default is None:
        raise ValueError(f"optimizer config is missing the field '{name}'; it needs {', '.join(_REQUIRED_FIELDS)}.")
    return default


def make_lr_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warmup from 0 to `peak_lr` over `warmup_steps`, then cosine decay to `end_lr` at `total_steps`.

    lr(s) = peak * s / warmup                                                  for s < warmup
    lr(s) = end + (peak - end) * (1 + cos(pi * min(1, (s - warmup) / (total - warmup)))) / 2   otherwise
    """
    peak = float(_field(cfg, "peak_lr"))
    end = float(_field(cfg, "end_lr"))
    warmup = int(_field(cfg, "warmup_steps"))
    total = int(_field(cfg, "total_steps"))
    if warmup < 0 or total <= 0:
        raise ValueError(f"need warmup_steps >= 0 and total_steps > 0, got warmup_steps={warmup}, total_steps={total}.")
    if warmup > total:
        raise ValueError(f"warmup_steps={warmup} exceeds total_steps={total}; shorten the warmup or train longer.")
    for name, value in (("peak_lr", peak), ("end_lr", end)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"optimizer.{name}={value} must be a finite number >= 0 (a negative learning rate climbs the loss); "
                f"set --config.optimizer.{name} to a small positive value such as 3e-4."
            )
    decay_steps = max(total - warmup, 1)

    def schedule(step):
        s = jnp.asarray(step, jnp.float32)
        warm = peak * s / max(warmup, 1)
        frac = jnp.clip((s - warmup) / decay_steps, 0.0, 1.0)
        cosine = end + (peak - end) * 0.5 * (1.0 + jnp.cos(math.pi * frac))
        return jnp.where(s < warmup, warm, cosine)

    return schedule


def _decay_matrices_only(params: Any) -> Any:
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def _adamw(cfg: ml_collections.ConfigDict, lr: optax.Schedule) -> optax.GradientTransformation:
    return optax.adamw(
        learning_rate=lr,
        b1=float(_field(cfg, "b1", 0.9)),
        b2=float(_field(cfg, "b2", 0.999)),
        eps=float(_field(cfg, "eps", 1e-8)),
        weight_decay=float(cfg.weight_decay),
        mask=_decay_matrices_only,
    )


def _adafactor(cfg: ml_collections.ConfigDict, lr: optax.Schedule) -> optax.GradientTransformation:
    b1 = float(_field(cfg, "b1", 0.0))
    wd = float(cfg.weight_decay)
    return optax.adafactor(
        learning_rate=lr,
        multiply_by_parameter_scale=False,
        clipping_threshold=None,
        momentum=b1 if b1 > 0 else None,
        weight_decay_rate=wd if wd > 0 else None,
        weight_decay_mask=_decay_matrices_only,
    )


OPTIMIZERS: dict[str, Callable[[ml_collections.ConfigDict, optax.Schedule], optax.GradientTransformation]] = {
    "adamw": _adamw,
    "adafactor": _adafactor,
}

TrainableMask = Any  # pytree of bools matching params, or a callable params -> pytree of bools


def make_optimizer(
    cfg: ml_collections.ConfigDict, trainable_mask: TrainableMask | None = None
) -> optax.GradientTransformation:
    """Global-norm clipping (if `clip_norm > 0`) then the named optimizer on the warmup+cosine schedule.

    Args:
        cfg: ConfigDict with name, peak_lr, end_lr, warmup_steps, total_steps, weight_decay, b1, b2, eps, clip_norm.
        trainable_mask: None (train everything) or a pytree of bools / a callable params -> pytree of bools;
            False leaves are frozen (zero updates, no optimizer state).
    """
    name = _field(cfg, "name")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer name {name!r}; valid names are {sorted(OPTIMIZERS)}.")
    clip_norm = float(_field(cfg, "clip_norm"))
    if clip_norm < 0:
        raise ValueError(f"clip_norm must be >= 0 (0 turns clipping off), got {clip_norm}.")
    parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm > 0 else []
    parts.append(OPTIMIZERS[name](cfg, make_lr_schedule(cfg)))
    tx = optax.chain(*parts)
    if trainable_mask is None:
        return tx

    def labels(params):
        mask = trainable_mask(params) if callable(trainable_mask) else trainable_mask
        return jax.tree.map(lambda m: "trainable" if bool(m) else "frozen", mask)

    return optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, labels)
