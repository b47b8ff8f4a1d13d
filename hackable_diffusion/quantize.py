"""Quantize a trained run's weights to FP8 (or NVFP4) once; the new run samples and evaluates like any other.

  python -m hackable_diffusion.quantize --workdir runs/shakespeare_ar --out runs/shakespeare_ar_fp8
  python -m hackable_diffusion.quantize --workdir runs/shakespeare_ar --out runs/shakespeare_ar_nvfp4 --format nvfp4
  python -m hackable_diffusion.sample --workdir runs/shakespeare_ar_fp8 --prompt "ROMEO:"
  python -m hackable_diffusion.evaluate --workdir runs/shakespeare_ar_fp8

Weight-only float8_e4m3fn with one scale per output channel (`models/quantize.py`): the run's latest checkpoint (its
EMA weights when it kept them) is read, every matmul weight quantized, and `--out` gets the run's config with
`model.weight_dtype="float8_e4m3fn"`, its tokenizer, the quantized weights (`fp8_params/`) and `quantized_from.json`
(source run, step, bytes before and after). `--format nvfp4`: NVIDIA's NVFP4 instead (E2M1 codes packed two per byte,
an e4m3 scale per block of 16 along the contracted axis, a float32 scale per tensor; `model.weight_dtype="nvfp4"`,
`nvfp4_params/`). Every model call dequantizes inside its compiled program. Prints one JSON
line. The output directory is a decoding run: it has no training state, so training cannot resume from it. It must
lie apart from the source run (not the same directory, not inside it, not around it), as `convert` requires.
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
    flags.DEFINE_enum(
        "format",
        "fp8",
        ["fp8", "nvfp4"],
        "fp8: float8_e4m3fn, a scale per output channel; nvfp4: E2M1 codes, an e4m3 scale per 16 inputs and one per "
        "tensor.",
    )


def quantize_run(workdir: str, out: str, *, weights: str = "ema", format: str = "fp8") -> dict:
    """Writes the quantized run `out` (`format` "fp8" or "nvfp4") from the trained run `workdir`; returns what the
    JSON line prints."""
    import jax

    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import quantized_runs, toolbox
    from hackable_diffusion.models import quantize as Q

    source, target = pathlib.Path(workdir), pathlib.Path(out)
    cli.check_apart(source, target, "--workdir", "--out")  # the trained run is kept as it is, nothing nested in it
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"--out {out} is a file: give a new directory.")
    if target.exists() and any(target.iterdir()) and not (target / quantized_runs.QUANTIZED_SOURCE).is_file():
        raise ValueError(f"--out {out} exists and is not a quantized run; choose a new directory.")
    exp = exp_lib.from_workdir(workdir)
    if exp.model.cfg.weight_dtype is not None:
        raise ValueError(f"{workdir} is already a quantized run (model.weight_dtype={exp.model.cfg.weight_dtype!r}).")
    params, step = toolbox.load_params(exp, workdir, weights=weights)
    weight_dtype = Q.FORMATS.get(format)
    if weight_dtype is None:
        raise ValueError(f"--format={format!r} must be one of {sorted(Q.FORMATS)}.")
    quantized = jax.jit(lambda p: Q.quantize_params_as(p, format))(params)
    target.mkdir(parents=True, exist_ok=True)
    config = exp.config.copy_and_resolve_references()
    config.model.weight_dtype = weight_dtype
    run_config.save_config(config, target / "config.json")
    if (source / "tokenizer").is_dir():
        shutil.copytree(source / "tokenizer", target / "tokenizer", dirs_exist_ok=True)
    for stale, directory in quantized_runs.WEIGHT_DIRS.items():  # a rewrite in the other format drops the old weights
        if stale != weight_dtype and (target / directory).is_dir():
            shutil.rmtree(target / directory)
    save = quantized_runs.save_nvfp4 if format == "nvfp4" else quantized_runs.save_quantized
    save(quantized, target / quantized_runs.WEIGHT_DIRS[weight_dtype])
    record = {
        "source": str(source),
        "step": int(step),
        "weights": "ema" if weights == "ema" and exp.config.train.ema_decay > 0 else "raw",
        "format": format,
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
    print(cli.json_line(quantize_run(FLAGS.workdir, FLAGS.out, weights=FLAGS.weights, format=FLAGS.format)), flush=True)


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
