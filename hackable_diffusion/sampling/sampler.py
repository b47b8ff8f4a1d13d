"""The sampler's configuration: `DiffusionSampler`, every piece that defines how a canvas is denoised.

Its defaults are DiffusionGemma's (docs/reference.md §2.1; google-deepmind/gemma `gemma/diffusion/_sampler.py`)
except the process: the entropy-bound selection rule, the annealed temperature, the reference's early stopping, 48
steps and canvases of 256. The pieces are small frozen dataclasses, so a sampler is a static jit argument of the
canvas loop (`canvas.py`), which runs it; one config line swaps any of them (`builders.build_sampler`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.diffusion.processes import MaskingProcess, NoiseProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.self_conditioning import NULL_SIGNALS
from hackable_diffusion.sampling.constraints import LogitConstraint
from hackable_diffusion.sampling.draws import BlockedInverseCdf, GumbelMax
from hackable_diffusion.sampling.early_stopping import EarlyStopping, diffusiongemma_early_stopping
from hackable_diffusion.sampling.keys import row_keys
from hackable_diffusion.sampling.scores import NEG_LOGIT
from hackable_diffusion.sampling.selection import EntropyBound
from hackable_diffusion.sampling.selection_base import SelectionRule
from hackable_diffusion.sampling.temperature import AnnealedTemperature, Temperature
from hackable_diffusion.sampling.views import PermutationViews


@dataclasses.dataclass(frozen=True)
class DiffusionSampler:
    """Everything that defines how a canvas is denoised; defaults are DiffusionGemma's (docs/reference.md §2.1) except the process.

    self_conditioning: None = use it iff the model has a self-conditioner; True = require it; False = feed the null
      signal at every step (a model without a self-conditioner gets plain token embeddings).
    score_temperature: None = the selection rule scores the temperature-shaped logits the tokens are drawn from
      (DiffusionGemma: entropies of the annealed distribution); a float = it scores logits / score_temperature
      instead (1.0: the model's own probabilities, as Kim et al. 2025 rank by, while tokens are drawn near-greedily).
      A near-zero sampling temperature saturates every confidence at 1 and every entropy at 0, so the ranking then
      degenerates to ties broken by position (left to right); scoring at 1.0 keeps the model's ranking.
    sc_temperature: None = the self-conditioning signal fed to the next step is the expected embedding under the
      temperature-shaped logits (docs/reference.md §1.6); a float = under `biased logits / sc_temperature` instead (the
      logit bias and any constraint applied; 1.0 = the model's own probabilities, which is what training feeds back:
      the first pass's raw logits). Only matters for a model with a self-conditioner; a near-zero sampling temperature
      (a puzzle task drawing at 0.1) otherwise feeds back near one-hot beliefs the model never saw in training.
    views: None = one model call per step; PermutationViews = the step's logits are the mean log-probabilities of the
      model over K relabelled copies of the canvas, batched (views.py; K x the FLOPs, the same number of passes). The
      cached prefix is shared, not relabelled: meant for a task solved in place on an empty cache (a grid puzzle).
    draw: how each position's candidate is drawn from the shaped logits (draws.py): `GumbelMax()` as the reference,
      or `BlockedInverseCdf()`, the same distribution at a fraction of the cost (other tokens for the same key).
    vocab_chunk: 0 = the step computes on whole-vocabulary arrays (several float32 [b, c, v] temporaries at once);
      N > 0 = it scans the vocabulary in chunks of N ids (vocab_chunks.py), holding [b, c, N] ones: the same
      candidates for the same keys, scores and self-conditioning equal to float32 rounding. Needs a selection rule and
      early stopping that read the logits only through entropies, confidences, margins and argmaxes (`chunkable()`,
      every built-in one), no `views`, and with `BlockedInverseCdf` a multiple of its block.
    commit: uniform process only: accepted tokens stay decided (as under a masking process) and each step re-noises
      only the free positions not yet decided; False = the reference, every free position re-decided at every step.
    token_shift: the model was trained with the token shift (diffusion/token_shift.py, `diffusion.token_shift`):
      position j of the canvas reads the model's logits at j - 1 and position 0 the logits of the last real token
      before the canvas, which `denoise_canvas` then needs (`before_logits`; `generate` keeps them). Not with `views`
      or self-conditioning.
    """

    process: NoiseProcess
    selection: SelectionRule = EntropyBound(0.1)
    temperature: Temperature = AnnealedTemperature()
    early_stopping: EarlyStopping = diffusiongemma_early_stopping()
    num_steps: int = 48
    canvas_length: int = 256
    self_conditioning: bool | None = None
    null_signal: str = "zeros"
    forbidden_tokens: tuple[int, ...] = ()
    score_temperature: float | None = None
    sc_temperature: float | None = None
    constraint: LogitConstraint | None = None
    views: PermutationViews | None = None
    draw: GumbelMax | BlockedInverseCdf = GumbelMax()
    vocab_chunk: int = 0
    token_shift: bool = False
    commit: bool = False

    def __post_init__(self):
        checks = (
            ("process", NoiseProcess),
            ("selection", SelectionRule),
            ("temperature", Temperature),
            ("early_stopping", EarlyStopping),
        )
        for name, kind in checks:
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"DiffusionSampler.{name} must be a {kind.__name__}, got {getattr(self, name)!r}.")
        for name in ("num_steps", "canvas_length"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"DiffusionSampler.{name} must be an int >= 1, got {value!r}.")
        if self.null_signal not in NULL_SIGNALS:
            raise ValueError(f"DiffusionSampler.null_signal must be one of {NULL_SIGNALS}, got {self.null_signal!r}.")
        if not isinstance(self.draw, (GumbelMax, BlockedInverseCdf)):
            raise ValueError(f"DiffusionSampler.draw must be GumbelMax() or BlockedInverseCdf(), got {self.draw!r}.")
        if self.selection.remasks and not self.persistent:
            raise ValueError(
                f"{type(self.selection).__name__} re-masks committed tokens and needs a MaskingProcess, "
                f"got {type(self.process).__name__}."
            )
        forbidden = tuple(int(i) for i in self.forbidden_tokens)
        bad = [i for i in forbidden if not 0 <= i < self.process.vocab_size]
        if bad:
            raise ValueError(f"DiffusionSampler.forbidden_tokens {bad} are outside [0, {self.process.vocab_size}).")
        object.__setattr__(self, "forbidden_tokens", forbidden)
        if self.constraint is not None and not isinstance(self.constraint, LogitConstraint):
            raise ValueError(f"DiffusionSampler.constraint must be a LogitConstraint or None, got {self.constraint!r}.")
        if self.views is not None:
            if not isinstance(self.views, PermutationViews):
                raise ValueError(f"DiffusionSampler.views must be PermutationViews or None, got {self.views!r}.")
            if self.views.vocab_size != self.process.vocab_size:
                raise ValueError(
                    f"DiffusionSampler.views relabel {self.views.vocab_size} token ids, the process has "
                    f"{self.process.vocab_size}."
                )
        if self.sc_temperature is not None and not self.sc_temperature > 0:
            raise ValueError(
                f"DiffusionSampler.sc_temperature must be None (feed back the sampling distribution) or > 0, got "
                f"{self.sc_temperature!r}."
            )
        if self.score_temperature is not None and not self.score_temperature > 0:
            raise ValueError(
                f"DiffusionSampler.score_temperature must be None (score the sampling distribution) or > 0, got "
                f"{self.score_temperature!r}."
            )
        if self.commit and self.persistent:
            raise ValueError(
                "DiffusionSampler.commit keeps a uniform sampler's accepted tokens; a masking process always keeps "
                "them: leave commit=False."
            )
        if self.token_shift and self.views is not None:
            raise ValueError(
                "DiffusionSampler.token_shift reads each position's logits from its left neighbour; relabelled views "
                "(a grid puzzle solved in place) have no such order. Use views=None or token_shift=False."
            )
        self._check_vocab_chunk()

    def _check_vocab_chunk(self):
        chunk = self.vocab_chunk
        if not isinstance(chunk, (int, np.integer)) or isinstance(chunk, bool) or chunk < 0:
            raise ValueError(f"DiffusionSampler.vocab_chunk must be an int >= 0 (0 = off), got {chunk!r}.")
        object.__setattr__(self, "vocab_chunk", int(chunk))
        if not chunk:
            return
        if not self.selection.chunkable():
            raise ValueError(
                f"DiffusionSampler.vocab_chunk: the selection rule {self.selection!r} may read the whole distribution "
                f"and cannot be computed in vocabulary chunks; use vocab_chunk=0."
            )
        if not self.early_stopping.chunkable():
            raise ValueError(
                f"DiffusionSampler.vocab_chunk: the early-stopping rule {self.early_stopping!r} may read the whole "
                f"distribution and cannot be computed in vocabulary chunks; use vocab_chunk=0."
            )
        if self.views is not None:
            raise ValueError(
                "DiffusionSampler.vocab_chunk cannot be combined with views (each view's log-probabilities are a "
                "[b, c, v] array of their own); use vocab_chunk=0."
            )
        v = self.process.vocab_size
        if isinstance(self.draw, BlockedInverseCdf) and chunk < v and chunk % min(self.draw.block, v):
            raise ValueError(
                f"DiffusionSampler.vocab_chunk {chunk} must be a multiple of BlockedInverseCdf.block "
                f"{self.draw.block} (or >= the vocabulary, {v})."
            )

    @classmethod
    def diffusiongemma(cls, vocab_size: int, **overrides: Any) -> DiffusionSampler:
        """The reference sampler: uniform process over the whole vocabulary, entropy bound 0.1, annealed 0.8 -> 0.4,
        stability AND entropy <= 0.005, 48 steps, canvases of 256."""
        return cls(process=UniformProcess(vocab_size, LinearSchedule()), **overrides)

    def replace(self, **changes: Any) -> DiffusionSampler:
        return dataclasses.replace(self, **changes)

    @property
    def persistent(self) -> bool:
        """True for a masking process: decided tokens stay decided."""
        return isinstance(self.process, MaskingProcess)

    @property
    def keeps_decisions(self) -> bool:
        """True when accepted tokens stay: a masking process, or a uniform one with `commit`."""
        return self.persistent or self.commit

    def uses_self_conditioning(self, model: T.Transformer) -> bool:
        if self.self_conditioning and not model.cfg.self_conditioning:
            raise ValueError(
                "DiffusionSampler.self_conditioning=True but the model has no self-conditioner "
                "(model.self_conditioning=False); set it to None or False."
            )
        return model.cfg.self_conditioning if self.self_conditioning is None else self.self_conditioning

    def logit_bias(self) -> Float[Array, "v"]:
        """0 for allowed tokens, -1e30 for forbidden ones (and the mask token of a masking process)."""
        bias = np.zeros(self.process.vocab_size, np.float32)
        bias[list(self.forbidden_tokens)] = NEG_LOGIT
        if self.persistent:
            bias[self.process.mask_id] = NEG_LOGIT
        return jnp.asarray(bias)

    def initial_canvas(
        self,
        keys: Array,
        batch_size: int,
        *,
        fixed: Bool[Array, "b c"] | None = None,
        fixed_tokens: Int[Array, "b c"] | None = None,
    ) -> Int[Array, "b c"]:
        """A canvas drawn from the prior (one key per row), with `fixed_tokens` written where `fixed`."""
        keys = row_keys(keys, batch_size)
        canvas = jax.vmap(lambda k: self.process.prior_sample(k, (self.canvas_length,)))(keys).astype(jnp.int32)
        if fixed is not None:
            if fixed_tokens is None:
                raise ValueError("fixed was given without fixed_tokens (the tokens to keep at those positions).")
            canvas = jnp.where(fixed, jnp.asarray(fixed_tokens, jnp.int32), canvas)
        return canvas
