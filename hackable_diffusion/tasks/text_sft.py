"""The text task's fine-tuning data: prompt -> response pairs chunked into canvases (DiffusionGemma's SFT format).

A text run whose objective is canvas SFT (`config.diffusion.objective="sft"`, made by `python -m
hackable_diffusion.sft`) trains on examples instead of packed sequences: the demo pairs are tiny Shakespeare's
non-overlapping windows of lines (prompt = `sft.prompt_lines` lines, response = the next `sft.response_lines`), each
chunked by `data.sft_canvases.CanvasChunker` into a prompt and `sft.num_canvases` canvases. The tokenizer is the one
the base weights came with, saved in the run directory before the data is built. Deliberate choices: windows whose
prompt is blank are skipped; a prompt longer than `prompt_len - 1` keeps its end; a pair with characters outside the
vocabulary is skipped.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from typing import Any, Sequence

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data import tokenizers as tok_lib
from hackable_diffusion.data.sft_canvases import CanvasChunker, collate_examples
from hackable_diffusion.data.tokenizers import Tokenizer

EVAL_METRICS = ("loss", "diffusion_loss", "encoder_ar_loss", "elbo_bits_per_token")


def shakespeare_pairs(text: str, prompt_lines: int, response_lines: int) -> list[tuple[str, str]]:
    """Non-overlapping (prompt, response) windows of lines; the prompt keeps its trailing newline."""
    if prompt_lines < 1 or response_lines < 1:
        raise ValueError(f"prompt_lines and response_lines must be >= 1, got {prompt_lines}, {response_lines}.")
    lines = text.split("\n")
    window = prompt_lines + response_lines
    pairs = []
    for start in range(0, len(lines) - window + 1, window):
        prompt = "\n".join(lines[start : start + prompt_lines])
        if not prompt.strip():
            continue
        pairs.append((prompt + "\n", "\n".join(lines[start + prompt_lines : start + window])))
    return pairs


def build_examples(
    pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer, chunker: CanvasChunker, max_examples: int = 0
) -> dict[str, np.ndarray]:
    """Collated CanvasChunker examples of the pairs (pairs with characters outside the vocabulary are skipped)."""
    examples = []
    for prompt, response in pairs:
        if max_examples and len(examples) >= max_examples:
            break
        try:
            examples.append(chunker(tokenizer.encode(prompt), tokenizer.encode(response)))
        except ValueError:
            continue
    if not examples:
        raise ValueError("No SFT example could be built (empty split, or every pair has unknown characters).")
    return collate_examples(examples)


@dataclasses.dataclass(frozen=True)
class GatherExamples:
    """Global batch of example indices -> this process's rows [start, stop) of every field."""

    examples: Mapping[str, np.ndarray]
    start: int
    stop: int

    def __call__(self, global_indices: np.ndarray) -> dict[str, np.ndarray]:
        rows = global_indices[self.start : self.stop]
        return {k: np.ascontiguousarray(v[rows]) for k, v in self.examples.items()}


def make_example_iterator(
    examples: Mapping[str, np.ndarray], batch_size: int, seed: int, process_index: int = 0, process_count: int = 1
) -> grain.DatasetIterator:
    """Shuffled, repeated batches of examples (per process), with a checkpointable grain state."""
    count = len(next(iter(examples.values())))
    if batch_size < 1 or count < 1:
        raise ValueError(f"need batch_size >= 1 and at least one example, got {batch_size} and {count}.")
    start = process_index * batch_size
    dataset = (
        grain.MapDataset.source(np.arange(count, dtype=np.int64))
        .seed(seed)
        .shuffle()
        .repeat()
        .batch(batch_size * process_count, drop_remainder=True)
        .map(GatherExamples(dict(examples), start, start + batch_size))
    )
    return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))


def eval_batches(examples: Mapping[str, np.ndarray], batch_size: int, num_batches: int) -> list[dict[str, np.ndarray]]:
    count = len(next(iter(examples.values())))
    out = []
    for begin in range(0, count - batch_size + 1, batch_size):
        out.append({k: v[begin : begin + batch_size] for k, v in examples.items()})
        if len(out) == num_batches:
            break
    return out


@dataclasses.dataclass(frozen=True)
class SFTData:
    tokenizer: Tokenizer
    train_examples: Mapping[str, np.ndarray]
    eval_examples: Mapping[str, np.ndarray]

    @property
    def train_sequences(self) -> np.ndarray:  # the progress line counts training rows
        return self.train_examples["prompt"]


def build_sft_data(config: ml_collections.ConfigDict, workdir: str) -> SFTData:
    """The run's tokenizer (saved in `workdir/tokenizer` from the base weights) and its train / eval examples."""
    directory = pathlib.Path(workdir) / "tokenizer"
    if not (directory / tok_lib.CONFIG_FILE).is_file():
        raise FileNotFoundError(
            f"{directory} holds no tokenizer: a fine-tuning run is made by python -m hackable_diffusion.sft, which "
            "saves the tokenizer of its base weights there first."
        )
    tokenizer = tok_lib.load_tokenizer(directory)
    s = config.sft
    chunker = CanvasChunker(s.prompt_len, s.num_canvases, config.diffusion.canvas_len, truncate_prompt=True)
    data_dir = config.data.data_dir or None

    def examples(split: str, limit: int):
        pairs = shakespeare_pairs(text_lib.load_shakespeare(split, data_dir), s.prompt_lines, s.response_lines)
        return build_examples(pairs, tokenizer, chunker, limit)

    return SFTData(tokenizer, examples("train", s.max_examples), examples("validation", s.eval_examples))


def sft_eval_fn(exp: Any, loss_fn: Any = None):
    """`eval_fn(params, ema_params)`: the SFT objective's metrics averaged over `config.eval.num_batches` batches of
    the eval examples; `loss_fn` replaces the experiment's objective (a LoRA run's, on {"base", "lora"} params)."""
    config = exp.config
    batches = eval_batches(exp.data.eval_examples, config.eval.batch_size, config.eval.num_batches)
    if not batches:
        return None
    fn = jax.jit(loss_fn or exp.objective)

    def evaluate(params, ema_params):
        use = ema_params if ema_params is not None else params
        totals: dict[str, float] = {}
        for i, batch in enumerate(batches):
            _, metrics = fn(use, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.key(10_007 + i))
            for k in EVAL_METRICS:
                totals[k] = totals.get(k, 0.0) + float(metrics[k]) / len(batches)
        return totals

    return evaluate
