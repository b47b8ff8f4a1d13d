"""Tokenizers (`data/tokenizers.py`): special ids, the char tokenizer on Shakespeare, SentencePiece on PTB, byte
fallback, save/load."""

import json

import numpy as np
import pytest
from _corpora import ptb_lines, ptb_spm, shakespeare_char

from hackable_diffusion.data import text, tokenizers
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, PAD_ID


def test_special_id_constants():
    assert (PAD_ID, EOS_ID, BOS_ID, MASK_ID) == (0, 1, 2, 3)
    assert tokenizers.SPECIAL_IDS == (0, 1, 2, 3)
    assert shakespeare_char().special_ids == (0, 1, 2, 3)
    assert ptb_spm().special_ids == (0, 1, 2, 3)


def test_char_tokenizer_shakespeare_round_trip_and_layout():
    tok = shakespeare_char()
    assert tok.vocab_size == 4 + 65  # all 65 characters of the file occur in the training split
    assert list(tok.chars) == sorted(tok.chars)
    validation = text.load_shakespeare("validation")
    ids = tok.encode(validation)
    assert len(ids) == len(validation)
    assert min(ids) >= 4 and max(ids) < tok.vocab_size
    assert tok.decode(ids) == validation
    assert tok.encode("\n ") == [4, 5]  # "\n" (10) and " " (32) are the two smallest code points


def test_char_tokenizer_errors_and_specials():
    tok = tokenizers.CharTokenizer.fit("abc")
    assert tok.encode("cab") == [6, 4, 5]
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("abz")
    with pytest.raises(ValueError, match="'é'"):
        tok.encode("é")  # code point beyond the lookup table
    # PAD/BOS/MASK are skipped; EOS stops unless stop_at_eos=False.
    assert tok.decode([BOS_ID, 4, MASK_ID, 5, PAD_ID, EOS_ID, 6]) == "ab"
    assert tok.decode([BOS_ID, 4, MASK_ID, 5, PAD_ID, EOS_ID, 6], stop_at_eos=False) == "abc"
    assert tok.decode(np.array([4, 5], np.int32)) == "ab"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([7])
    with pytest.raises(ValueError, match="1-D"):
        tok.decode([[4]])


def test_spm_special_pieces_and_ptb_round_trip():
    tok = ptb_spm()
    assert tok.vocab_size == 1000
    pieces = [tok.id_to_piece(i) for i in range(5)]
    assert pieces == ["<pad>", "</s>", "<s>", "<mask>", "<spm_unk>"]
    validation = ptb_lines("valid")
    encoded = tok.encode_batch(validation)
    mismatches = [line for line, ids in zip(validation, encoded) if tok.decode(ids) != line]
    assert mismatches == []  # exact, including PTB's leading and trailing spaces and the "<unk>" words
    assert all(min(ids) >= 4 for ids in encoded)
    # Compression sanity: BPE-1000 on PTB gives several characters per token.
    assert sum(map(len, validation)) / sum(map(len, encoded)) > 2.5
    # A literal "<mask>" is text, never the mask id; decode skips specials.
    ids = tok.encode(" a <mask> b")
    assert MASK_ID not in ids and tok.decode(ids) == " a <mask> b"
    assert tok.decode([BOS_ID, *ids, MASK_ID, EOS_ID, *ids]) == " a <mask> b"
    assert tok.decode([BOS_ID, *ids, MASK_ID, EOS_ID, *ids], stop_at_eos=False) == " a <mask> b a <mask> b"
    assert tok.decode(tok.encode("x\ny\n")) == "x\ny\n"  # "\n" is a piece
    with pytest.raises(ValueError, match="byte_fallback"):
        tok.encode("naïve")


def test_spm_deterministic_byte_fallback_and_unigram():
    lines = ptb_lines("train")[:2000]
    first = tokenizers.SentencePieceTokenizer.train(lines, vocab_size=300, model_type="bpe")
    second = tokenizers.SentencePieceTokenizer.train(lines, vocab_size=300, model_type="bpe")
    assert first.model_proto == second.model_proto
    fallback = tokenizers.SentencePieceTokenizer.train(lines, vocab_size=400, byte_fallback=True)
    assert fallback.decode(fallback.encode("naïve ☃ café")) == "naïve ☃ café"
    unigram = tokenizers.SentencePieceTokenizer.train(lines[:500], vocab_size=200, model_type="unigram")
    assert [unigram.id_to_piece(i) for i in range(4)] == ["<pad>", "</s>", "<s>", "<mask>"]
    assert unigram.decode(unigram.encode(lines[0])) == lines[0]
    with pytest.raises(ValueError, match="model_type"):
        tokenizers.SentencePieceTokenizer.train(lines, vocab_size=300, model_type="word")
    with pytest.raises(ValueError, match="vocab_size"):
        tokenizers.SentencePieceTokenizer.train(["ab ab"], vocab_size=5000)


def test_save_load_identical(tmp_path):
    sample = ptb_lines("valid")[:50]
    for name, tok in (("char", shakespeare_char()), ("spm", ptb_spm())):
        directory = tok.save(tmp_path / name, metadata={"note": name})
        config = json.loads((directory / "tokenizer.json").read_text())
        assert config["kind"] == name and config["metadata"] == {"note": name}
        loaded = tokenizers.load_tokenizer(directory)
        assert type(loaded) is type(tok) and loaded.vocab_size == tok.vocab_size
        texts = sample if name == "spm" else [text.load_shakespeare("validation")[:5000]]
        assert loaded.encode_batch(texts) == tok.encode_batch(texts)
    assert (tmp_path / "spm" / "spm.model").read_bytes() == ptb_spm().model_proto
    with pytest.raises(FileNotFoundError):
        tokenizers.load_tokenizer(tmp_path / "missing")
