"""Symmetry views: a denoising step that averages the model over relabelled copies of the canvas (test-time augmentation).

A task whose answers are equivariant under a group of symmetries (a puzzle whose digits, rows and columns can be
permuted without changing what a solution is) gives a denoiser more than one look at the same canvas: each view permutes the canvas positions
and relabels the tokens, the model is run on every view in one batch, each view's log-probabilities are mapped back to
the original positions and tokens, and the step uses their mean (the normalised geometric mean of the views'
distributions). A trained network is only approximately equivariant, so the views disagree where it is unsure; their
mean is a better-calibrated denoiser. The cost is K network evaluations per step, batched: the number of sequential
forward passes (what a step budget counts) does not change, the FLOPs per pass grow K-fold. Reported apart from the
single-view figures.

Not in DiffusionGemma (its sampler runs the model once per step); test-time augmentation over a task's symmetry group
is a standard vision and puzzle-solving device, applied here per denoising step. `PermutationViews` holds any set of
(position, token) permutations; a task draws them from its own symmetry group.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int


@dataclasses.dataclass(frozen=True)
class PermutationViews:
    """`views(logits_fn, canvas) -> mean log-probs`: the model averaged over K (position, token) relabellings.

    positions[k][i] = the canvas position that view k shows at position i (view_canvas = canvas[:, positions[k]]).
    tokens[k][t] = the id that view k writes for token t (view_canvas = tokens[k][view_canvas]); a token the task does
      not relabel maps to itself.
    Tuples keep the views hashable, so a sampler holding them stays a static jit argument.
    """

    positions: tuple[tuple[int, ...], ...]
    tokens: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        if not self.positions or len(self.positions) != len(self.tokens):
            raise ValueError(
                f"PermutationViews needs as many token maps as position maps (>= 1), got {len(self.positions)} and "
                f"{len(self.tokens)}."
            )
        for name, perms in (("positions", self.positions), ("tokens", self.tokens)):
            size = len(perms[0])
            for k, perm in enumerate(perms):
                if sorted(perm) != list(range(size)):
                    raise ValueError(f"PermutationViews.{name}[{k}] is not a permutation of 0..{size - 1}: {perm}.")

    @property
    def num_views(self) -> int:
        return len(self.positions)

    @property
    def canvas_length(self) -> int:
        return len(self.positions[0])

    @property
    def vocab_size(self) -> int:
        return len(self.tokens[0])

    def to_views(self, canvas: Int[Array, "b c"]) -> Int[Array, "kb c"]:
        """The K relabelled copies of the canvas (kb = K x b rows), view-major: rows k*b .. (k+1)*b - 1 are view k."""
        b, c = canvas.shape
        if c != self.canvas_length:
            raise ValueError(
                f"the views permute {self.canvas_length} positions, the canvas has {c}; symmetry views need the "
                f"task's own canvas, solved in place."
            )
        positions = jnp.asarray(self.positions, jnp.int32)
        tokens = jnp.asarray(self.tokens, jnp.int32)
        views = jax.vmap(lambda p, t: t[canvas[:, p]])(positions, tokens)
        return views.reshape(self.num_views * b, c)

    def from_views(self, logits: Float[Array, "kb c v"]) -> Float[Array, "b c v"]:
        """Each view's log-probabilities mapped back to the original positions and tokens, averaged over views."""
        kb, c, v = logits.shape
        if v != self.vocab_size:
            raise ValueError(f"the views relabel a vocabulary of {self.vocab_size} ids, the logits have {v}.")
        b = kb // self.num_views
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(self.num_views, b, c, v)
        inverse = jnp.asarray(np.argsort(np.asarray(self.positions), axis=-1), jnp.int32)
        tokens = jnp.asarray(self.tokens, jnp.int32)
        # original (position j, token t) = view (position inverse[j], token tokens[t])
        back = jax.vmap(lambda lp, inv, t: jnp.take(lp[:, inv], t, axis=-1))(log_probs, inverse, tokens)
        return back.mean(axis=0)

    def __call__(
        self, logits_fn: Callable[[Int[Array, "kb c"]], Float[Array, "kb c v"]], canvas: Int[Array, "b c"]
    ) -> Float[Array, "b c v"]:
        return self.from_views(logits_fn(self.to_views(canvas)))

    def restore(self, copies: Int[np.ndarray, "k b c"]) -> Int[np.ndarray, "k b c"]:
        """The inverse of `to_views` for canvases of tokens (its rows reshaped to (K, b, c)), on the host: each view's
        tokens mapped back to the original positions and ids."""
        copies = np.asarray(copies)
        if copies.shape[0] != self.num_views or copies.shape[-1] != self.canvas_length:
            raise ValueError(f"expected ({self.num_views}, b, {self.canvas_length}) copies, got {copies.shape}.")
        positions, tokens = np.asarray(self.positions), np.asarray(self.tokens)
        out = np.empty_like(copies)
        for k in range(self.num_views):
            out[k][:, positions[k]] = np.argsort(tokens[k])[copies[k]]
        return out
