"""LoRA adapters on the toolbox's parameter tree, applied functionally: W' = W + (alpha / r) * A @ B.

Follows Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models" (A random, B zero, so training starts
exactly at the base model; update scaled by alpha / r), and, for which weights are adapted, the DiffusionGemma
reference adapter (`HDA/hd/lora.py`, docs/reference.md §3.4): every linear map of the backbone —
attention `q_einsum`, `kv_einsum`, `k_einsum`, `attn_vec_einsum`, the dense FFN `mlp2`, the MoE router
`router_logits` and `self_conditioner/ffw` — and never the embedding, norms or scales.

How a weight becomes a matrix
-----------------------------
Each adaptable weight's axes are split into "in" axes (contracted with the activation), "out" axes and batch axes
(`FACTORIZATIONS`). A has shape `batch + in + (r,)` and B has `batch + (r,) + out`, so `einsum(A, B)` over r, put back
in the weight's axis order, has exactly the weight's shape. The scanned `layers` axis and the expert axis `E` are
batch axes: every layer and every expert has its own independent A and B.

| weight (unstacked)                | in axes   | out axes | batch | A               | B                 |
|-----------------------------------|-----------|----------|-------|-----------------|-------------------|
| attn/q_einsum (N, D, H)           | D         | N, H     |       | (D, r)          | (r, N, H)         |
| attn/kv_einsum (2, K, D, H)       | D         | 2, K, H  |       | (D, r)          | (r, 2, K, H)      |
| attn/k_einsum (K, D, H)           | D         | K, H     |       | (D, r)          | (r, K, H)         |
| attn/attn_vec_einsum (N, H, D)    | N, H      | D        |       | (N, H, r)       | (r, D)            |
| mlp2, ffw gating_einsum (2, F, D) | D         | 2, F     |       | (D, r)          | (r, 2, F)         |
| mlp2, ffw linear (F, D)           | F         | D        |       | (F, r)          | (r, D)            |
| moe/router_logits (D, E)          | D         | E        |       | (D, r)          | (r, E)            |
| moe/gating_einsum (E, 2, He, D)   | D         | 2, He    | E     | (E, D, r)       | (E, r, 2, He)     |
| moe/linear (E, He, D)             | He        | D        | E     | (E, He, r)      | (E, r, D)         |

(plus a leading `layers` axis on both factors for leaves under `layers/`). `logical_axes` names the factors' axes
after the weight's own logical axes with `lora_rank` for r, so LoRA factors shard like their weights.

The adapter tree mirrors the parameter tree with only the adapted leaves, each replaced by `{"lora_a", "lora_b"}`,
e.g. `lora["layers"]["block_0"]["attn"]["q_einsum"]["lora_a"]`.

Training: the train state's params are `{"base": params, "lora": adapters}`; `lora_loss_fn` evaluates the objective
on `merge(base, lora)` and `trainable_mask` freezes `base` through the optimizer's mask
(`training/optimizers.make_optimizer(cfg, trainable_mask)`: frozen leaves get exact zero updates and no optimizer
state), so the base weights stay bit-identical and only A, B learn. The same state is what the run checkpoints, so
adapters are saved and restored with the run. For sampling, `merge` fuses the adapters into plain params.

Deliberate differences from the reference
-----------------------------------------
- Scaling alpha / r (Hu et al.); the reference has none. `alpha=None` means alpha = r, i.e. scale 1, the reference.
- The experts can be adapted too (`include_experts=True`, per-expert A and B); the reference never adapts them.
  With `include_experts=False` expert weights are never adapted, whatever the target regexes say.
- The forward pass uses the merged weight `W + s * A @ B` (one weight per linear map, no second matmul path in the
  model code) instead of `x W + s * (x A) B`; it is the same function of x, and gradients reach A and B through the
  merge. It materialises one merged copy of every adapted weight per step (the reference's on-the-fly form does not).
- Targets are regexes (`re.search`) over the toolbox path of a weight (`layers/block_{i}/attn/q_einsum`,
  `self_conditioner/ffw/linear`, ...). Layers are scanned, so a target selects a position `block_{i}` of the layer
  pattern in every repeat, not single layers. A regex that selects nothing is an error (typo guard), except the
  default ones (a dense model has no router).
- A is initialised uniform in +-1/sqrt(fan_in) with fan_in = product of the in axes (PyTorch/PEFT's default
  `kaiming_uniform(a=sqrt(5))`), B with zeros; factors are float32 by default whatever the base dtype, and the merged
  weight is cast back to the base weight's dtype.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.models import partitioning

PyTree = Any
ALL_LINEAR = "all-linear"
BASE_KEY, LORA_KEY = "base", "lora"
A_NAME, B_NAME = "lora_a", "lora_b"


@dataclasses.dataclass(frozen=True)
class Factorization:
    """How an (unstacked) weight of `ndim` axes is read as a matrix: its contracted and batch axes."""

    ndim: int
    in_axes: tuple[int, ...]
    batch_axes: tuple[int, ...] = ()

    def out_axes(self) -> tuple[int, ...]:
        return tuple(a for a in range(self.ndim) if a not in self.in_axes and a not in self.batch_axes)


#: Leaf-path suffix -> factorization; the first matching suffix wins (longer suffixes first).
FACTORIZATIONS: tuple[tuple[tuple[str, ...], Factorization], ...] = (
    (("attn", "q_einsum"), Factorization(3, (1,))),
    (("attn", "kv_einsum"), Factorization(4, (2,))),
    (("attn", "k_einsum"), Factorization(3, (1,))),
    (("attn", "attn_vec_einsum"), Factorization(3, (0, 1))),
    (("moe", "router_logits"), Factorization(2, (0,))),
    (("moe", "gating_einsum"), Factorization(4, (3,), (0,))),
    (("moe", "linear"), Factorization(3, (1,), (0,))),
    (("gating_einsum",), Factorization(3, (2,))),  # mlp2, self_conditioner/ffw
    (("linear",), Factorization(2, (0,))),
)
EXPERT_SUFFIXES: tuple[tuple[str, ...], ...] = (("moe", "gating_einsum"), ("moe", "linear"))

#: The reference's 'all-linear' set, as regexes over toolbox paths (experts excluded; see include_experts).
DEFAULT_TARGETS: tuple[str, ...] = (
    r"attn/(q|kv|k|attn_vec)_einsum$",
    r"mlp2/(gating_einsum|linear)$",
    r"moe/router_logits$",
    r"self_conditioner/ffw/(gating_einsum|linear)$",
)


def _names(path: Sequence[Any]) -> tuple[str, ...]:
    out = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                key = getattr(key, attr)
                break
        out.append(str(key))
    return tuple(n for n in out if n != "params")


def factorization_of(path: Sequence[str]) -> tuple[Factorization, bool] | None:
    """(factorization of the unstacked weight, stacked over `layers`?) or None if the leaf is not adaptable."""
    names = tuple(path)
    for suffix, fact in FACTORIZATIONS:
        if names[-len(suffix) :] == suffix:
            return fact, "layers" in names
    return None


def _is_expert(path: Sequence[str]) -> bool:
    return any(tuple(path[-len(s) :]) == s for s in EXPERT_SUFFIXES)


def _flatten(tree: PyTree) -> dict[tuple[str, ...], Any]:
    return {_names(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _set(tree: dict, path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree: Mapping, path: Sequence[str]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _full_axes(fact: Factorization, stacked: bool) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(batch, in, out) axes of the stored (maybe stacked) weight."""
    shift = 1 if stacked else 0
    batch = ((0,) if stacked else ()) + tuple(a + shift for a in fact.batch_axes)
    return batch, tuple(a + shift for a in fact.in_axes), tuple(a + shift for a in fact.out_axes())


