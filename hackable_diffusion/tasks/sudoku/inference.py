"""The Sudoku solver loop around a trained model: decode, repair, restart, attempt in parallel, within a pass budget.

A puzzle is solved by the run's sampler with its givens fixed: in place, `sampling.canvas.denoise_canvas` over an
empty KV cache; canvas layout, `generate` after the puzzle's prompt; AR layout, 81 cached decode steps. Around that,
`config.solver` (`SolverSettings`) adds verifier-guided inference-time compute, none of it in DiffusionGemma:

* `repair_rounds` = R (in place and canvas): after the decode, every non-given cell that repeats a digit in its row,
  column or box (`repair_scope="units"`: every cell of such a unit) is blanked and decoded again with the other cells
  held, up to R rounds. A complete conflict-free grid that keeps a unique puzzle's givens is its solution, so this
  spends passes only where the answer is certainly wrong.
* `restarts` = K: a grid that still breaks a rule is solved again from the puzzle with fresh randomness, tokens at
  `restart_temperature` and (diffusion) Gumbel noise `restart_gumbel_scale` on the ranking, up to K times; the first
  rule-abiding attempt is kept, otherwise the one with the fewest conflicting cells.
* `parallel_attempts` = K: K symmetric copies of each puzzle (`symmetry.grid_symmetries`, copy 0 the puzzle itself)
  solved side by side in the same batches, mapped back; the first complete, givens-keeping, rule-abiding grid is kept,
  otherwise the one with the fewest blank, conflicting and given-breaking cells. Passes = the slowest copy's (they run
  in lockstep); network evaluations add all K.
* `pass_budget` = B caps every puzzle's forward passes, restarts included: a restart runs only while the passes so
  far plus an attempt's most fit in B.
* `rules` (the `rules.SudokuRules` constraint) and `views` (K symmetry views averaged inside each step) change the
  sampler itself.
* `search=True` replaces the sampler by the model-steered depth-first search of `search.py` (sure cells at margin
  `search_sure_margin`, a branch point at `search_branch`'s cell when none is sure, backtracking on a rule violation)
  within `pass_budget` passes; `search_scores="uniform"` runs it on the rules alone (the ablation). In place only,
  with `rules=True`; `views` average the model over symmetric copies as in the sampler. With `parallel_attempts` = K
  the K symmetric copies are K searches side by side: a puzzle is solved by the first copy that solves it (its
  passes: that copy's, the searches run in lockstep; network evaluations: all copies' passes until then).

Row i's randomness is fold_in(key(seed), i), so a puzzle's answer does not depend on the batch it is in; the last
batch is padded with inactive rows so that every batch has one compiled shape.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jaxtyping import Int

from hackable_diffusion import builders
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.sampling import autoregressive as ar_lib
from hackable_diffusion.sampling import generate as gen_lib
from hackable_diffusion.sampling.canvas import commit_passes, denoise_canvas
from hackable_diffusion.sampling.keys import row_key_data
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.tasks.sudoku import search as search_lib
from hackable_diffusion.tasks.sudoku.grids import conflicting_cells
from hackable_diffusion.tasks.sudoku.layouts import layout_of
from hackable_diffusion.tasks.sudoku.rules import SudokuRules
from hackable_diffusion.tasks.sudoku.symmetry import grid_symmetries, symmetry_views
from hackable_diffusion.tasks.sudoku.vocab import NON_DIGIT_IDS, SudokuVocab

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class SolverSettings:
    """`config.solver`: see the module docstring. The defaults are the model alone."""

    rules: bool = False
    views: int = 1
    views_seed: int = 0
    parallel_attempts: int = 1
    repair_rounds: int = 0
    repair_scope: str = "cells"
    restarts: int = 0
    restart_temperature: float = 1.0
    restart_gumbel_scale: float = 0.0  # 0: restarts rank as the first attempt does
    pass_budget: int = 0  # 0: no cap
    fix_givens: bool = True  # canvas layout: hold the givens in the canvas too (infilling)
    search: bool = False  # True: search.py's model-steered depth-first search instead of the sampler
    search_sure_margin: float = 0.99  # search: blanks whose top-probability margin reaches this are committed
    search_branch: str = "confident"  # search: the cell to branch on, search.BRANCH_RULES
    search_scores: str = "model"  # search: "uniform" steers by the rules alone (search.SCORES)
    search_doubt_below: float = 0.0  # search: backtrack when a blank's allowed digits hold less probability than this
    search_cells_per_branch: int = 1  # search: blanks decided by a branch pass (the first alternative: the cell alone)
    search_paced: bool = False  # search: each pass decides >= ceil(blanks / passes left of pass_budget) cells

    def __post_init__(self):
        if self.parallel_attempts < 1:
            raise ValueError(f"config.solver.parallel_attempts={self.parallel_attempts} must be >= 1 (1: one attempt).")
        if self.views < 1:
            raise ValueError(f"config.solver.views={self.views} must be >= 1 (1: the model alone).")
        if self.repair_scope not in ("cells", "units"):
            raise ValueError(
                f"config.solver.repair_scope={self.repair_scope!r} must be 'cells' (the repeated digits) or 'units' "
                "(their rows, columns and boxes)."
            )
        if self.restarts < 0 or self.repair_rounds < 0 or self.pass_budget < 0:
            raise ValueError(
                f"config.solver.restarts={self.restarts}, repair_rounds={self.repair_rounds} and "
                f"pass_budget={self.pass_budget} must be >= 0."
            )
        if self.search:
            branch_rules, scores = search_lib.BRANCH_RULES, search_lib.SCORES
            if self.search_branch not in branch_rules or self.search_scores not in scores:
                raise ValueError(
                    f"config.solver.search_branch={self.search_branch!r} must be one of {branch_rules} and "
                    f"search_scores={self.search_scores!r} one of {scores}."
                )
            if not 0.0 < self.search_sure_margin <= 1.0:
                raise ValueError(f"config.solver.search_sure_margin={self.search_sure_margin} must lie in (0, 1].")
            if self.search_cells_per_branch < 1:
                raise ValueError(f"config.solver.search_cells_per_branch={self.search_cells_per_branch} must be >= 1.")
            if not 0.0 <= self.search_doubt_below < 1.0:
                raise ValueError(
                    f"config.solver.search_doubt_below={self.search_doubt_below} must lie in [0, 1) (0: off)."
                )
            if not self.rules or self.pass_budget < 1:
                raise ValueError(
                    "config.solver.search=True backtracks on the rules within a pass budget: set "
                    "config.solver.rules=True and config.solver.pass_budget to the most forward passes per puzzle."
                )
            if self.repair_rounds or self.restarts:
                raise ValueError(
                    "config.solver.search=True revises cells by backtracking; it does not combine with "
                    "repair_rounds or restarts (set them to 0)."
                )
        if self.restart_gumbel_scale < 0:
            raise ValueError(f"config.solver.restart_gumbel_scale={self.restart_gumbel_scale} must be >= 0 (0: none).")
        if self.restarts and self.restart_temperature <= 0:
            raise ValueError(
                f"config.solver.restart_temperature={self.restart_temperature} must be > 0: a restart needs fresh "
                "randomness."
            )

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> SolverSettings:
        section = config.get("solver") or {}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section.keys()) - known)
        if unknown:
            raise ValueError(f"unknown config.solver keys {unknown}; valid keys: {sorted(known)}.")
        return cls(**dict(section.items()))

    def check(self, layout: str, num_steps: int) -> int:
        """Checks the settings against the layout; returns the most passes one attempt can take."""
        if layout == "ar" and self.rules:
            raise ValueError(
                "config.solver.rules acts on a diffusion step's logits; the AR layout has no such sampler."
            )
        if layout != "in_place" and self.views > 1:
            raise ValueError(
                f"config.solver.views relabels the canvas but not a prompt; it needs the in-place layout, not {layout!r}."
            )
        if self.search and layout != "in_place":
            raise ValueError(f"config.solver.search decides cells in place; the {layout!r} layout has no such model.")
        if self.search:
            return 1  # a pass at a time, within pass_budget
        if self.repair_rounds and layout == "ar":
            raise ValueError(
                "config.solver.repair_rounds re-decodes cells in place; the AR layout has no such sampler."
            )
        # the most passes one attempt can take: AR prefill + 81 cells; in place num_steps per decode; canvas + 1 prefill
        per_decode = int(num_steps) + (1 if layout == "canvas" else 0)
        attempt_passes = 82 if layout == "ar" else per_decode * (1 + self.repair_rounds)
        if self.pass_budget and self.pass_budget < attempt_passes:
            raise ValueError(
                f"config.solver.pass_budget={self.pass_budget} must be 0 (no cap) or at least one attempt's passes "
                f"({attempt_passes} with num_steps, repair_rounds and the layout's prefill); lower "
                "config.sampler.num_steps or raise the budget."
            )
        return attempt_passes


def puzzle_sampler(config: ml_collections.ConfigDict, process, settings: SolverSettings) -> DiffusionSampler:
    """The run's diffusion sampler on the 81-cell canvas with the solver's rules and views, never writing a
    non-digit."""
    return builders.build_sampler(
        config,
        process,
        constraint=SudokuRules() if settings.rules else None,
        views=symmetry_views(settings.views, settings.views_seed) if settings.views > 1 else None,
        canvas_length=81,
        forbidden_tokens=NON_DIGIT_IDS,
    )


def restart_config(config: ml_collections.ConfigDict, settings: SolverSettings) -> ml_collections.ConfigDict:
    """The config of a restart attempt: tokens at `restart_temperature`, and Gumbel noise on the ranking scores when
    `restart_gumbel_scale` > 0 (so that the attempt decides cells in another order)."""
    config = config.copy_and_resolve_references()
    temperature = float(settings.restart_temperature)
    config.sampler.ar_temperature = temperature
    config.sampler.min_temperature = config.sampler.max_temperature = temperature
    if settings.restart_gumbel_scale:
        config.sampler.selection.gumbel_scale = float(settings.restart_gumbel_scale)
    return config


@dataclasses.dataclass(frozen=True)
class SudokuSolution:
    """predictions: (n, 81) grids; steps: denoising steps (forward passes) each puzzle used; seconds: wall time of
    the solving calls after one compile/warm-up batch; batch_forward_passes: model calls over all batches;
    network_passes: each puzzle's passes summed over its parallel attempts (= steps with one attempt; with more, `steps`
    is the slowest attempt's, since the attempts run side by side); search: the search's outcomes (how many puzzles
    ended solved / exhausted / out of budget, mean branch points and backtracks), None for the sampler."""

    predictions: np.ndarray
    steps: np.ndarray
    seconds: float
    batch_forward_passes: int
    network_passes: np.ndarray
    search: dict[str, Any] | None = None
    commit_pass: np.ndarray | None = None  # (n, 81) with record_order: the pass that wrote each cell, -1 for givens


def solve_puzzles(
    exp: Experiment,
    params,
    puzzles: Int[np.ndarray, "n 81"],
    *,
    seed: int = 0,
    batch_size: int = 256,
    config: ml_collections.ConfigDict | None = None,
    warm_up: bool = True,
    record_order: bool = False,
) -> SudokuSolution:
    """Fills the blanks of `puzzles` (0 = blank) with the run's sampler and `config.solver` (see the module
    docstring); `config` defaults to the experiment's own (pass an overridden copy to try other settings).
    `warm_up=False` skips the untimed compile-and-warm-up batch of the sampler path (RL rollouts call this every
    step and do not time it). `record_order=True` (the in-place sampler alone: no search, parallel attempts, repairs
    or restarts) also returns the pass at which each cell was written (`SudokuSolution.commit_pass`)."""
    if not isinstance(exp.tokenizer, SudokuVocab):
        raise ValueError("solve_puzzles needs a Sudoku experiment (config.data.task='sudoku').")
    puzzles = np.asarray(puzzles)
    if puzzles.ndim != 2 or puzzles.shape[1] != 81 or len(puzzles) == 0:
        raise ValueError(f"puzzles must be a non-empty (n, 81) array, got shape {puzzles.shape}.")
    config = config or exp.config
    settings = SolverSettings.from_config(config)
    if record_order:
        if layout_of(config) != "in_place" or settings.search or settings.parallel_attempts > 1:
            raise ValueError(
                "the order in which cells were written is recorded for the in-place sampler alone (config.solver: no "
                f"search, parallel_attempts=1); this run's layout is {layout_of(config)!r}, search "
                f"{bool(settings.search)}, parallel_attempts {settings.parallel_attempts}."
            )
        if settings.repair_rounds or settings.restarts:
            raise ValueError(
                "the order in which cells were written is recorded for one decode per puzzle: set "
                "config.solver.repair_rounds=0 and config.solver.restarts=0."
            )
    if settings.search:
        return _solve_by_search(exp, params, puzzles, settings, batch_size=batch_size, config=config)
    if settings.parallel_attempts > 1:
        return _solve_in_parallel_attempts(
            exp, params, puzzles, settings, seed=seed, batch_size=batch_size, config=config
        )
    return _solve(
        exp,
        params,
        puzzles,
        settings,
        seed=seed,
        batch_size=batch_size,
        config=config,
        warm_up=warm_up,
        record_order=record_order,
    )


def _solve(
    exp,
    params,
    puzzles,
    settings: SolverSettings,
    *,
    seed,
    batch_size,
    config,
    warm_up: bool = True,
    record_order: bool = False,
) -> SudokuSolution:
    layout = layout_of(config)
    attempt_passes = settings.check(layout, config.sampler.num_steps)
    rounds, pass_budget = settings.repair_rounds, settings.pass_budget
    vocab = exp.tokenizer
    n = len(puzzles)
    b = max(1, min(int(batch_size), n))

    def make_decoder(cfg):
        if layout == "ar":
            return ar_lib.ARSampling(temperature=float(cfg.sampler.ar_temperature))
        return puzzle_sampler(cfg, exp.process, settings)

    first_decoder = make_decoder(config)
    restart_decoder = make_decoder(restart_config(config, settings)) if settings.restarts else None
    empty_cache = init_cache(exp.model.cfg, b, 1)  # in place: no prefix, every slot invalid
    orders: list[np.ndarray] = []  # record_order: each batch's commit passes, in the order the batches ran

    def run(chunk: np.ndarray, keys: np.ndarray, decoder):
        """Solves up to b puzzles (0 = blank) with their raw keys (`row_key_data`, on the host: indexing and padding
        them compiles nothing): (grids, steps per row, forward passes of the batch)."""
        real = len(chunk)
        padded = np.concatenate([chunk, np.repeat(chunk[-1:], b - real, axis=0)]) if real < b else chunk
        keys = np.concatenate([keys, np.repeat(keys[-1:], b - real, axis=0)]) if real < b else keys
        fixed = jnp.asarray(padded != 0)
        tokens = jnp.asarray(vocab.encode(padded))  # givens as digits, blanks as MASK: the prompt, too
        active = jnp.asarray(np.arange(b) < real)
        if layout == "ar":  # prefill the puzzle, then 81 cached decode steps
            out = ar_lib.generate_ar(
                exp.model,
                params,
                tokens,
                key=keys,
                max_new_tokens=81,
                sampling=decoder,
                stop_tokens=(),
                forbidden_tokens=NON_DIGIT_IDS,
            )
            grids, used, forward_passes = out.tokens, np.full((b,), out.forward_passes), out.forward_passes
        elif layout == "canvas":  # prefill the puzzle, then one canvas with the givens held (infilling)
            out = gen_lib.generate(
                exp.model,
                params,
                tokens,
                sampler=decoder,
                key=keys,
                max_new_tokens=81,
                stop_tokens=(),
                fixed=fixed if settings.fix_givens else None,
                fixed_tokens=tokens,
            )
            grids, used, forward_passes = out.tokens, out.steps[:, 0] + 1, out.forward_passes  # + 1: the prefill
        else:
            canvas = decoder.initial_canvas(keys, b, fixed=fixed, fixed_tokens=tokens)
            result = denoise_canvas(
                exp.model,
                params,
                empty_cache,
                canvas,
                keys,
                sampler=decoder,
                fixed=fixed,
                active=active,
                return_trajectory=record_order,
            )
            grids, used, forward_passes = result.canvas, result.steps, result.forward_passes
            if record_order:
                orders.append(
                    commit_passes(np.asarray(result.trajectory), np.asarray(fixed), exp.process.mask_id)[:real]
                )
        return vocab.decode(np.asarray(grids)[:real]), np.asarray(used)[:real], int(forward_passes)

    def solve_all(grids: np.ndarray, keys: np.ndarray, decoder):
        out, used, passes = [], [], 0
        for start in range(0, len(grids), b):
            chunk_out, chunk_used, chunk_passes = run(grids[start : start + b], keys[start : start + b], decoder)
            out.append(chunk_out)
            used.append(chunk_used)
            passes += chunk_passes
        return np.concatenate(out), np.concatenate(used), passes

    def attempt(rows: np.ndarray, base_key: jax.Array, decoder):
        """Solves puzzles[rows] and repairs them: (grids, passes per row, batch passes). Row i's keys come from
        fold_in(base_key, i) (round r of repairs: fold_in(fold_in(base_key, r + 1), i)), whatever `rows` holds."""
        given = puzzles[rows]
        preds, steps, passes = solve_all(given, row_key_data(base_key, n)[rows], decoder)
        for round_index in range(rounds):
            # Repair: blank every non-given cell that repeats a digit in its row, column or box and re-decode those
            # cells with the rest held; rows without a conflict are final.
            bad = conflicting_cells(preds, whole_units=settings.repair_scope == "units") & (given == 0)
            todo = np.flatnonzero(bad.any(axis=-1))
            if not len(todo):
                break
            round_keys = row_key_data(jax.random.fold_in(base_key, round_index + 1), n)[rows[todo]]
            fixed_preds, fixed_steps, round_passes = solve_all(np.where(bad[todo], 0, preds[todo]), round_keys, decoder)
            preds[todo], steps[todo] = fixed_preds, steps[todo] + fixed_steps
            passes += round_passes
        return preds, steps, passes

    warm_up_keys = row_key_data(seed, min(n, b))
    for decoder in (first_decoder, restart_decoder):  # compile (and warm up) outside the timed loop
        if decoder is not None and warm_up:
            run(puzzles[:b], warm_up_keys, decoder)
    orders.clear()
    start_time = time.perf_counter()
    preds, steps, passes = attempt(np.arange(n), jax.random.key(seed), first_decoder)
    conflicts = conflicting_cells(preds).sum(axis=-1)
    for restart_index in range(settings.restarts):
        # Restart (verifier-guided): a grid that breaks a rule is certainly wrong; solve its puzzle again afresh.
        fits = steps + attempt_passes <= pass_budget if pass_budget else True
        todo = np.flatnonzero((conflicts > 0) & fits)
        if not len(todo):
            break
        base_key = jax.random.fold_in(jax.random.key(seed), 10_000 + restart_index)
        new_preds, new_steps, restart_passes = attempt(todo, base_key, restart_decoder)
        new_conflicts = conflicting_cells(new_preds).sum(axis=-1)
        better = new_conflicts < conflicts[todo]
        preds[todo[better]], conflicts[todo[better]] = new_preds[better], new_conflicts[better]
        steps[todo] += new_steps
        passes += restart_passes
    seconds = time.perf_counter() - start_time
    order = np.concatenate(orders) if record_order else None
    return SudokuSolution(preds, steps, seconds, passes, network_passes=steps, commit_pass=order)


def _symmetric_copies(puzzles: Int[np.ndarray, "n 81"], attempts: int):
    """(the group, its (attempts x n, 81) images of the puzzles): copy k of puzzle i is row k*n + i, copy 0 the puzzle."""
    group = grid_symmetries(attempts)
    positions, digits = np.asarray(group.positions), np.asarray(group.tokens)
    # `group.to_views` on the host: no program compiled for each number of puzzles
    copies = np.concatenate([digits[k][np.asarray(puzzles)[:, positions[k]]] for k in range(group.num_views)])
    return group, copies.astype(puzzles.dtype)


def _solve_by_search(exp, params, puzzles, settings: SolverSettings, *, batch_size, config) -> SudokuSolution:
    """search.py's depth-first search, steered by the model (or by the rules alone); deterministic, no key."""
    settings.check(layout_of(config), config.sampler.num_steps)
    attempts, n = settings.parallel_attempts, len(puzzles)
    group, copies = _symmetric_copies(puzzles, attempts)
    b = max(1, min(int(batch_size), len(copies)))
    if settings.search_scores == "uniform":
        probabilities = search_lib.uniform_probabilities
    else:
        views = symmetry_views(settings.views, settings.views_seed) if settings.views > 1 else None
        probabilities = search_lib.ModelProbabilities(exp.model, params, b, views)
        probabilities.warm_up(puzzles[0])  # compile outside the timed search
    start_time = time.perf_counter()
    result = search_lib.search_puzzles(
        probabilities,
        copies,
        pass_budget=settings.pass_budget,
        sure_margin=settings.search_sure_margin,
        branch=settings.search_branch,
        doubt_below=settings.search_doubt_below,
        cells_per_branch=settings.search_cells_per_branch,
        paced=settings.search_paced,
        attempts=attempts,
        batch_size=b,
    )
    seconds = time.perf_counter() - start_time
    status, passes = result.status.reshape(attempts, n), result.passes.reshape(attempts, n)
    # the copy that solved the puzzle in the fewest passes (copy 0 when none did)
    chosen = np.argmin(np.where(status == "solved", passes, np.iinfo(np.int32).max), axis=0)
    rows = np.arange(n)
    grids = group.restore(result.grids.reshape(attempts, n, 81))[chosen, rows]
    network = passes.sum(axis=0) if settings.search_scores == "model" else np.zeros(n, passes.dtype)
    puzzle_status = np.where(
        (status == "solved").any(axis=0), "solved", np.where((status == "budget").any(axis=0), "budget", "exhausted")
    )
    outcomes = {f"search_{name}": int((puzzle_status == name).sum()) for name in ("solved", "exhausted", "budget")}
    outcomes["search_branch_points_per_puzzle"] = float(result.branches.reshape(attempts, n).sum(axis=0).mean())
    outcomes["search_backtracks_per_puzzle"] = float(result.backtracks.reshape(attempts, n).sum(axis=0).mean())
    outcomes["search_doubts_per_puzzle"] = float(result.doubts.reshape(attempts, n).sum(axis=0).mean())
    outcomes["search_strict_restarts"] = int(result.restarts.sum())
    passes = np.where(puzzle_status == "solved", passes[chosen, rows], passes.max(axis=0))
    # Unpaced, the search does not look at its budget until it runs out, so a smaller budget would have stopped each
    # puzzle's same trajectory earlier: the fraction solved within B passes is the accuracy at pass_budget = B. A paced
    # search keeps the pace of its own budget, so only that budget's accuracy is reported.
    solved = puzzle_status == "solved"
    budgets = [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512) if b < settings.pass_budget]
    budgets = [] if settings.search_paced else budgets
    outcomes["search_solved_within_passes"] = {
        str(b): float((solved & (passes <= b)).mean()) for b in (*budgets, settings.pass_budget)
    }
    return SudokuSolution(grids, passes, seconds, result.batch_forward_passes, network_passes=network, search=outcomes)


def _solve_in_parallel_attempts(exp, params, puzzles, settings: SolverSettings, *, seed, batch_size, config):
    """K symmetric copies of every puzzle, solved side by side (see the module docstring)."""
    attempts, n = settings.parallel_attempts, len(puzzles)
    group, copies = _symmetric_copies(puzzles, attempts)
    one = dataclasses.replace(settings, parallel_attempts=1)
    inner = _solve(exp, params, copies, one, seed=seed, batch_size=batch_size, config=config)
    grids = group.restore(inner.predictions.reshape(attempts, n, 81))
    broken = (
        conflicting_cells(grids).sum(axis=-1)
        + (grids == 0).sum(axis=-1)
        + ((puzzles[None] != 0) & (grids != puzzles[None])).sum(axis=-1)
    )  # (K, n): 0 = a complete rule-abiding grid with the givens kept
    chosen = np.argmin(broken, axis=0)  # the first copy with the fewest broken cells
    steps = inner.steps.reshape(attempts, n)
    return SudokuSolution(
        predictions=grids[chosen, np.arange(n)],
        steps=steps.max(axis=0),
        seconds=inner.seconds,
        batch_forward_passes=inner.batch_forward_passes,
        network_passes=steps.sum(axis=0),
    )
