"""Tests for the text data layer: tokenizers, corpora/splits, packing, grain pipelines, build_text_data, CanvasChunker."""

import functools
import json
import pathlib
import re
import tempfile

import grain
import numpy as np
import pytest

from hackable_diffusion.data import canvas, text, tokenizers
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, PAD_ID

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


# ----------------------------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Corpora, streams, packing
# ----------------------------------------------------------------------------------------------------------------


def test_data_file_lookup_order(monkeypatch, tmp_path):
    """Shipped files first, then $HD_DATA_DIR; an explicit data_dir alone; a missing file says where to get it."""
    monkeypatch.delenv("HD_DATA_DIR", raising=False)
    shipped = text.data_file("tinyshakespeare.txt")
    assert shipped == text.PACKAGED_DATA_DIR / "tinyshakespeare.txt" and shipped.is_file()
    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "ptb.valid.txt").write_text(" a b \n")
    (tmp_path / "tinyshakespeare.txt").write_text("not the shipped file")
    monkeypatch.setenv("HD_DATA_DIR", str(tmp_path))
    assert text.data_file("tinyshakespeare.txt") == shipped
    assert text.load_ptb("valid") == [" a b "]
    assert text.data_file("tinyshakespeare.txt", data_dir=tmp_path) == tmp_path / "tinyshakespeare.txt"
    with pytest.raises(FileNotFoundError, match="data_dir"):
        text.data_file("ptb/ptb.train.txt", data_dir=tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="HD_DATA_DIR.*sha256"):
        text.load_ptb("train")  # not in tmp_path: the error tells where to get the Penn Treebank
    monkeypatch.delenv("HD_DATA_DIR")
    with pytest.raises(FileNotFoundError, match="does not ship"):
        text.load_ptb("valid")


def test_shipped_data_files_match_their_provenance():
    import hashlib

    provenance = (text.PACKAGED_DATA_DIR / "PROVENANCE.md").read_text()
    for name in ("tinyshakespeare.txt", "kaggle3m_curated_5000.csv"):
        data = (text.PACKAGED_DATA_DIR / name).read_bytes()
        assert f"`{hashlib.sha256(data).hexdigest()}`" in provenance, name
        assert f"{len(data):,}" in provenance, name


