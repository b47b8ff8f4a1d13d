"""Toolbox runs exported to Hugging Face (`convert --from RUN --to DIR`): config.json describes the tensors the run
trained (its tokenizer's vocabulary, its context, its decoder-window convention), the tokenizer is exported, and the
toolbox's own `load_hf` of the export gives the run's logits, encoder and canvas, with a prompt longer than the
sliding window. With `transformers` importable (`pip install -e '.[interop]'`) the same directories are loaded by it
and compared (experiments/checkpoints/hf_interop.py); without it those tests are skipped."""

import json
import pathlib

import pytest

import hf_interop  # experiments/checkpoints/hf_interop.py
from _tiny_configs import tiny_text_config
from hackable_diffusion import convert
from hackable_diffusion.checkpoints import hf as H
from hackable_diffusion.checkpoints import hf_config
from hackable_diffusion.checkpoints import hf_files
from hackable_diffusion.data import tokenizers as tok_lib
from hackable_diffusion.models import presets
from hackable_diffusion.models.config import TransformerConfig

EXACT = 1e-5  # the export holds the run's values bit for bit; the same programs run on them


@pytest.fixture(scope="module")
def diffusion_runs(trained_text_runs, tmp_path_factory):
    """The suite's tiny uniform + self-conditioning run (char tokenizer, per_token window 4, canvas 8) and the same
    weights recorded as trained with transformers' cache_tail window."""
    root = tmp_path_factory.mktemp("export_runs")
    run = trained_text_runs["uniform"]
    return {"per_token": run, "cache_tail": hf_interop.with_decoder_window(run, "cache_tail", root / "cache_tail")}


@pytest.fixture(scope="module")
def masking_spm_run(tmp_path_factory):
    """A block masking MoE run with a SentencePiece tokenizer, at initialisation (export needs no training)."""
    config = tiny_text_config("masking", steps=1)
    config.data.tokenizer, config.data.vocab_size = "spm", 96
    return hf_interop.init_run(config, tmp_path_factory.mktemp("masking_spm") / "run")


def assert_export_reproduces_the_run(run: pathlib.Path, export: pathlib.Path, model_type: str, window: str):
    record = hf_interop.check_export(run, export, with_transformers=False)
    assert record["model_type"] == model_type and record["decoder_window"] == window
    # config.json agrees with every tensor: load_hf checks each shape against the config it reads
    model, _ = hf_interop.run_model(run)
    assert record["vocab_size"] == record["embedding_shape"][0] == model.cfg.vocab_size
    assert record["max_position_embeddings"] == 32  # the run's data.seq_len, not the release's 131,072
    assert record["tokenizer_same_ids"], record
    assert set(record["max_abs_diff"]) >= {"load_hf_encoder_past", "load_hf_canvas_past"}
    assert record["prompt_lengths"]["past"] > model.cfg.sliding_window
    assert max(record["max_abs_diff"].values()) <= EXACT, record["max_abs_diff"]
    return record


@pytest.mark.slow
def test_a_uniform_run_trained_with_the_cache_tail_window_exports_as_diffusiongemma(diffusion_runs, tmp_path):
    run = diffusion_runs["cache_tail"]
    convert.convert(str(run), str(tmp_path / "hf"))
    record = assert_export_reproduces_the_run(run, tmp_path / "hf", H.DIFFUSION_GEMMA, "cache_tail")
    assert record["vocab_size"] == tok_lib.load_tokenizer(run / "tokenizer").vocab_size != 64  # not the preset's
    assert {"load_hf_canvas_sc_past"} <= set(record["max_abs_diff"])
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    assert H.load_hf(tmp_path / "hf").config.decoder_window == "cache_tail"  # read from config.json
    # `--workdir hf:DIR` finds the tokenizer (it used to fail: neither tokenizer.model nor tokenizer.json)
    from hackable_diffusion.checkpoints import hf_runs

    assert (hf_runs.hf_run_dir(str(tmp_path / "hf")) / "config.json").is_file()


