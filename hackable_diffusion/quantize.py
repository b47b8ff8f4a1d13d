"""Quantize a trained run's weights to FP8 once; the new run samples and evaluates like any other.

  python -m hackable_diffusion.quantize --workdir runs/shakespeare_ar --out runs/shakespeare_ar_fp8
  python -m hackable_diffusion.sample --workdir runs/shakespeare_ar_fp8 --prompt "ROMEO:"
  python -m hackable_diffusion.evaluate --workdir runs/shakespeare_ar_fp8

Weight-only float8_e4m3fn with one scale per output channel (`models/quantize.py`): the run's latest checkpoint (its
EMA weights when it kept them) is read, every matmul weight quantized, and `--out` gets the run's config with
`model.weight_dtype="float8_e4m3fn"`, its tokenizer, the quantized weights (`fp8_params/`) and `quantized_from.json`
(source run, step, bytes before and after). Every model call dequantizes inside its compiled program. Prints one JSON
line. The output directory is a decoding run: it has no training state, so training cannot resume from it.
"""

from __future__ import annotations

import json
import pathlib
import shutil

from absl import flags

from hackable_diffusion import cli, run_config

FLAGS = flags.FLAGS


def define_flags(argv: list[str]):
    del argv
    flags.DEFINE_string("workdir", None, "The trained run to quantize (a workdir of hackable_diffusion.train).")
    flags.DEFINE_string("out", None, "The quantized run to write (a new directory, or one this command wrote).")
    flags.DEFINE_enum("weights", "ema", ["ema", "raw"], "ema: quantize the EMA weights when the run kept them; raw: the trained.")


def quantize_run(workdir: str, out: str, *, weights: str = "ema") -> dict:
    """Writes the quantized run `out` from the trained run `workdir`; returns what the JSON line prints."""
    import jax

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import quantized_runs, toolbox
    from hackable_diffusion.models import quantize as Q

    source, target = pathlib.Path(workdir), pathlib.Path(out)
    if source.resolve() == target.resolve():
        raise ValueError(f"--out must differ from --workdir ({workdir}): the trained run is kept as it is.")
    if target.exists() and any(target.iterdir()) and not (target / quantized_runs.QUANTIZED_SOURCE).is_file():
        raise ValueError(f"--out {out} exists and is not a quantized run; choose a new directory.")
    exp = exp_lib.from_workdir(workdir)
    if exp.model.cfg.weight_dtype is not None:
        raise ValueError(f"{workdir} is already a quantized run (model.weight_dtype={exp.model.cfg.weight_dtype!r}).")
    params, step = toolbox.load_params(exp, workdir, weights=weights)
    quantized = jax.jit(Q.quantize_params)(params)
    target.mkdir(parents=True, exist_ok=True)
    config = exp.config.copy_and_resolve_references()
    config.model.weight_dtype = "float8_e4m3fn"
    run_config.save_config(config, target / "config.json")
    if (source / "tokenizer").is_dir():
        shutil.copytree(source / "tokenizer", target / "tokenizer", dirs_exist_ok=True)
    quantized_runs.save_quantized(quantized, target / quantized_runs.QUANTIZED_DIR)
    record = {
        "source": str(source),
        "step": int(step),
        "weights": "ema" if weights == "ema" and exp.config.train.ema_decay > 0 else "raw",
        "bytes_before": Q.nbytes(params),
        "bytes_after": Q.nbytes(quantized),
        "out": str(target),
    }
    (target / quantized_runs.QUANTIZED_SOURCE).write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv):
    del argv
    if not FLAGS.workdir or not FLAGS.out:
        raise ValueError("--workdir (a trained run) and --out (the quantized run to write) are both required.")
    cli.quiet_library_logs()
    print(cli.json_line(quantize_run(FLAGS.workdir, FLAGS.out, weights=FLAGS.weights)), flush=True)


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
