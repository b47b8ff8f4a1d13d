"""XLA's counts of a compiled decode program, and the compile of those programs on one device that they are read from.

What it follows:
  * XLA's `compiled.cost_analysis()` (HloCostAnalysis): "flops" counts every HLO instruction (elementwise ops and
    converts too), "bytes accessed" sums, over every instruction left after fusion, the bytes of all its operands and
    of its output, as if each one went through memory. It counts the body of a while loop once whatever the trip
    count, so the programs are compiled with the layer scan unrolled (`scan_unroll = num_groups`: the same
    parameters and the same math, a static slice of the stacked weights per layer).

They are checked against `costs.compiled_counts` (what the toolbox's program computes as compiled here).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from aot import layout, programs
from aot.costs import Program
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.training import sharding

# ---------------------------------------------------------------------------------------------------------------------
# XLA's counts of a compiled program.

_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
}
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\w+\[[\d,]*\]\S*) ([\w\-]+)\((.*?)\)(.*)$")


def _shape_bytes(shape: str) -> int:
    return sum(
        math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES[dtype]
        for dtype, dims in _SHAPE.findall(shape)
        if dtype in _DTYPE_BYTES
    )


def _dims(shape: str) -> list[int]:
    match = _SHAPE.search(shape)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


@dataclasses.dataclass(frozen=True)
class HloCosts:
    """Counts read from an optimized HLO module's text.

    dot_flops: 2 x output elements x contracted size, summed over every dot of every computation (times the number of
      places that call it). bytes_by_kind: operand + output bytes of the entry computation's instructions (what
      "bytes accessed" sums), by kind: "matmul" (dots and fusions holding one), "argument_copies" (instructions
      computed from the program's arguments alone, no matmul upstream: XLA:CPU's converts, slices and layout copies
      of the stacked weights and of the cache, the embedding lookup) and "other" (the activations' traffic).
      while_loops: loops left in the module, whose bodies XLA's cost analysis counts once.
    """

    dot_flops: float
    bytes_by_kind: Mapping[str, float]
    while_loops: int


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
        elif current is not None and line.startswith(" "):
            computations[current].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text.")
    return computations, entry


def hlo_costs(hlo_text: str) -> HloCosts:
    """Parses `compiled.as_text()` (see `HloCosts`)."""
    computations, entry = _computations(hlo_text)
    calls = collections.Counter(re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", hlo_text))
    has_dot = {name: any(" dot(" in line for line in lines) for name, lines in computations.items()}
    dot_flops, by_kind, loops = 0.0, collections.Counter(), 0
    for name, lines in computations.items():
        shapes: dict[str, str] = {}
        arguments: set[str] = set()
        times = 1 if name == entry else calls.get(name, 0)
        for line in lines:
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            result, shape, op, operands, attributes = match.groups()
            shapes[result] = shape
            names = [o.strip().split(" ")[-1].lstrip("%") for o in operands.split(",") if o.strip()]
            if op == "while":
                loops += times
            elif op == "dot":
                contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attributes)
                lhs = _dims(shapes.get(names[0], "")) if names else []
                size = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d) if contracting else 1
                dot_flops += times * 2.0 * math.prod(_dims(shape)) * size
            if name != entry:
                continue
            called = re.search(r"calls=%?([\w.\-]+)", attributes)
            matmul = op == "dot" or (op == "fusion" and called is not None and has_dot.get(called.group(1), False))
            if op in ("parameter", "constant") or (not matmul and all(o in arguments for o in names)):
                arguments.add(result)  # computed from the arguments alone
            if op in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
                continue
            kind = "matmul" if matmul else "argument_copies" if result in arguments else "other"
            by_kind[kind] += _shape_bytes(shape) + sum(_shape_bytes(shapes.get(o, "")) for o in names)
    return HloCosts(dot_flops=dot_flops, bytes_by_kind=dict(by_kind), while_loops=loops)


def xla_costs(compiled: Any) -> dict[str, Any]:
    """XLA's cost analysis of a compiled program (flops, bytes accessed, transcendentals) and the HLO's own counts."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, Sequence):  # older jax: one dict per device program
        analysis = analysis[0]
    hlo = hlo_costs(compiled.as_text())
    return {
        "flops": float(analysis.get("flops", 0.0)),
        "bytes_accessed": float(analysis.get("bytes accessed", 0.0)),
        "transcendentals": float(analysis.get("transcendentals", 0.0)),
        "dot_flops": hlo.dot_flops,
        "bytes_by_kind": hlo.bytes_by_kind,
        "while_loops": hlo.while_loops,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Compiling the decode programs on one device.

ONE_DEVICE = {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}


def compile_decode_program(
    model: Mapping[str, Any],
    program: Program,
    cache_slots: int,
    compiler_options: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], Any]:
    """Compiles `program` for the model dictionary `model` on one device, with the layer scan unrolled and nothing
    allocated (`aot.programs`: canvas mode = `canvas_denoise`, append mode = `transformer.append` into a cache of
    `cache_slots` slots); returns (the AOT report, the compiled program)."""
    cfg = TransformerConfig.from_dict(model)
    unrolled = dict(model, scan_unroll=cfg.num_groups)
    options = dict(layout.NO_LICM) if compiler_options is None else dict(compiler_options)
    settings = layout.AotSettings(
        model=unrolled,
        mesh=ONE_DEVICE,
        decode_batch=program.batch,
        canvas=program.tokens,
        cache_len=cache_slots,
        append_len=program.tokens,
        compiler_options=options,
    )
    mesh = sharding.make_mesh(ONE_DEVICE, devices=jax.devices()[:1])
    start = time.perf_counter()
    if program.mode == "canvas":
        report, compiled = programs.canvas_denoise_program(settings, mesh)
    else:
        report, compiled = programs.append_program(settings, mesh, program.tokens)
    report["wall_s"] = round(time.perf_counter() - start, 2)
    return report, compiled
