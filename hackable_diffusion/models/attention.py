"""Gemma-4 attention (local sliding-window and global layers) with an explicit, functional KV cache.

Follows docs/reference.md §1.2 and §2.8: grouped-query attention; qk-norm with scale, V-norm
without scale; no 1/sqrt(d) query scaling (configurable); global layers with their own head dim / kv heads and an
optional single K=V projection (RoPE on K only, V is the scale-free-normed raw projection); half-split partial RoPE
with per-layer-type base and proportion; local layers see a key iff |pos_q - pos_k| < window, computed on token
positions (not cache slots).

One attention routine serves every mode. A block of L query tokens attends to
  (1) the keys already in the cache (`prefix_mask`, default: every valid cached slot), and
  (2) the block's own keys (`self_mask`: causal, bidirectional, or any hand-made structure).
If `write_index` is given, the block's K/V are then written into the cache at that slot (causal prefill/append);
otherwise the cache is only read (DiffusionGemma's "decoder" mode for a noisy canvas). Attention over the two
parts is one softmax over their concatenated logits, so nothing is copied into the cache to read it.

Deliberate differences from the reference: the canvas reads the cache without a functional copy being written
(same result, less memory traffic); padded slots are excluded through `valid` in every mode (the reference's
sliding/append masks ignore padding, docs/reference.md §5); the cache is never written past its end (callers check, the
sampler raises before a canvas would not fit, instead of wrapping, §5 there). Not in the reference: a task's
structure prior (`cfg.structure_attention_bias`, `models/structure.py`; Sudoku: same row, column or box), a learned
per-head logit bias for query/key pairs that share a unit; keys in the cache get it from their stored positions.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.models.config import TransformerConfig, resolve_dtype
from hackable_diffusion.models.layers import (
    RMSNorm,
    apply_rope,
    from_heads,
    rms_normalize,
    to_heads,
)
from hackable_diffusion.models.structure import get_structure, shared_units, unit_bias_init

NEG_INF = -1e30


@flax.struct.dataclass
class KVCache:
    """Keys/values of every layer plus per-slot bookkeeping shared by all layers.

    layers: one dict per position in the layer pattern, {'k', 'v'} of shape (groups, b, slots, kv_heads, head_dim)
      (stacked over pattern repeats so the layer scan can slice them).
    positions: RoPE position of the token in each slot (counts real tokens only, per row).
    valid: whether a slot holds a real token (False for unwritten slots and padding).
    end_index: the next slot to write; one cursor for the whole batch (rows of different lengths differ in
      `valid` and `positions`, never in slot indices).
    """

    layers: tuple[dict[str, Array], ...]
    positions: Int[Array, "b s"]
    valid: Bool[Array, "b s"]
    end_index: Int[Array, ""]

    @property
    def length(self) -> int:
        return self.positions.shape[1]

    @property
    def batch_size(self) -> int:
        return self.positions.shape[0]

    def next_positions(self) -> Int[Array, "b"]:
        """Position of the next real token in each row: the number of real tokens cached so far."""
        return jnp.sum(self.valid, axis=1).astype(jnp.int32)


def init_cache(cfg: TransformerConfig, batch_size: int, length: int, dtype: Any = None) -> KVCache:
    """An empty cache of `length` slots for `batch_size` rows."""
    dtype = resolve_dtype(dtype or cfg.compute_dtype)
    layers = []
    for layer_type in cfg.layer_pattern:
        kv_heads, head_dim = _kv_shape(cfg, layer_type)
        shape = (cfg.num_groups, batch_size, length, kv_heads, head_dim)
        layers.append({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)})
    return KVCache(
        layers=tuple(layers),
        positions=jnp.zeros((batch_size, length), jnp.int32),
        valid=jnp.zeros((batch_size, length), bool),
        end_index=jnp.zeros((), jnp.int32),
    )


def _kv_shape(cfg: TransformerConfig, layer_type: str) -> tuple[int, int]:
    if layer_type == "global":
        return cfg.global_kv_heads, cfg.global_attn_head_dim
    return cfg.num_kv_heads, cfg.head_dim


def sliding_window_mask(q_pos: Int[Array, "b l"], k_pos: Int[Array, "b s"], window: int) -> Bool[Array, "b l s"]:
    """True where |pos_q - pos_k| < window (symmetric, on token positions)."""
    return jnp.abs(q_pos[:, :, None] - k_pos[:, None, :]) < window


class Attention(nn.Module):
    """One attention layer of type 'local' or 'global'. Parameter names follow the gemma library."""

    cfg: TransformerConfig
    layer_type: str

    @staticmethod
    def _einsum_attention(q, k, v, self_mask, layer_cache, prefix_mask, bias, dtype, kv_heads, group):
        """Grouped-query attention as einsums: the cached prefix and the block are two logit blocks under one softmax,
        so the cache is read where it lies (out: b l k g h, float32)."""
        b, l, _, head_dim = q.shape
        q = q.reshape(b, l, kv_heads, group, head_dim)
        logits = [jnp.einsum("blkgh,bmkh->bkglm", q, k, preferred_element_type=jnp.float32)]
        masks = [self_mask]
        if layer_cache is not None:
            cache_k = layer_cache["k"].astype(dtype)
            logits.insert(0, jnp.einsum("blkgh,bskh->bkgls", q, cache_k, preferred_element_type=jnp.float32))
            masks.insert(0, prefix_mask)
        mask = jnp.concatenate(masks, axis=-1)[:, None, None]  # b 1 1 l (s + l)
        all_logits = jnp.concatenate(logits, axis=-1)
        if bias is not None:
            all_logits = all_logits + bias.reshape(b, kv_heads, group, l, -1)
        all_logits = jnp.where(mask, all_logits, NEG_INF)
        probs = jax.nn.softmax(all_logits, axis=-1).astype(dtype)
        out = jnp.einsum("bkglm,bmkh->blkgh", probs[..., -l:], v, preferred_element_type=jnp.float32)
        if layer_cache is not None:
            cache_v = layer_cache["v"].astype(dtype)
            out = out + jnp.einsum("bkgls,bskh->blkgh", probs[..., :-l], cache_v, preferred_element_type=jnp.float32)
        return out

    @nn.compact
    def __call__(
        self,
        x: Float[Array, "b l d"],
        positions: Int[Array, "b l"],
        self_mask: Bool[Array, "b l l"],
        layer_cache: dict[str, Array] | None = None,
        prefix_mask: Bool[Array, "b l s"] | None = None,
        cache_positions: Int[Array, "b s"] | None = None,
        write_index: Int[Array, ""] | None = None,
    ) -> tuple[Float[Array, "b l d"], dict[str, Array] | None]:
        cfg = self.cfg
        dtype, pdtype = resolve_dtype(cfg.compute_dtype), resolve_dtype(cfg.param_dtype)
        is_global = self.layer_type == "global"
        kv_heads, head_dim = _kv_shape(cfg, self.layer_type)
        d = x.shape[-1]
        init = nn.initializers.normal(stddev=d**-0.5)

        w_q = self.param("q_einsum", init, (cfg.num_heads, d, head_dim), pdtype)
        q = to_heads(x, w_q, dtype)
        if is_global and cfg.k_eq_v_global:
            w_k = self.param("k_einsum", init, (kv_heads, d, head_dim), pdtype)
            k = to_heads(x, w_k, dtype)
            v = k
        else:
            w_kv = self.param("kv_einsum", init, (2, kv_heads, d, head_dim), pdtype)
            kv = to_heads(x, w_kv, dtype)
            k, v = kv[:, :, 0], kv[:, :, 1]

        if cfg.qk_norm:
            q = RMSNorm(eps=cfg.norm_eps, param_dtype=pdtype, name="query_norm")(q)
            k = RMSNorm(eps=cfg.norm_eps, param_dtype=pdtype, name="key_norm")(k)
        if cfg.v_norm:
            v = rms_normalize(v, cfg.norm_eps)
        base = cfg.rope_global_base if is_global else cfg.rope_local_base
        proportion = cfg.rope_global_proportion if is_global else cfg.rope_local_proportion
        q = apply_rope(q, positions, base, proportion)
        k = apply_rope(k, positions, base, proportion)
        if cfg.scale_queries:
            q = q * jnp.asarray(head_dim**-0.5, dtype)

        # Decoder mode (a block reading the cache without writing it) with transformers' convention: local layers see
        # the last (window - 1) cached tokens and the whole block, with no per-token window (docs/reference.md §6).
        cache_tail = layer_cache is not None and write_index is None and cfg.decoder_window == "cache_tail"
        if not is_global and not cache_tail:
            self_mask = self_mask & sliding_window_mask(positions, positions, cfg.sliding_window)

        b, l = x.shape[:2]
        group = cfg.num_heads // kv_heads
        if layer_cache is not None:
            if prefix_mask is None or cache_positions is None:
                raise ValueError("Reading a KV cache needs prefix_mask and cache_positions.")
            if not is_global and cache_tail:
                # each query's block starts at the first position it sees in the block (training decodes every
                # canvas of a sequence in one call, each query seeing its own canvas; sampling decodes one block)
                unseen = jnp.iinfo(positions.dtype).max
                first = jnp.min(jnp.where(self_mask, positions[:, None, :], unseen), axis=-1)[:, :, None]
                prefix_mask = prefix_mask & (cache_positions[:, None, :] >= first - (cfg.sliding_window - 1))
            elif not is_global:
                prefix_mask = prefix_mask & sliding_window_mask(positions, cache_positions, cfg.sliding_window)
        bias = None
        if cfg.structure_attention_bias:
            # A task's structure prior (models/structure.py): a learned per-head bias for pairs sharing a unit.
            structure = get_structure(cfg.structure)
            shape = (len(structure.units), cfg.num_heads)
            init = unit_bias_init(cfg.structure_attention_bias)
            weights = self.param(f"{structure.name}_bias", init, shape, jnp.float32)
            key_pos = positions if layer_cache is None else jnp.concatenate([cache_positions, positions], axis=1)
            relations = shared_units(structure, positions, key_pos)
            bias = jnp.einsum("brls,rn->bnls", relations, weights)  # b n l (s + l)

        if cfg.attention_impl == "dot_product":
            keys, values, mask = k, v, self_mask
            if layer_cache is not None:
                keys = jnp.concatenate([layer_cache["k"].astype(dtype), k], axis=1)
                values = jnp.concatenate([layer_cache["v"].astype(dtype), v], axis=1)
                mask = jnp.concatenate([prefix_mask, self_mask], axis=-1)
            out = jax.nn.dot_product_attention(
                q,
                keys,
                values,
                bias=bias,
                mask=mask[:, None],
                scale=1.0,  # no 1/sqrt(h): see scale_queries
            ).astype(jnp.float32)
            out = out.reshape(b, l, kv_heads, group, head_dim)
        else:
            out = self._einsum_attention(q, k, v, self_mask, layer_cache, prefix_mask, bias, dtype, kv_heads, group)
        new_cache = None
        if layer_cache is not None:
            new_cache = layer_cache
            if write_index is not None:
                start = (0, write_index, 0, 0)
                new_cache = {
                    "k": jax.lax.dynamic_update_slice(layer_cache["k"], k.astype(layer_cache["k"].dtype), start),
                    "v": jax.lax.dynamic_update_slice(layer_cache["v"], v.astype(layer_cache["v"].dtype), start),
                }
        out = out.astype(dtype).reshape(b, l, cfg.num_heads, head_dim)
        w_o = self.param(
            "attn_vec_einsum",
            nn.initializers.normal(stddev=(cfg.num_heads * head_dim) ** -0.5),
            (cfg.num_heads, head_dim, d),
            pdtype,
        )
        return from_heads(out, w_o, dtype), new_cache
