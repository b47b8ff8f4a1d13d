"""End-to-end command paths of the two baselines next to DiffusionGemma's recipe: the MD4/MDLM masking run and the
autoregressive run train, sample and are scored (ELBO, exact NLL, generative perplexity). A file of its own so that
the two slowest end-to-end tests run in different xdist workers."""

import pytest
from _tiny_configs import tiny_text_config


def test_masking_and_autoregressive_runs_train_sample_and_score(tmp_path, capsys):
    from hackable_diffusion import cli, evaluate, train

    for process in ("masking", "none"):
        config = tiny_text_config(process, steps=2, moe=False)  # dense: MoE runs in test_entry_points.py
        config.train.eval_every = 0
        config.train.checkpoint_every = 2
        train.run(config, str(tmp_path / process))
        assert "Sample (" + ("autoregressive" if process == "none" else "diffusion") in capsys.readouterr().out
        metrics = evaluate.likelihood(str(tmp_path / process), num_batches=1, batch_size=8)
        assert metrics["bound"] == ("exact NLL" if process == "none" else "ELBO (upper bound on NLL)")

    # Generative perplexity of the diffusion run's samples under the AR run, with a sampler override.
    scored = evaluate.likelihood(
        str(tmp_path / "masking"),
        num_batches=1,
        batch_size=8,
        repeats=2,
        num_samples=2,
        max_new_tokens=16,
        scorer_workdir=str(tmp_path / "none"),
        config=cli.override(cli.load_saved_config(str(tmp_path / "masking")), {"sampler.num_steps": 3}),
    )
    assert scored["sampler"]["num_steps"] == 3 and scored["mean_steps_per_canvas"] <= 3
    assert 0 < scored["gen_tokens"] <= 32 and scored["gen_ppl"] > 1 and len(scored["samples"]) == 2
    assert scored["bits_per_token_se"] >= 0
    with pytest.raises(ValueError, match="autoregressive scorer"):
        evaluate.likelihood(
            str(tmp_path / "none"), num_batches=1, num_samples=1, scorer_workdir=str(tmp_path / "masking")
        )
    with pytest.raises(cli.ConfigKeyError, match="sampler.num_steps"):
        cli.override(cli.load_saved_config(str(tmp_path / "masking")), {"sampler.num_step": 3})