@pytest.mark.slow
def test_a_per_token_run_is_refused_as_diffusiongemma_unless_allowed_then_load_hf_follows_it(diffusion_runs, tmp_path):
    """transformers decodes with cache_tail: a per_token run is refused by name, with the flag that fixes it; allowed,
    config.json records per_token and the toolbox reproduces the run past the window (where cache_tail differs)."""
    run = diffusion_runs["per_token"]
    with pytest.raises(ValueError, match="decoder_window=cache_tail.*--allow_decoder_window_mismatch"):
        convert.convert(str(run), str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    convert.convert(str(run), str(tmp_path / "hf"), allow_decoder_window_mismatch=True)
    assert_export_reproduces_the_run(run, tmp_path / "hf", H.DIFFUSION_GEMMA, "per_token")
    # the conventions differ here, so the comparison above could fail: read as transformers decodes, it does
    model, params = hf_interop.run_model(run)
    tail = H.load_hf(tmp_path / "hf", decoder_window="cache_tail")
    batch = hf_interop.inputs(model.cfg.vocab_size, hf_interop.prompt_lengths(model.cfg)["past"])
    from hackable_diffusion.models import transformer as T

    ours = hf_interop.toolbox_logits(model, params, batch)
    theirs = hf_interop.toolbox_logits(T.Transformer(tail.config), tail.params, batch)
    assert hf_interop.max_diff(ours["encoder"], theirs["encoder"]) <= EXACT
    assert hf_interop.max_diff(ours["canvas"], theirs["canvas"]) > 1e-3


@pytest.mark.slow
def test_a_masking_run_with_sentencepiece_exports_as_gemma4(masking_spm_run, tmp_path):
    convert.convert(str(masking_spm_run), str(tmp_path / "hf"))
    assert_export_reproduces_the_run(masking_spm_run, tmp_path / "hf", H.GEMMA4_TEXT, "per_token")
    spm = (masking_spm_run / "tokenizer" / tok_lib.SPM_MODEL_FILE).read_bytes()
    assert (tmp_path / "hf" / "tokenizer.model").read_bytes() == spm
    assert hf_files.read_config(tmp_path / "hf")["vocab_size"] == 96 != 64


@pytest.mark.slow
@pytest.mark.parametrize("case", ["diffusiongemma", "gemma4"])
def test_transformers_loads_the_export_with_the_runs_logits_and_generates(
    case, diffusion_runs, masking_spm_run, tmp_path
):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    run = diffusion_runs["cache_tail"] if case == "diffusiongemma" else masking_spm_run
    convert.convert(str(run), str(tmp_path / "hf"))
    record = hf_interop.check_export(run, tmp_path / "hf")
    assert not any(record["loading_info"].values()), record["loading_info"]
    assert all(v <= hf_interop.TOLERANCE for v in record["max_abs_diff"].values()), record["max_abs_diff"]
    assert len(record["generated"]) > 6 and record["ok"], record


def test_a_character_tokenizer_exports_as_a_tokenizers_json_with_the_same_ids(tmp_path):
    from hackable_diffusion.data import text

    tokenizer = tok_lib.CharTokenizer.fit(text.load_shakespeare("train"))
    path = tok_lib.save_hf_tokenizer(tokenizer, tmp_path)
    assert path.name == "tokenizer.json"
    exported = tok_lib.PretrainedTokenizer.from_directory(tmp_path)
    sample = text.load_shakespeare("validation")[:3000]
    ids = tokenizer.encode(sample)
    assert exported.vocab_size == tokenizer.vocab_size and exported.encode(sample) == ids
    assert exported.decode(ids) == tokenizer.decode(ids) == sample
    angled = tok_lib.CharTokenizer.fit("</s> <pad>")  # a literal special name is its characters, as here
    (tmp_path / "angled").mkdir()
    tok_lib.save_hf_tokenizer(angled, tmp_path / "angled")
    assert tok_lib.PretrainedTokenizer.from_directory(tmp_path / "angled").encode("</s>") == angled.encode("</s>")
    spm = tok_lib.SentencePieceTokenizer.train(sample, vocab_size=80)
    (tmp_path / "spm").mkdir()
    path = tok_lib.save_hf_tokenizer(spm, tmp_path / "spm")
    assert path.name == "tokenizer.model" and tok_lib.PretrainedTokenizer(path).encode(sample) == spm.encode(sample)


def tiny_cfg(**changes) -> TransformerConfig:
    return TransformerConfig.from_dict(dict(presets.tiny(), **changes))


def test_config_json_records_the_context_and_window_and_refuses_an_uncapped_diffusiongemma():
    cfg = tiny_cfg(self_conditioning=True, decoder_window="cache_tail", k_eq_v_global=True)
    hf = hf_config.config_to_hf(cfg, max_position_embeddings=32)
    assert hf["text_config"]["max_position_embeddings"] == 32 and hf["decoder_window"] == "cache_tail"
    back, _ = hf_config.config_from_hf(hf)
    assert back.decoder_window == "cache_tail"
    assert hf_config.config_from_hf(hf, decoder_window="per_token")[0].decoder_window == "per_token"
    unrecorded = dict(hf, decoder_window=None, text_config=dict(hf["text_config"], decoder_window=None))
    assert hf_config.config_from_hf(unrecorded)[0].decoder_window == "per_token"  # a file transformers wrote
    with pytest.raises(ValueError, match="final_logit_softcap=None cannot be exported as diffusion_gemma"):
        hf_config.config_to_hf(cfg.replace(final_logit_softcap=None))
    gemma4 = hf_config.config_to_hf(tiny_cfg(final_logit_softcap=None), model_type=H.GEMMA4_TEXT)
    assert gemma4["final_logit_softcapping"] is None  # Gemma-4's own default: no cap


def test_parameters_that_disagree_with_the_config_are_refused_before_writing(tmp_path):
    import jax

    from hackable_diffusion.models import transformer as T

    cfg = tiny_cfg(moe=None)
    params = jax.device_get(T.init_params(T.Transformer(cfg.replace(vocab_size=69)), jax.random.key(0)))
    with pytest.raises(ValueError, match=r"embedder/input_embedding has shape \(69, 32\).*\(64, 32\)"):
        list(H.hf_tensors(cfg, params, model_type=H.GEMMA4_TEXT))


def test_a_diffusiongemma_export_without_a_source_holds_the_stand_in_vision_weights(tmp_path):
    import jax

    from hackable_diffusion.models import transformer as T

    cfg = tiny_cfg(self_conditioning=True, k_eq_v_global=True)
    params = jax.device_get(T.init_params(T.Transformer(cfg), jax.random.key(0)))
    H.save_hf(tmp_path / "hf", cfg, params, canvas_length=8)
    shapes = hf_files.tensor_shapes(hf_files.weight_files(tmp_path / "hf"))
    stand_in = hf_config.minimal_vision_shapes(cfg.embed_dim)
    assert {name: shapes[name] for name in stand_in} == stand_in
    assert H.load_hf(tmp_path / "hf").skipped_tensors == len(stand_in)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vision_config"] == H.MINIMAL_VISION_CONFIG
