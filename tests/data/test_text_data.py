"""Text corpora and pipelines (`data/text.py`): file lookup and provenance, splits, word counts, EOS placement,
packing, grain iterators (epochs, exact resume, two-process shards, orbax state), eval batches, build_text_data."""

import pathlib

import grain
import numpy as np
import pytest
from _corpora import SHAKESPEARE_CHARS, ptb_data_dir, ptb_lines, real_ptb_dir, requires_real_ptb

from hackable_diffusion.data import text, tokenizers
from hackable_diffusion.data.tokenizers import EOS_ID, PAD_ID


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


@pytest.mark.slow
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
        "import hackable_diffusion, pathlib; from hackable_diffusion import cli; from hackable_diffusion.tasks.text_task import TextTask; "
        "assert pathlib.Path(hackable_diffusion.__file__).is_relative_to(pathlib.Path.cwd()); "
        "c = cli.load_config_file('configs/quickstart.py'); d = TextTask().build_data(c, 'run'); "
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


def test_train_fraction_keeps_the_leading_share_of_the_training_split_and_one_vocabulary(tmp_path):
    """A data-constrained run trains on the first 10% of the training split's tokens, with the whole split's tokenizer
    (so runs of any fraction share one vocabulary), and evaluates on the whole validation split."""
    whole = text.build_text_data("shakespeare", "char", None, 256, tmp_path / "whole")
    tenth = text.build_text_data("shakespeare", "char", None, 256, tmp_path / "tenth", train_fraction=0.1)
    assert tenth.tokenizer.vocab_size == whole.tokenizer.vocab_size
    expected_rows = int(round(0.1 * 1_003_854)) // 256
    assert tenth.train_sequences.shape == (expected_rows, 256)
    np.testing.assert_array_equal(tenth.train_sequences, whole.train_sequences[:expected_rows])
    np.testing.assert_array_equal(tenth.eval_sequences, whole.eval_sequences)
    with pytest.raises(ValueError, match="train_fraction"):
        text.build_text_data("shakespeare", "char", None, 256, tmp_path / "none", train_fraction=0.0)


def test_ptb_word_count_counts_each_lines_words_and_its_end():
    """Mikolov's PTB perplexity counts every word and one end-of-sentence token per line (no real PTB needed)."""
    assert text.ptb_word_count([" a b ", "c d e", ""]) == (2 + 1) + (3 + 1) + (0 + 1)
    with pytest.raises(ValueError, match="list of lines"):
        text.ptb_word_count("a b")


def test_fixed_rows_iterator_splits_tokens_from_their_fixed_mask():
    tokens = np.arange(4 * 5, dtype=np.int32).reshape(4, 5) + 4
    fixed = tokens % 3 == 0
    batch = next(text.make_fixed_rows_iterator(tokens, fixed, batch_size=4, seed=0))
    assert batch["tokens"].shape == batch["fixed"].shape == (4, 5) and batch["fixed"].dtype == bool
    order = np.argsort(batch["tokens"][:, 0])  # one epoch of four rows, shuffled
    np.testing.assert_array_equal(batch["tokens"][order], tokens)
    np.testing.assert_array_equal(batch["fixed"][order], fixed)
    for bad_fixed in (fixed[:, :4], fixed[0]):
        with pytest.raises(ValueError, match="one shape"):
            text.make_fixed_rows_iterator(tokens, bad_fixed, batch_size=4, seed=0)
    with pytest.raises(ValueError, match="one shape"):
        text.make_fixed_rows_iterator(tokens[0], fixed[0], batch_size=4, seed=0)  # 1-D rows


def test_a_saved_tokenizer_is_reused_only_for_the_data_it_was_made_for(tmp_path):
    """A workdir's tokenizer made with other settings is refused; a checkpoint's own ("pretrained") tokenizer serves
    any corpus a pretrained run asks for, but not a request for a fitted one."""
    fitted = tokenizers.CharTokenizer.fit("abc")
    saved = tmp_path / "tokenizer"
    fitted.save(saved, metadata={"kind": "pretrained", "source": "ckpt-a"})

    def never_fit():
        raise AssertionError("a saved tokenizer must not be fitted again")

    reused = text._load_or_fit_tokenizer(saved, {"kind": "pretrained", "source": "ckpt-b"}, never_fit)
    assert reused.vocab_size == fitted.vocab_size
    with pytest.raises(ValueError, match="holds a tokenizer made with"):
        text._load_or_fit_tokenizer(saved, {"kind": "char", "corpus": "shakespeare"}, never_fit)


def test_train_dataset_defaults_to_one_process_and_checks_its_arguments():
    sequences = _toy_sequences(6)
    default = text.make_train_dataset(sequences, 2, 0)
    explicit = text.make_train_dataset(sequences, 2, 0, process_index=0, process_count=1)
    for i in range(4):  # two epochs of three batches
        np.testing.assert_array_equal(default[i]["tokens"], explicit[i]["tokens"])
    fixed = np.zeros(sequences.shape, bool)
    defaults = text.make_fixed_rows_iterator(sequences, fixed, batch_size=2, seed=0)
    one_process = text.make_fixed_rows_iterator(sequences, fixed, 2, 0, process_index=0, process_count=1)
    for _ in range(4):
        np.testing.assert_array_equal(next(defaults)["tokens"], next(one_process)["tokens"])
    with pytest.raises(ValueError, match="non-empty"):
        text.make_train_dataset(sequences[:0], 2, 0)  # no sequence at all (the rows are still 2-D)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        text.make_train_dataset(sequences, 2, -1)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        text.make_eval_batches(sequences, 0)


def test_a_char_vocabulary_of_exactly_the_needed_size_is_accepted(tmp_path):
    needed = tokenizers.CharTokenizer.fit(text.load_shakespeare("train")).vocab_size
    data = text.build_text_data("shakespeare", "char", needed, 16, tmp_path / "exact")
    assert data.tokenizer.vocab_size == needed
    with pytest.raises(ValueError, match="char ids"):
        text.build_text_data("shakespeare", "char", needed - 1, 16, tmp_path / "short")


def test_check_corpus_looks_for_the_named_corpus_files(monkeypatch, tmp_path):
    monkeypatch.delenv("HD_DATA_DIR", raising=False)
    text.check_corpus("shakespeare", "char")  # shipped with the package
    with pytest.raises(FileNotFoundError, match="ptb"):
        text.check_corpus("ptb", "spm", data_dir=tmp_path)  # not there
    with pytest.raises(ValueError, match="corpus"):
        text.check_corpus("wikitext", "char")
