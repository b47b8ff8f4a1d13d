"""Where the time goes: one canvas denoising step vs one autoregressive decode step, profiled op by op.

  python experiments/speed/profile_steps.py [--workdir runs/shakespeare_uniform] [--canvas 64] [--context 512]
      [--preset mini|small] [--out results/text/profile.md]

Both steps run on the same network against a KV cache holding `--context` tokens: the canvas step is
`transformer.decode_block` over a canvas of `--canvas` tokens (the cache is only read), the AR step is
`transformer.append` of one token (it writes the cache). Each is traced with `jax.profiler` for `--repeats` calls;
the XLA:CPU trace's per-HLO-op events are summed and mapped back to the model's code through the compiled HLO's
`op_name` metadata, then grouped into: attention projections, attention scores/softmax/values, FFN, output head
(tied embedding matmul + softcap), norms, KV-cache update, layer-scan bookkeeping (per-layer weight slicing in the
scanned loop, `copy`/`dynamic-slice`), and other. One JSON line per step, and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import jax.numpy as jnp
from benchmarking import model_shapes, profile


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="", help="a trained run (its model and params); default: --preset")
    parser.add_argument("--preset", default="mini")
    parser.add_argument(
        "--throughput_size",
        default="",
        help="instead of --preset: a random-weight size of `throughput.py --quick` (small, large, large_moe)",
    )
    parser.add_argument(
        "--loop_steps",
        type=int,
        default=0,
        help="also profile the sampler's whole denoising loop (uniform process, entropy bound, annealed temperature, "
        "no early stopping) for this many steps; its figures are per step",
    )
    parser.add_argument("--draw", default="gumbel_max", help="the loop's candidate draw (sampling/draws.py)")
    parser.add_argument("--canvas", type=int, default=64)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    from hackable_diffusion.models import presets
    from hackable_diffusion.models import transformer as T
    from hackable_diffusion.models.attention import init_cache
    from hackable_diffusion.models.config import TransformerConfig

    if args.workdir:
        from hackable_diffusion import experiment as exp_lib
        from hackable_diffusion.checkpoints import toolbox

        exp = exp_lib.from_workdir(args.workdir)
        model = exp.model
        params, _ = toolbox.load_params(exp, args.workdir)
        source = args.workdir
    elif args.throughput_size:
        model = T.Transformer(TransformerConfig.from_dict(model_shapes(quick=True)[args.throughput_size]))
        params = T.init_params(model, jax.random.key(0))
        source = f"throughput.py --quick size {args.throughput_size} (random weights)"
    else:
        model = T.Transformer(TransformerConfig.from_dict(getattr(presets, args.preset)(vocab_size=128)))
        params = T.init_params(model, jax.random.key(0))
        source = f"presets.{args.preset} (random weights)"
    b = args.batch
    cache = init_cache(model.cfg, b, args.context + args.canvas)
    prefix = jnp.full((b, args.context), 5, jnp.int32)
    _, cache = T.append(model, params, prefix, cache)

    def canvas_step(p, tokens, c):
        return T.decode_block(model, p, tokens, c)[0]

    def ar_step(p, tokens, c):
        logits, new_cache = T.append(model, p, tokens, c)
        return logits, new_cache.end_index

    programs = [
        ("canvas step", jax.jit(canvas_step), jnp.full((b, args.canvas), 6, jnp.int32), 1),
        ("AR step", jax.jit(ar_step), jnp.full((b, 1), 6, jnp.int32), 1),
    ]
    if args.loop_steps:
        from hackable_diffusion.diffusion.processes import UniformProcess
        from hackable_diffusion.diffusion.schedules import LinearSchedule
        from hackable_diffusion.sampling import canvas as canvas_lib
        from hackable_diffusion.sampling.draws import make_draw
        from hackable_diffusion.sampling.early_stopping import NoEarlyStop
        from hackable_diffusion.sampling.keys import row_keys
        from hackable_diffusion.sampling.sampler import DiffusionSampler

        vocab = model.cfg.vocab_size
        sampler = DiffusionSampler(
            process=UniformProcess(vocab, LinearSchedule(), excluded_ids=(0, 1, 2, 3)),
            canvas_length=args.canvas,
            num_steps=args.loop_steps,
            early_stopping=NoEarlyStop(),
            forbidden_tokens=(0, 1, 2, 3),
            draw=make_draw(args.draw),
        )
        keys = row_keys(0, b)
        fixed, active = jnp.zeros((b, args.canvas), bool), jnp.ones((b,), bool)

        def denoising_loop(p, tokens, c):
            return canvas_lib._denoise(
                model, p, c, tokens, keys, fixed, active, sampler=sampler, return_trajectory=False
            ).canvas

        programs.append(
            (f"denoising loop step ({args.loop_steps} steps)", jax.jit(denoising_loop), programs[0][2], args.loop_steps)
        )
    rows = []
    for name, fn, tokens, per_call in programs:
        result = profile(fn, (params, tokens, cache), args.repeats)
        result["wall_ms"] /= per_call
        result["traced_op_ms"] /= per_call
        result.update(step=name, tokens_per_call=int(tokens.size), model=source, context=args.context, batch=b)
        result["wall_ms_per_token"] = result["wall_ms"] / tokens.size
        print(json.dumps(result), flush=True)
        rows.append(result)

    if args.out:
        cats = sorted({c for r in rows for c in r["share_by_category"]})
        lines = [
            f"Made by `python experiments/speed/profile_steps.py {' '.join(f'--{k}={v}' for k, v in vars(args).items() if v)}`"
            f" — {source}, cache of {args.context} tokens, batch {b}.",
            "",
            "| step | tokens / call | wall ms / call | ms / token | " + " | ".join(cats) + " |",
            "|---|---:|---:|---:|" + "---:|" * len(cats),
        ]
        for r in rows:
            lines.append(
                f"| {r['step']} | {r['tokens_per_call']} | {r['wall_ms']:.2f} | {r['wall_ms_per_token']:.3f} | "
                + " | ".join(f"{100 * r['share_by_category'].get(c, 0):.0f}%" for c in cats)
                + " |"
            )
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