def test_quickstart_data_loads_from_a_copy_of_the_package_alone(tmp_path):
    """A fresh clone has no data folder beside it: the quickstart's corpus comes from the package itself."""
    import os
    import shutil
    import subprocess
    import sys

    import hackable_diffusion

    package = pathlib.Path(hackable_diffusion.__file__).parent
    shutil.copytree(package, tmp_path / "copy" / "hackable_diffusion", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(package.parent / "configs", tmp_path / "copy" / "configs")
    env = {k: v for k, v in os.environ.items() if k != "HD_DATA_DIR"}
    env["PYTHONPATH"] = str(tmp_path / "copy")
    code = (
        "import hackable_diffusion, pathlib; from hackable_diffusion import cli, experiment; "
        "assert pathlib.Path(hackable_diffusion.__file__).is_relative_to(pathlib.Path.cwd()); "
        "c = cli.load_config_file('configs/quickstart.py'); d = experiment.build_text_data(c, 'run'); "
        "print(d.train_sequences.shape, d.eval_num_chars)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "copy", env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "111540" in out.stdout


def test_shakespeare_split_is_90_10_by_characters():
    train, validation = text.load_shakespeare("train"), text.load_shakespeare("validation")
    assert len(train) == int(0.9 * SHAKESPEARE_CHARS) == 1_003_854
    assert len(train) + len(validation) == SHAKESPEARE_CHARS
    assert text.data_file("tinyshakespeare.txt").read_text() == train + validation
    with pytest.raises(ValueError, match="split"):
        text.load_shakespeare("valid")


@requires_real_ptb
def test_ptb_lines_and_word_counts():
    expected = {"train": (42068, 929_589), "valid": (3370, 73_760), "test": (3761, 82_430)}
    for split, (num_lines, num_words) in expected.items():
        lines = text.load_ptb(split)
        assert len(lines) == num_lines
        assert not any("\n" in line for line in lines)
        assert text.ptb_word_count(lines) == num_words
    with pytest.raises(ValueError, match="split"):
        text.load_ptb("validation")


def test_tokenize_corpus_eos_placement():
    tok = tokenizers.CharTokenizer.fit("abc")
    between = text.tokenize_corpus(tok, ["ab", "c"])
    np.testing.assert_array_equal(between, [4, 5, EOS_ID, 6])
    assert between.dtype == np.int32
    np.testing.assert_array_equal(text.tokenize_corpus(tok, ["ab", "c"], add_eos_at_end=True), [4, 5, 1, 6, 1])
    np.testing.assert_array_equal(text.tokenize_corpus(tok, ["ab", "c"], add_eos_between=False), [4, 5, 6])
    np.testing.assert_array_equal(text.tokenize_corpus(tok, ["abc"]), [4, 5, 6])
    with pytest.raises(ValueError, match="wrap it"):
        text.tokenize_corpus(tok, "abc")


def test_pack_sequences():
    stream = np.arange(10, dtype=np.int32) + 4
    packed = text.pack_sequences(stream, 3)
    assert packed.shape == (3, 3) and packed.dtype == np.int32
    np.testing.assert_array_equal(packed.reshape(-1), stream[:9])
    padded = text.pack_sequences(stream, 3, pad_remainder=True)
    np.testing.assert_array_equal(padded[-1], [13, PAD_ID, PAD_ID])
    np.testing.assert_array_equal(text.pack_sequences(stream, 5, pad_remainder=True), stream.reshape(2, 5))
    with pytest.raises(ValueError, match="no full sequence"):
        text.pack_sequences(stream, 11)


# ----------------------------------------------------------------------------------------------------------------
# grain pipelines
# ----------------------------------------------------------------------------------------------------------------


def _toy_sequences(num=24, length=3):
    # Row i is [i, i, i] (+4), so a batch's first column identifies its rows.
    return np.repeat(np.arange(num, dtype=np.int32)[:, None] + 4, length, axis=1)


def _rows(batch):
    return (np.asarray(batch["tokens"])[:, 0] - 4).tolist()


def test_train_iterator_epochs_and_seeds():
    sequences = _toy_sequences(24)
    iterator = text.make_train_iterator(sequences, batch_size=4, seed=7)
    batches = [next(iterator) for _ in range(18)]  # 3 epochs of 6 batches
    assert all(b["tokens"].shape == (4, 3) and b["tokens"].dtype == np.int32 for b in batches)
    epochs = [sum((_rows(b) for b in batches[6 * e : 6 * e + 6]), []) for e in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(24))  # every sequence exactly once per epoch
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch
    assert epochs[0] != list(range(24))
    again = text.make_train_iterator(sequences, batch_size=4, seed=7)
    assert [_rows(next(again)) for _ in range(18)] == [_rows(b) for b in batches]
    other = text.make_train_iterator(sequences, batch_size=4, seed=8)
    assert [_rows(next(other)) for _ in range(6)] != [_rows(b) for b in batches[:6]]


def test_train_iterator_exact_resume():
    sequences = _toy_sequences(10)
    iterator = text.make_train_iterator(sequences, batch_size=3, seed=1)
    for _ in range(5):
        next(iterator)
    state = iterator.get_state()
    expected = [next(iterator)["tokens"] for _ in range(6)]
    fresh = text.make_train_iterator(sequences, batch_size=3, seed=1)
    fresh.set_state(state)
    for want in expected:
        np.testing.assert_array_equal(next(fresh)["tokens"], want)


def test_two_process_shards_union_equals_one_process_batch():
    sequences = _toy_sequences(22)  # not a multiple of the global batch: batches cross epoch boundaries
    single = text.make_train_iterator(sequences, batch_size=6, seed=3)
    shards = [text.make_train_iterator(sequences, 3, 3, process_index=p, process_count=2) for p in range(2)]
    for _ in range(12):
        local = [_rows(next(shard)) for shard in shards]
        assert local[0] + local[1] == _rows(next(single))
    with pytest.raises(ValueError, match="process_index"):
        text.make_train_iterator(sequences, 3, 3, process_index=2, process_count=2)


def test_train_iterator_with_worker_matches_in_process():
    sequences = _toy_sequences(12)
    in_process = text.make_train_iterator(sequences, batch_size=4, seed=5)
    with_worker = text.make_train_iterator(sequences, batch_size=4, seed=5, worker_count=1)
    try:
        for _ in range(4):
            np.testing.assert_array_equal(np.asarray(next(with_worker)["tokens"]), next(in_process)["tokens"])
    finally:
        with_worker.close()


def test_iterator_state_orbax_round_trip(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    sequences = _toy_sequences(10)
    iterator = text.make_train_iterator(sequences, batch_size=3, seed=2)
    for _ in range(4):
        next(iterator)
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    manager.save(4, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(iterator)))
    manager.wait_until_finished()
    expected = [next(iterator)["tokens"] for _ in range(3)]
    fresh = text.make_train_iterator(sequences, batch_size=3, seed=2)
    manager.restore(4, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
    manager.close()
    for want in expected:
        np.testing.assert_array_equal(next(fresh)["tokens"], want)


def test_eval_batches_cover_everything_once():
    sequences = text.pack_sequences(np.arange(4, 4 + 23, dtype=np.int32), 4, pad_remainder=True)  # 6 rows
    batches = text.make_eval_batches(sequences, batch_size=4)
    assert len(batches) == 2
    tokens = np.concatenate([b["tokens"] for b in batches])
    weights = np.concatenate([b["weights"] for b in batches])
    assert tokens.shape == weights.shape == (8, 4) and weights.dtype == np.float32
    real = tokens[weights > 0]
    np.testing.assert_array_equal(real, np.arange(4, 27))  # every real token once, in order
    assert weights.sum() == 23
    np.testing.assert_array_equal(tokens[6:], PAD_ID)
    assert len(text.make_eval_batches(sequences[:4], batch_size=4)) == 1


# ----------------------------------------------------------------------------------------------------------------
# build_text_data
# ----------------------------------------------------------------------------------------------------------------


def test_build_text_data_shakespeare_char(tmp_path):
    data = text.build_text_data("shakespeare", "char", None, 256, tmp_path)
    assert data.tokenizer.vocab_size == 69
    assert data.train_sequences.shape == (1_003_854 // 256, 256)
    assert data.eval_num_chars == data.eval_num_tokens == SHAKESPEARE_CHARS - 1_003_854
    assert data.eval_num_words is None
    assert data.tokenizer.decode(data.eval_sequences.reshape(-1)) == text.load_shakespeare("validation")
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()
    again = text.build_text_data("shakespeare", "char", None, 256, tmp_path)  # reloads tokenizer and cache
    np.testing.assert_array_equal(again.train_sequences, data.train_sequences)
    assert again.tokenizer == data.tokenizer
    with pytest.raises(ValueError, match="new workdir"):
        text.build_text_data("ptb", "char", None, 256, tmp_path, data_dir=ptb_data_dir())


def test_build_text_data_ptb_spm(tmp_path):
    data = text.build_text_data("ptb", "spm", 1000, 64, tmp_path, data_dir=ptb_data_dir())
    valid = ptb_lines("valid")
    assert data.tokenizer.vocab_size == 1000
    assert data.eval_num_words == text.ptb_word_count(valid)
    if real_ptb_dir() is not None:
        assert data.eval_num_words == 73_760
    eval_stream = data.eval_sequences.reshape(-1)
    assert data.eval_num_tokens == int((eval_stream != PAD_ID).sum())
    assert int((eval_stream == EOS_ID).sum()) == len(valid)  # one EOS per sentence
    assert data.train_sequences.shape[1] == 64 and data.train_sequences.dtype == np.int32
    reloaded = text.build_text_data("ptb", "spm", 1000, 64, tmp_path, data_dir=ptb_data_dir())
    assert reloaded.tokenizer.model_proto == data.tokenizer.model_proto
    np.testing.assert_array_equal(reloaded.eval_sequences, data.eval_sequences)
    assert data.tokenizer.decode(eval_stream) == valid[0]


# ----------------------------------------------------------------------------------------------------------------
# CanvasChunker
# ----------------------------------------------------------------------------------------------------------------


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
