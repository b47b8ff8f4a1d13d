"""The Sudoku rules as a logit constraint: no digit twice in a row, column or box.

On the 81-cell canvas (position i = cell i, digits as `vocab.FIRST_DIGIT_ID`..), a cell may not take a digit that a
decided cell of its row, column or box already holds. Decided = fixed (the givens) or, with a masking process,
committed. A cell whose every digit is excluded (a dead end: an earlier decision was wrong) is left unconstrained, so
the step still has a distribution to draw from and the grid's conflict shows in the result, where the solver's
repairs and restarts act on it. Not in DiffusionGemma, Ye et al. 2024 or Kim et al. 2025 (their samplers use the
model alone): `config.solver.rules=True`, reported apart from the model-only figures.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool

from hackable_diffusion.sampling.constraints import LogitConstraint
from hackable_diffusion.tasks.sudoku.structure import grid_units
from hackable_diffusion.tasks.sudoku.vocab import FIRST_DIGIT_ID


def same_unit_matrix(side: int = 9) -> Bool[np.ndarray, "n n"]:
    """(side^2, side^2) bool: cells i != j that share a row, a column or a box (NumPy: a constant that modules build
    at import, which must not start jax's backend)."""
    if round(side**0.5) ** 2 != side:
        raise ValueError(f"a Sudoku side must be a square number (4, 9, 16, ...), got {side}.")
    row, col, box = grid_units(np.arange(side * side), side)
    same = (row[:, None] == row[None]) | (col[:, None] == col[None]) | (box[:, None] == box[None])
    return same & ~np.eye(side * side, dtype=bool)


@dataclasses.dataclass(frozen=True)
class SudokuRules(LogitConstraint):
    """No digit twice in a row, column or box (see the module docstring); canvas position i is cell i."""

    first_digit_id: int = FIRST_DIGIT_ID
    side: int = 9

    def __call__(self, canvas, decided, vocab_size):
        b, c = canvas.shape
        n = self.side
        if c != n * n:
            raise ValueError(f"SudokuRules: the canvas has {c} positions; a {n} x {n} grid has {n * n} cells.")
        if self.first_digit_id + n > vocab_size:
            raise ValueError(
                f"SudokuRules: digit ids {self.first_digit_id}..{self.first_digit_id + n - 1} exceed the vocabulary "
                f"of {vocab_size}."
            )
        same = jnp.asarray(same_unit_matrix(n), jnp.float32)
        digit = canvas - self.first_digit_id
        held = decided & (digit >= 0) & (digit < n)
        onehot = (digit[..., None] == jnp.arange(n)) & held[..., None]  # (b, c, n)
        taken = jnp.einsum("ij,bjd->bid", same, onehot.astype(jnp.float32)) > 0
        taken = taken & ~jnp.all(taken, axis=-1, keepdims=True)  # a dead-end cell stays unconstrained
        excluded = jnp.zeros((b, c, vocab_size), bool)
        return excluded.at[..., self.first_digit_id : self.first_digit_id + n].set(taken)
