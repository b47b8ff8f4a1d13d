"""What FP8 weight-only quantization (models/quantize.py) costs a trained run: its validation likelihood with the
full-precision weights and with the weights quantized to float8_e4m3fn (per-output-channel scales) and dequantized,
on the same batches and noise draws (a paired difference), plus the weights' storage.

  python experiments/fp8_likelihood.py --workdirs runs/shakespeare_ar,runs/quickstart [--num_batches 8]

One JSON line per run.
"""

import argparse
import json

import jax
import jax.numpy as jnp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdirs", required=True, help="comma-separated training workdirs")
    parser.add_argument("--num_batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.models import quantize as Q
    from hackable_diffusion.tasks.text import evaluate_likelihood

    for workdir in args.workdirs.split(","):
        exp = exp_lib.from_workdir(workdir)
        params, step = toolbox.load_params(exp, workdir)
        values, scales = Q.quantize_fp8(params)
        fp8 = Q.dequantize(values, scales, jnp.float32)
        full = evaluate_likelihood(exp, params, num_batches=args.num_batches, seed=args.seed)
        quant = evaluate_likelihood(exp, fp8, num_batches=args.num_batches, seed=args.seed)
        bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
        line = {
            "benchmark": "fp8_likelihood",
            "workdir": workdir,
            "checkpoint_step": step,
            "kind": "autoregressive" if exp.is_autoregressive else f"diffusion/{exp.config.diffusion.process}",
            "bound": "exact NLL" if exp.is_autoregressive else "ELBO (same noise draws for both)",
            "num_batches": args.num_batches,
            "bits_per_token_full": full["bits_per_token"],
            "bits_per_token_fp8": quant["bits_per_token"],
            "delta_bits_per_token": quant["bits_per_token"] - full["bits_per_token"],
            "relative_delta": quant["bits_per_token"] / full["bits_per_token"] - 1,
            "bits_per_token_se_full": full["bits_per_token_se"],
            "weight_bytes_f32": Q.nbytes(params),
            "weight_bytes_bf16": Q.nbytes(bf16),
            "weight_bytes_fp8_with_scales": Q.nbytes(values) + Q.nbytes(scales),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
