"""Corpora shared by the data tests: tiny Shakespeare, and the Penn Treebank when $HD_DATA_DIR has it, else a
corpus in PTB's format written from Shakespeare, so that the PTB code paths are tested on every machine."""

import functools
import pathlib
import re
import tempfile

import pytest

from hackable_diffusion.data import text, tokenizers

SHAKESPEARE_CHARS = 1_115_394


def real_ptb_dir() -> pathlib.Path | None:
    """The folder holding ptb/ when $HD_DATA_DIR has the Penn Treebank (it does not ship with the package)."""
    try:
        return text.data_file("ptb/ptb.train.txt").parents[1]
    except FileNotFoundError:
        return None


requires_real_ptb = pytest.mark.skipif(
    real_ptb_dir() is None,
    reason="the Penn Treebank does not ship with the package: set HD_DATA_DIR (hackable_diffusion/data/files/"
    "PROVENANCE.md)",
)


@functools.lru_cache(maxsize=None)
def ptb_data_dir() -> pathlib.Path:
    """The real PTB when available, else a corpus in PTB's format (one lower-case sentence a line with a leading and
    a trailing space, rare words as <unk>, numbers as N) written from tiny Shakespeare, so that the PTB code paths
    are tested on every machine."""
    real = real_ptb_dir()
    if real is not None:
        return real
    folder = pathlib.Path(tempfile.mkdtemp(prefix="ptb_format_"))
    sentences = [re.findall(r"[a-z']+|[0-9]+", line.lower()) for line in text.load_shakespeare("train").split("\n")]
    sentences = [words for words in sentences if words]
    counts: dict[str, int] = {}
    for words in sentences:
        for word in words:
            counts[word] = counts.get(word, 0) + 1

    def line(words):
        words = ["N" if w.isdigit() else (w if counts[w] > 2 else "<unk>") for w in words]
        return " " + " ".join(words) + " "

    (folder / "ptb").mkdir()
    splits = {"train": sentences[:6000], "valid": sentences[6000:6600], "test": sentences[6600:7200]}
    for split, rows in splits.items():
        (folder / "ptb" / f"ptb.{split}.txt").write_text("".join(line(words) + "\n" for words in rows))
    return folder


def ptb_lines(split: str) -> list[str]:
    return text.load_ptb(split, ptb_data_dir())


@functools.lru_cache(maxsize=None)
def ptb_spm() -> tokenizers.SentencePieceTokenizer:
    """BPE, vocab 1000, trained on the PTB training split (0.3 s)."""
    return tokenizers.SentencePieceTokenizer.train(ptb_lines("train"), vocab_size=1000, model_type="bpe")


@functools.lru_cache(maxsize=None)
def shakespeare_char() -> tokenizers.CharTokenizer:
    return tokenizers.CharTokenizer.fit(text.load_shakespeare("train"))
