"""The Gemma-4-style transformer: layer blocks, a scan over the repeating layer pattern, and its run modes.

Follows docs/reference.md §1 (google-deepmind/gemma `gm/nn/gemma4`). A block is

    h   = x + post_attention_norm(attn(pre_attention_norm(x)))
    d   = post_ffw2_norm(mlp2(pre_ffw2_norm(h)))                       # dense gated-GELU FFN
    m   = post_ffw1_norm(moe(pre_ffw_norm(h), router_input=h))         # only with cfg.moe
    out = (h + post_ffw_norm(d + m)) * skip_scale                      # skip_scale also scales the residual

Embeddings are scaled by sqrt(d), the head is tied, logits are soft-capped. The layers are applied by `nn.scan`
over repeats of `cfg.layer_pattern` (default 5 local + 1 global), so compile time depends on the pattern length,
not the depth; `cfg.remat` rematerialises each scanned group. `cfg.depth_loops` > 1 runs the whole scanned stack
again with the same weights (looped, universal-transformer depth, Dehghani et al. 2019; not in DiffusionGemma, and
refused for passes that write a KV cache).

Why flax.linen rather than NNX: linen modules are frozen dataclasses with `__call__` and are functional by
construction (params in, arrays out), with scan, remat and logical partitioning built in, and a jitted linen step costs the
same as NNX used functionally (split once, jit a pure function; `nnx.jit` per call adds Python overhead). Parameters are a plain nested dict whose names follow the gemma
library, which keeps checkpoints and the Gemma-4 converter simple.

Run modes (pure functions at the bottom of this file), all over the same weights:
  (a) causal with a KV cache: `prefill` / `append` (write the block into the cache), one-token decode = append;
  (b) decoder mode: `decode_block` — a block attends bidirectionally to itself and to the cached prefix, without
      writing the cache (DiffusionGemma's canvas denoiser);
  (c) `forward`: a plain full-sequence causal or bidirectional pass for training, or any hand-made mask.
Batched prompts of different lengths: padded tokens are never attended (`valid`), and positions count real tokens.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.models import quantize as Q
from hackable_diffusion.models.attention import Attention, KVCache
from hackable_diffusion.models.config import TransformerConfig, resolve_dtype
from hackable_diffusion.models.layers import Embedder, FeedForward, RMSNorm
from hackable_diffusion.models.moe import MoEFeedForward
from hackable_diffusion.models.self_conditioning import NULL_SIGNALS, SelfConditioning
from hackable_diffusion.models.structure import StructureEmbedding, get_structure

AUX_KEYS = ("moe_load_balance_loss", "moe_router_z_loss", "moe_dropped_fraction")


class Block(nn.Module):
    """One transformer layer (attention + dense FFN + optional MoE FFN), gemma parameter names."""

    cfg: TransformerConfig
    layer_type: str

    @nn.compact
    def __call__(self, x, positions, self_mask, layer_cache, prefix_mask, cache_positions, write_index, token_mask):
        cfg = self.cfg
        dtype, pdtype = resolve_dtype(cfg.compute_dtype), resolve_dtype(cfg.param_dtype)

        def norm(name):
            return RMSNorm(eps=cfg.norm_eps, param_dtype=pdtype, name=name)

        attn_out, new_cache = Attention(cfg, self.layer_type, name="attn")(
            norm("pre_attention_norm")(x), positions, self_mask, layer_cache, prefix_mask, cache_positions, write_index
        )
        h = x + norm("post_attention_norm")(attn_out)

        ffw = FeedForward(cfg.ffw_hidden, dtype=dtype, param_dtype=pdtype, name="mlp2")(norm("pre_ffw2_norm")(h))
        ffw = norm("post_ffw2_norm")(ffw)
        aux = {k: jnp.zeros((), jnp.float32) for k in AUX_KEYS}
        if cfg.moe is not None:
            moe = cfg.moe
            moe_out, aux = MoEFeedForward(
                num_experts=moe.num_experts,
                top_k=moe.top_k,
                hidden_dim=moe.hidden_dim,
                dispatch=moe.dispatch,
                capacity_factor=moe.capacity_factor,
                load_balance_weight=moe.load_balance_weight,
                router_z_weight=moe.router_z_weight,
                norm_eps=cfg.norm_eps,
                dtype=dtype,
                param_dtype=pdtype,
                name="moe",
            )(norm("pre_ffw_norm")(h), router_input=h, token_mask=token_mask)
            ffw = ffw + norm("post_ffw1_norm")(moe_out)
            aux = {k: aux[k].astype(jnp.float32) for k in AUX_KEYS}
        skip_scale = self.param("skip_scale", nn.initializers.ones, (1,), pdtype)
        out = (h + norm("post_ffw_norm")(ffw)) * skip_scale.astype(dtype)
        return out.astype(dtype), new_cache, aux


class LayerGroup(nn.Module):
    """One repeat of the layer pattern; the unit that `nn.scan` stacks over depth."""

    cfg: TransformerConfig

    @nn.compact
    def __call__(
        self, carry, layer_caches, positions, self_mask, prefix_mask, cache_positions, write_index, token_mask
    ):
        x, aux = carry
        new_caches = []
        for i, layer_type in enumerate(self.cfg.layer_pattern):
            layer_cache = layer_caches[i] if layer_caches else None
            x, new_cache, block_aux = Block(self.cfg, layer_type, name=f"block_{i}")(
                x, positions, self_mask, layer_cache, prefix_mask, cache_positions, write_index, token_mask
            )
            aux = {k: aux[k] + block_aux[k] for k in AUX_KEYS}
            if new_cache is not None:
                new_caches.append(new_cache)
        return (x, aux), tuple(new_caches)


class Transformer(nn.Module):
    """Embedder -> scanned layer groups -> final norm -> tied, soft-capped head."""

    cfg: TransformerConfig

    def setup(self):
        cfg = self.cfg
        dtype, pdtype = resolve_dtype(cfg.compute_dtype), resolve_dtype(cfg.param_dtype)
        self.embedder = Embedder(cfg.vocab_size, cfg.embed_dim, dtype=dtype, param_dtype=pdtype)
        if cfg.structure_embeddings:  # a task's structure prior (models/structure.py), named by the structure
            structure = get_structure(cfg.structure)
            self.structure_embedding = StructureEmbedding(
                structure, cfg.embed_dim, dtype=dtype, param_dtype=pdtype, name=f"{structure.name}_embedding"
            )
        group = LayerGroup
        if cfg.remat != "none":
            policy = None if cfg.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
            group = nn.remat(LayerGroup, policy=policy, prevent_cse=False)
        scanned = nn.scan(
            group,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(0,) + (nn.broadcast,) * 6,
            length=cfg.num_groups,
            unroll=min(cfg.scan_unroll, cfg.num_groups),
        )
        self.layers = scanned(cfg)
        self.final_norm = RMSNorm(eps=cfg.norm_eps, param_dtype=pdtype)
        if cfg.self_conditioning:
            self.self_conditioner = SelfConditioning(cfg.ffw_hidden, eps=cfg.norm_eps, dtype=dtype, param_dtype=pdtype)

    def embed(self, tokens: Int[Array, "b l"]) -> Float[Array, "b l d"]:
        return self.embedder.encode(tokens)

    def encode_probs(self, probs: Float[Array, "b l v"]) -> Float[Array, "b l d"]:
        return self.embedder.encode_probs(probs)

    def mean_embedding(self) -> Float[Array, "d"]:
        return self.embedder.mean_embedding()

    def sc_signal(self, logits: Float[Array, "b l v"]) -> Float[Array, "b l d"]:
        """Self-conditioning signal from logits: sqrt(d) * softmax(logits) @ E (softmax in float32)."""
        return self.embedder.encode_probs(jax.nn.softmax(logits.astype(jnp.float32), axis=-1))

    def null_sc_signal(self, shape: tuple[int, int], kind: str = "zeros") -> Float[Array, "b l d"]:
        """The 'no signal' input: exact zeros (gemma.diffusion) or the mean embedding (the HD adapter)."""
        if kind not in NULL_SIGNALS:
            raise ValueError(f"Unknown null self-conditioning signal {kind!r}; choose one of {NULL_SIGNALS}.")
        dtype = resolve_dtype(self.cfg.compute_dtype)
        if kind == "zeros":
            return jnp.zeros((*shape, self.cfg.embed_dim), dtype)
        return jnp.broadcast_to(self.mean_embedding(), (*shape, self.cfg.embed_dim)).astype(dtype)

    def __call__(
        self,
        tokens: Int[Array, "b l"],
        positions: Int[Array, "b l"],
        self_mask: Bool[Array, "b l l"],
        *,
        cache: KVCache | None = None,
        prefix_mask: Bool[Array, "b l s"] | None = None,
        write_cache: bool = False,
        token_mask: Bool[Array, "b l"] | None = None,
        input_embeddings: Float[Array, "b l d"] | None = None,
        sc_signal: Float[Array, "b l d"] | None = None,
        return_hidden: bool = False,
    ) -> tuple[Float[Array, "b l v"], KVCache | None, dict[str, Array]]:
        """One pass over a block of tokens.

        sc_signal: if given, the block is a diffusion canvas and its embeddings go through the self-conditioner
          (pass `null_sc_signal(...)` for "no signal"). Needs `cfg.self_conditioning`.
        input_embeddings: replaces the token embeddings entirely (advanced use).
        """
        cfg = self.cfg
        b, l = tokens.shape
        if token_mask is None:
            token_mask = jnp.ones((b, l), bool)
        x = (
            self.embed(tokens)
            if input_embeddings is None
            else input_embeddings.astype(resolve_dtype(cfg.compute_dtype))
        )
        if sc_signal is not None:
            if not cfg.self_conditioning:
                raise ValueError("sc_signal was given but model.self_conditioning is False.")
            x = self.self_conditioner(x, sc_signal)
        if cfg.structure_embeddings:
            x = x + self.structure_embedding(positions)

        layer_caches, cache_positions, write_index = (), None, None
        if cache is not None:
            layer_caches, cache_positions = cache.layers, cache.positions
            if prefix_mask is None:
                prefix_mask = jnp.broadcast_to(cache.valid[:, None, :], (b, l, cache.length))
            if write_cache:
                write_index = cache.end_index
        elif write_cache:
            raise ValueError("write_cache=True needs a cache.")
        if write_cache and cfg.depth_loops > 1:
            # A read-only cache is fine (a puzzle solved in place decodes over an empty one); writing one is not.
            raise ValueError(
                f"model.depth_loops={cfg.depth_loops} applies the layer stack several times, which a KV cache (one "
                "set of keys per layer) cannot hold; use passes that do not write a cache (`forward`, `decode_block` "
                "over an empty cache: a puzzle's in-place layout) or depth_loops=1."
            )

        aux = {k: jnp.zeros((), jnp.float32) for k in AUX_KEYS}
        for _ in range(cfg.depth_loops):  # looped depth: the same scanned stack again, same parameters
            (x, aux), new_layers = self.layers(
                (x, aux), layer_caches, positions, self_mask, prefix_mask, cache_positions, write_index, token_mask
            )
        if cfg.moe is not None:
            aux = dict(aux, moe_dropped_fraction=aux["moe_dropped_fraction"] / (cfg.num_layers * cfg.depth_loops))
        hidden = self.final_norm(x)
        logits = self.embedder.decode(hidden)
        if cfg.final_logit_softcap is not None:
            cap = cfg.final_logit_softcap
            logits = jnp.tanh(logits / cap) * cap

        new_cache = cache
        if cache is not None and write_cache:
            start = (0, cache.end_index)
            new_cache = KVCache(
                layers=new_layers,
                positions=jax.lax.dynamic_update_slice(cache.positions, positions.astype(jnp.int32), start),
                valid=jax.lax.dynamic_update_slice(cache.valid, token_mask, start),
                end_index=cache.end_index + l,
            )
        if return_hidden:
            aux = dict(aux, hidden=hidden)
        return logits, new_cache, aux


# ----------------------------------------------------------------------------------------------------------------
# Masks and positions.


def causal_mask(token_mask: Bool[Array, "b l"]) -> Bool[Array, "b l l"]:
    """Query i sees real keys j <= i."""
    l = token_mask.shape[1]
    return jnp.tril(jnp.ones((l, l), bool))[None] & token_mask[:, None, :]


def bidirectional_mask(token_mask: Bool[Array, "b l"]) -> Bool[Array, "b l l"]:
    """Every query sees every real key of the block."""
    l = token_mask.shape[1]
    return jnp.broadcast_to(token_mask[:, None, :], (token_mask.shape[0], l, l))


def positions_from_mask(token_mask: Bool[Array, "b l"], offset: Int[Array, "b"] | int = 0) -> Int[Array, "b l"]:
    """Positions counting real tokens only (pads repeat the previous position; they are never attended)."""
    counts = jnp.cumsum(token_mask.astype(jnp.int32), axis=1) - 1
    return jnp.maximum(counts, 0) + jnp.asarray(offset, jnp.int32).reshape(-1, 1)


# ----------------------------------------------------------------------------------------------------------------
# Run modes: pure functions of (model, params, ...).


@functools.partial(jax.jit, static_argnames=("model", "causal"))
def forward(
    model: Transformer,
    params,
    tokens: Int[Array, "b l"],
    *,
    token_mask: Bool[Array, "b l"] | None = None,
    causal: bool = True,
    mask: Bool[Array, "b l l"] | None = None,
    input_embeddings: Float[Array, "b l d"] | None = None,
    sc_signal: Float[Array, "b l d"] | None = None,
    positions: Int[Array, "b l"] | None = None,
) -> tuple[Float[Array, "b l v"], dict[str, Array]]:
    """Full-sequence pass for training: causal, bidirectional, or a hand-made `mask`."""
    if token_mask is None:
        token_mask = jnp.ones(tokens.shape, bool)
    if mask is None:
        mask = causal_mask(token_mask) if causal else bidirectional_mask(token_mask)
    if positions is None:
        positions = positions_from_mask(token_mask)
    logits, _, aux = model.apply(
        {"params": Q.for_compute(params, model.cfg.param_dtype)},
        tokens,
        positions,
        mask,
        token_mask=token_mask,
        input_embeddings=input_embeddings,
        sc_signal=sc_signal,
    )
    return logits, aux


@functools.partial(jax.jit, static_argnames=("model",))
def append(
    model: Transformer,
    params,
    tokens: Int[Array, "b l"],
    cache: KVCache,
    *,
    token_mask: Bool[Array, "b l"] | None = None,
) -> tuple[Float[Array, "b l v"], KVCache]:
    """Causally encodes a block into the cache (prefill, canvas commit, or one-token decode with l=1).

    The block occupies slots [end_index, end_index + l); its positions continue each row's count of real tokens.
    The caller must make sure it fits (`cache.end_index + l <= cache.length`); the samplers check before calling.
    """
    if token_mask is None:
        token_mask = jnp.ones(tokens.shape, bool)
    positions = positions_from_mask(token_mask, cache.next_positions())
    logits, new_cache, _ = model.apply(
        {"params": Q.for_compute(params, model.cfg.param_dtype)},
        tokens,
        positions,
        causal_mask(token_mask),
        cache=cache,
        write_cache=True,
        token_mask=token_mask,
    )
    return logits, new_cache


prefill = append


@functools.partial(jax.jit, static_argnames=("model", "return_hidden"))
def decode_block(
    model: Transformer,
    params,
    tokens: Int[Array, "b l"],
    cache: KVCache,
    *,
    token_mask: Bool[Array, "b l"] | None = None,
    input_embeddings: Float[Array, "b l d"] | None = None,
    sc_signal: Float[Array, "b l d"] | None = None,
    prefix_mask: Bool[Array, "b l s"] | None = None,
    positions: Int[Array, "b l"] | None = None,
    self_mask: Bool[Array, "b l l"] | None = None,
    return_hidden: bool = False,
) -> tuple[Float[Array, "b l v"], dict[str, Array]]:
    """Decoder mode: the block attends to every valid cached slot and bidirectionally to itself; cache untouched."""
    if token_mask is None:
        token_mask = jnp.ones(tokens.shape, bool)
    if positions is None:
        positions = positions_from_mask(token_mask, cache.next_positions())
    if self_mask is None:
        self_mask = bidirectional_mask(token_mask)
    logits, _, aux = model.apply(
        {"params": Q.for_compute(params, model.cfg.param_dtype)},
        tokens,
        positions,
        self_mask,
        cache=cache,
        token_mask=token_mask,
        prefix_mask=prefix_mask,
        input_embeddings=input_embeddings,
        sc_signal=sc_signal,
        return_hidden=return_hidden,
    )
    return logits, aux


@functools.partial(jax.jit, static_argnames=("model", "batch_size", "seq_len"))
def init_params(model: Transformer, rng: jax.Array, batch_size: int = 1, seq_len: int = 8) -> Any:
    """Initialises parameters with a dummy pass (through the self-conditioner too when the model has one)."""
    tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
    mask = jnp.ones((batch_size, seq_len), bool)
    sc = None
    if model.cfg.self_conditioning:
        sc = jnp.zeros((batch_size, seq_len, model.cfg.embed_dim), resolve_dtype(model.cfg.compute_dtype))
    return model.init(rng, tokens, positions_from_mask(mask), causal_mask(mask), sc_signal=sc)["params"]


def with_scan_unroll(model: Transformer, unroll: int | None = None) -> Transformer:
    """The same model (same parameter tree) with its layer scan unrolled by `unroll` groups (None: fully)."""
    cfg = model.cfg
    return Transformer(cfg.replace(scan_unroll=cfg.num_groups if unroll is None else unroll))


def model_method(model: Transformer, params, method: str, *args, **kwargs):
    """Calls a helper method of the model (`sc_signal`, `null_sc_signal`, `embed`, ...) with `params`."""
    return model.apply(
        {"params": Q.for_compute(params, model.cfg.param_dtype)}, *args, method=getattr(Transformer, method), **kwargs
    )


# The run modes are jitted with the model as a static argument (a frozen, hashable dataclass): called eagerly, a
# linen scan would be traced and compiled again on every call; jitted, each (model, shapes) compiles once.
