"""Text corpora, token streams, fixed-length packing and grain input pipelines for language-model training.

Corpora and splits follow the usual references: tiny Shakespeare as in nanoGPT's ``shakespeare_char`` (first 90% of
the characters for training, last 10% for validation) and Mikolov's Penn Treebank (``ptb.{train,valid,test}.txt``;
word-level perplexity counts one ``<eos>`` per line, 73,760 words in valid and 82,430 in test). The training
pipeline uses grain (google/grain) ``MapDataset`` random access so that its state is a single index and can be
checkpointed with orbax (``grain.checkpoint.CheckpointSave``/``CheckpointRestore``).

Deliberate choices:
- Token streams: PTB puts EOS after every line (the standard ``<eos>`` per sentence); Shakespeare is one document
  without EOS, so bits per character compare with nanoGPT's character model.
- Training sequences are non-overlapping windows of the stream (remainder dropped), reshuffled every epoch; global
  batches cross epoch boundaries (the dataset repeats forever), so no data is dropped between epochs.
- Multi-process: every process computes the same global batch of indices and gathers only its own contiguous
  slice, so the union of the local batches of a step equals the one-process batch (a 2-process run sees the same
  data as a 1-process run).
- Evaluation sequences keep the tail: the last window is right-padded with PAD, and ``make_eval_batches`` pads the
  last batch with PAD rows; ``weights`` marks real tokens, so per-character/word metrics cover the whole split.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np
from jaxtyping import Int

from hackable_diffusion.data import safe_files
from hackable_diffusion.data import tokenizers as tok_lib
from hackable_diffusion.data.tokenizers import EOS_ID, PAD_ID, CharTokenizer, SentencePieceTokenizer, Tokenizer

DATA_DIR_ENV = "HD_DATA_DIR"
SHAKESPEARE_FILE = "tinyshakespeare.txt"
SHAKESPEARE_TRAIN_FRACTION = 0.9
SHAKESPEARE_SPLITS = ("train", "validation")
PTB_SPLITS = ("train", "valid", "test")
CORPORA = ("shakespeare", "ptb")
TOKENIZER_KINDS = ("char", "spm", "pretrained")  # pretrained: a checkpoint's own, saved in workdir/tokenizer


# ----------------------------------------------------------------------------------------------------------------
# Corpora
# ----------------------------------------------------------------------------------------------------------------


PACKAGED_DATA_DIR = pathlib.Path(__file__).resolve().parent / "files"
WHERE_TO_GET = {
    "ptb": (
        "the Penn Treebank (LDC-derived, research use) does not ship with the package: put Mikolov's ptb.train.txt, "
        "ptb.valid.txt and ptb.test.txt (the 'simple-examples' archive, data/ptb.*.txt) in a folder ptb/ and set "
        f"{DATA_DIR_ENV} to the folder that holds ptb/ (hackable_diffusion/data/files/PROVENANCE.md has their sha256)"
    ),
}


def data_file(relative: str, data_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The path of a data file, looked up in order: ``data_dir`` when given; the files that ship with the package
    (``hackable_diffusion/data/files``: tiny Shakespeare, the Kaggle Sudoku sample); ``$HD_DATA_DIR``. A file found
    nowhere raises FileNotFoundError saying where to get it."""
    if data_dir is not None:
        path = pathlib.Path(data_dir).expanduser() / relative
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (config.data.data_dir={str(data_dir)!r}).")
        return path
    packaged = PACKAGED_DATA_DIR / relative
    if packaged.is_file():
        return packaged
    tried = [str(packaged)]
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = pathlib.Path(env).expanduser() / relative
        if path.is_file():
            return path
        tried.append(str(path))
    hint = WHERE_TO_GET.get(pathlib.PurePath(relative).parts[0], f"set {DATA_DIR_ENV} to a folder holding {relative}")
    raise FileNotFoundError(f"data file {relative!r} not found (tried {tried}); {hint}.")


def load_shakespeare(split: str, data_dir: str | os.PathLike | None = None) -> str:
    """Tiny Shakespeare: ``"train"`` = first 90% of the characters, ``"validation"`` = the last 10%."""
    if split not in SHAKESPEARE_SPLITS:
        raise ValueError(f"Shakespeare split must be one of {SHAKESPEARE_SPLITS}, got {split!r}.")
    text = data_file(SHAKESPEARE_FILE, data_dir).read_text(encoding="utf-8")
    boundary = int(len(text) * SHAKESPEARE_TRAIN_FRACTION)
    return text[:boundary] if split == "train" else text[boundary:]


