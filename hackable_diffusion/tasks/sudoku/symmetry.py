"""The Sudoku symmetry group as permutation views: the same puzzle seen relabelled, rearranged and transposed.

Permuting the nine digits, the three bands, the three stacks, the rows inside a band, the columns inside a stack, and
transposing the grid all map a puzzle and its solution to a puzzle and its solution. The task uses the group
three times: training augmentation (`config.data.augment_symmetry=True`: each training row mapped by a random element,
`RandomSymmetry`, as recursive-reasoning models such as TRM train on Sudoku), symmetry views inside a denoising step
(`config.solver.views=K`: the model averaged over K copies of the canvas, `sampling.views.PermutationViews`) and
parallel attempts (`config.solver.parallel_attempts=K`: K copies of each puzzle solved side by side, `solve.py`). None
of the three is in DiffusionGemma, Ye et al. 2024 or Kim et al. 2025.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Int

from hackable_diffusion.sampling.views import PermutationViews
from hackable_diffusion.tasks.sudoku.vocab import FIRST_DIGIT_ID, VOCAB_SIZE

ATTEMPT_SEED = 1  # the group elements of parallel attempts (symmetry views inside a step draw theirs from views_seed)


def symmetry_views(
    num_views: int, seed: int = 0, *, first_digit_id: int = FIRST_DIGIT_ID, vocab_size: int = VOCAB_SIZE
) -> PermutationViews:
    """K random elements of the Sudoku symmetry group (view 0 = the identity), the digits as ids first_digit_id.. + 8.

    Each element: a random order of the bands and of the rows inside each band, the same for stacks and columns, a
    transpose with probability 1/2, and a random relabelling of the nine digits. Deterministic in (num_views, seed).
    """
    if num_views < 1:
        raise ValueError(f"symmetry_views needs num_views >= 1, got {num_views}.")
    rng = np.random.default_rng(seed)
    positions, tokens = [tuple(range(81))], [tuple(range(vocab_size))]
    for _ in range(num_views - 1):
        cells, token_map = random_element(rng, first_digit_id=first_digit_id, vocab_size=vocab_size)
        positions.append(tuple(int(i) for i in cells))
        tokens.append(tuple(int(i) for i in token_map))
    return PermutationViews(tuple(positions), tuple(tokens))


def random_element(
    rng: np.random.Generator, *, first_digit_id: int = FIRST_DIGIT_ID, vocab_size: int = VOCAB_SIZE
) -> tuple[Int[np.ndarray, " 81"], Int[np.ndarray, " vocab"]]:
    """One random element of the group: (cells, token_map), where cell i of the image is cell cells[i] of the source
    and id k becomes token_map[k] (only the nine digit ids move).

    A random order of the bands and of the rows inside each band, the same for stacks and columns, a transpose with
    probability 1/2, and a random relabelling of the nine digits.
    """
    rows = np.concatenate([3 * band + rng.permutation(3) for band in rng.permutation(3)])
    cols = np.concatenate([3 * stack + rng.permutation(3) for stack in rng.permutation(3)])
    grid = rows[:, None] * 9 + cols[None, :]
    if rng.random() < 0.5:
        grid = grid.T
    token_map = np.arange(vocab_size)
    token_map[first_digit_id : first_digit_id + 9] = first_digit_id + rng.permutation(9)
    return grid.reshape(-1), token_map


@dataclasses.dataclass(frozen=True)
class RandomSymmetry:
    """Training augmentation: every row of a batch {"tokens": (b, 81), "fixed": (b, 81)} mapped by its own random
    group element (a solution stays a solution, its givens move with their cells). A grain random map: the draws
    depend only on the pipeline seed and the batch index, so a resumed run sees the same rows."""

    first_digit_id: int = FIRST_DIGIT_ID
    vocab_size: int = VOCAB_SIZE

    def __call__(self, batch: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        tokens, fixed = np.asarray(batch["tokens"]), np.asarray(batch["fixed"])
        out_tokens, out_fixed = np.empty_like(tokens), np.empty_like(fixed)
        for row in range(tokens.shape[0]):
            cells, token_map = random_element(rng, first_digit_id=self.first_digit_id, vocab_size=self.vocab_size)
            out_tokens[row] = token_map[tokens[row, cells]]
            out_fixed[row] = fixed[row, cells]
        return {**batch, "tokens": out_tokens, "fixed": out_fixed}


def grid_symmetries(count: int, seed: int = ATTEMPT_SEED) -> PermutationViews:
    """`count` group elements acting on grids of digits (0 = blank stays blank), the first the identity: the same
    draws as `symmetry_views` with the digits 1..9 as the relabelled ids."""
    return symmetry_views(count, seed, first_digit_id=1, vocab_size=10)
