"""Training objectives: whole-batch losses, pure functions of (params, batch, rng) -> (loss, metrics).

Three objectives over the same backbone:

* `DiffusionPretrainObjective` — packed text, either process; an optional `batch["fixed"]` (puzzle givens, infill
  context) marks positions that are attended to but never corrupted and never in the loss.
  - `canvas_len=None`: one canvas per sequence, a bidirectional pass over the whole corrupted sequence (MD4/MDLM).
  - `canvas_len=C`: block diffusion over canvases of C tokens (BD3-LM, Arriola et al. 2025, and exactly
    DiffusionGemma's structure): a causal "encoder" pass over the clean sequence fills a KV cache (and gives an AR
    loss); a "decoder" pass runs every noisy canvas at once, canvas k attending bidirectionally to itself and to the
    cached clean canvases < k. The cache is exact: the same KV the block sampler builds by committing canvases.
* `CanvasSFTObjective` — prompt -> response SFT as DiffusionGemma does it (docs/reference.md §3): the encoder
  pass over [prompt; clean canvases] gives the KV cache and the AR loss; one canvas s per example is drawn, corrupted
  and denoised against the prompt and the clean canvases < s. Deliberate fix of the reference's multi-canvas bug
  (docs/reference.md §5): only the selected noisy canvas is run, with its own positions, and nothing is written over the cache, so
  the noisy canvas can neither overwrite prompt slots nor see a noisy copy of an earlier canvas.
* `AutoregressiveObjective` — next-token cross-entropy, the baseline on the same backbone.

Losses (`loss=`) are objects (`training_losses`): `Elbo`, `MaskedCE(alpha, gamma)`, `CanvasCE`; whatever the training
loss, the metrics carry the ELBO of the same forward pass (`elbo_bits_per_token`), so uniform models trained with
canvas CE still report a likelihood bound. The autoregressive baseline's loss is `ArCE`.

Self-conditioning (`self_condition_prob` > 0, model built with `self_conditioning=True`, docs/reference.md §1.6): a first decoder
pass with the null signal, then a second pass whose signal is the first pass's (stop-gradient, raw) logits with
probability `self_condition_prob` per example and the null signal otherwise; the loss uses the second pass.
The network never receives t, as in DiffusionGemma.

Adapting an AR model (`adaptation`, `diffusion.adaptation`): `DiffusionPretrainObjective(adaptation=...)` takes the
training step (`uses_step`; `train_state.make_train_step` passes it) and applies a canvas-size curriculum, decoder
mask annealing and a scheduled encoder AR-loss weight; without a step (evaluation, the ELBO) it is the target
objective. The schedule values are logged as `adapt_*` metrics. `token_shift=True` reads each position's prediction
from the logits one position to its left (Fast-dLLM v2; diffusion/token_shift.py), the canvas start from the
encoder's logits of the token before it, so an adapted AR model keeps what its head means; the sampler must then be
built with `token_shift=True` too (`diffusion.token_shift` sets both).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from hackable_diffusion.diffusion import elbos
from hackable_diffusion.diffusion import token_shift as shift_lib
from hackable_diffusion.diffusion.adaptation import Adaptation, MaskAnnealing
from hackable_diffusion.diffusion.processes import NoiseProcess
from hackable_diffusion.diffusion.schedules import UniformTimeSampler
from hackable_diffusion.diffusion.training_losses import ArCE, CanvasCE, DiffusionLoss, Elbo
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache

Metrics = dict[str, Array]
_ANNEAL_STREAM = 0x616E6E  # fold_in tag of the mask-annealing draws


def _decoder_with_self_conditioning(
    model: T.Transformer, params, run, shape: tuple[int, int], rng: jax.Array, prob: float, null_signal: str
) -> tuple[Float[Array, "b l v"], Metrics]:
    """Runs `run(sc_signal)` once (no self-conditioning) or twice (self-conditioning training)."""
    if not model.cfg.self_conditioning:
        return run(None)
    null = T.model_method(model, params, "null_sc_signal", shape, kind=null_signal)
    if prob <= 0.0:
        return run(null)
    first, _ = run(null)
    signal = jax.lax.stop_gradient(T.model_method(model, params, "sc_signal", first))
    use = jax.random.bernoulli(rng, prob, (shape[0],))[:, None, None]
    return run(jnp.where(use, signal, null))


def _diffusion_loss(loss: DiffusionLoss, process: NoiseProcess, logits, x0, xt, t, loss_mask):
    """(training loss per example, ELBO nats per example)."""
    elbo = elbos.process_elbo(logits, x0, xt, t, process, loss_mask)
    return loss(process, logits, x0, xt, loss_mask, elbo), elbo


@dataclasses.dataclass(frozen=True)
class DiffusionPretrainObjective:
    """Diffusion on packed text: one canvas per sequence, or block diffusion over canvases of `canvas_len`."""

    model: T.Transformer
    process: NoiseProcess
    time_sampler: Any = UniformTimeSampler()
    canvas_len: int | None = None
    loss: DiffusionLoss = Elbo()
    encoder_ar_weight: float = 0.0  # DiffusionGemma adds the encoder's next-token loss with weight 1
    self_condition_prob: float = 0.0
    null_signal: str = "zeros"
    adaptation: Adaptation | None = None  # schedules over the training step (adapting an AR model)
    token_shift: bool = False  # position i is predicted from the logits at i - 1 (diffusion/token_shift.py)

    def __post_init__(self):
        self.loss.check(self.process)
        if self.canvas_len is None and self.encoder_ar_weight:
            raise ValueError(
                "encoder_ar_weight needs block diffusion (canvas_len): one-canvas training has no encoder."
            )
        if self.token_shift and self.self_condition_prob > 0:
            raise ValueError(
                "token_shift with self-conditioning: the fed-back signal is per position and unshifted; set "
                "diffusion.self_condition_prob=0 or diffusion.token_shift=False."
            )
        a = self.adaptation
        if a is None:
            return
        if (a.canvas is not None or a.ar_loss is not None) and self.canvas_len is None:
            raise ValueError(
                "the canvas curriculum and the AR-loss schedule need block diffusion (diffusion.canvas_len > 0)."
            )
        if a.canvas is not None and a.canvas.target != self.canvas_len:
            raise ValueError(
                f"the canvas curriculum must end at the target canvas: its last size is {a.canvas.target}, "
                f"diffusion.canvas_len is {self.canvas_len}."
            )
        if a.ar_loss is not None and self.encoder_ar_weight:
            raise ValueError(
                f"the AR-loss schedule replaces diffusion.encoder_ar_weight={self.encoder_ar_weight}; set it to 0."
            )

    @property
    def uses_step(self) -> bool:
        """Whether the loss depends on the training step (`make_train_step` then passes `step=`)."""
        return self.adaptation is not None and self.adaptation.active

    def __call__(
        self, params, batch: dict[str, Array], rng: jax.Array, step: Int[Array, ""] | None = None
    ) -> tuple[Float[Array, ""], Metrics]:
        """batch: tokens (b, l); optional weights (b, l) (0 = padding: not attended, not in the loss) and fixed
        (b, l) bool (given context such as puzzle givens: attended, never corrupted, not in the loss). `step`: the
        training step the adaptation schedules read (None: their end, the target objective)."""
        if not self.uses_step:
            return self._reduce(self._terms(params, batch, rng), self.encoder_ar_weight)
        a = self.adaptation
        values = a.values(step)
        mask_fraction = values.get("adapt_mask_fraction")
        ar_weight = values.get("adapt_ar_weight", self.encoder_ar_weight)
        if a.canvas is None or step is None:
            loss, metrics = self._reduce(self._terms(params, batch, rng, mask_fraction), ar_weight)
            return loss, dict(metrics, **values)

        def branch(size):
            objective = dataclasses.replace(self, canvas_len=size, adaptation=None)
            return lambda: objective._reduce(objective._terms(params, batch, rng, mask_fraction), ar_weight)

        loss, metrics = jax.lax.switch(a.canvas.branch(step), [branch(s) for s in a.canvas.distinct_sizes])
        return loss, dict(metrics, **values)

    def _reduce(self, terms: dict[str, Array], ar_weight) -> tuple[Float[Array, ""], Metrics]:
        train, elbo, scored, aux = terms["train"], terms["elbo"], terms["scored"], terms["aux"]
        diffusion = jnp.mean(train)
        metrics = {
            "diffusion_loss": diffusion,
            "elbo_bits_per_token": jnp.sum(elbo) / jnp.maximum(jnp.sum(scored), 1) / math.log(2),
        }
        loss = diffusion + aux_loss(aux)
        if "encoder_ar" in terms:
            loss = loss + ar_weight * jnp.mean(terms["encoder_ar"])
            metrics["encoder_ar_loss"] = jnp.mean(terms["encoder_ar"])
        return loss, dict(metrics, loss=loss, **moe_metrics(aux))

    def elbo_per_example(
        self, params, batch: dict[str, Array], rng: jax.Array
    ) -> tuple[Float[Array, " b"], Int[Array, " b"]]:
        """One Monte-Carlo draw of the negative ELBO of each example, in nats, over its scored positions (weights > 0
        and not fixed), and how many positions were scored: the estimator behind `elbo_bits_per_token`, per row
        (for conditional likelihoods: the context `fixed`, the continuation scored)."""
        terms = self._terms(params, batch, rng)
        b = batch["tokens"].shape[0]
        return terms["elbo"].reshape(b, -1).sum(-1), terms["scored"].reshape(b, -1).sum(-1)

    def train_loss_per_example(self, params, batch: dict[str, Array], rng: jax.Array) -> Float[Array, " b"]:
        """One draw of each example's training loss (`loss`: the ELBO per scored position, or a reweighted CE), whose
        batch mean is the diffusion part of `__call__`'s loss without adaptation schedules."""
        return self._terms(params, batch, rng)["train"]

    def _terms(self, params, batch: dict[str, Array], rng: jax.Array, mask_fraction=None) -> dict[str, Array]:
        x0: Int[Array, "b l"] = batch["tokens"]
        b, l = x0.shape
        t_key, noise_key, sc_key = jax.random.split(rng, 3)
        weights = batch.get("weights")
        token_mask = jnp.ones((b, l), bool) if weights is None else weights > 0
        fixed = batch.get("fixed")
        if fixed is not None and fixed.shape != (b, l):
            raise ValueError(f'batch["fixed"] must have the shape of batch["tokens"] {(b, l)}, got {fixed.shape}.')
        fixed = jnp.zeros((b, l), bool) if fixed is None else fixed.astype(bool)
        # Mask annealing draws from its own key, so the keys above (and the plain objective) are unchanged.
        anneal = None if mask_fraction is None else (mask_fraction, jax.random.fold_in(rng, _ANNEAL_STREAM))
        if self.canvas_len is None:
            return self._one_canvas(params, x0, token_mask, fixed, t_key, noise_key, sc_key, anneal)
        return self._blocks(params, x0, token_mask, fixed, t_key, noise_key, sc_key, anneal)

    def _one_canvas(self, params, x0, token_mask, fixed, t_key, noise_key, sc_key, anneal=None):
        b, l = x0.shape
        t = self.time_sampler(t_key, b)
        loss_mask = token_mask & ~fixed
        if self.token_shift:  # the first token has no token before it: it stays clean, as context
            loss_mask = loss_mask & shift_lib.first_scored(l)[None]
        xt, _ = self.process.corrupt(noise_key, x0, t, fixed=~loss_mask)

        mask = None if anneal is None else MaskAnnealing.mask(T.bidirectional_mask(token_mask), *anneal)

        def run(signal):
            return T.forward(self.model, params, xt, token_mask=token_mask, causal=False, mask=mask, sc_signal=signal)

        logits, aux = _decoder_with_self_conditioning(
            self.model, params, run, (b, l), sc_key, self.self_condition_prob, self.null_signal
        )
        if self.token_shift:
            logits = shift_lib.shift_sequence_logits(logits, None, l)
        train, elbo = _diffusion_loss(self.loss, self.process, logits, x0, xt, t, loss_mask)
        return dict(train=train, elbo=elbo, scored=jnp.sum(loss_mask, axis=-1), aux=aux)

    def _blocks(self, params, x0, token_mask, fixed, t_key, noise_key, sc_key, anneal=None):
        b, l = x0.shape
        c = self.canvas_len
        if l % c:
            raise ValueError(f"Sequence length {l} is not a multiple of canvas_len={c}.")
        n = l // c
        # Encoder: causal pass over the clean sequence; its KV cache is what every canvas reads.
        cache = init_cache(self.model.cfg, b, l)
        enc_logits, cache = T.append(self.model, params, x0, cache, token_mask=token_mask)

        # One time per (example, canvas), as BD3-LM; each canvas is corrupted on its own.
        t = self.time_sampler(t_key, b * n)
        scored = token_mask & ~fixed
        if self.token_shift:  # the first token has no token before it: it stays clean, as context
            scored = scored & shift_lib.first_scored(l)[None]
        x0_c, mask_c = x0.reshape(b * n, c), scored.reshape(b * n, c)
        xt_c, _ = self.process.corrupt(noise_key, x0_c, t, fixed=~mask_c)
        xt = xt_c.reshape(b, l)

        canvas_of = jnp.arange(l) // c
        prefix_mask = (canvas_of[None, :, None] > canvas_of[None, None, :]) & cache.valid[:, None, :]  # clean < k
        self_mask = (canvas_of[:, None] == canvas_of[None, :])[None] & token_mask[:, None, :]
        if anneal is not None:  # key j after query i is in the same canvas exactly where the diffusion mask allows it
            self_mask = MaskAnnealing.mask(jnp.broadcast_to(self_mask, (b, l, l)), *anneal)
        positions = T.positions_from_mask(token_mask)

        def run(signal):
            return T.decode_block(
                self.model,
                params,
                xt,
                cache,
                token_mask=token_mask,
                sc_signal=signal,
                prefix_mask=jnp.broadcast_to(prefix_mask, (b, l, l)),
                positions=positions,
                self_mask=self_mask,
            )

        logits, aux = _decoder_with_self_conditioning(
            self.model, params, run, (b, l), sc_key, self.self_condition_prob, self.null_signal
        )
        if self.token_shift:  # a canvas start reads the encoder's logits of the clean token before it
            logits = shift_lib.shift_sequence_logits(logits, enc_logits, c)
        train, elbo = _diffusion_loss(self.loss, self.process, logits.reshape(b * n, c, -1), x0_c, xt_c, t, mask_c)
        ar, _ = elbos.autoregressive_cross_entropy(enc_logits, x0, token_mask)
        return dict(train=train, elbo=elbo, scored=jnp.sum(mask_c, axis=-1), aux=aux, encoder_ar=ar)