def _delta_equation(ndim: int, batch: tuple[int, ...], ins: tuple[int, ...], outs: tuple[int, ...]) -> str:
    letters = string.ascii_lowercase[:ndim]
    rank = "z"
    a = "".join(letters[i] for i in batch + ins) + rank
    b = "".join(letters[i] for i in batch) + rank + "".join(letters[i] for i in outs)
    return f"{a},{b}->{letters}"


@dataclasses.dataclass(frozen=True)
class LoRA:
    """Low-rank adapters of rank `rank` with scale `alpha / rank` on the weights selected by `targets`.

    targets: regexes searched in the '/'-joined toolbox path of each adaptable weight, or "all-linear" (every
      adaptable weight except the experts). include_experts: also adapt the MoE expert weights (per expert).
    dtype: dtype of A and B (None: float32).
    """

    rank: int = 8
    alpha: float | None = None
    targets: tuple[str, ...] | str = DEFAULT_TARGETS
    include_experts: bool = False
    dtype: Any = None

    def __post_init__(self):
        if isinstance(self.targets, list):
            object.__setattr__(self, "targets", tuple(self.targets))
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}; use full fine-tuning for rank 0.")
        if self.alpha is not None and self.alpha <= 0:
            raise ValueError(f"LoRA alpha must be > 0 (or None for alpha = rank), got {self.alpha}.")
        if isinstance(self.targets, str) and self.targets != ALL_LINEAR:
            raise ValueError(
                f"LoRA targets must be a tuple of regexes or {ALL_LINEAR!r}, got the string "
                f"{self.targets!r}; wrap a single regex in a tuple."
            )
        if not isinstance(self.targets, str):
            for pattern in self.targets:
                try:
                    re.compile(pattern)
                except re.error as err:
                    raise ValueError(f"LoRA target {pattern!r} is not a valid regex: {err}.") from None

    @property
    def scale(self) -> float:
        return (self.rank if self.alpha is None else self.alpha) / self.rank

    def adaptable_paths(self, params: PyTree) -> list[str]:
        """Every weight that has a factorization ('/'-joined), experts included."""
        return ["/".join(p) for p in _flatten(params) if factorization_of(p) is not None]

    def targeted_paths(self, params: PyTree) -> list[str]:
        """The '/'-joined paths of the weights this adapter adapts in `params` (sorted)."""
        candidates = [p for p in _flatten(params) if factorization_of(p) is not None]
        plain = [p for p in candidates if not _is_expert(p)]
        experts = [p for p in candidates if _is_expert(p)]
        if self.targets == ALL_LINEAR:
            chosen = set(plain)
        else:
            chosen = set()
            for pattern in self.targets:
                hits = {p for p in plain if re.search(pattern, "/".join(p))}
                expert_hits = {p for p in experts if re.search(pattern, "/".join(p))}
                if not hits and not (expert_hits and self.include_experts) and pattern not in DEFAULT_TARGETS:
                    raise ValueError(
                        f"LoRA target {pattern!r} selects no adaptable weight"
                        + (" (it matches only expert weights; set include_experts=True)" if expert_hits else "")
                        + f". Adaptable weights: {sorted('/'.join(p) for p in candidates)}."
                    )
                chosen |= hits
        if self.include_experts:
            if not experts:
                raise ValueError("include_experts=True but the model has no MoE expert weights (model.moe is None).")
            chosen |= set(experts)
        if not chosen:
            raise ValueError("LoRA selects no weight; check targets.")
        return sorted("/".join(p) for p in chosen)

    def factor_shapes(self, path: Sequence[str], shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of (A, B) for the weight at `path` with (stored, maybe stacked) `shape`."""
        found = factorization_of(path)
        if found is None:
            raise ValueError(
                f"{'/'.join(path)} has no LoRA factorization; adaptable leaves are listed in "
                "hackable_diffusion/models/lora.py FACTORIZATIONS."
            )
        fact, stacked = found
        if len(shape) != fact.ndim + stacked:
            raise ValueError(
                f"{'/'.join(path)} has shape {tuple(shape)}; its LoRA factorization expects {fact.ndim + stacked} axes."
            )
        batch, ins, outs = _full_axes(fact, stacked)
        a = tuple(shape[i] for i in batch + ins) + (self.rank,)
        b = tuple(shape[i] for i in batch) + (self.rank,) + tuple(shape[i] for i in outs)
        return a, b

    def init(self, params: PyTree, key: jax.Array) -> PyTree:
        """Adapters for `params`: A uniform in +-1/sqrt(fan_in), B zeros (so merge(params, init) == params)."""
        flat = {"/".join(p): (p, leaf) for p, leaf in _flatten(params).items()}
        dtype = self.dtype or jnp.float32
        plan = []
        for path in self.targeted_paths(params):
            names, leaf = flat[path]
            a_shape, b_shape = self.factor_shapes(names, leaf.shape)
            fact, stacked = factorization_of(names)
            fan_in = math.prod(leaf.shape[i] for i in _full_axes(fact, stacked)[1])
            plan.append((names, a_shape, b_shape, 1.0 / math.sqrt(fan_in)))
        # One uniform draw for every A (one RNG program instead of one per weight), cut in path order.
        total = sum(math.prod(a_shape) for _, a_shape, _, _ in plan)
        uniform = jax.random.uniform(key, (total,), jnp.float32, -1.0, 1.0)
        lora: dict[str, Any] = {}
        offset = 0
        for names, a_shape, b_shape, bound in plan:
            size = math.prod(a_shape)
            a = (uniform[offset : offset + size].reshape(a_shape) * bound).astype(dtype)
            offset += size
            _set(lora, names, {A_NAME: a, B_NAME: jnp.zeros(b_shape, dtype)})
        return lora

    def delta(self, path: Sequence[str], a: Float[Array, "..."], b: Float[Array, "..."]) -> Float[Array, "..."]:
        """(alpha / r) * A @ B in the layout of the weight at `path` (float32)."""
        fact, stacked = factorization_of(path)
        batch, ins, outs = _full_axes(fact, stacked)
        equation = _delta_equation(fact.ndim + stacked, batch, ins, outs)
        product = jnp.einsum(
            equation, a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
        )
        return product * self.scale

    def merge(self, params: PyTree, lora: PyTree) -> PyTree:
        """Fused params: W + (alpha / r) * A @ B for every adapter in `lora`; other leaves pass through unchanged."""
        adapters = _adapter_paths(lora)
        merged = jax.tree_util.tree_map(lambda x: x, params)  # a new tree; leaves shared
        for names in adapters:
            try:
                weight = _get(params, names)
            except (KeyError, TypeError):
                raise ValueError(f"LoRA adapter {'/'.join(names)} has no base weight in params.") from None
            pair = _get(lora, names)
            a_shape, b_shape = self.factor_shapes(names, weight.shape)
            if tuple(pair[A_NAME].shape) != a_shape or tuple(pair[B_NAME].shape) != b_shape:
                raise ValueError(
                    f"LoRA adapter {'/'.join(names)} has A {tuple(pair[A_NAME].shape)}, B "
                    f"{tuple(pair[B_NAME].shape)}; rank {self.rank} on weight {tuple(weight.shape)} "
                    f"needs A {a_shape}, B {b_shape}."
                )
            fused = weight.astype(jnp.float32) + self.delta(names, pair[A_NAME], pair[B_NAME])
            _set(merged, names, fused.astype(weight.dtype))
        return merged

    __call__ = merge


def _adapter_paths(lora: PyTree) -> list[tuple[str, ...]]:
    paths = set()
    for names in _flatten(lora):
        if names[-1] not in (A_NAME, B_NAME):
            raise ValueError(f"{'/'.join(names)} is not a LoRA factor (leaves must be named {A_NAME} / {B_NAME}).")
        paths.add(names[:-1])
    return sorted(paths)


def num_params(lora: PyTree) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(lora))


# ----------------------------------------------------------------------------------------------------------------
# Training integration: state params {"base": ..., "lora": ...}.


def init_state(adapter: LoRA, base: PyTree, key: jax.Array) -> dict[str, PyTree]:
    """The params a LoRA run trains: `{"base": the frozen base as arrays, "lora": fresh adapters}`."""
    return {BASE_KEY: jax.tree.map(jnp.asarray, base), LORA_KEY: adapter.init(base, key)}


def lora_loss_fn(adapter: LoRA, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """`loss(state_params, batch, key)` = `loss_fn(adapter.merge(base, lora), batch, key)` for
    `state_params = {"base": base, "lora": lora}`."""

    def loss(state_params, batch, key):
        return loss_fn(adapter.merge(state_params[BASE_KEY], state_params[LORA_KEY]), batch, key)

    return loss


def trainable_mask(state_params: Mapping[str, PyTree]) -> PyTree:
    """For `make_optimizer` / `loop.train(trainable_mask=...)`: the base frozen, every LoRA factor trained."""
    if set(state_params) != {BASE_KEY, LORA_KEY}:
        raise ValueError(
            f"LoRA training state params must be {{'{BASE_KEY}': params, '{LORA_KEY}': adapters}}, got "
            f"keys {sorted(state_params)}."
        )
    return {
        BASE_KEY: jax.tree.map(lambda _: False, state_params[BASE_KEY]),
        LORA_KEY: jax.tree.map(lambda _: True, state_params[LORA_KEY]),
    }


def logical_axes(path: Sequence[Any], shape: Sequence[int]) -> tuple[str | None, ...]:
    """Logical axes of any leaf of `{"base": params, "lora": adapters}` (or of plain params / adapters).

    A factor takes the logical names of the weight axes it keeps (batch + in for A, batch + out for B) and
    `lora_rank` for r; everything else is `partitioning.logical_axes`.
    """
    names = _names(path)
    names = names[1:] if names and names[0] in (BASE_KEY, LORA_KEY) else names
    if not names or names[-1] not in (A_NAME, B_NAME):
        return partitioning.logical_axes(names, shape)
    weight = names[:-1]
    found = factorization_of(weight)
    if found is None:
        raise ValueError(f"LoRA factor {'/'.join(names)} sits on a weight without a factorization.")
    fact, stacked = found
    weight_axes = partitioning.logical_axes(weight, (1,) * (fact.ndim + stacked))
    batch, ins, outs = _full_axes(fact, stacked)
    if names[-1] == A_NAME:
        axes = tuple(weight_axes[i] for i in batch + ins) + ("lora_rank",)
    else:
        axes = tuple(weight_axes[i] for i in batch) + ("lora_rank",) + tuple(weight_axes[i] for i in outs)
    if len(axes) != len(shape):
        raise ValueError(f"LoRA factor {'/'.join(names)} has shape {tuple(shape)} but logical axes {axes}.")
    return axes


ROUTER_LEAVES = ("moe/router_logits", "moe/router_scale", "moe/per_expert_scale")


def router_frozen_mask(params: PyTree) -> PyTree:
    """Full fine-tuning that keeps the router as pretrained: True (trained) for every leaf but the router's."""

    def trained(path, _):
        name = "/".join(str(getattr(p, "key", p)) for p in path)
        return not any(name.endswith(leaf) for leaf in ROUTER_LEAVES)

    return jax.tree_util.tree_map_with_path(trained, params)
