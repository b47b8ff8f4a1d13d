"""Converter between the toolbox's parameters and the gemma library's Gemma-4 / DiffusionGemma parameter tree.

Follows the parameter tree of google-deepmind/gemma `gm/nn/gemma4` (`_transformer.py`, `_modules.py`, `_moe.py`,
`_layers.py`) and `gemma/diffusion/_transformer.py` (the `self_conditioner`), as described in
docs/reference.md §1 and §3.4. The names below were checked against the public source
(module attribute names and `self.param` names); no code of theirs is used.

The two trees
-------------
- Toolbox (`transformer.init_params`): a nested dict; the layers are scanned, so every leaf under
  `layers/block_{i}/...` has a leading axis of size `cfg.num_groups`; slice `g` of block `i` is gemma layer
  `n = g * len(cfg.layer_pattern) + i`.
- Gemma: a nested dict with one sub-tree per layer, `layer_{n}/...`, unstacked. `Einsum` and MoE `_Weight` modules
  store their array under a leaf named `w`; `FeedForward` (`mlp2`, `self_conditioner/ffw`) shares its scope with its
  two einsums, so its arrays have no `/w`. `to_gemma` returns exactly the nested dict that gemma's `model.init`
  produces (the `params` collection, without the `{"params": ...}` wrapper).

Mapping (one entry of `RULES` per row; `{i}` = block index in the layer pattern, `{n}` = gemma layer index;
per-layer shapes are those of one unstacked layer; every transform is the identity because the toolbox stores each
weight in gemma's layout)

| toolbox path                                | gemma path                                   | shape            |
|---------------------------------------------|----------------------------------------------|------------------|
| embedder/input_embedding                    | embedder/input_embedding                     | (V, D)           |
| final_norm/scale                            | final_norm/scale                             | (D,)             |
| self_conditioner/pre_norm/scale             | self_conditioner/pre_norm/scale              | (D,)             |
| self_conditioner/ffw/gating_einsum          | self_conditioner/ffw/gating_einsum           | (2, F, D)        |
| self_conditioner/ffw/linear                 | self_conditioner/ffw/linear                  | (F, D)           |
| layers/block_{i}/pre_attention_norm/scale   | layer_{n}/pre_attention_norm/scale           | (D,)             |
| layers/block_{i}/post_attention_norm/scale  | layer_{n}/post_attention_norm/scale          | (D,)             |
| layers/block_{i}/pre_ffw_norm/scale         | layer_{n}/pre_ffw_norm/scale                 | (D,)             |
| layers/block_{i}/post_ffw_norm/scale        | layer_{n}/post_ffw_norm/scale                | (D,)             |
| layers/block_{i}/pre_ffw2_norm/scale        | layer_{n}/pre_ffw2_norm/scale                | (D,)             |
| layers/block_{i}/post_ffw2_norm/scale       | layer_{n}/post_ffw2_norm/scale               | (D,)             |
| layers/block_{i}/post_ffw1_norm/scale       | layer_{n}/post_ffw1_norm/scale               | (D,)             |
| layers/block_{i}/skip_scale                 | layer_{n}/skip_scale                         | (1,)             |
| layers/block_{i}/attn/q_einsum              | layer_{n}/attn/q_einsum/w                    | (N, D, H)        |
| layers/block_{i}/attn/kv_einsum             | layer_{n}/attn/kv_einsum/w                   | (2, K, D, H)     |
| layers/block_{i}/attn/k_einsum  (K=V global)| layer_{n}/attn/k_einsum/w                    | (K, D, H)        |
| layers/block_{i}/attn/attn_vec_einsum       | layer_{n}/attn/attn_vec_einsum/w             | (N, H, D)        |
| layers/block_{i}/attn/query_norm/scale      | layer_{n}/attn/query_norm/scale              | (H,)             |
| layers/block_{i}/attn/key_norm/scale        | layer_{n}/attn/key_norm/scale                | (H,)             |
| layers/block_{i}/mlp2/gating_einsum         | layer_{n}/mlp2/gating_einsum                 | (2, F, D)        |
| layers/block_{i}/mlp2/linear                | layer_{n}/mlp2/linear                        | (F, D)           |
| layers/block_{i}/moe/router_logits          | layer_{n}/mlp/router_logits/w                | (D, E)           |
| layers/block_{i}/moe/router_scale           | layer_{n}/mlp/router_scale                   | (D,)             |
| layers/block_{i}/moe/per_expert_scale       | layer_{n}/mlp/per_expert_scale               | (E,)             |
| layers/block_{i}/moe/gating_einsum          | layer_{n}/mlp/gating_einsum/w                | (E, 2, He, D)    |
| layers/block_{i}/moe/linear                 | layer_{n}/mlp/linear/w                       | (E, He, D)       |

(V vocab, D embed_dim, N heads, K kv heads, H head dim — the global head dim and kv heads on global layers —,
F ffw_hidden, E experts, He expert hidden.) Which rows exist is decided by the model config, not by the table: the
expected leaves are those of `init_params` for `cfg` (kv_einsum on local layers and on global layers without K=V,
k_einsum on K=V global layers, no `mlp`/`moe` rows for `moe=None`, `self_conditioner` rows only with
`self_conditioning=True`, no query/key norms with `qk_norm=False`). The MoE lives under gemma's `mlp` (MoERagged) and
the dense FFN under `mlp2`, as in Gemma-4 26B-A4B. A toolbox model with `moe=None` keeps its dense FFN under `mlp2`
with its own norms; that is not the layout of a dense gemma model (which uses `mlp` and no `ffw2` norms).

To fix a name, edit its row in `RULES` (or pass `rules=` to every function here); a row may carry a transform pair
(`to_gemma`, `from_gemma`) for a layout change, applied per unstacked layer.

Deliberate choices
------------------
- Both directions copy arrays bit for bit (slicing and stacking only); dtypes are kept. `load_gemma_checkpoint` casts
  only when `dtype` is given.
- Validation is strict: a missing leaf, an unexpected leaf or a mis-shaped leaf raises a ValueError naming the gemma
  path (and the expected shape). The reference loader instead discards checkpoint-only keys with a warning; pass
  `ignore_unexpected=True` for that behaviour (e.g. a checkpoint that also holds a vision encoder).
- Input trees are accepted nested or flat (`'/'`-joined keys), optionally wrapped in a single `params` or
  `transformer` key, and with or without the trailing `/w` (the reference loader strips `/w` when needed, because
  `FeedForward`'s shared scope has none while `Einsum` and `_Weight` have one); outputs always use the layout above.
- Checkpoints are plain orbax PyTree checkpoints of the nested gemma dict (what the reference's
  `GemmaCheckpointFormatter` writes with `ocp.PyTreeCheckpointer`), restored on the CPU as numpy arrays; shapes are
  checked from the checkpoint metadata before any array is read.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from hackable_diffusion.checkpoints.trees import flatten_tree, natural_key, tree_metadata, unflatten_tree  # noqa: F401
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig, resolve_dtype

PyTree = Any
WRAPPER_KEYS = ("params", "transformer")


def _identity(x):
    return x


@dataclasses.dataclass(frozen=True)
class Rule:
    """One row of the mapping: a toolbox path pattern, a gemma path pattern and a per-layer transform pair.

    `{i}` in `toolbox` marks a scanned leaf (`layers/block_{i}/...`, leading group axis); the gemma pattern then uses
    `{n}` for the unstacked layer index. `to_gemma`/`from_gemma` act on one unstacked layer and must be inverses.
    """

    toolbox: str
    gemma: str
    to_gemma: Callable[[Any], Any] = _identity
    from_gemma: Callable[[Any], Any] = _identity

    def __post_init__(self):
        if ("{i}" in self.toolbox) != ("{n}" in self.gemma):
            raise ValueError(
                f"Rule {self.toolbox!r} -> {self.gemma!r}: a per-layer rule needs {{i}} in the toolbox "
                "pattern and {n} in the gemma pattern (a global rule needs neither)."
            )

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.toolbox

    def match(self, toolbox_path: str) -> int | None | bool:
        """Block index for a per-layer match, True for a global match, None/False for no match."""
        if not self.per_layer:
            return toolbox_path == self.toolbox
        pattern = "^" + re.escape(self.toolbox).replace(re.escape("{i}"), r"(\d+)") + "$"
        found = re.match(pattern, toolbox_path)
        return int(found.group(1)) if found else None


def _block(rest: str, gemma_rest: str) -> Rule:
    return Rule(f"layers/block_{{i}}/{rest}", f"layer_{{n}}/{gemma_rest}")


_NORMS = (
    "pre_attention_norm",
    "post_attention_norm",
    "pre_ffw_norm",
    "post_ffw_norm",
    "pre_ffw2_norm",
    "post_ffw2_norm",
    "post_ffw1_norm",
)

#: The mapping, one row per leaf kind (see the module docstring's table).
RULES: tuple[Rule, ...] = (
    Rule("embedder/input_embedding", "embedder/input_embedding"),
    Rule("final_norm/scale", "final_norm/scale"),
    Rule("self_conditioner/pre_norm/scale", "self_conditioner/pre_norm/scale"),
    Rule("self_conditioner/ffw/gating_einsum", "self_conditioner/ffw/gating_einsum"),
    Rule("self_conditioner/ffw/linear", "self_conditioner/ffw/linear"),
    *(_block(f"{norm}/scale", f"{norm}/scale") for norm in _NORMS),
    _block("skip_scale", "skip_scale"),
    _block("attn/q_einsum", "attn/q_einsum/w"),
    _block("attn/kv_einsum", "attn/kv_einsum/w"),
    _block("attn/k_einsum", "attn/k_einsum/w"),
    _block("attn/attn_vec_einsum", "attn/attn_vec_einsum/w"),
    _block("attn/query_norm/scale", "attn/query_norm/scale"),
    _block("attn/key_norm/scale", "attn/key_norm/scale"),
    _block("mlp2/gating_einsum", "mlp2/gating_einsum"),
    _block("mlp2/linear", "mlp2/linear"),
    _block("moe/router_logits", "mlp/router_logits/w"),
    _block("moe/router_scale", "mlp/router_scale"),
    _block("moe/per_expert_scale", "mlp/per_expert_scale"),
    _block("moe/gating_einsum", "mlp/gating_einsum/w"),
    _block("moe/linear", "mlp/linear/w"),
)


def _unwrap(tree: Mapping[str, Any]) -> Mapping[str, Any]:
    while isinstance(tree, Mapping) and len(tree) == 1 and next(iter(tree)) in WRAPPER_KEYS:
        tree = tree[next(iter(tree))]
    return tree


def _stack(arrays: Sequence[Any]) -> Any:
    if all(isinstance(a, np.ndarray) for a in arrays):
        return np.stack(arrays)
    return jnp.stack([jnp.asarray(a) for a in arrays])


def _shape_text(shape: Sequence[int]) -> str:
    return str(tuple(int(s) for s in shape))


# ----------------------------------------------------------------------------------------------------------------
# The expected trees of a config.


def toolbox_shapes(cfg: TransformerConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Flat {toolbox path: ShapeDtypeStruct} of `init_params` for `cfg` (abstract, nothing is allocated)."""
    return dict(_toolbox_shapes_cached(cfg))


