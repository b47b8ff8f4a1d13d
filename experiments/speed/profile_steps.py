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
import collections
import glob
import json
import pathlib
import re
import tempfile
import time

import jax
import jax.numpy as jnp

CATEGORIES = [  # (category, regex over the op_name metadata, else the instruction name), first match wins
    ("sampler: categorical draw", r"categorical|random_bits|threefry|gumbel|prior_sample|BlockedInverseCdf|uniform"),
    ("sampler: selection (entropy, sort)", r"selection|entropy|argsort|\bsort|cumsum"),
    ("sampler: temperature, argmax, stopping", r"denoising_loop/while/body/(?!.*canvas_logits)"),
    ("KV-cache update", r"dynamic_update_slice|dynamic-update-slice|scatter"),
    ("output head", r"embedder|decode\b|softcap|tanh"),
    (
        "attention scores / softmax / values",
        r"attn.*(bkglm|bkgls|softmax|_logits|where)|softmax|reduce_max|exponential",
    ),
    ("attention projections", r"q_einsum|kv_einsum|k_einsum|attn_vec_einsum|td,n?c?kdh->|td,ndh->|tnh,nhd->"),
    ("FFN / MoE", r"mlp|moe|gating_einsum|linear|gelu|ffw"),
    ("norms", r"norm|rsqrt"),
    ("rotary embedding", r"rope|(?<![a-z])(sin|cos)(?![a-z])"),
    # the scanned stack's own ops: weights sliced (copied) out of the stacked parameters, the loop itself
    ("layer scan (weight slicing, loop)", r"dynamic_slice|dynamic-slice|closed_call$|^while|^copy|bitcast"),
]


def op_metadata(hlo_text: str) -> dict[str, tuple[str, str]]:
    """instruction name -> (op_name metadata, opcode) from compiled HLO text."""
    out = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S+\s+([\w\-]+)\(", line)
        if not m:
            continue
        meta = re.search(r'op_name="([^"]*)"', line)
        out[m.group(1)] = (meta.group(1) if meta else "", m.group(2))
    return out


def categorise(name: str, meta: dict[str, tuple[str, str]], categories=None) -> str:
    categories = CATEGORIES if categories is None else categories
    op_name, opcode = meta.get(name, ("", ""))
    if op_name:
        # Weight slices of the scanned layer stack carry the slicing op's name, not the layer's.
        if re.search(r"dynamic_slice|dynamic_index_in_dim", op_name):
            return "layer scan (weight slicing, loop)"
        for category, pattern in categories:
            if re.search(pattern, op_name):
                return category
        return "other"
    if opcode == "dot":
        return "matmul (no source metadata)"
    for category, pattern in categories:
        if re.search(pattern, name):
            return category
    return "other"


def profile(fn, args, repeats: int, categories=None) -> dict:
    """Wall time per call and the traced XLA:CPU op time by category (`categorise`); `fn` must not donate `args`
    (it is called again on them)."""
    compiled = fn.lower(*args).compile() if hasattr(fn, "lower") else None
    meta = op_metadata(compiled.as_text()) if compiled is not None else {}
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(*args))
    wall = (time.perf_counter() - start) / repeats
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(repeats):
                jax.block_until_ready(fn(*args))
        path = sorted(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True))[-1]
        data = jax.profiler.ProfileData.from_file(path)
        per_op: collections.Counter = collections.Counter()
        for plane in data.planes:
            for line in plane.lines:
                if not line.name.startswith("tf_XLAEigen"):
                    continue
                for event in line.events:
                    if event.name in meta and not event.name.startswith("while"):
                        per_op[event.name] += event.duration_ns
    total = sum(per_op.values()) or 1
    by_category: collections.Counter = collections.Counter()
    backward = 0
    for name, ns in per_op.items():
        by_category[categorise(name, meta, categories)] += ns
        backward += ns * bool(re.search(r"transpose\(", meta.get(name, ("", ""))[0]))
    return {
        "wall_ms": 1e3 * wall,
        "traced_op_ms": sum(per_op.values()) / 1e6 / repeats,
        "share_by_category": {k: v / total for k, v in by_category.most_common()},
        "backward_share": backward / total,  # ops under jax's transpose: the backward pass (0 for inference)
        "top_ops": [
            {
                "op": n,
                "share": v / total,
                "category": categorise(n, meta, categories),
                "op_name": meta.get(n, ("", ""))[0][-100:],
            }
            for n, v in per_op.most_common(8)
        ],
    }


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
        import throughput  # experiments/speed/throughput.py, beside this script

        model = T.Transformer(TransformerConfig.from_dict(throughput.model_shapes(quick=True)[args.throughput_size]))
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
