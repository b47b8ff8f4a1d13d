"""`python -m hackable_diffusion.convert` on bad inputs: a truncated weight file, a malformed config.json, a target
that already holds a checkpoint. Each stops with one `error:` line naming the file and exit status 2 before anything is
written; `--overwrite` replaces a target whole, and a write that fails part-way leaves the target as it was. Also the
generation_config.json an export writes (never an empty one)."""

import json
import pathlib
import shutil

import pytest
from _commands import REPO, one_error_line, run_module

from hackable_diffusion.checkpoints import hf as H
from hackable_diffusion.checkpoints import hf_config
from hackable_diffusion.checkpoints import hf_files

FIXTURES = REPO / "tests" / "fixtures"
DG, G4 = FIXTURES / "hf_diffusiongemma", FIXTURES / "hf_gemma4"


def convert(*args):
    return run_module("hackable_diffusion.convert", *args)


def snapshot(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def leftovers(parent: pathlib.Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name]


def test_a_truncated_weight_file_is_one_error_line_naming_it(tmp_path):
    source = tmp_path / "ckpt"
    shutil.copytree(DG, source)
    weights = source / hf_files.SINGLE_FILE
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = one_error_line(convert("--from", source, "--to", tmp_path / "out"))
    assert str(weights) in line and "truncated or corrupt" in line and "again" in line
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


def test_a_malformed_config_is_one_error_line_naming_the_file(tmp_path):
    source = tmp_path / "ckpt"
    shutil.copytree(DG, source)
    (source / "config.json").write_text('{"model_type": "diffusion_gemma",\n "canvas_length": 8\n "dtype": 1}')
    line = one_error_line(convert("--from", source, "--to", tmp_path / "out"))
    assert str(source / "config.json") in line and "not valid JSON" in line and "line 3" in line
    assert not (tmp_path / "out").exists()


def test_a_config_without_a_needed_field_names_the_file_and_the_field(tmp_path):
    source = tmp_path / "ckpt"
    shutil.copytree(DG, source)
    hf = json.loads((source / "config.json").read_text())
    del hf["text_config"]["layer_types"]
    (source / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=f"{source / 'config.json'} has no field 'layer_types'"):
        H.load_hf(source)
    (source / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a JSON list"):
        H.load_hf(source)


def test_a_non_empty_target_is_refused_and_overwrite_replaces_it_whole(tmp_path):
    target = tmp_path / "target"
    shutil.copytree(G4, target)  # another checkpoint: tokenizer.json, generation_config.json, arrays.npz
    (target / "notes.txt").write_text("kept until replaced")
    before = snapshot(target)
    line = one_error_line(convert("--from", DG, "--to", target))
    assert str(target) in line and "not empty" in line and "--overwrite" in line
    assert snapshot(target) == before

    out = convert("--from", DG, "--to", target, "--overwrite")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["to"] == str(target)
    assert sorted(p.name for p in target.iterdir()) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.model"]
    )
    generation = json.loads((target / "generation_config.json").read_text())
    assert generation and generation["max_denoising_steps"] == 48
    mode = (target / "model.safetensors").stat().st_mode  # as readable as the other files, not owner-only
    assert mode == (target / "config.json").stat().st_mode
    assert not leftovers(tmp_path)
    assert H.load_hf(target).config.num_layers == 6


def test_a_target_overlapping_the_source_is_refused(tmp_path):
    source = tmp_path / "ckpt"
    shutil.copytree(DG, source)
    line = one_error_line(convert("--from", source, "--to", source, "--overwrite"))
    assert "overlaps" in line and str(source) in line
    assert (source / "tokenizer.model").is_file()


def test_a_write_that_fails_part_way_leaves_the_target_as_it_was(tmp_path, monkeypatch):
    checkpoint = H.load_hf(DG)
    target = tmp_path / "target"
    shutil.copytree(G4, target)
    before = snapshot(target)
    real, calls = H._write_shard, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args)

    monkeypatch.setattr(H, "_write_shard", failing)
    with pytest.raises(OSError, match="disk full"):
        H.save_hf(target, checkpoint.config, checkpoint.params, canvas_length=8, max_shard_bytes=60_000)
    assert snapshot(target) == before and not leftovers(tmp_path)
    with pytest.raises(ValueError, match="not empty"):
        H.save_hf(target, checkpoint.config, checkpoint.params, overwrite=False)


def test_a_shard_missing_from_the_index_is_named(tmp_path):
    checkpoint = H.load_hf(G4)
    out = H.save_hf(
        tmp_path / "sharded", checkpoint.config, checkpoint.params, model_type=H.GEMMA4_TEXT, max_shard_bytes=60_000
    )
    shard = sorted(out.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=f"{shard.name} is missing.*incomplete"):
        H.load_hf(out)


def test_generation_config_is_meaningful_or_absent(tmp_path):
    checkpoint = H.load_hf(G4)
    cfg, params = checkpoint.config, checkpoint.params
    bare = H.save_hf(tmp_path / "bare", cfg, params, model_type=H.GEMMA4_TEXT)
    assert not (bare / hf_files.GENERATION_CONFIG_FILE).exists()  # nothing to say: no file, never {}
    carried = H.save_hf(tmp_path / "carried", cfg, params, model_type=H.GEMMA4_TEXT, source=G4)
    assert json.loads((carried / hf_files.GENERATION_CONFIG_FILE).read_text()) == json.loads(
        (G4 / hf_files.GENERATION_CONFIG_FILE).read_text()
    )
    run = H.save_hf(tmp_path / "run", cfg, params, model_type=H.GEMMA4_TEXT, sampler={"ar_temperature": 0.7})
    generation = json.loads((run / hf_files.GENERATION_CONFIG_FILE).read_text())
    assert generation["do_sample"] is True and generation["temperature"] == 0.7 and generation["top_k"] == 0
    assert generation["eos_token_id"] == 1
    greedy = hf_config.generation_config(H.GEMMA4_TEXT, sampler={"ar_temperature": 0.0})
    assert greedy["do_sample"] is False and "temperature" not in greedy
    # DiffusionGemma: the run's sampler, else the source's set fields over the defaults
    sampler = {"num_steps": 12, "selection": {"rule": "entropy_bound", "gamma": 0.3}}
    assert hf_config.generation_config(H.DIFFUSION_GEMMA, sampler=sampler)["max_denoising_steps"] == 12
    source = {"max_denoising_steps": 20, "t_min": None}
    from_source = hf_config.generation_config(H.DIFFUSION_GEMMA, source=source, source_model_type=H.DIFFUSION_GEMMA)
    assert from_source["max_denoising_steps"] == 20 and "t_min" not in from_source


def test_a_run_with_a_checkpoints_own_tokenizer_exports_it(tmp_path):
    """A run that tokenizes with a Hugging Face checkpoint's tokenizer (kind "pretrained") names that file for the
    export, so `sample --workdir hf:DIR` finds it; a run with the toolbox's own tokenizer names none."""
    from hackable_diffusion.convert import run_tokenizer_file
    from hackable_diffusion.data import tokenizers as tok_lib

    run = tmp_path / "run"
    tok_lib.PretrainedTokenizer(G4 / "tokenizer.json").save(run / "tokenizer")
    found = run_tokenizer_file(run)["tokenizer_file"]
    assert found.read_bytes() == (G4 / "tokenizer.json").read_bytes()
    char = tmp_path / "char"
    tok_lib.CharTokenizer.fit("abc").save(char / "tokenizer")
    assert run_tokenizer_file(char) == {} and run_tokenizer_file(tmp_path / "none") == {}
