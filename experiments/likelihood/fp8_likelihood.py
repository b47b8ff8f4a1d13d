"""What weight-only quantization (models/quantize.py) costs a trained run: its validation likelihood with the
full-precision weights, with the weights quantized to float8_e4m3fn (per-output-channel scales) and to NVFP4 (E2M1
codes, an e4m3 scale per block of 16 along the contracted axis, a float32 scale per tensor), each dequantized, on the
same batches and noise draws (paired differences), plus the weights' storage in each format.

  python experiments/likelihood/fp8_likelihood.py --workdirs runs/shakespeare_ar,runs/quickstart [--num_batches 8] [--out FILE]

One JSON line per run (printed, and appended to --out when given).
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
    parser.add_argument("--out", default="", help="a JSON-lines file the lines are appended to")
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
        nvfp4_params = jax.jit(Q.quantize_nvfp4)(params)
        nvfp4 = evaluate_likelihood(
            exp, nvfp4_params.dequantize(jnp.float32), num_batches=args.num_batches, seed=args.seed
        )
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
            "bits_per_token_nvfp4": nvfp4["bits_per_token"],
            "delta_bits_per_token_nvfp4": nvfp4["bits_per_token"] - full["bits_per_token"],
            "relative_delta_nvfp4": nvfp4["bits_per_token"] / full["bits_per_token"] - 1,
            "bits_per_token_se_full": full["bits_per_token_se"],
            "weight_bytes_f32": Q.nbytes(params),
            "weight_bytes_bf16": Q.nbytes(bf16),
            "weight_bytes_fp8_with_scales": Q.nbytes(values) + Q.nbytes(scales),
            "weight_bytes_nvfp4_with_scales": Q.nbytes(nvfp4_params),
        }
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as out:
                out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
