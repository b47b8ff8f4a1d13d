"""The Sudoku grid as a structure prior of the backbone (`models/structure.py`): each position is a cell
(position mod side^2) with a row, a column and a box, so a canvas after a prompt repeats the prompt's cells.

Importing this module registers the structure `grid` (`model.structure="grid:9"` for a 9 x 9 puzzle); `grid_prior`
gives the model fields that switch it on.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
from jaxtyping import Array, Int

from hackable_diffusion.models.structure import register_structure


def grid_units(positions: Int[Array, "*b"], side: int) -> tuple[Int[Array, "*b"], Int[Array, "*b"], Int[Array, "*b"]]:
    """Row, column and box (0..side-1) of each position's cell on a side x side grid (cell = position mod side^2);
    NumPy in, NumPy out."""
    box = round(side**0.5)
    cell = positions % (side * side)
    row, col = cell // side, cell % side
    return row, col, (row // box) * box + col // box


@dataclasses.dataclass(frozen=True)
class GridStructure:
    """Rows, columns and boxes of a side x side grid with sqrt(side) x sqrt(side) boxes."""

    side: int
    name: ClassVar[str] = "grid"
    units: ClassVar[tuple[str, ...]] = ("row", "column", "box")

    def __post_init__(self):
        if self.side < 1 or round(self.side**0.5) ** 2 != self.side:
            raise ValueError(f"model.structure='grid:{self.side}': the side must be a square (4, 9, 16, ...).")

    @property
    def sizes(self) -> tuple[int, ...]:
        return (self.side,) * 3

    def unit_indices(self, positions: Int[Array, "*b"]) -> tuple[Int[Array, "*b"], ...]:
        return grid_units(positions, self.side)


def _grid(argument: str) -> GridStructure:
    if not argument.isdigit():
        raise ValueError(f"model.structure='grid:{argument}' needs the grid side, e.g. 'grid:9'.")
    return GridStructure(int(argument))


register_structure(GridStructure.name, _grid)


def grid_prior(side: int = 9, attention_bias: float = 0.0) -> dict[str, Any]:
    """The model fields of the grid prior: row/column/box embeddings, and the relation bias when `attention_bias` > 0."""
    return dict(structure=f"grid:{side}", structure_embeddings=True, structure_attention_bias=attention_bias)
