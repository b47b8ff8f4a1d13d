"""Sudoku solving as a search that the diffusion model steers: commit what the model is sure of, branch where it is
not, and backtrack when the rules show that an earlier decision was wrong.

A masking sampler decides every blank once; a wrong early decision is never revised, and on puzzles that an exact
solver can only finish by guessing the model alone gets stuck (about 1% of 17-25-givens search puzzles). Here each
puzzle keeps a grid and a stack of branch points, and every forward pass of the network does one of two things:

* **sure cells**: every blank whose top-probability margin (model probabilities over the digits the rules still
  allow, renormalised) reaches `sure_margin` takes its top digit; a blank with a single allowed digit is always sure;
* **a branch**: when no blank is sure, one blank is decided by its top digit and the remaining allowed digits are
  pushed, most probable first, as the alternatives of that branch point (with `cells_per_branch` = k > 1 every pass
  commits its sure cells and branches too, the k - 1 next most confident blanks are decided with the branch cell, and
  the first alternative is the branch cell alone: the pace of a k-cells-per-step sampler, with backtracking; a `paced`
  search sets k every pass to what the budget still needs: ceil(blanks / passes left) minus the sure cells).
  `branch="confident"` picks the blank with the highest top probability (the guess most likely right), `branch="fewest"`
  the one with the fewest allowed digits (ties: the most confident), as exact solvers do.

After the commits, the host checks the grid against the rules: a digit repeated in a row, column or box, or a blank with
no allowed digit, is a dead end, and the search backtracks to the latest branch point and decides its cell by the next
alternative, undoing every commit made since (the revision that a masking sampler lacks); this costs no forward pass. A
sure commit made before the first branch point has no branch point to return to: when such a search runs out of
alternatives it starts again from the puzzle, strictly (only single-digit blanks are sure, no doubt), which makes every
decision revisable, so only a puzzle without a solution ends "exhausted". With `doubt_below` > 0 the model can start a
backtrack too: when some blank has less than that much probability on all the digits the rules still allow it, the grid
is treated as a dead end (the pass is counted; ReMDM-style revision driven by the model's own confidence). A puzzle ends
solved (complete and rule-abiding), exhausted (no solution) or out of budget (`pass_budget` forward passes); an
unfinished puzzle reports the grid it was at, blanks as 0. Every forward pass of a puzzle counts, the passes of branches
later abandoned included. With `attempts` = K the rows are K copies of each puzzle (the solver passes symmetric
images): all advance in lockstep and the first copy that solves a puzzle stops the others.

`scores="uniform"` replaces the network by a uniform distribution over the allowed digits: the same search steered by
the rules alone (sure cells are then the naked singles and "confident" branching is fewest-candidates), the ablation
that shows what the model adds. Not in DiffusionGemma, Ye et al. 2024 or Kim et al. 2025; close in spirit to the
remasking samplers (ReMDM, Wang et al. 2025) and to the exact solver's depth-first search (`solver.py`), which
propagates hidden singles as well and branches on the fewest candidates without a model.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Bool, Float, Int

from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.sampling.canvas import canvas_logits
from hackable_diffusion.sampling.views import PermutationViews
from hackable_diffusion.tasks.sudoku.grids import conflicting_cells
from hackable_diffusion.tasks.sudoku.rules import same_unit_matrix
from hackable_diffusion.tasks.sudoku.vocab import FIRST_DIGIT_ID, MASK_ID

BRANCH_RULES = ("confident", "fewest")
SCORES = ("model", "uniform")

# the 20 peers of each cell, from the rules constraint's own same-unit matrix
PEERS: Int[np.ndarray, "81 20"] = np.stack([np.flatnonzero(row) for row in np.asarray(same_unit_matrix(9))])
PEER_SETS = tuple(frozenset(int(c) for c in row) for row in PEERS)


def allowed_digits(grids: Int[np.ndarray, "*b 81"]) -> Bool[np.ndarray, "*b 81 9"]:
    """For every blank (0) cell, the digits 1..9 (index d - 1) that no peer holds; all False at filled cells."""
    grids = np.asarray(grids)
    peer_digits = grids[..., PEERS]  # (*b, 81, 20)
    held = (peer_digits[..., None] == np.arange(1, 10)).any(axis=-2)  # (*b, 81, 9)
    return ~held & (grids == 0)[..., None]


def dead_end(grid: Int[np.ndarray, "81"]) -> bool:
    """True when the rules already rule `grid` out: a digit repeated among peers, or a blank with no allowed digit."""
    return bool(conflicting_cells(grid).any() or ((grid == 0) & ~allowed_digits(grid).any(axis=-1)).any())


def _top_two_and_best(p: Float[np.ndarray, "81 9"]) -> tuple[Float[np.ndarray, "81 2"], Int[np.ndarray, " 81"]]:
    """Each cell's two largest probabilities (descending) and its most probable digit (1..9)."""
    return -np.sort(-p, axis=-1)[:, :2], np.argmax(p, axis=-1) + 1