@dataclasses.dataclass(frozen=True)
class CanvasSFTObjective:
    """DiffusionGemma's prompt -> response canvas SFT, without the reference's multi-canvas bug.

    The batch is `data.sft_canvases.collate_examples` of `CanvasChunker` outputs: prompt (b, P), prompt_mask, canvas
    (b, N*C), canvas_id, canvas_mask, num_canvases.
    """

    model: T.Transformer
    process: NoiseProcess
    canvas_len: int
    time_sampler: Any = UniformTimeSampler(1e-4, 1.0 - 1e-4)
    loss: DiffusionLoss = CanvasCE()
    encoder_ar_weight: float = 1.0
    self_condition_prob: float = 0.5
    null_signal: str = "mean_embedding"

    def __post_init__(self):
        self.loss.check(self.process)

    def pieces(
        self, params, batch: dict[str, Array], rng: jax.Array, selected: Int[Array, "b"] | None = None
    ) -> dict[str, Array]:
        """Every intermediate of the objective (used by the loss, and by tests)."""
        prompt, prompt_mask = batch["prompt"], batch["prompt_mask"].astype(bool)
        canvas, canvas_mask = batch["canvas"], batch["canvas_mask"].astype(bool)
        b, p = prompt.shape
        c = self.canvas_len
        n = canvas.shape[1] // c
        t_key, noise_key, pick_key, sc_key = jax.random.split(rng, 4)
        if selected is None:
            count = jnp.maximum(jnp.asarray(batch["num_canvases"]).reshape(b), 1)
            selected = jnp.floor(jax.random.uniform(pick_key, (b,)) * count).astype(jnp.int32)

        # Encoder: causal pass over [prompt; clean canvases] -> KV cache and AR logits.
        seq = jnp.concatenate([prompt, canvas], axis=1)
        seq_mask = jnp.concatenate([prompt_mask, canvas_mask], axis=1)
        cache = init_cache(self.model.cfg, b, p + n * c)
        enc_logits, cache = T.append(self.model, params, seq, cache, token_mask=seq_mask)

        # The selected clean canvas, its positions, and its corruption.
        take = lambda x: jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s * c, c))(x, selected)
        x0 = take(canvas)
        positions = take(T.positions_from_mask(seq_mask)[:, p:])
        t = self.time_sampler(t_key, b)
        xt, _ = self.process.corrupt(noise_key, x0, t)

        slot_canvas = jnp.concatenate([jnp.full((p,), -1), jnp.arange(n * c) // c])  # -1 for prompt slots
        visible = (slot_canvas[None, :] < selected[:, None]) & seq_mask  # prompt + clean canvases < s
        prefix_mask = jnp.broadcast_to(visible[:, None, :], (b, c, p + n * c))

        def run(signal):
            return T.decode_block(
                self.model, params, xt, cache, sc_signal=signal, prefix_mask=prefix_mask, positions=positions
            )

        logits, aux = _decoder_with_self_conditioning(
            self.model, params, run, (b, c), sc_key, self.self_condition_prob, self.null_signal
        )
        return dict(
            cache=cache,
            encoder_logits=enc_logits,
            seq=seq,
            seq_mask=seq_mask,
            selected=selected,
            x0=x0,
            xt=xt,
            t=t,
            positions=positions,
            logits=logits,
            aux=aux,
        )

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        out = self.pieces(params, batch, rng)
        b, c = out["x0"].shape
        canvas_loss_mask = jnp.ones((b, c), bool)  # every position of the selected canvas, EOS fill included
        train, elbo = _diffusion_loss(
            self.loss, self.process, out["logits"], out["x0"], out["xt"], out["t"], canvas_loss_mask
        )
        ar, _ = elbos.autoregressive_cross_entropy(out["encoder_logits"], out["seq"], out["seq_mask"])
        diffusion = jnp.mean(train)
        loss = diffusion + self.encoder_ar_weight * jnp.mean(ar) + aux_loss(out["aux"])
        metrics = {
            "loss": loss,
            "diffusion_loss": diffusion,
            "encoder_ar_loss": jnp.mean(ar),
            "elbo_bits_per_token": jnp.sum(elbo) / (b * c) / math.log(2),
        }
        return loss, dict(metrics, **moe_metrics(out["aux"]))


@dataclasses.dataclass(frozen=True)
class AutoregressiveObjective:
    """Next-token cross-entropy with a causal pass: the baseline on the same backbone."""

    model: T.Transformer
    loss: ArCE = ArCE()

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        del rng
        tokens = batch["tokens"]
        weights = batch.get("weights")
        token_mask = jnp.ones(tokens.shape, bool) if weights is None else weights > 0
        logits, aux = T.forward(self.model, params, tokens, token_mask=token_mask, causal=True)
        per_example, count = self.loss(logits, tokens, token_mask)
        nats = jnp.sum(per_example * count) / jnp.maximum(jnp.sum(count), 1)
        loss = jnp.mean(per_example) + aux_loss(aux)
        return loss, dict({"loss": loss, "ar_loss": nats, "nll_bits_per_token": nats / math.log(2)}, **moe_metrics(aux))


def aux_loss(aux: Metrics) -> Float[Array, ""]:
    return aux.get("moe_load_balance_loss", 0.0) + aux.get("moe_router_z_loss", 0.0)


def moe_metrics(aux: Metrics) -> Metrics:
    return {k: v for k, v in aux.items() if k.startswith("moe_")}
