"""The three ways a Sudoku run lays a puzzle out for the backbone, chosen by `config.diffusion.objective`.

* in_place (`pretrain`): one bidirectional canvas of 81 cells, givens fixed, blanks noised (Ye et al. 2024; Kim et
  al. 2025). Masking process only: givens are fixed tokens and blanks start masked.
* canvas (`sft`): DiffusionGemma's layout, the puzzle (blanks as MASK) a causal prompt of 81 tokens and the solution
  one 81-cell canvas denoised against the prompt's KV cache (`SudokuCanvasObjective`; either process).
* ar (`ar`): the same [puzzle; solution] sequence, causal, the solution's cells predicted left to right
  (`SudokuAutoregressiveObjective`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
from jax import Array
from jaxtyping import Bool, Int

from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.diffusion.training_losses import ArCE
from hackable_diffusion.models import transformer as T

LAYOUTS = {"pretrain": "in_place", "sft": "canvas", "ar": "ar"}


def layout_of(config: ml_collections.ConfigDict) -> str:
    """ "in_place", "canvas" or "ar", from `config.diffusion.objective` (process "none" is the AR layout)."""
    objective = "ar" if config.diffusion.process == "none" else config.diffusion.objective
    if objective not in LAYOUTS:
        raise ValueError(f"config.diffusion.objective={objective!r} must be one of {sorted(LAYOUTS)} for Sudoku.")
    return LAYOUTS[objective]


def check_layout(config: ml_collections.ConfigDict) -> str:
    """The layout, after checking that the process and canvas length fit it."""
    layout = layout_of(config)
    d = config.diffusion
    if layout == "in_place" and d.process != "masking":
        raise ValueError(
            "Sudoku in place (objective='pretrain') needs config.diffusion.process='masking' (givens are fixed "
            f"tokens, blanks start masked); got {d.process!r}. For a uniform process use the canvas layout: "
            "config.diffusion.objective='sft' (configs/sudoku_canvas.py)."
        )
    if layout == "in_place" and d.canvas_len:
        raise ValueError("Sudoku in place is one canvas of 81 cells: set config.diffusion.canvas_len=0.")
    if layout == "canvas" and d.canvas_len != 81:
        raise ValueError(
            "The Sudoku canvas layout denoises the solution as one canvas: set config.diffusion.canvas_len=81."
        )
    return layout


def puzzle_prompt(tokens: Int[Array, "b 81"], fixed: Bool[Array, "b 81"]) -> Int[Array, "b 81"]:
    """The puzzle as a prompt: the givens' tokens, MASK at the blanks."""
    return jnp.where(fixed, tokens, MASK_ID).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class SudokuCanvasObjective:
    """`CanvasSFTObjective` on Sudoku rows: prompt = the puzzle, one canvas = the solution (givens included, so the
    decoder learns to copy them from the prompt)."""

    inner: obj_lib.CanvasSFTObjective

    @property
    def loss(self):
        return self.inner.loss

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array):
        tokens, fixed = batch["tokens"], batch["fixed"]
        b, n = tokens.shape
        sft_batch = {
            "prompt": puzzle_prompt(tokens, fixed),
            "prompt_mask": jnp.ones((b, n), bool),
            "canvas": tokens,
            "canvas_id": jnp.zeros((b, n), jnp.int32),
            "canvas_mask": jnp.ones((b, n), bool),
            "num_canvases": jnp.ones((b,), jnp.int32),
        }
        return self.inner(params, sft_batch, rng)


@dataclasses.dataclass(frozen=True)
class SudokuAutoregressiveObjective:
    """Causal next-token loss over [puzzle; solution], counted on the 81 solution cells only."""

    model: T.Transformer
    loss: ArCE = ArCE()

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array):
        del rng
        tokens, fixed = batch["tokens"], batch["fixed"]
        b, n = tokens.shape
        seq = jnp.concatenate([puzzle_prompt(tokens, fixed), tokens], axis=1)
        logits, aux = T.forward(self.model, params, seq, causal=True)
        targets = jnp.concatenate([jnp.zeros((b, n), bool), jnp.ones((b, n), bool)], axis=1)
        per_example, _ = self.loss(logits, seq, targets)
        nats = jnp.mean(per_example)
        loss = nats + obj_lib.aux_loss(aux)
        return loss, {"loss": loss, "ar_loss": nats, "nll_bits_per_token": nats / math.log(2)}


def adapt_objective(config: ml_collections.ConfigDict, model: T.Transformer, objective):
    """The generic objective for the layout: in place as is (rows carry `fixed`), wrapped for the canvas layout,
    replaced for the AR layout."""
    layout = layout_of(config)
    if layout == "canvas":
        return SudokuCanvasObjective(objective)
    if layout == "ar":
        return SudokuAutoregressiveObjective(model)
    return objective
