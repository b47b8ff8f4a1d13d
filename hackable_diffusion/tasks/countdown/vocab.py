"""The Countdown vocabulary: one fixed character per id, shared by the prompt and the completion.

The toolbox-wide specials keep their ids (PAD, EOS, BOS, MASK = 0..3); then the digits 0-9 (ids 4..13), the operators
and parentheses `+ - * / ( )` (14..19), the separator `,` between the given numbers and `=` before the target (20,
21): 22 ids in all. A prompt reads "3,7,25,50=75", a completion "(50-25)*3" followed by EOS. Decoding skips the
specials and ends at the first EOS or PAD; `strict_text` is the decoding a reward uses, which refuses a row that holds
any other special or an unknown id before its end.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Int

from hackable_diffusion.data.tokenizers import EOS_ID, MASK_ID, PAD_ID

CHARACTERS = "0123456789+-*/(),="
FIRST_CHARACTER_ID = MASK_ID + 1
VOCAB_SIZE = FIRST_CHARACTER_ID + len(CHARACTERS)
ID_OF = {ch: FIRST_CHARACTER_ID + i for i, ch in enumerate(CHARACTERS)}
END_IDS = (EOS_ID, PAD_ID)  # a text ends at the first of these


@dataclasses.dataclass(frozen=True)
class CountdownVocab:
    """Strings of `CHARACTERS` <-> token ids: the specials at 0..3, character k of `CHARACTERS` at 4 + k."""

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        """One id per character; a character outside the vocabulary raises ValueError."""
        unknown = sorted({ch for ch in text if ch not in ID_OF})
        if unknown:
            raise ValueError(f"characters {unknown} are not in the Countdown vocabulary {CHARACTERS!r}.")
        return [ID_OF[ch] for ch in text]

    def encode_padded(self, text: str, length: int, *, eos: bool = False) -> Int[np.ndarray, " length"]:
        """`text` (then EOS when `eos`) right-padded with PAD to `length` ids; ValueError when it does not fit."""
        ids = self.encode(text) + ([EOS_ID] if eos else [])
        if len(ids) > length:
            raise ValueError(f"{text!r} takes {len(ids)} tokens{' with EOS' if eos else ''}; the row holds {length}.")
        return np.asarray(ids + [PAD_ID] * (length - len(ids)), np.int32)

    def decode(self, ids: Int[np.ndarray, " n"]) -> str:
        """The characters up to the first EOS or PAD; the other specials and unknown ids are skipped."""
        out = []
        for token in np.asarray(ids).reshape(-1).tolist():
            if token in END_IDS:
                break
            if FIRST_CHARACTER_ID <= token < VOCAB_SIZE:
                out.append(CHARACTERS[token - FIRST_CHARACTER_ID])
        return "".join(out)

    def strict_text(self, ids: Int[np.ndarray, " n"]) -> str | None:
        """The characters up to the first EOS or PAD, or None when BOS, MASK or an id outside the vocabulary comes
        before it (a completion with a hole is no answer)."""
        out = []
        for token in np.asarray(ids).reshape(-1).tolist():
            if token in END_IDS:
                break
            if not FIRST_CHARACTER_ID <= token < VOCAB_SIZE:
                return None
            out.append(CHARACTERS[token - FIRST_CHARACTER_ID])
        return "".join(out)
