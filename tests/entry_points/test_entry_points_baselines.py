"""End-to-end command paths of the two baselines next to DiffusionGemma's recipe: the MD4/MDLM masking run and the
autoregressive run train, sample and are scored (ELBO, exact NLL, generative perplexity). The runs are the test run's
shared ones (tests/conftest.py)."""

import pytest


@pytest.mark.slow
def test_masking_and_autoregressive_runs_train_sample_and_score(trained_text_runs):
    from _tiny_configs import TRAIN_OUTPUT

    from hackable_diffusion import cli, evaluate, run_config
    from hackable_diffusion.tasks.text_evaluation import Likelihood

    for process in ("masking", "none"):  # dense, 2 steps: tiny_text_config(process, steps=2, moe=False)
        output = (trained_text_runs[process] / TRAIN_OUTPUT).read_text()
        assert "Sample (" + ("autoregressive" if process == "none" else "diffusion") in output
        metrics = evaluate.run(str(trained_text_runs[process]), Likelihood(num_batches=1, batch_size=8))
        assert metrics["bound"] == ("exact NLL" if process == "none" else "ELBO (upper bound on NLL)")

    # Generative perplexity of the diffusion run's samples under the AR run, with a sampler override.
    scored = evaluate.run(
        str(trained_text_runs["masking"]),
        Likelihood(
            num_batches=1,
            batch_size=8,
            repeats=2,
            num_samples=2,
            max_new_tokens=16,
            scorer_workdir=str(trained_text_runs["none"]),
        ),
        config=cli.override(run_config.load_saved_config(str(trained_text_runs["masking"])), {"sampler.num_steps": 3}),
    )
    assert scored["sampler"]["num_steps"] == 3 and scored["mean_steps_per_canvas"] <= 3
    assert 0 < scored["gen_tokens"] <= 32 and scored["gen_ppl"] > 1 and len(scored["samples"]) == 2
    assert scored["bits_per_token_se"] >= 0
    with pytest.raises(ValueError, match="autoregressive scorer"):
        evaluate.run(
            str(trained_text_runs["none"]),
            Likelihood(num_batches=1, num_samples=1, scorer_workdir=str(trained_text_runs["masking"])),
        )
    with pytest.raises(cli.ConfigKeyError, match="sampler.num_steps"):
        cli.override(run_config.load_saved_config(str(trained_text_runs["masking"])), {"sampler.num_step": 3})


def test_evaluate_reads_the_checkpoint_step_it_is_given(trained_text_runs):
    import numpy as np

    from hackable_diffusion import evaluate
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.checkpoints.trees import flatten_tree

    workdir = str(trained_text_runs["uniform"])  # checkpoints at steps 3 and 6
    _, latest, latest_step, _ = evaluate.load_run(workdir, weights="raw")
    _, earlier, earlier_step, _ = evaluate.load_run(workdir, weights="raw", step=3)
    assert (latest_step, earlier_step) == (6, 3)
    expected = flatten_tree(toolbox.load_toolbox_params(workdir, weights="raw", step=3)[0])
    got, last = flatten_tree(earlier), flatten_tree(latest)
    for path, array in got.items():
        np.testing.assert_allclose(np.asarray(array, np.float32), np.asarray(expected[path], np.float32), err_msg=path)
    assert any(not np.array_equal(np.asarray(got[p]), np.asarray(last[p])) for p in got)
    with pytest.raises(ValueError, match=r"step 4 not found .*available: \[3, 6\]"):
        evaluate.load_run(workdir, step=4)
