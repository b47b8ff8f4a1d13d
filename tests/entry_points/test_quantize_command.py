"""`python -m hackable_diffusion.quantize`: a trained run quantized once to FP8 weights samples and is scored like any
run, its likelihood close to the full-precision one, its weights in about a quarter of the float32 bytes; bad
arguments are one error line. The runs are the test run's shared ones (tests/conftest.py)."""

import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_quantized_run_samples_and_scores_like_its_source(trained_text_runs, tmp_path):
    from hackable_diffusion import evaluate
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.models import quantize as Q
    from hackable_diffusion.quantize import quantize_run
    from hackable_diffusion.tasks import text
    from hackable_diffusion.tasks.text_evaluation import Likelihood

    source = str(trained_text_runs["none"])  # the autoregressive run: exact NLL, no Monte-Carlo noise
    out = tmp_path / "ar_fp8"
    command = [sys.executable, "-m", "hackable_diffusion.quantize", f"--workdir={source}", f"--out={out}"]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(run.stdout.strip().splitlines()[-1])
    assert record["step"] == 2 and record["bytes_after"] < 0.3 * record["bytes_before"]  # float32 -> 1 byte + scales
    assert json.loads((out / "config.json").read_text())["model"]["weight_dtype"] == "float8_e4m3fn"

    exp = exp_lib.from_workdir(str(out))
    params, step = toolbox.load_params(exp, str(out))
    assert isinstance(params, Q.QuantizedParams) and step == 2
    texts, _ = text.sample_texts(exp, params, ["ROMEO:"], seed=0, max_new_tokens=8)
    assert len(texts) == 1 and isinstance(texts[0], str)
    full = evaluate.run(source, Likelihood(num_batches=2, batch_size=8))
    fp8 = evaluate.run(str(out), Likelihood(num_batches=2, batch_size=8))
    assert fp8["bound"] == "exact NLL" and fp8["bits_per_token"] != full["bits_per_token"]
    np.testing.assert_allclose(fp8["bits_per_token"], full["bits_per_token"], rtol=0.02)

    from hackable_diffusion.convert import load_source  # convert writes the dequantized weights

    cfg, weights, _ = load_source(out, "workdir")
    assert cfg.weight_dtype is None and not isinstance(weights, Q.QuantizedParams)
    np.testing.assert_array_equal(
        jax.tree.leaves(weights)[0], jax.tree.leaves(jax.device_get(params.dequantize(cfg.param_dtype)))[0]
    )

    assert quantize_run(source, str(out))["step"] == 2  # rewriting its own output is allowed
    with pytest.raises(ValueError, match="overlaps --workdir"):
        quantize_run(source, source)
    with pytest.raises(ValueError, match="already a quantized run"):
        quantize_run(str(out), str(tmp_path / "again"))
    bad = subprocess.run(command[:-1], cwd=REPO, capture_output=True, text=True)  # no --out: one error line
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "both required" in bad.stderr, bad.stderr
