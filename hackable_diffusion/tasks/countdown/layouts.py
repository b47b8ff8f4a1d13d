"""The two ways a Countdown run lays a problem out for the backbone, on the same rows [prompt; completion].

A row is a prompt of `data.prompt_len` (P) tokens, "3,7,25,50=75" then PAD, followed by a completion canvas of
`data.completion_len` (C) tokens, the answer then EOS then PAD. `fixed` marks the P prompt positions.

* in_place (`diffusion.process="masking"`, objective "pretrain"): masking diffusion over the completion, the prompt
  fixed (attended, never corrupted, not in the loss), one bidirectional pass per step: the generic
  `DiffusionPretrainObjective` as is, the same rows as Sudoku in place (d1, Zhao et al. 2025, samples a masked
  completion after a prompt with LLaDA; here the whole row is one canvas of P + C tokens).
* ar (`diffusion.process="none"`): the same backbone causal over the row, next-token loss on the completion's tokens
  up to and including its EOS (the PAD after it is not a target: decoding stops at EOS);
  `CountdownAutoregressiveObjective`.

A uniform process is refused: its noise would need a token set for the PAD tail, which the task does not define.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
from jax import Array

from hackable_diffusion.data.tokenizers import EOS_ID
from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.diffusion.training_losses import ArCE
from hackable_diffusion.models import transformer as T

LAYOUTS = ("in_place", "ar")


def layout_of(config: ml_collections.ConfigDict) -> str:
    """ "ar" for `diffusion.process="none"`, "in_place" for the masking process; ValueError otherwise."""
    process = config.diffusion.process
    if process == "none":
        return "ar"
    if process == "masking":
        return "in_place"
    raise ValueError(
        f"Countdown trains masking diffusion in place (config.diffusion.process='masking') or the autoregressive "
        f"baseline (process='none'); got process={process!r}."
    )


def check_layout(config: ml_collections.ConfigDict) -> str:
    """The layout, after checking that the objective and canvas length fit it."""
    layout = layout_of(config)
    d = config.diffusion
    if layout == "in_place" and (d.objective != "pretrain" or d.canvas_len):
        raise ValueError(
            "Countdown in place denoises the whole row as one canvas: set config.diffusion.objective='pretrain' and "
            f"config.diffusion.canvas_len=0 (got objective={d.objective!r}, canvas_len={d.canvas_len})."
        )
    return layout


@dataclasses.dataclass(frozen=True)
class CountdownAutoregressiveObjective:
    """Causal next-token loss over [prompt; completion], counted on the completion's tokens up to its EOS."""

    model: T.Transformer
    loss: ArCE = dataclasses.field(default_factory=ArCE)

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array):
        del rng
        tokens, fixed = batch["tokens"], batch["fixed"].astype(bool)
        logits, aux = T.forward(self.model, params, tokens, causal=True)
        answer_eos = ~fixed & (tokens == EOS_ID)
        after_eos = (jnp.cumsum(answer_eos, axis=1) - answer_eos) > 0
        targets = ~fixed & ~after_eos  # the answer and its EOS; the PAD tail is no target
        per_example, count = self.loss(logits, tokens, targets)
        nats = jnp.sum(per_example * count) / jnp.maximum(jnp.sum(count), 1)
        loss = jnp.mean(per_example) + obj_lib.aux_loss(aux)
        metrics = {"loss": loss, "ar_loss": nats, "nll_bits_per_token": nats / math.log(2)}
        return loss, dict(metrics, **obj_lib.moe_metrics(aux))


def adapt_objective(config: ml_collections.ConfigDict, model: T.Transformer, objective):
    """In place: the generic objective as is (the rows carry `fixed`); AR: replaced by the completion-only loss."""
    if layout_of(config) == "ar":
        return CountdownAutoregressiveObjective(model)
    return objective