def load_ptb(split: str, data_dir: str | os.PathLike | None = None) -> list[str]:
    """Penn Treebank lines of ``split`` in {"train", "valid", "test"}, trailing newline stripped (one sentence each)."""
    if split not in PTB_SPLITS:
        raise ValueError(f"PTB split must be one of {PTB_SPLITS}, got {split!r}.")
    text = data_file(f"ptb/ptb.{split}.txt", data_dir).read_text(encoding="utf-8")
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def ptb_word_count(lines: Sequence[str]) -> int:
    """Words plus one ``<eos>`` per line: the denominator of word-level perplexity."""
    if isinstance(lines, str):
        raise ValueError("ptb_word_count expects a list of lines, got one str; use load_ptb(split).")
    return sum(len(line.split()) + 1 for line in lines)


# ----------------------------------------------------------------------------------------------------------------
# Token streams and packing
# ----------------------------------------------------------------------------------------------------------------


def tokenize_corpus(
    tokenizer: Tokenizer, texts: Sequence[str], add_eos_between: bool = True, add_eos_at_end: bool = False
) -> Int[np.ndarray, " n"]:
    """One int32 token stream: the texts' tokens, EOS between consecutive texts and optionally after the last one.

    PTB: ``tokenize_corpus(tok, lines, add_eos_at_end=True)`` gives one EOS per sentence. Shakespeare:
    ``tokenize_corpus(tok, [text])`` is the single document without EOS.
    """
    if isinstance(texts, str):
        raise ValueError("tokenize_corpus expects a list of texts, got one str; wrap it: [text].")
    texts = list(texts)
    pieces: list[np.ndarray] = []
    eos = np.array([EOS_ID], dtype=np.int32)
    for i, ids in enumerate(tokenizer.encode_batch(texts)):
        pieces.append(np.asarray(ids, dtype=np.int32))
        if (add_eos_between and i < len(texts) - 1) or (add_eos_at_end and i == len(texts) - 1):
            pieces.append(eos)
    return np.concatenate(pieces) if pieces else np.zeros((0,), np.int32)


def pack_sequences(stream: Int[np.ndarray, " n"], seq_len: int, pad_remainder: bool = False) -> Int[np.ndarray, "s l"]:
    """Non-overlapping windows of ``seq_len`` tokens; the remainder is dropped, or right-padded with PAD."""
    stream = np.asarray(stream)
    if stream.ndim != 1:
        raise ValueError(f"pack_sequences expects a 1-D token stream, got shape {stream.shape}.")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}.")
    num_full = stream.shape[0] // seq_len
    if pad_remainder and stream.shape[0] % seq_len:
        padded = np.full(((num_full + 1) * seq_len,), PAD_ID, np.int32)
        padded[: stream.shape[0]] = stream
        return padded.reshape(num_full + 1, seq_len)
    if num_full == 0:
        raise ValueError(
            f"stream of {stream.shape[0]} tokens gives no full sequence of {seq_len}; lower seq_len or use "
            "pad_remainder=True."
        )
    return stream[: num_full * seq_len].astype(np.int32).reshape(num_full, seq_len)


# ----------------------------------------------------------------------------------------------------------------
# grain pipelines
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GatherLocalBatch:
    """Map a global batch of sequence indices to this process's slice ``[start, stop)`` of token rows."""

    sequences: np.ndarray
    start: int
    stop: int

    def __call__(self, global_indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"tokens": np.ascontiguousarray(self.sequences[global_indices[self.start : self.stop]], np.int32)}


