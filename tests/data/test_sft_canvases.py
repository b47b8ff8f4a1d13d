"""Prompt -> response canvases for SFT (`data/sft_canvases.py`): layout, EOS at a canvas boundary, truncation, collation."""

import numpy as np
import pytest

from hackable_diffusion.data import sft_canvases as canvas
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, PAD_ID


def test_chunker_layout_partial_response():
    chunker = canvas.CanvasChunker(prompt_len=5, num_canvases=3, canvas_len=4)
    example = chunker([10, 11], [20, 21, 22, 23, 24])
    np.testing.assert_array_equal(example["prompt"], [BOS_ID, 10, 11, PAD_ID, PAD_ID])
    np.testing.assert_array_equal(example["prompt_mask"], [True, True, True, False, False])
    np.testing.assert_array_equal(example["canvas"], [20, 21, 22, 23, 24, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(example["canvas_id"], [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(example["canvas_mask"], [True] * 8 + [False] * 4)
    assert int(example["num_canvases"]) == 2
    assert example["canvas"].dtype == example["prompt"].dtype == np.int32


def test_chunker_eos_at_canvas_boundary_and_truncation():
    chunker = canvas.CanvasChunker(prompt_len=3, num_canvases=3, canvas_len=2)
    exact = chunker([], [20, 21, 22, 23])  # fills 2 canvases exactly: the 3rd becomes all EOS
    np.testing.assert_array_equal(exact["canvas"], [20, 21, 22, 23, 1, 1])
    assert int(exact["num_canvases"]) == 3 and exact["canvas_mask"].all()
    np.testing.assert_array_equal(exact["prompt"], [BOS_ID, PAD_ID, PAD_ID])
    truncated = chunker([], list(range(20, 28)))  # 8 tokens > 6: cut, no room for EOS
    np.testing.assert_array_equal(truncated["canvas"], [20, 21, 22, 23, 24, 25])
    assert int(truncated["num_canvases"]) == 3
    last_slot = chunker([], list(range(20, 25)))  # 5 tokens: EOS in the last slot
    np.testing.assert_array_equal(last_slot["canvas"], [20, 21, 22, 23, 24, 1])
    empty = chunker([], [])
    np.testing.assert_array_equal(empty["canvas"], [1, 1, 0, 0, 0, 0])
    assert int(empty["num_canvases"]) == 1
    already_terminated = chunker([], [20, EOS_ID])  # an explicit EOS is not doubled
    np.testing.assert_array_equal(already_terminated["canvas"], [20, 1, 0, 0, 0, 0])


def test_chunker_prompt_too_long():
    chunker = canvas.CanvasChunker(prompt_len=3, num_canvases=1, canvas_len=2)
    with pytest.raises(ValueError, match=r"3 tokens \+ BOS = 4 > prompt_len=3"):
        chunker([5, 6, 7], [8])
    truncating = canvas.CanvasChunker(prompt_len=3, num_canvases=1, canvas_len=2, truncate_prompt=True)
    example = truncating([5, 6, 7], [8])
    np.testing.assert_array_equal(example["prompt"], [BOS_ID, 6, 7])  # keeps the last P-1 tokens
    assert example["prompt_mask"].all()
    with pytest.raises(ValueError, match="PAD"):
        chunker([5], [8, PAD_ID])
    with pytest.raises(ValueError, match="canvas_len"):
        canvas.CanvasChunker(prompt_len=3, num_canvases=1, canvas_len=0)


def test_collate_examples():
    chunker = canvas.CanvasChunker(prompt_len=4, num_canvases=2, canvas_len=3)
    examples = [chunker([5], [6]), chunker([5, 6], [7, 8, 9, 10])]
    batch = canvas.collate_examples(examples)
    shapes = canvas.canvas_batch_shapes(chunker, 2)
    assert {key: value.shape for key, value in batch.items()} == shapes
    np.testing.assert_array_equal(batch["num_canvases"], [1, 2])
    np.testing.assert_array_equal(batch["canvas"][1], [7, 8, 9, 10, 1, 1])
    with pytest.raises(ValueError, match="keys"):
        canvas.collate_examples([examples[0], {"prompt": examples[0]["prompt"]}])