@functools.lru_cache(maxsize=16)
def _toolbox_shapes_cached(cfg: TransformerConfig) -> dict[str, jax.ShapeDtypeStruct]:
    model = T.Transformer(cfg)
    abstract = jax.eval_shape(lambda key: T.init_params(model, key), jax.random.key(0))
    return flatten_tree(abstract)


def _rule_for(path: str, rules: Sequence[Rule]) -> tuple[Rule, int | None]:
    for rule in rules:
        found = rule.match(path)
        if rule.per_layer and found is not None:
            return rule, found
        if not rule.per_layer and found:
            return rule, None
    raise ValueError(
        f"No conversion rule for the toolbox parameter {path!r}; add a Rule for it to "
        "hackable_diffusion/checkpoints/gemma.py RULES (or pass rules=)."
    )


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One gemma leaf: where it comes from in the toolbox tree."""

    toolbox_path: str
    group: int | None  # slice of the scanned axis, None for an unscanned leaf
    rule: Rule
    shape: tuple[int, ...]
    dtype: Any


def _plan(cfg: TransformerConfig, rules: Sequence[Rule]) -> tuple[dict[str, _Entry], dict[str, jax.ShapeDtypeStruct]]:
    """({gemma path: entry}, toolbox shapes) for `cfg`, layers in order (cached per config; do not mutate)."""
    return _plan_cached(cfg, tuple(rules))


@functools.lru_cache(maxsize=16)
def _plan_cached(cfg: TransformerConfig, rules: tuple[Rule, ...]):
    shapes = toolbox_shapes(cfg)
    pattern_len = len(cfg.layer_pattern)
    plan: dict[str, _Entry] = {}
    for path, struct in shapes.items():
        rule, block = _rule_for(path, rules)
        if block is None:
            out = jax.eval_shape(rule.to_gemma, struct)
            plan[rule.gemma] = _Entry(path, None, rule, tuple(out.shape), out.dtype)
            continue
        layer = jax.ShapeDtypeStruct(struct.shape[1:], struct.dtype)
        out = jax.eval_shape(rule.to_gemma, layer)
        for group in range(struct.shape[0]):
            gemma_path = rule.gemma.replace("{n}", str(group * pattern_len + block))
            if gemma_path in plan:
                raise ValueError(
                    f"Two toolbox parameters map to the gemma path {gemma_path!r} "
                    f"({plan[gemma_path].toolbox_path!r} and {path!r}); fix RULES."
                )
            plan[gemma_path] = _Entry(path, group, rule, tuple(out.shape), out.dtype)
    return {p: plan[p] for p in sorted(plan, key=natural_key)}, shapes


def gemma_shapes(cfg: TransformerConfig, rules: Sequence[Rule] = RULES) -> dict[str, jax.ShapeDtypeStruct]:
    """Flat {gemma path: ShapeDtypeStruct} of the gemma tree that `cfg` converts to."""
    plan, _ = _plan(cfg, rules)
    return {path: jax.ShapeDtypeStruct(e.shape, e.dtype) for path, e in plan.items()}


def mapping_table(cfg: TransformerConfig, rules: Sequence[Rule] = RULES) -> list[tuple[str, str, tuple[int, ...]]]:
    """(gemma path, toolbox path[group], gemma shape) for every leaf of `cfg`: the mapping, spelled out."""
    plan, _ = _plan(cfg, rules)
    rows = []
    for path, e in plan.items():
        source = e.toolbox_path if e.group is None else f"{e.toolbox_path}[{e.group}]"
        rows.append((path, source, e.shape))
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Validation.


def _normalise_gemma(tree: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, Any]:
    """Flattens an input gemma tree and reconciles the optional trailing '/w' with the expected paths."""
    flat = flatten_tree(_unwrap(tree))
    out: dict[str, Any] = {}
    for path, leaf in flat.items():
        name = path
        if name not in expected:
            if name.endswith("/w") and name[:-2] in expected:
                name = name[:-2]
            elif name + "/w" in expected:
                name = name + "/w"
        if name in out:
            raise ValueError(f"The gemma tree holds both {name!r} and a '/w' variant of it; keep one.")
        out[name] = leaf
    return out


def _check_gemma(
    flat: Mapping[str, Any],
    expected: Mapping[str, jax.ShapeDtypeStruct],
    cfg: TransformerConfig,
    ignore_unexpected: bool,
) -> None:
    missing = [p for p in expected if p not in flat]
    if missing:
        p = missing[0]
        more = f" (and {len(missing) - 1} more: {missing[1:4]}...)" if len(missing) > 1 else ""
        raise ValueError(
            f"The gemma tree is missing the leaf {p!r}; expected shape {_shape_text(expected[p].shape)} "
            f"for this model config ({cfg.num_layers} layers, pattern {cfg.layer_pattern}){more}."
        )
    unexpected = [p for p in flat if p not in expected]
    if unexpected and not ignore_unexpected:
        p = unexpected[0]
        raise ValueError(
            f"The gemma tree has the unexpected leaf {p!r} with shape "
            f"{_shape_text(np.shape(flat[p]))}, which this model config does not have "
            f"({len(unexpected)} unexpected in all: {unexpected[:4]}). Check the config (num_layers, "
            "moe, self_conditioning, k_eq_v_global) or pass ignore_unexpected=True to drop them."
        )
    for p, struct in expected.items():
        shape = tuple(np.shape(flat[p]))
        if shape != tuple(struct.shape):
            raise ValueError(
                f"The gemma leaf {p!r} has shape {_shape_text(shape)}, expected "
                f"{_shape_text(struct.shape)} for this model config."
            )


def check_toolbox_params(params: PyTree, cfg: TransformerConfig, where: str = "The toolbox parameters") -> None:
    """ValueError naming the first toolbox parameter that is missing, unexpected or mis-shaped for `cfg`."""
    _check_toolbox(flatten_tree(params), toolbox_shapes(cfg), where)


def _check_toolbox(
    flat: Mapping[str, Any], shapes: Mapping[str, jax.ShapeDtypeStruct], where: str = "The toolbox parameters"
) -> None:
    for p, struct in shapes.items():
        if p not in flat:
            raise ValueError(
                f"{where} lack {p!r} (expected shape {_shape_text(struct.shape)}); they were made "
                "for a different model config."
            )
        if tuple(np.shape(flat[p])) != tuple(struct.shape):
            raise ValueError(
                f"{where}: {p!r} has shape {_shape_text(np.shape(flat[p]))}, expected "
                f"{_shape_text(struct.shape)} for this model config."
            )
    extra = [p for p in flat if p not in shapes]
    if extra:
        raise ValueError(
            f"{where} have {extra[0]!r}, which this model config does not have "
            f"({len(extra)} such leaves); check the model config."
        )


# ----------------------------------------------------------------------------------------------------------------
# Conversion.


def to_gemma(params: PyTree, cfg: TransformerConfig, rules: Sequence[Rule] = RULES) -> dict[str, Any]:
    """Toolbox params (nested dict, scanned layers) -> the nested gemma tree (`layer_{n}/...`, unstacked)."""
    plan, shapes = _plan(cfg, rules)
    flat = flatten_tree(params)
    _check_toolbox(flat, shapes)
    out = {}
    for gemma_path, e in plan.items():
        leaf = flat[e.toolbox_path]
        out[gemma_path] = e.rule.to_gemma(leaf if e.group is None else leaf[e.group])
    return unflatten_tree(out)


def from_gemma(
    tree: Mapping[str, Any], cfg: TransformerConfig, rules: Sequence[Rule] = RULES, *, ignore_unexpected: bool = False
) -> PyTree:
    """A gemma tree (nested or flat, optional `params` wrapper, with or without trailing `/w`) -> toolbox params.

    Raises ValueError naming the gemma path of a missing, unexpected or mis-shaped leaf.
    """
    plan, shapes = _plan(cfg, rules)
    expected = {p: jax.ShapeDtypeStruct(e.shape, e.dtype) for p, e in plan.items()}
    flat = _normalise_gemma(tree, expected)
    _check_gemma(flat, expected, cfg, ignore_unexpected)
    groups: dict[str, dict[int, Any]] = {}
    out: dict[str, Any] = {}
    for gemma_path, e in plan.items():
        leaf = e.rule.from_gemma(flat[gemma_path])
        if e.group is None:
            out[e.toolbox_path] = leaf
        else:
            groups.setdefault(e.toolbox_path, {})[e.group] = leaf
    for path, by_group in groups.items():
        out[path] = _stack([by_group[g] for g in range(shapes[path].shape[0])])
    return unflatten_tree(out)


# ----------------------------------------------------------------------------------------------------------------
# Orbax checkpoint directories.


def load_gemma_checkpoint(
    directory: str | os.PathLike,
    cfg: TransformerConfig,
    dtype: Any = None,
    *,
    rules: Sequence[Rule] = RULES,
    ignore_unexpected: bool = False,
) -> PyTree:
    """Restores a gemma-layout orbax checkpoint on the CPU and converts it to toolbox params.

    Shapes are validated from the checkpoint's metadata first (ValueError naming the gemma path), then the arrays
    are read as numpy arrays. `dtype` (e.g. "bfloat16" or cfg.param_dtype) casts every leaf; None keeps the stored
    dtypes.
    """
    directory = os.path.abspath(os.fspath(directory))
    if not os.path.isdir(directory):
        raise ValueError(f"Gemma checkpoint directory {directory!r} does not exist.")
    metadata = tree_metadata(directory)
    plan, _ = _plan(cfg, rules)
    expected = {p: jax.ShapeDtypeStruct(e.shape, e.dtype) for p, e in plan.items()}
    flat_meta = flatten_tree(metadata)
    shapes_only = {
        p: np.broadcast_to(np.zeros((), np.int8), tuple(m.shape))
        for p, m in _normalise_gemma(unflatten_tree(flat_meta), expected).items()
    }
    _check_gemma(shapes_only, expected, cfg, ignore_unexpected)

    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    restored = ocp.PyTreeCheckpointer().restore(directory, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    params = from_gemma(restored, cfg, rules, ignore_unexpected=ignore_unexpected)
    if dtype is not None:
        target = resolve_dtype(dtype)
        params = jax.tree.map(lambda x: np.asarray(x).astype(target), params)
    return params


def save_gemma_checkpoint(
    params: PyTree,
    cfg: TransformerConfig,
    directory: str | os.PathLike,
    *,
    rules: Sequence[Rule] = RULES,
    force: bool = False,
) -> str:
    """Converts toolbox params to the gemma tree and writes it as an orbax PyTree checkpoint; returns the path.

    `force=True` overwrites an existing directory.
    """
    directory = os.path.abspath(os.fspath(directory))
    tree = to_gemma(params, cfg, rules)
    tree = jax.tree.map(np.asarray, tree)
    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(directory, tree, force=force)
    return directory