@dataclasses.dataclass
class BranchPoint:
    """A decision that can be revised: `grid` as it was before `cell` was guessed, and the digits still to try there,
    most probable first."""

    grid: np.ndarray
    cell: int
    alternatives: list[int]


@dataclasses.dataclass
class PuzzleSearch:
    """One puzzle's search state: the current grid, its branch points (latest last), forward passes so far, and the
    outcome ("open", "solved", "exhausted", "budget"). `strict`: after a restart, only single-digit blanks count as
    sure and the model's doubt is ignored, so that every decision can be revised (a complete search)."""

    grid: np.ndarray
    stack: list[BranchPoint] = dataclasses.field(default_factory=list)
    passes: int = 0
    branches: int = 0
    backtracks: int = 0
    doubts: int = 0
    restarts: int = 0
    strict: bool = False
    status: str = "open"
    puzzle: np.ndarray | None = None

    def __post_init__(self):
        if self.puzzle is None:
            self.puzzle = self.grid.copy()

    def backtrack(self, *, doubted: bool = False) -> None:
        """Replaces a dead-end grid (or, `doubted`, the current grid whatever the rules say) by the next alternative of
        the latest branch point that leads somewhere the rules allow; the status becomes "exhausted" when no
        alternative is left."""
        while doubted or dead_end(self.grid):
            doubted = False
            if not self.stack:
                if self.strict or dead_end(self.puzzle):
                    self.status = "exhausted"  # a complete search found nothing: the puzzle has no solution
                    return
                # a sure commit made before any branch point was wrong: start again, strictly
                self.strict, self.grid = True, self.puzzle.copy()
                self.restarts += 1
                continue
            point = self.stack[-1]
            digit = point.alternatives.pop(0)
            if not point.alternatives:
                self.stack.pop()
            self.grid = point.grid.copy()
            self.grid[point.cell] = digit
            self.backtracks += 1

    def _bulk(self, cell, digit, confidence, best, blank, count) -> list[tuple[int, int]]:
        """Up to `count` more (cell, top digit) commits, most confident first, none repeating a chosen peer's digit."""
        chosen = [(cell, digit)]
        if count <= 0:
            return []
        for other in np.argsort(-np.where(blank, confidence, -1.0), kind="stable"):
            other = int(other)
            if len(chosen) > count or not blank[other]:
                break
            if other == cell:
                continue
            d = int(best[other])
            if any(d == dc and other in PEER_SETS[c] for c, dc in chosen):
                continue
            chosen.append((other, d))
        return chosen[1:]

    def _restricted(self, probs):
        """(allowed digits, probabilities renormalised over them, the mass they held) for the current grid; a blank
        where the model puts (almost) no mass on an allowed digit gets a uniform distribution over them."""
        allowed = allowed_digits(self.grid)
        p = np.where(allowed, probs, 0.0)
        total = p.sum(axis=-1, keepdims=True)
        uniform = allowed / np.maximum(allowed.sum(-1, keepdims=True), 1)
        return allowed, np.where(total > 1e-12, p / np.maximum(total, 1e-30), uniform), total[:, 0]

    def settle(self) -> None:
        """Backtracks out of a dead end and marks a complete rule-abiding grid solved."""
        self.backtrack()
        if self.status == "open" and not (self.grid == 0).any():
            self.status = "solved"  # complete, and not a dead end: no digit repeated among peers

    def step(
        self,
        probs: Float[np.ndarray, "81 9"],
        *,
        sure_margin: float,
        branch: str,
        doubt_below: float = 0.0,
        cells_per_branch: int = 1,
        paced_budget: int = 0,
    ) -> None:
        """One forward pass's decisions from `probs` (each cell's distribution over the digits 1..9): commit the sure
        cells or else branch on one cell, then settle.

        `cells_per_branch` = k > 1: every pass commits its sure cells and then branches, and the branch also commits
        the next k - 1 most confident blanks (skipping any whose digit a chosen peer takes); its first alternative is
        the branch cell's top digit alone, then its other digits. `doubt_below` > 0: when some blank has less than
        that probability on all the digits the rules allow it, the model doubts the grid and the search backtracks as
        from a dead end (while a branch point is left to revise). `paced_budget` = B > 0: the pass decides at least
        ceil(blanks / passes left of B) cells, the sure ones first and the rest as a branch with bulk cells, so that
        the search keeps the pace that fills the grid within B passes (`cells_per_branch` is then ignored)."""
        if self.strict:
            sure_margin, doubt_below = np.inf, 0.0  # sure: single-digit blanks only
        allowed, p, total = self._restricted(probs)
        blank = allowed.any(axis=-1)  # every blank has an allowed digit: the grid is settled, not a dead end
        if doubt_below > 0 and self.stack and (blank & (total < doubt_below)).any():
            self.passes += 1
            self.doubts += 1
            self.backtrack(doubted=True)
            self.settle()
            return
        top2, best = _top_two_and_best(p)
        margin = np.where(blank, top2[:, 0] - top2[:, 1], -1.0)
        self.passes += 1
        sure = blank & ((margin >= sure_margin) | (allowed.sum(-1) == 1))
        if paced_budget:
            passes_left = max(paced_budget - self.passes + 1, 1)  # this pass included
            pace = -(-int(blank.sum()) // passes_left)
            cells_per_branch = max(pace - int(sure.sum()), 1)
            bulk_after_sure = pace > int(sure.sum())
        else:
            bulk_after_sure = cells_per_branch > 1
        if sure.any():
            self.grid = np.where(sure, best, self.grid).astype(self.grid.dtype)
            if not bulk_after_sure or dead_end(self.grid) or not (self.grid == 0).any():
                self.settle()
                return
            # k > 1: a branch in the same pass, from the same probabilities over what the sure cells left allowed
            allowed, p, _ = self._restricted(probs)
            blank = allowed.any(axis=-1)
            top2, best = _top_two_and_best(p)
        if branch == "confident":
            cell = int(np.argmax(np.where(blank, top2[:, 0], -1.0)))
        else:
            count = np.where(blank, allowed.sum(-1), 10)
            fewest = count == count.min()
            cell = int(np.argmax(np.where(fewest, top2[:, 0], -1.0)))
        order = [int(d) + 1 for d in np.argsort(-p[cell], kind="stable") if allowed[cell, d]]
        extra = self._bulk(cell, order[0], top2[:, 0], best, blank, cells_per_branch - 1)
        alternatives = order if extra else order[1:]  # bulk first, then the branch cell alone
        if alternatives:
            self.stack.append(BranchPoint(self.grid.copy(), cell, alternatives))
            self.branches += 1
        self.grid = self.grid.copy()
        self.grid[cell] = order[0]
        for other, digit in extra:
            self.grid[other] = digit
        self.settle()


@functools.partial(jax.jit, static_argnames=("model", "views"))
def _digit_probs(model, params, cache, tokens, sc_signal, views):
    if views is None:
        logits = canvas_logits(model, params, cache, tokens, sc_signal)
    else:
        logits = views(lambda v: canvas_logits(model, params, cache, v, None), tokens)
    digits = logits[..., FIRST_DIGIT_ID : FIRST_DIGIT_ID + 9].astype(jnp.float32)
    return jax.nn.softmax(digits, axis=-1)


@dataclasses.dataclass(frozen=True)
class ModelProbabilities:
    """Grids (0 = blank) -> the model's distribution over the digits at every cell: one forward pass (K with symmetry
    `views`) in batches of at most `batch_size`. A batch is padded to the smallest of `batch_size`, `batch_size` / 2,
    / 4, ... (at least 8) that holds it, so that few shapes are compiled and the late rounds of a search, when most
    puzzles are finished, do not pay for a full batch."""

    model: T.Transformer
    params: Any
    batch_size: int
    views: PermutationViews | None = None
    _inputs: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.model.cfg.self_conditioning and self.views is not None:
            raise ValueError("symmetry views do not relabel a self-conditioning signal; use views=1 with this model.")

    @property
    def sizes(self) -> tuple[int, ...]:
        sizes = [int(self.batch_size)]
        while sizes[-1] // 2 >= 8:
            sizes.append(sizes[-1] // 2)
        return tuple(sizes)

    def _padded_call(self, padded: np.ndarray) -> np.ndarray:
        size = len(padded)
        if size not in self._inputs:
            copies = 1 if self.views is None else self.views.num_views
            cache = init_cache(self.model.cfg, size * copies, 1)  # in place: no prefix, every slot invalid
            signal = None
            if self.model.cfg.self_conditioning:
                signal = T.model_method(self.model, self.params, "null_sc_signal", (size, 81), kind="zeros")
            self._inputs[size] = (cache, signal)
        cache, signal = self._inputs[size]
        tokens = np.where(padded == 0, MASK_ID, padded + FIRST_DIGIT_ID - 1).astype(np.int32)
        probs = _digit_probs(self.model, self.params, cache, jnp.asarray(tokens), signal, self.views)
        return np.asarray(probs, np.float64)

    def __call__(self, grids: Int[np.ndarray, "n 81"]) -> Float[np.ndarray, "n 81 9"]:
        grids = np.asarray(grids)
        out = []
        for start in range(0, len(grids), self.batch_size):
            chunk = grids[start : start + self.batch_size]
            size = min(s for s in self.sizes if s >= len(chunk))
            padded = np.concatenate([chunk, np.repeat(chunk[-1:], size - len(chunk), axis=0)])
            out.append(self._padded_call(padded)[: len(chunk)])
        return np.concatenate(out) if out else np.zeros((0, 81, 9))

    def warm_up(self, grid: Int[np.ndarray, "81"]) -> None:
        """Compiles every padded shape (outside a timed run)."""
        for size in self.sizes:
            self._padded_call(np.repeat(np.asarray(grid)[None], size, axis=0))


def uniform_probabilities(grids: Int[np.ndarray, "n 81"]) -> Float[np.ndarray, "n 81 9"]:
    """The rules-only ablation: every digit equally likely (the search renormalises over the allowed ones)."""
    return np.full((len(grids), 81, 9), 1.0 / 9)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """grids: (n, 81) final grids (0 = undecided); passes: forward passes per puzzle; status: per puzzle "solved",
    "exhausted", "budget" or "stopped" (another attempt at the same puzzle solved it first); branches / backtracks:
    branch points pushed and alternatives taken per puzzle; doubts: backtracks the model's doubt started; restarts:
    strict restarts after a wrong sure commit; batch_forward_passes: batched network calls over the whole run."""

    grids: np.ndarray
    passes: np.ndarray
    status: np.ndarray
    branches: np.ndarray
    backtracks: np.ndarray
    doubts: np.ndarray
    restarts: np.ndarray
    batch_forward_passes: int


def search_puzzles(
    probabilities: Callable[[Int[np.ndarray, "n 81"]], Float[np.ndarray, "n 81 9"]],
    puzzles: Int[np.ndarray, "n 81"],
    *,
    pass_budget: int,
    sure_margin: float = 0.99,
    branch: str = "confident",
    doubt_below: float = 0.0,
    cells_per_branch: int = 1,
    paced: bool = False,
    attempts: int = 1,
    batch_size: int = 256,
) -> SearchResult:
    """Runs the search (module docstring) on every puzzle, all open puzzles advancing one forward pass per round.
    `paced`: every pass decides at least ceil(blanks / passes left of `pass_budget`) cells (`PuzzleSearch.step`), so
    the trajectory depends on the budget. `attempts` = K > 1: the rows are K attempts at n = rows / K puzzles,
    attempt-major (row k * n + i is attempt k at puzzle i, e.g. symmetric copies); when one attempt solves its puzzle,
    the puzzle's other open attempts stop there (status "stopped"), so no pass is spent on a solved puzzle."""
    if branch not in BRANCH_RULES:
        raise ValueError(f"branch={branch!r} must be one of {BRANCH_RULES}.")
    if pass_budget < 1:
        raise ValueError(f"pass_budget={pass_budget} must be >= 1: the search needs a cap on forward passes.")
    if cells_per_branch < 1:
        raise ValueError(f"cells_per_branch={cells_per_branch} must be >= 1 (1: one guess per branch).")
    if not 0.0 <= doubt_below < 1.0:
        raise ValueError(f"doubt_below={doubt_below} must lie in [0, 1) (0: backtrack on the rules alone).")
    if not 0.0 < sure_margin <= 1.0:
        raise ValueError(
            f"sure_margin={sure_margin} must lie in (0, 1] "
            "(1: only cells the model is certain of, or with one allowed digit)."
        )
    if attempts < 1 or len(puzzles) % attempts:
        raise ValueError(f"attempts={attempts} must be >= 1 and divide the {len(puzzles)} rows (attempt-major).")
    puzzles = np.asarray(puzzles).astype(np.int8)
    states = [PuzzleSearch(p.copy()) for p in puzzles]
    for state in states:
        state.settle()  # a puzzle given complete, or broken from the start
    n = len(states) // attempts  # row i is an attempt at puzzle i % n
    batch_calls = 0
    while True:
        solved_puzzles = {i % n for i, s in enumerate(states) if s.status == "solved"}
        for i, state in enumerate(states):
            if state.status == "open" and i % n in solved_puzzles:
                state.status = "stopped"
        open_rows = [i for i, s in enumerate(states) if s.status == "open" and s.passes < pass_budget]
        if not open_rows:
            break
        probs = probabilities(np.stack([states[i].grid for i in open_rows]))
        batch_calls += -(-len(open_rows) // batch_size)
        for row, i in enumerate(open_rows):
            states[i].step(
                probs[row],
                sure_margin=sure_margin,
                branch=branch,
                doubt_below=doubt_below,
                cells_per_branch=cells_per_branch,
                paced_budget=pass_budget if paced else 0,
            )
    for state in states:
        if state.status == "open":
            state.status = "budget"
    return SearchResult(
        grids=np.stack([s.grid for s in states]),
        passes=np.array([s.passes for s in states]),
        status=np.array([s.status for s in states]),
        branches=np.array([s.branches for s in states]),
        backtracks=np.array([s.backtracks for s in states]),
        doubts=np.array([s.doubts for s in states]),
        restarts=np.array([s.restarts for s in states]),
        batch_forward_passes=batch_calls,
    )
