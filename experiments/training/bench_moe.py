"""Benchmark: MoE dispatches vs a dense gated-GELU FFN with the same active parameters (CPU, forward + backward).

Setup (the one ``meets_target`` is defined for): T=4096 tokens (b=4, l=1024), d=512, 8 experts, top-2, expert hidden
1024, float32.
The reference is a dense gated-GELU FFN with hidden top_k * 1024 = 2048 (the same active parameters per token).
Each variant is ``jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))`` of a mean-squared-error loss with respect to
the input and all parameters. After warm-up, repetitions are interleaved (one call of each variant per round)
so that machine-load drifts hit every variant alike; the median wall time per variant is reported, and every
ratio is a variant's median divided by the dense-active FFN's median from the same run (``meets_target`` uses
these). ``cpu_ratio_*`` are the same ratios of median process CPU time, a second view on a shared machine.

Prints ONE JSON line. Usage: ``python experiments/training/bench_moe.py [--rounds 7] [--tokens 4096]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from hackable_diffusion.models.moe import MoEFeedForward, expert_capacity, gated_gelu

TARGET_SORTED_RATIO = 1.5


class DenseGatedFFN(nn.Module):
    """Plain gated-GELU FFN ``gelu_tanh(x W0) * (x W1) @ W2`` (the dense-active reference); it uses the same
    ``gated_gelu`` activation as the experts, so that the ratios measure dispatch, not activation code."""

    hidden_dim: int

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        init = nn.initializers.lecun_normal()
        w_gate = self.param("gate", init, (d, self.hidden_dim))
        w_up = self.param("up", init, (d, self.hidden_dim))
        w_down = self.param("down", init, (self.hidden_dim, d))
        # Flatten to (tokens, d) as the MoE does: with (b, l, d) inputs XLA:CPU computes the weight gradients as
        # dots with two contracting dimensions, which measured ~2.5x slower and would flatter the MoE ratios.
        tokens = x.reshape(-1, d)
        return (gated_gelu(tokens @ w_gate, tokens @ w_up) @ w_down).reshape(x.shape)


def _apply(module, params, x_in):
    """Output of either variant; the MoE routes from its own input (router_input = x)."""
    if isinstance(module, DenseGatedFFN):
        return module.apply(params, x_in), {}
    return module.apply(params, x_in, x_in)


def _make_step(module, x, target):
    params = jax.jit(lambda key: module.init(key, x) if isinstance(module, DenseGatedFFN) else module.init(key, x, x))(
        jax.random.key(0)
    )

    def loss(x_in, p):
        y, _ = _apply(module, p, x_in)
        return jnp.mean(jnp.square(y - target))

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    return step, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--model-dim", type=int, default=512)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-hidden", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--skip", default="", help="comma-separated variant names to skip (e.g. dense,ragged)")
    args = parser.parse_args()

    batch = 4
    if args.tokens % batch:
        raise ValueError(f"--tokens must be a multiple of {batch} (batch of {batch} sequences), got {args.tokens}.")
    length = args.tokens // batch
    kx, kt = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (batch, length, args.model_dim), jnp.float32)
    target = jax.random.normal(kt, x.shape, jnp.float32)

    moe = dict(num_experts=args.experts, top_k=args.top_k, hidden_dim=args.expert_hidden)
    variants = {
        "dense_active": DenseGatedFFN(hidden_dim=args.top_k * args.expert_hidden),
        "dense": MoEFeedForward(**moe, dispatch="dense"),
        "sorted_cf1.25": MoEFeedForward(**moe, dispatch="sorted", capacity_factor=1.25),
        "sorted_cf2.0": MoEFeedForward(**moe, dispatch="sorted", capacity_factor=2.0),
        "ragged": MoEFeedForward(**moe, dispatch="ragged"),
    }
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(variants):
        raise ValueError(f"--skip names {sorted(skip - set(variants))} unknown; choose from {sorted(variants)}.")
    variants = {k: v for k, v in variants.items() if k not in skip or k == "dense_active"}

    steps = {}
    for name, module in variants.items():
        step, params = _make_step(module, x, target)
        steps[name] = (step, params)
        for _ in range(args.warmup):
            jax.block_until_ready(step(x, params))

    times = {name: [] for name in steps}
    cpu_times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, (step, params) in steps.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            jax.block_until_ready(step(x, params))
            times[name].append(time.perf_counter() - start)
            cpu_times[name].append(time.process_time() - cpu_start)

    medians_ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    cpu_medians_ms = {name: 1e3 * statistics.median(ts) for name, ts in cpu_times.items()}
    result = {
        "bench": "moe_dispatch_fwd_bwd_cpu",
        "tokens": args.tokens,
        "d": args.model_dim,
        "experts": args.experts,
        "top_k": args.top_k,
        "expert_hidden": args.expert_hidden,
        "dtype": "float32",
        "rounds": args.rounds,
        "capacity_cf1.25": expert_capacity(args.tokens, args.top_k, args.experts, 1.25),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
    }
    for name, ms in medians_ms.items():
        result[f"ms_{name}"] = round(ms, 2)
    for name, ms in medians_ms.items():
        if name != "dense_active":
            result[f"ratio_{name}"] = round(ms / medians_ms["dense_active"], 3)
    # Secondary: process CPU time (all threads), less sensitive to other jobs on a shared machine.
    for name, ms in cpu_medians_ms.items():
        if name != "dense_active":
            result[f"cpu_ratio_{name}"] = round(ms / cpu_medians_ms["dense_active"], 3)
    for name, (_, params) in steps.items():
        if name.startswith("sorted"):
            _, aux = jax.jit(lambda p, module=variants[name]: _apply(module, p, x))(params)
            result[f"dropped_fraction_{name}"] = round(float(aux["moe_dropped_fraction"]), 4)
    result["target_sorted_cf1.25_le"] = TARGET_SORTED_RATIO
    result["meets_target"] = bool(result.get("ratio_sorted_cf1.25", float("inf")) <= TARGET_SORTED_RATIO)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
