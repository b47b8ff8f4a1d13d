"""The compiled kernels of `fast_solver`: `exact_solver`'s depth-first search in numba, and the generator's searches.

The state is one 9-bit candidate mask and one digit per cell, one copy per search depth (at most 82 levels); the
search is iterative (`_dfs`). Propagation to a fixed point (`_propagate`): naked singles, and under the ``"fewest"``
rule hidden singles and dead units; queued singles are placed cell by cell and only the units whose cells changed are
rescanned. The generator's kernels (`_other_solution_kernel`, `_minimize_kernel`, `_count_one`, `_swap_kernel`) run
the same search for one puzzle. Every kernel is compiled on its first call (seconds; cached on disk after, until
this file changes). `fast_solver` is their interface: argument checks, batches and results.
"""

from __future__ import annotations

import numba
import numpy as np

from hackable_diffusion.tasks.sudoku.grids import NUM_CELLS, UNITS

_ALL = 0x1FF  # the nine digits as a candidate mask: bit d is digit d + 1
_DEPTH = NUM_CELLS + 1  # search levels: each level places at least one cell

_PEERS = np.array(
    [
        [
            j
            for j in range(NUM_CELLS)
            if j != i and (j // 9 == i // 9 or j % 9 == i % 9 or (j // 27, j % 9 // 3) == (i // 27, i % 9 // 3))
        ]
        for i in range(NUM_CELLS)
    ],
    np.int64,
)  # (81, 20)
_UNITS = np.ascontiguousarray(UNITS, np.int64)  # (27, 9)
_POPCOUNT = np.array([bin(m).count("1") for m in range(512)], np.int64)
_LOWEST = np.array([(m & -m).bit_length() - 1 for m in range(512)], np.int64)  # digit index of the lowest bit
_BRANCH_KEY = np.where(_POPCOUNT == 0, 10, _POPCOUNT)  # candidates of a blank; 10 for a filled cell
_IDENTITY_ORDER = np.tile(np.arange(9, dtype=np.int8), (NUM_CELLS, 1))
_ALL_UNITS = (1 << 27) - 1
_CELL_UNITS = np.array([[c // 9, 9 + c % 9, 18 + (c // 27) * 3 + c % 9 // 3] for c in range(NUM_CELLS)], np.int64)
_UNIT_BITS = np.array([sum(1 << int(u) for u in units) for units in _CELL_UNITS], np.int64)  # a cell's units as bits


# ------------------------------------------------------------------------------------------- compiled kernels


@numba.njit(cache=True)
def _setup(cells, cand, val) -> bool:
    """Fills ``cand`` and ``val`` from 81 cell values; False when two givens that see each other hold one digit."""
    seen = np.zeros(27, np.int64)
    for c in range(NUM_CELLS):
        v = cells[c]
        val[c] = v
        if v:
            bit = 1 << (v - 1)
            for j in range(3):
                u = _CELL_UNITS[c, j]
                if seen[u] & bit:
                    return False
                seen[u] |= bit
    for c in range(NUM_CELLS):
        if val[c]:
            cand[c] = 0
        else:
            cand[c] = _ALL & ~(seen[_CELL_UNITS[c, 0]] | seen[_CELL_UNITS[c, 1]] | seen[_CELL_UNITS[c, 2]])
    return True


@numba.njit(cache=True)
def _propagate(cand, val, unsolved, hidden, queue, qlen, dirty) -> int:
    """Places the ``qlen`` queued naked singles and those they make, and with ``hidden`` hidden singles and dead
    units, to a fixed point, in place. ``dirty``: the units (bit u) whose cells changed since they were last found
    free of hidden singles; only those are scanned. Returns the number of blanks left, or -1 on a contradiction."""
    while True:
        qi = 0
        while qi < qlen:
            c = queue[qi]
            qi += 1
            if val[c] != 0:
                continue
            m = cand[c]
            if m == 0:
                return -1
            val[c] = _LOWEST[m] + 1
            cand[c] = 0
            unsolved -= 1
            dirty |= _UNIT_BITS[c]
            for k in range(20):
                p = _PEERS[c, k]
                pm = cand[p]
                if pm & m:
                    pm &= ~m
                    cand[p] = pm
                    dirty |= _UNIT_BITS[p]
                    if pm == 0:
                        return -1
                    if _POPCOUNT[pm] == 1:
                        queue[qlen] = p
                        qlen += 1
        qlen = 0
        if not hidden or unsolved == 0:
            return unsolved
        scan = dirty
        dirty = 0
        for u in range(27):
            if not scan & (1 << u):
                continue
            ones = 0
            twos = 0
            placed = 0
            for k in range(9):  # branch-free: a blank has val 0, a filled cell cand 0
                c = _UNITS[u, k]
                placed |= (1 << val[c]) >> 1
                m = cand[c]
                twos |= ones & m
                ones |= m
            if (ones | placed) != _ALL:
                return -1  # a digit with no place left in this unit
            single = ones & ~twos
            while single:
                bit = single & -single
                single ^= bit
                where = -1
                for k in range(9):
                    if cand[_UNITS[u, k]] & bit:
                        where = _UNITS[u, k]
                        break
                if where < 0:
                    return -1  # an earlier hidden single of this unit took the digit's only cell
                if cand[where] != bit:
                    cand[where] = bit
                    dirty |= _UNIT_BITS[where]
                    queue[qlen] = where
                    qlen += 1
        if qlen == 0:
            return unsolved


@numba.njit(cache=True)
def _enter(cand, val, unsolved, hidden, queue, branch_cell) -> int:
    """`_propagate` of a node: at the root (``branch_cell`` -1) every cell is checked and every unit scanned; below
    it the parent has made its branch cell a naked single, which is all that changed."""
    qlen = 0
    if branch_cell < 0:
        for c in range(NUM_CELLS):
            if val[c] == 0:
                m = cand[c]
                if m == 0:
                    return -1
                if _POPCOUNT[m] == 1:
                    queue[qlen] = c
                    qlen += 1
        return _propagate(cand, val, unsolved, hidden, queue, qlen, _ALL_UNITS)
    queue[0] = branch_cell
    return _propagate(cand, val, unsolved, hidden, queue, 1, 0)


@numba.njit(cache=True)
def _dfs(cand0, val0, hidden, first_cell, max_solutions, max_tries, order, sols, work, stats) -> None:
    """Depth-first search from the state ``cand0`` / ``val0`` (blanks: val 0). Writes up to ``sols.shape[0]``
    solutions into ``sols`` and ``stats`` = [solutions, nodes, branch points, tries, backtracks, stopped]."""
    cand, val, unsolved, cell_at, digits, count, index, found, queue = work
    for c in range(NUM_CELLS):
        cand[0, c] = cand0[c]
        val[0, c] = val0[c]
    n_blank = 0
    for c in range(NUM_CELLS):
        if val0[c] == 0:
            n_blank += 1
    unsolved[0] = n_blank
    n_sol = 0
    nodes = 0
    branches = 0
    tries = 0
    backtracks = 0
    stopped = 0
    level = 0
    mode = 0  # 0: enter the node at `level`; 1: its next try; 2: return from it to its parent
    while True:
        if mode == 0:
            nodes += 1
            left = _enter(cand[level], val[level], unsolved[level], hidden, queue, cell_at[level - 1] if level else -1)
            if left < 0:
                mode = 2
            elif left == 0:
                if n_sol < sols.shape[0]:
                    for c in range(NUM_CELLS):
                        sols[n_sol, c] = val[level, c]
                n_sol += 1
                mode = 2
            else:
                unsolved[level] = left
                cell = -1
                if first_cell:
                    for c in range(NUM_CELLS):
                        if val[level, c] == 0:
                            cell = c
                            break
                else:
                    best = 10
                    for c in range(NUM_CELLS):
                        n = _BRANCH_KEY[cand[level, c]]  # a filled cell (cand 0) never wins
                        if n < best:
                            best = n
                            cell = c
                            if n == 2:
                                break
                m = cand[level, cell]
                n = 0
                for k in range(9):
                    d = order[cell, k]
                    if m & (1 << d):
                        digits[level, n] = d
                        n += 1
                cell_at[level] = cell
                count[level] = n
                index[level] = 0
                branches += 1
                mode = 1
        elif mode == 1:
            if index[level] >= count[level]:
                mode = 2
                continue
            if max_tries > 0 and tries >= max_tries:
                stopped = 1
                break
            tries += 1
            found[level] = n_sol
            d = digits[level, index[level]]
            index[level] += 1
            cell = cell_at[level]
            child = level + 1
            for c in range(NUM_CELLS):
                cand[child, c] = cand[level, c]
                val[child, c] = val[level, c]
            cand[child, cell] = 1 << d  # a naked single, placed first by `_enter`
            unsolved[child] = unsolved[level]
            level = child
            mode = 0
        else:
            if level == 0:
                break
            level -= 1
            if n_sol == found[level]:
                backtracks += 1
            if n_sol >= max_solutions:
                break
            mode = 1
    stats[0] = n_sol
    stats[1] = nodes
    stats[2] = branches
    stats[3] = tries
    stats[4] = backtracks
    stats[5] = stopped


def _workspace():
    return (
        np.zeros((_DEPTH, NUM_CELLS), np.int64),  # candidate masks per level
        np.zeros((_DEPTH, NUM_CELLS), np.int8),  # digits per level
        np.zeros(_DEPTH, np.int64),  # blanks left per level
        np.zeros(_DEPTH, np.int64),  # branch cell per level
        np.zeros((_DEPTH, 9), np.int8),  # digits to try per level
        np.zeros(_DEPTH, np.int64),  # how many
        np.zeros(_DEPTH, np.int64),  # the next one
        np.zeros(_DEPTH, np.int64),  # solutions found before the current try
        np.zeros(NUM_CELLS, np.int64),  # the propagation queue
    )


@numba.njit(cache=True)
def _search_batch(puzzles, hidden, first_cell, max_solutions, max_tries, order, sols, stats, work) -> None:
    """`_dfs` of every row of ``puzzles`` (n, 81); ``stats[i]`` as in `_dfs`, ``sols[i]`` its solutions. A puzzle
    whose givens conflict gets one node and nothing else (as the reference)."""
    cand0 = np.zeros(NUM_CELLS, np.int64)
    val0 = np.zeros(NUM_CELLS, np.int8)
    for i in range(puzzles.shape[0]):
        if _setup(puzzles[i], cand0, val0):
            _dfs(cand0, val0, hidden, first_cell, max_solutions, max_tries, order, sols[i], work, stats[i])
        else:
            for k in range(6):
                stats[i, k] = 0
            stats[i, 1] = 1


@numba.njit(cache=True)
def _other_solution_kernel(cells, solution, cell, out, work, stats) -> bool:
    """A solution of ``cells`` (``cell`` blank) with another digit than ``solution[cell]`` at ``cell`` into ``out``
    (the first one of the fewest rule's search); False when there is none."""
    cand0 = np.zeros(NUM_CELLS, np.int64)
    val0 = np.zeros(NUM_CELLS, np.int8)
    if not _setup(cells, cand0, val0):
        return False
    cand0[cell] &= ~(1 << (solution[cell] - 1))
    sols = np.zeros((1, NUM_CELLS), np.int8)
    _dfs(cand0, val0, True, False, 1, 0, _IDENTITY_ORDER, sols, work, stats)
    if stats[0] == 0:
        return False
    for c in range(NUM_CELLS):
        out[c] = sols[0, c]
    return True


@numba.njit(cache=True)
def _minimize_kernel(cells, solution, order, target, work) -> None:
    """Blanks givens of ``cells`` in ``order``, in place, while the unique puzzle stays unique and has more than
    ``target`` givens (blanking cell c keeps it unique iff no solution has another digit at c)."""
    givens = 0
    for c in range(NUM_CELLS):
        if cells[c]:
            givens += 1
    other = np.zeros(NUM_CELLS, np.int8)
    stats = np.zeros(6, np.int64)
    for k in range(order.shape[0]):
        if givens <= target:
            break
        c = order[k]
        if not cells[c]:
            continue
        cells[c] = 0
        if _other_solution_kernel(cells, solution, c, other, work, stats):
            cells[c] = solution[c]
        else:
            givens -= 1


@numba.njit(cache=True)
def _count_one(cells, hidden, first_cell, max_solutions, max_tries, work, stats) -> int:
    """`_dfs` of one puzzle (81 cell values) into ``stats``; returns its guesses (tries)."""
    cand0 = np.zeros(NUM_CELLS, np.int64)
    val0 = np.zeros(NUM_CELLS, np.int8)
    sols = np.zeros((1, NUM_CELLS), np.int8)
    if _setup(cells, cand0, val0):
        _dfs(cand0, val0, hidden, first_cell, max_solutions, max_tries, _IDENTITY_ORDER, sols, work, stats)
    else:
        for k in range(6):
            stats[k] = 0
        stats[1] = 1
    return stats[3]


@numba.njit(cache=True)
def _swap_kernel(trial, solution, a, differ, work, stats) -> int:
    """With ``trial[a]`` blank: the cells other than ``a`` where the first solution with another digit at ``a``
    differs from ``solution``, ascending, into ``differ``; returns how many (0: no such solution)."""
    other = np.zeros(NUM_CELLS, np.int8)
    if not _other_solution_kernel(trial, solution, a, other, work, stats):
        return 0
    n = 0
    for c in range(NUM_CELLS):
        if c != a and other[c] != solution[c]:
            differ[n] = c
            n += 1
    return n
