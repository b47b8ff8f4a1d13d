"""Symmetry views: a denoising step that averages the model over relabelled copies of the canvas (test-time augmentation).

A task whose answers are equivariant under a group of symmetries (Sudoku: permuting the digits, the bands, the stacks,
the rows inside a band, the columns inside a stack, and transposing the grid all map a puzzle and its solution to a
puzzle and its solution) gives a denoiser more than one look at the same canvas: each view permutes the canvas positions
and relabels the tokens, the model is run on every view in one batch, each view's log-probabilities are mapped back to
the original positions and tokens, and the step uses their mean (the normalised geometric mean of the views'
distributions). A trained network is only approximately equivariant, so the views disagree where it is unsure; their
mean is a better-calibrated denoiser. The cost is K network evaluations per step, batched: the number of sequential
forward passes (what a step budget counts) does not change, the FLOPs per pass grow K-fold. Reported apart from the
single-view figures.

Not in DiffusionGemma, Ye et al. 2024 or Kim et al. 2025 (their Sudoku samplers run the model once per step); test-time
augmentation over a task's symmetry group is a standard vision and puzzle-solving device, applied here per denoising
step. `PermutationViews` holds any set of (position, token) permutations; `sudoku_views(K, seed)` draws K elements of
the Sudoku group (the first is the identity).
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
                f"task's own canvas (Sudoku in place: 81 cells)."
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


def sudoku_views(num_views: int, seed: int = 0, *, first_digit_id: int = 4, vocab_size: int = 13) -> PermutationViews:
    """K random elements of the Sudoku symmetry group (view 0 = the identity), digits as ids first_digit_id.. + 8.

    Each element: a random order of the bands and of the rows inside each band, the same for stacks and columns, a
    transpose with probability 1/2, and a random relabelling of the nine digits. Deterministic in (num_views, seed).
    """
    if num_views < 1:
        raise ValueError(f"sudoku_views needs num_views >= 1, got {num_views}.")
    rng = np.random.default_rng(seed)
    positions, tokens = [tuple(range(81))], [tuple(range(vocab_size))]
    for _ in range(num_views - 1):
        rows = np.concatenate([3 * band + rng.permutation(3) for band in rng.permutation(3)])
        cols = np.concatenate([3 * stack + rng.permutation(3) for stack in rng.permutation(3)])
        grid = rows[:, None] * 9 + cols[None, :]
        if rng.random() < 0.5:
            grid = grid.T
        token_map = np.arange(vocab_size)
        token_map[first_digit_id : first_digit_id + 9] = first_digit_id + rng.permutation(9)
        positions.append(tuple(int(i) for i in grid.reshape(-1)))
        tokens.append(tuple(int(i) for i in token_map))
    return PermutationViews(tuple(positions), tuple(tokens))


def unrelabel_grids(views: PermutationViews, copies: Int[np.ndarray, "k b c"]) -> Int[np.ndarray, "k b c"]:
    """The inverse of `PermutationViews.to_views` for grids of tokens (its rows reshaped to (K, b, c)), on the host:
    each view's grids mapped back to the original positions and tokens."""
    copies = np.asarray(copies)
    positions, tokens = np.asarray(views.positions), np.asarray(views.tokens)
    out = np.empty_like(copies)
    for k in range(views.num_views):
        out[k][:, positions[k]] = np.argsort(tokens[k])[copies[k]]
    return out


def make_views(spec: str) -> PermutationViews | None:
    """Views by name: "" or "none" -> None; "sudoku:K" (or "sudoku:K:SEED") -> `sudoku_views(K, SEED)`."""
    if spec in ("", "none"):
        return None
    parts = spec.split(":")
    if parts[0] == "sudoku" and len(parts) in (2, 3) and all(p.isdigit() for p in parts[1:]):
        return sudoku_views(int(parts[1]), int(parts[2]) if len(parts) == 3 else 0)
    raise ValueError(f"unknown views {spec!r}; use 'sudoku:K' (K views, e.g. 'sudoku:8'), 'sudoku:K:SEED' or 'none'.")