def make_train_dataset(
    sequences: Int[np.ndarray, "s l"], batch_size: int, seed: int, process_index: int = 0, process_count: int = 1
) -> grain.MapDataset:
    """Infinite MapDataset of this process's batches ``{"tokens": int32 (batch_size, L)}`` (see make_train_iterator)."""
    sequences = np.asarray(sequences)
    if sequences.ndim != 2 or sequences.shape[0] == 0:
        raise ValueError(f"sequences must be a non-empty (num_sequences, seq_len) array, got shape {sequences.shape}.")
    if not np.issubdtype(sequences.dtype, np.integer):
        raise ValueError(f"sequences must hold integer token ids, got dtype {sequences.dtype}.")
    if batch_size < 1:
        raise ValueError(f"batch_size (per process) must be >= 1, got {batch_size}.")
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"need 0 <= process_index < process_count, got {process_index} and {process_count}.")
    if seed < 0:
        raise ValueError(f"seed must be >= 0 for grain, got {seed}.")
    global_batch = batch_size * process_count
    indices = (
        grain.MapDataset.source(np.arange(sequences.shape[0], dtype=np.int64))
        .seed(seed)
        .shuffle()  # a fresh permutation for every epoch of the repeat below
        .repeat()
        .batch(global_batch, drop_remainder=True)
    )
    start = process_index * batch_size
    return indices.map(GatherLocalBatch(sequences, start, start + batch_size))


@dataclasses.dataclass(frozen=True)
class _SplitTokensAndFixed:
    """(b, 2l) rows of [tokens | fixed] -> {"tokens": int32 (b, l), "fixed": bool (b, l)}."""

    length: int

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = batch["tokens"]
        return {"tokens": rows[:, : self.length], "fixed": rows[:, self.length :].astype(bool)}


def make_fixed_rows_iterator(
    tokens: Int[np.ndarray, "n l"],
    fixed: Any,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    random_map: Any = None,
):
    """`make_train_dataset` over rows with a `fixed` mask (puzzle givens, a prompt: attended, never noised), as
    `{"tokens", "fixed"}` batches: shuffled, repeated, checkpointable (grain). `random_map` (a grain RandomMapTransform,
    e.g. Sudoku's random symmetry) maps every batch with its own seeded randomness."""
    tokens, fixed = np.asarray(tokens), np.asarray(fixed)
    if tokens.shape != fixed.shape or tokens.ndim != 2:
        raise ValueError(f"tokens and fixed must be (n, l) arrays of one shape, got {tokens.shape}, {fixed.shape}.")
    rows = np.concatenate([tokens.astype(np.int32), fixed.astype(np.int32)], axis=1)
    dataset = make_train_dataset(rows, batch_size, seed, process_index, process_count)
    dataset = dataset.map(_SplitTokensAndFixed(tokens.shape[1]))
    if random_map is not None:
        dataset = dataset.random_map(random_map, seed=seed + process_index)
    return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))


def make_train_iterator(
    sequences: Int[np.ndarray, "s l"],
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    worker_count: int = 0,
) -> grain.DatasetIterator:
    """Shuffled, repeated-forever batches ``{"tokens": int32 (batch_size, L)}`` for process ``process_index``.

    ``batch_size`` is per process: the global batch of a step has ``batch_size * process_count`` sequences and
    process ``p`` gets rows ``[p*batch_size, (p+1)*batch_size)`` of it. The iterator's ``get_state()`` /
    ``set_state()`` restore exactly (also through ``grain.checkpoint.CheckpointSave/CheckpointRestore``).
    """
    dataset = make_train_dataset(sequences, batch_size, seed, process_index, process_count)
    if worker_count < 0:
        raise ValueError(f"worker_count must be >= 0, got {worker_count}.")
    if worker_count == 0:
        # Gathering rows of an in-memory array is cheap: one prefetch thread, a short buffer.
        return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain workers read absl flags; outside absl.app.run they are unparsed
        flags.FLAGS.mark_as_parsed()
    iter_dataset = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    return iter(iter_dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count)))


