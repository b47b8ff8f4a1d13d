"""The Sudoku vocabulary: the one token layout every part of the task uses.

DiffusionGemma's specials keep their toolbox-wide ids (PAD, EOS, BOS, MASK = 0..3) and digit d (1..9) is id d + 3
(4..12), 13 ids in all. A grid of digits (0 = blank) becomes tokens with its blanks as MASK; a decoded grid maps every
non-digit id back to a blank. The rules constraint and the symmetry views relabel ids FIRST_DIGIT_ID..LAST_DIGIT_ID.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Int

from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, PAD_ID

FIRST_DIGIT_ID = MASK_ID + 1  # digit 1; digit d is FIRST_DIGIT_ID + d - 1
LAST_DIGIT_ID = FIRST_DIGIT_ID + 8
VOCAB_SIZE = LAST_DIGIT_ID + 1
NON_DIGIT_IDS = (PAD_ID, EOS_ID, BOS_ID, MASK_ID)  # never written into a grid by a solver


@dataclasses.dataclass(frozen=True)
class SudokuVocab:
    """Grids of digits (0 = blank) <-> token ids: the specials at 0..3, digit d at FIRST_DIGIT_ID + d - 1."""

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def encode(self, grids: Int[np.ndarray, "*b 81"]) -> Int[np.ndarray, "*b 81"]:
        """Digits -> ids 4..12, blanks (0) -> MASK_ID; int32."""
        g = np.asarray(grids).astype(np.int32)
        if g.shape[-1:] != (81,) or g.min(initial=0) < 0 or g.max(initial=0) > 9:
            raise ValueError(f"grids must be (..., 81) with cells 0 (blank) .. 9, got shape {g.shape}.")
        return np.where(g == 0, np.int32(MASK_ID), g + FIRST_DIGIT_ID - 1).astype(np.int32)

    def decode(self, tokens: Int[np.ndarray, "*b 81"]) -> Int[np.ndarray, "*b 81"]:
        """Ids 4..12 -> digits 1..9, every other id -> blank (0); int8."""
        t = np.asarray(tokens)
        digit = (t >= FIRST_DIGIT_ID) & (t <= LAST_DIGIT_ID)
        return np.where(digit, t - FIRST_DIGIT_ID + 1, 0).astype(np.int8)
