"""SFT example layout for block diffusion: a BOS-prefixed prompt and a response cut into fixed-size canvases.

Follows DiffusionGemma's ``CanvasChunker`` (google-deepmind/gemma HDA ``data/data.py``; see
docs/reference.md §3.1): the response is truncated to ``N*C`` tokens, the last non-empty canvas
is filled with EOS to its end, later canvases are PAD, ``canvas_id = repeat(arange(N), C)`` and ``canvas_mask``
is True on every token of a non-empty canvas (EOS fill included). The prompt is BOS followed by the prompt ids,
right-padded to ``prompt_len``.

Deliberate differences from the reference:
- An EOS is always written when there is room: the chunker appends EOS to the response (unless it already ends
  with one) before cutting it into canvases. A response that exactly fills ``k < N`` canvases therefore gets one
  more canvas made entirely of EOS (so the model learns to stop); the reference leaves it without any EOS. Only a
  response of ``N*C`` tokens or more (truncated) has no EOS.
- A prompt longer than ``prompt_len - 1`` raises ValueError instead of being silently cut; with
  ``truncate_prompt=True`` the *last* ``prompt_len - 1`` prompt tokens are kept after BOS (the end of a prompt, the
  question/turn marker, matters most; the reference's right-truncation can drop ``<|turn>model``).
- PAD inside a prompt or response is rejected: validity of a canvas is read from its tokens downstream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, PAD_ID


def _as_ids(ids, name: str) -> np.ndarray:
    array = np.asarray(ids)
    if array.size == 0:
        return np.zeros((0,), np.int32)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D sequence of integer token ids, got shape {array.shape}, {array.dtype}.")
    return array.astype(np.int32)


@dataclasses.dataclass(frozen=True)
class CanvasChunker:
    """Build one SFT example ``{prompt, prompt_mask, canvas, canvas_id, canvas_mask, num_canvases}``.

    Shapes: ``prompt``/``prompt_mask`` (P,), ``canvas``/``canvas_id``/``canvas_mask`` (N*C,), ``num_canvases`` ()
    = number of non-empty canvases (>= 1).
    """

    prompt_len: int
    num_canvases: int
    canvas_len: int
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    truncate_prompt: bool = False

    def __post_init__(self):
        for name in ("prompt_len", "num_canvases", "canvas_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"CanvasChunker.{name} must be >= 1, got {getattr(self, name)}.")
        if len({self.eos_id, self.pad_id, self.bos_id}) != 3:
            raise ValueError(f"eos_id, pad_id, bos_id must differ, got {self.eos_id}, {self.pad_id}, {self.bos_id}.")

    @property
    def total_canvas_len(self) -> int:
        return self.num_canvases * self.canvas_len

    def __call__(
        self, prompt_ids: Sequence[int] | np.ndarray, response_ids: Sequence[int] | np.ndarray
    ) -> dict[str, np.ndarray]:
        prompt_body = _as_ids(prompt_ids, "prompt_ids")
        response = _as_ids(response_ids, "response_ids")
        for name, ids in (("prompt_ids", prompt_body), ("response_ids", response)):
            if (ids == self.pad_id).any():
                raise ValueError(f"{name} contains the PAD id {self.pad_id}; pass unpadded token ids.")

        room = self.prompt_len - 1  # after BOS
        if prompt_body.shape[0] > room:
            if not self.truncate_prompt:
                raise ValueError(
                    f"prompt has {prompt_body.shape[0]} tokens + BOS = {prompt_body.shape[0] + 1} > prompt_len="
                    f"{self.prompt_len}; raise prompt_len, shorten the prompt, or pass truncate_prompt=True "
                    f"(keeps the last {room} prompt tokens)."
                )
            prompt_body = prompt_body[prompt_body.shape[0] - room :]
        prompt_used = 1 + prompt_body.shape[0]
        prompt = np.full((self.prompt_len,), self.pad_id, np.int32)
        prompt[0] = self.bos_id
        prompt[1:prompt_used] = prompt_body
        prompt_mask = np.arange(self.prompt_len) < prompt_used

        total = self.total_canvas_len
        if response.shape[0] == 0 or response[-1] != self.eos_id:
            response = np.concatenate([response, np.array([self.eos_id], np.int32)])
        content = response[:total]
        filled_canvases = max(1, -(-content.shape[0] // self.canvas_len))
        filled_len = filled_canvases * self.canvas_len
        canvas = np.full((total,), self.pad_id, np.int32)
        canvas[:filled_len] = self.eos_id
        canvas[: content.shape[0]] = content
        return {
            "prompt": prompt,
            "prompt_mask": prompt_mask,
            "canvas": canvas,
            "canvas_id": np.repeat(np.arange(self.num_canvases, dtype=np.int32), self.canvas_len),
            "canvas_mask": np.arange(total) < filled_len,
            "num_canvases": np.int32(filled_canvases),
        }


def collate_examples(examples: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack examples with identical keys and shapes into a batch (leading axis = example)."""
    if not examples:
        raise ValueError("collate_examples needs at least one example.")
    keys = set(examples[0])
    for i, example in enumerate(examples):
        if set(example) != keys:
            raise ValueError(f"example {i} has keys {sorted(example)}, expected {sorted(keys)}.")
    try:
        return {key: np.stack([np.asarray(example[key]) for example in examples]) for key in examples[0]}
    except ValueError as error:
        raise ValueError(f"examples have different shapes ({error}); build them with one CanvasChunker.") from error


def canvas_batch_shapes(chunker: CanvasChunker, batch_size: int) -> dict[str, tuple[int, ...]]:
    """Shapes of a collated batch, e.g. for building abstract inputs before data arrives."""
    return {
        "prompt": (batch_size, chunker.prompt_len),
        "prompt_mask": (batch_size, chunker.prompt_len),
        "canvas": (batch_size, chunker.total_canvas_len),
        "canvas_id": (batch_size, chunker.total_canvas_len),
        "canvas_mask": (batch_size, chunker.total_canvas_len),
        "num_canvases": (batch_size,),
    }