def make_eval_batches(sequences: Int[np.ndarray, "s l"], batch_size: int) -> list[dict[str, np.ndarray]]:
    """All sequences in order, in batches of ``batch_size``; the last batch is padded with PAD rows.

    Each batch is ``{"tokens": int32 (B, L), "weights": float32 (B, L)}``; ``weights`` is 1 on real tokens and 0 on
    padding rows and PAD tokens (the PAD tail of ``pack_sequences(..., pad_remainder=True)``).
    """
    sequences = np.asarray(sequences)
    if sequences.ndim != 2:
        raise ValueError(f"sequences must be a (num_sequences, seq_len) array, got shape {sequences.shape}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    batches = []
    for begin in range(0, sequences.shape[0], batch_size):
        tokens = np.full((batch_size, sequences.shape[1]), PAD_ID, np.int32)
        chunk = sequences[begin : begin + batch_size]
        tokens[: chunk.shape[0]] = chunk
        weights = np.zeros(tokens.shape, np.float32)
        weights[: chunk.shape[0]] = chunk != PAD_ID
        batches.append({"tokens": tokens, "weights": weights})
    return batches


# ----------------------------------------------------------------------------------------------------------------
# Corpus recipe
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TextData:
    """A tokenizer plus packed training/evaluation sequences of one corpus.

    ``eval_num_tokens`` counts the real (non-PAD) tokens of ``eval_sequences``; ``eval_num_chars`` (Shakespeare)
    or ``eval_num_words`` (PTB, with one ``<eos>`` per line) is the denominator of per-character / per-word
    metrics over the whole evaluation split (the other is None).
    """

    tokenizer: Tokenizer
    train_sequences: Int[np.ndarray, "s l"]
    eval_sequences: Int[np.ndarray, "e l"]
    eval_num_tokens: int
    eval_num_chars: int | None
    eval_num_words: int | None
    tokenizer_dir: pathlib.Path


def _fit_tokenizer(
    corpus: str, kind: str, vocab_size: int | None, train_texts: Sequence[str], seed: int, model_type: str
) -> Tokenizer:
    if kind == "pretrained":
        raise ValueError(
            "tokenizer kind 'pretrained' is a checkpoint's own tokenizer, saved in the run's tokenizer/ folder when "
            "the run is made from the checkpoint (sample / evaluate --workdir hf:DIR); it is never fitted."
        )
    if kind == "char":
        tokenizer = CharTokenizer.fit("\n".join(train_texts))
        if vocab_size is not None and vocab_size < tokenizer.vocab_size:
            raise ValueError(
                f"{corpus} needs {tokenizer.vocab_size} char ids but vocab_size={vocab_size}; use vocab_size=None."
            )
        return tokenizer
    if vocab_size is None:
        raise ValueError("tokenizer_kind='spm' needs an integer vocab_size (e.g. 1000 or 4000).")
    lines = [line for text in train_texts for line in text.split("\n")]
    return SentencePieceTokenizer.train(lines, vocab_size, model_type=model_type, seed=seed)


def _load_or_fit_tokenizer(directory: pathlib.Path, metadata: dict[str, Any], fit) -> Tokenizer:
    if (directory / tok_lib.CONFIG_FILE).is_file():
        saved = tok_lib.load_tokenizer_config(directory).get("metadata", {})
        if metadata.get("kind") == "pretrained" and saved.get("kind") == "pretrained":
            return tok_lib.load_tokenizer(directory)  # a checkpoint's tokenizer serves every corpus
        if saved != metadata:
            raise ValueError(
                f"{directory} holds a tokenizer made with {saved}, but {metadata} was requested; use a new workdir "
                "or delete that tokenizer folder."
            )
        return tok_lib.load_tokenizer(directory)
    tokenizer = fit()
    staging = pathlib.Path(tempfile.mkdtemp(dir=directory.parent, prefix=".tokenizer-"))
    try:
        tokenizer.save(staging, metadata=metadata)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        safe_files.raise_if_disk_full(error, directory.parent, "the tokenizer", "nothing partial was left there")
        raise
    try:
        os.rename(staging, directory)
    except OSError:  # another process saved it first; fitting is deterministic, so use theirs
        shutil.rmtree(staging, ignore_errors=True)
    return tok_lib.load_tokenizer(directory)


def _tokenizer_fingerprint(directory: pathlib.Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cached_stream(cache_dir: pathlib.Path, name: str, compute) -> np.ndarray:
    path = cache_dir / f"{name}.npy"
    if path.is_file():
        return np.load(path)
    stream = compute()
    safe_files.write_atomic(path, lambda handle: np.save(handle, stream), f"the token cache {path.name}")
    return stream


def check_corpus(corpus: str, tokenizer_kind: str, data_dir: str | os.PathLike | None = None) -> None:
    """Raises before any work if the corpus name, the tokenizer kind or the corpus files are wrong."""
    if corpus not in CORPORA:
        raise ValueError(f"config.data.corpus={corpus!r} must be one of {CORPORA}.")
    if tokenizer_kind not in TOKENIZER_KINDS:
        raise ValueError(f"config.data.tokenizer={tokenizer_kind!r} must be one of {TOKENIZER_KINDS}.")
    names = [SHAKESPEARE_FILE] if corpus == "shakespeare" else [f"ptb/ptb.{s}.txt" for s in PTB_SPLITS]
    for name in names:
        data_file(name, data_dir)


def build_text_data(
    corpus: str,
    tokenizer_kind: str,
    vocab_size: int | None,
    seq_len: int,
    workdir: str | os.PathLike,
    *,
    eval_split: str | None = None,
    model_type: str = "bpe",
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    train_fraction: float = 1.0,
) -> TextData:
    """Tokenizer + packed sequences for ``corpus`` in {"shakespeare", "ptb"} with a "char" or "spm" tokenizer.

    The tokenizer is fitted on the training split only and saved to ``workdir/tokenizer/``; when that folder
    exists it is reloaded instead (so training, sampling and evaluation share one tokenizer). Token streams are
    cached in ``workdir/data_cache/``. ``eval_split`` defaults to "validation" (Shakespeare) / "valid" (PTB).
    For ``tokenizer_kind="char"``, ``vocab_size`` may be None (the corpus decides the size).
    ``train_fraction`` < 1 keeps only that leading share of the training split's tokens (a data-constrained run); the
    tokenizer is still fitted on the whole split, so runs with different fractions share one vocabulary.
    """
    if not 0.0 < train_fraction <= 1.0:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}.")
    if corpus not in CORPORA:
        raise ValueError(f"corpus must be one of {CORPORA}, got {corpus!r}.")
    if tokenizer_kind not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer_kind must be one of {TOKENIZER_KINDS}, got {tokenizer_kind!r}.")
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def load_split(split: str) -> list[str]:
        return [load_shakespeare(split, data_dir)] if corpus == "shakespeare" else load_ptb(split, data_dir)

    if eval_split is None:
        eval_split = "validation" if corpus == "shakespeare" else "valid"
    if eval_split == "train" or eval_split not in (SHAKESPEARE_SPLITS if corpus == "shakespeare" else PTB_SPLITS):
        raise ValueError(f"eval_split {eval_split!r} is not a held-out split of {corpus}.")

    train_texts = load_split("train")
    eval_texts = load_split(eval_split)
    metadata = {"corpus": corpus, "kind": tokenizer_kind, "requested_vocab_size": vocab_size}
    if tokenizer_kind == "spm":
        metadata.update(model_type=model_type, seed=seed)
    tokenizer_dir = workdir / "tokenizer"
    tokenizer = _load_or_fit_tokenizer(
        tokenizer_dir,
        metadata,
        lambda: _fit_tokenizer(corpus, tokenizer_kind, vocab_size, train_texts, seed, model_type),
    )

    per_line_eos = corpus == "ptb"  # one EOS per sentence; Shakespeare is one document without EOS
    cache_dir = workdir / "data_cache"
    fingerprint = _tokenizer_fingerprint(tokenizer_dir)

    def stream_of(split: str, texts: list[str]) -> np.ndarray:
        return _cached_stream(
            cache_dir,
            f"{corpus}_{split}_{fingerprint}",
            lambda: tokenize_corpus(tokenizer, texts, add_eos_between=True, add_eos_at_end=per_line_eos),
        )

    train_stream = stream_of("train", train_texts)
    train_stream = train_stream[: max(seq_len, int(round(train_fraction * train_stream.shape[0])))]
    eval_stream = stream_of(eval_split, eval_texts)
    return TextData(
        tokenizer=tokenizer,
        train_sequences=pack_sequences(train_stream, seq_len),
        eval_sequences=pack_sequences(eval_stream, seq_len, pad_remainder=True),
        eval_num_tokens=int(eval_stream.shape[0]),
        eval_num_chars=len(eval_texts[0]) if corpus == "shakespeare" else None,
        eval_num_words=ptb_word_count(eval_texts) if corpus == "ptb" else None,
        tokenizer_dir=tokenizer_dir,
    )
