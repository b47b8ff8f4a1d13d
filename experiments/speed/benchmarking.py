"""What the decode and training benchmarks share: the random-weight model sizes, timing in turns, and the op-level
profiler that maps an XLA:CPU trace back to the model's code.

Used by `throughput.py` (end-to-end decoding, trained runs and their text), `decode_bench.py` (each decode program
against the hardware peaks measured in the same run), `profile_steps.py` (where a canvas step's and an AR step's time
goes) and `training/bench_train.py --profile` (a training step's op time).
"""

from __future__ import annotations

import collections
import glob
import re
import tempfile
import time

import jax
import numpy as np

from hackable_diffusion.models import presets

# ---------------------------------------------------------------------------------------------------------------------
# Random-weight sizes.


def model_shapes(quick: bool) -> dict[str, dict]:
    """The trained-size model and >= 300M-parameter dense and MoE models (random weights)."""
    large = dict(
        embed_dim=1024,
        num_layers=18,
        num_heads=16,
        head_dim=64,
        num_kv_heads=8,
        ffw_hidden=4096,
        layer_pattern=("local", "local", "global"),
        sliding_window=1024,
        global_head_dim=64,
        global_num_kv_heads=4,
        vocab_size=32_768,
        param_dtype="float32",
        compute_dtype="float32",
    )
    shapes = {
        "small": presets.small(vocab_size=128),
        "large": presets.derived(**large, moe=None),
        "large_moe": presets.derived(
            **dict(large, ffw_hidden=2048),
            moe=dict(num_experts=8, top_k=2, hidden_dim=1024, dispatch="sorted", capacity_factor=4.0),
        ),
    }
    if quick:
        shapes = {k: dict(v, num_layers=len(v["layer_pattern"])) for k, v in shapes.items()}
    return shapes


# ---------------------------------------------------------------------------------------------------------------------
# Timing.


def best_time(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved_medians(fns: dict, repeats: int) -> dict[str, float]:
    """Median wall time of each function, compiled first, then timed in turns so that all see the same machine."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def median_time(fn, repeats: int) -> float:
    return interleaved_medians({"only": fn}, repeats)["only"]


# ---------------------------------------------------------------------------------------------------------------------
# The op-level profiler.

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
