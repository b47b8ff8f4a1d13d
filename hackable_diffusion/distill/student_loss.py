"""The student's loss in few-step distillation: weighted cross-entropy of one denoising pass at each state.

A batch holds, per canvas, the k states the student will start its steps from, a target token and a weight per
position (`methods.py`), and for block runs the prefix. The prefix is encoded causally into the KV cache with the
student's own weights (the cache the student will read when it samples), the k states of a canvas share it, and all
b * k states run as one decoder pass over that cache; the loss is sum(w * CE) / sum(w) over the batch. A model with a
self-conditioner is trained as the pretraining objective trains it (a first pass with the null signal, then, with
probability `self_condition_prob` per row, a second one fed the first pass's belief).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.diffusion.objectives import _decoder_with_self_conditioning, aux_loss, moe_metrics
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.sampling.canvas import tile_cache


def prefix_cache(model: T.Transformer, params, prefix, prefix_mask, batch_size: int, copies: int):
    """The prefix (b, p) encoded causally with `params`, the cache tiled `copies` times copy-major; without a prefix
    (None or p = 0: a canvas in place) an empty cache of copies * b rows, every slot invalid."""
    if prefix is None or not prefix.shape[1]:
        return init_cache(model.cfg, copies * batch_size, 1)
    cache = init_cache(model.cfg, batch_size, prefix.shape[1])
    _, cache = T.append(model, params, prefix, cache, token_mask=prefix_mask)
    return tile_cache(cache, copies)


@dataclasses.dataclass(frozen=True)
class StudentLoss:
    """(params, batch, rng) -> (loss, metrics) for the student; batch: states / targets / weights (b, k, c), optional
    prefix / prefix_mask (b, p)."""

    model: T.Transformer
    self_condition_prob: float = 0.0
    null_signal: str = "zeros"

    def logits(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, "kb c v"], dict]:
        states = batch["states"]
        b, k, c = states.shape
        rows = jnp.swapaxes(states, 0, 1).reshape(k * b, c)  # copy-major, as tile_cache lays out the cache
        cache = prefix_cache(self.model, params, batch.get("prefix"), batch.get("prefix_mask"), b, k)

        def run(signal):
            return T.decode_block(self.model, params, rows, cache, sc_signal=signal)

        return _decoder_with_self_conditioning(
            self.model, params, run, (k * b, c), rng, self.self_condition_prob, self.null_signal
        )

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], dict]:
        b, k, c = batch["states"].shape
        logits, aux = self.logits(params, batch, rng)
        targets = jnp.swapaxes(batch["targets"], 0, 1).reshape(k * b, c)
        weights = jnp.swapaxes(batch["weights"], 0, 1).reshape(k * b, c).astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        ce = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        total = jnp.maximum(jnp.sum(weights), 1e-9)
        distill = jnp.sum(weights * ce) / total
        hit = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
        loss = distill + aux_loss(aux)
        metrics = {
            "loss": loss,
            "distill_ce": distill,
            "target_accuracy": jnp.sum(weights * hit) / total,
            "targets_per_canvas": jnp.sum(weights > 0) / b,
            **moe_metrics(aux),
        }
        return loss, metrics
