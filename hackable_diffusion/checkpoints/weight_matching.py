"""The source weights in the new model: strict matching of a run's starting weights, and its report.

`train` keeps its config's model and maps the starting weights (`base_weights.load_base`) onto it strictly
(`match_params`): every parameter of the new model is loaded (its shape checked) or is new, and a new parameter is an
error unless a glob of `init.allow_new` matches its path; source parameters the new model has no place for are
reported as unused. The outcome is an `InitReport`, printed as one table and saved as `init_report.json` in the run
directory; `start_init_fn` builds the new model's params from the loaded arrays and its own random init.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from hackable_diffusion.checkpoints.trees import flatten_tree, unflatten_tree
from hackable_diffusion.models import transformer as T

PyTree = Any
REPORT_FILE = "init_report.json"


class InitMismatchError(ValueError):
    """The source weights do not fit the new model: a shape differs, or a new parameter is not allowed."""


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in np.shape(x))


def _size(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


@dataclasses.dataclass(frozen=True)
class InitReport:
    """What a run took from its starting weights: every parameter of the new model is `loaded` (path, shape) or
    `new` (path, shape, the `init.allow_new` glob that allowed it); `unused` lists the source's parameters the new
    model has no place for; `cast` the loaded arrays whose dtype changed (path, source dtype, new dtype)."""

    source: str
    loaded: tuple[tuple[str, tuple[int, ...]], ...]
    new: tuple[tuple[str, tuple[int, ...], str], ...]
    unused: tuple[tuple[str, tuple[int, ...]], ...]
    cast: tuple[tuple[str, str, str], ...] = ()

    def totals(self) -> dict[str, dict[str, int]]:
        """{"loaded" | "new" | "unused": {"arrays": n, "values": parameter count}}."""
        groups = {"loaded": self.loaded, "new": self.new, "unused": self.unused}
        return {
            name: {"arrays": len(rows), "values": sum(_size(row[1]) for row in rows)} for name, rows in groups.items()
        }

    def table(self, max_listed: int = 8) -> str:
        """The report as printed at the start of a run: counts and parameter totals, then the new and unused paths."""
        totals = self.totals()
        meaning = {
            "loaded": "from the source",
            "new": "random init (init.allow_new)",
            "unused": "in the source, not in this model",
        }
        lines = [f"Starting weights: {self.source}", f"  {'':8}{'arrays':>8}{'parameters':>14}"]
        for name, total in totals.items():
            lines.append(f"  {name:8}{total['arrays']:>8,}{total['values']:>14,}  {meaning[name]}")

        def listed(title, rows):
            shown = [f"{row[0]} {row[1]}" + (f" [{row[2]}]" if len(row) > 2 else "") for row in rows[:max_listed]]
            more = f", ... ({len(rows) - max_listed} more in {REPORT_FILE})" if len(rows) > max_listed else ""
            return f"  {title}: " + ", ".join(shown) + more

        if self.new:
            lines.append(listed("new", self.new))
        if self.unused:
            lines.append(listed("unused", self.unused))
        if self.cast:
            kinds = sorted({f"{a} -> {b}" for _, a, b in self.cast})
            lines.append(f"  cast: {len(self.cast)} loaded arrays ({', '.join(kinds)})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "totals": self.totals(),
            "loaded": [{"path": p, "shape": list(s)} for p, s in self.loaded],
            "new": [{"path": p, "shape": list(s), "allowed_by": g} for p, s, g in self.new],
            "unused": [{"path": p, "shape": list(s)} for p, s in self.unused],
            "cast": [{"path": p, "from": a, "to": b} for p, a, b in self.cast],
        }

    def save(self, directory: str | pathlib.Path) -> pathlib.Path:
        """Writes `directory/init_report.json`; returns its path."""
        path = pathlib.Path(directory) / REPORT_FILE
        report = self.to_dict()
        lines = [f'  "{k}": {json.dumps(report[k])},' for k in ("source", "totals")]
        for key in ("loaded", "new", "unused", "cast"):  # one parameter a line
            rows = [f"    {json.dumps(row)}" for row in report[key]]
            lines.append(f'  "{key}": [' + ("\n" + ",\n".join(rows) + "\n  " if rows else "") + "],")
        path.write_text("{\n" + "\n".join(lines).rstrip(",") + "\n}\n")
        return path


def match_params(
    source_params: PyTree, shapes: PyTree, *, allow_new: Sequence[str], source: str
) -> tuple[dict[str, np.ndarray], InitReport]:
    """The source's arrays for every parameter of the new model (`shapes`: its tree of `jax.ShapeDtypeStruct`, e.g.
    `jax.eval_shape` of its init), as {path: host array in the new model's dtype}, and the report.

    Strict: a parameter of both whose shapes differ raises InitMismatchError naming every such path with both shapes;
    a parameter of the new model the source lacks is new, allowed only when a glob of `allow_new` matches its
    '/'-joined path (`fnmatch`: `*` crosses '/'), else InitMismatchError saying how to allow it. Source parameters the
    new model lacks are reported as unused."""
    flat_source, flat_new = flatten_tree(source_params), flatten_tree(shapes)
    mismatched = [
        (p, _shape(flat_source[p]), _shape(s))
        for p, s in flat_new.items()
        if p in flat_source and _shape(flat_source[p]) != _shape(s)
    ]
    if mismatched:
        shown = "; ".join(f"{p!r}: {a} in the source, {b} in this model" for p, a, b in mismatched[:5])
        more = f" (and {len(mismatched) - 5} more)" if len(mismatched) > 5 else ""
        raise InitMismatchError(
            f"config.init: {len(mismatched)} parameter(s) of the source {source} do not fit this model: {shown}{more}. "
            "The new model is config.model (with the source's vocabulary); give it the source's shape (a toolbox "
            "run's config.json lists it under 'model'), or start from scratch with config.init.kind=scratch."
        )
    loaded, arrays, new, missing, cast = [], {}, [], [], []
    for path, struct in flat_new.items():
        if path in flat_source:
            array = np.asarray(jax.device_get(flat_source[path]))
            if array.dtype != np.dtype(struct.dtype):
                cast.append((path, str(array.dtype), str(np.dtype(struct.dtype))))
                array = array.astype(struct.dtype)
            arrays[path] = array
            loaded.append((path, _shape(struct)))
            continue
        glob = next((g for g in allow_new if fnmatch.fnmatchcase(path, g)), None)
        (new if glob is not None else missing).append((path, _shape(struct), glob))
    if missing:
        shown = ", ".join(f"{p!r} {s}" for p, s, _ in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        suggested = ",".join(dict.fromkeys([*allow_new, *(p.split("/")[0] + "/*" for p, _, _ in missing)]))
        raise InitMismatchError(
            f"config.init: {len(missing)} parameter(s) of this model are not in the source {source}: {shown}{more}. "
            "A run that starts from weights loads every parameter unless it is allowed to start from random init: "
            f"--config.init.allow_new='{suggested}' (comma-separated globs on parameter paths; now "
            f"{','.join(allow_new) or 'empty'}), or make config.model match the source."
        )
    unused = [(p, _shape(a)) for p, a in flat_source.items() if p not in flat_new]
    report = InitReport(source, tuple(loaded), tuple((p, s, g) for p, s, g in new), tuple(unused), tuple(cast))
    return arrays, report


def start_init_fn(model: T.Transformer, loaded: Mapping[str, np.ndarray]) -> Callable[[jax.Array], PyTree]:
    """`init_fn(key) -> params` for `training.loop.train`: the loaded arrays where the source had them, the model's
    own random init (the same as a run from scratch with this key) for the new parameters."""
    import jax.numpy as jnp

    def init_fn(key: jax.Array) -> PyTree:
        flat = flatten_tree(T.init_params(model, key))
        flat.update({p: jnp.asarray(a) for p, a in loaded.items()})
        return unflatten_tree(flat)

    return init_fn


def param_shapes(model: T.Transformer) -> PyTree:
    """The model's parameter tree as `jax.ShapeDtypeStruct`s (nothing is initialised)."""
    return jax.eval_shape(lambda key: T.init_params(model, key), jax.random.key(0))
