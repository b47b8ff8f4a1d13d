"""Sudoku training data: generated unique puzzles as token rows with their givens marked `fixed`, a held-out set from
another generator seed, and the grain pipeline that feeds the training loop; plus the puzzle sets `evaluate` reads.

Training rows are solutions as tokens (`vocab.SudokuVocab`) with `fixed` = the givens (attended, never corrupted,
not in the loss). `config.data.noise_givens=True` (in place only) noises all 81 cells instead.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time

import ml_collections
import numpy as np
from jaxtyping import Bool, Int

from hackable_diffusion.data import text as text_lib
from hackable_diffusion.tasks.sudoku import csv_io, exact_solver, generator
from hackable_diffusion.tasks.sudoku.layouts import layout_of
from hackable_diffusion.tasks.sudoku.symmetry import RandomSymmetry
from hackable_diffusion.tasks.sudoku.vocab import SudokuVocab

HELD_OUT_SEED_OFFSET = 1_000_003  # the held-out set's generator seed = the training seed + this


@dataclasses.dataclass(frozen=True, eq=False)
class SudokuData:
    """Training rows (solutions as tokens, givens as `fixed`) and a held-out generated set (grids, 0 = blank)."""

    tokenizer: SudokuVocab
    train_tokens: Int[np.ndarray, "n 81"]
    train_fixed: Bool[np.ndarray, "n 81"]
    eval_puzzles: Int[np.ndarray, "e 81"]
    eval_solutions: Int[np.ndarray, "e 81"]

    @property
    def train_sequences(self) -> np.ndarray:
        return self.train_tokens


def givens_range(config: ml_collections.ConfigDict) -> tuple[int, int]:
    lo, hi = int(config.data.givens_min), int(config.data.givens_max)
    if not 17 <= lo <= hi <= 80:
        raise ValueError(f"config.data.givens_min/givens_max must satisfy 17 <= min <= max <= 80, got {lo}, {hi}.")
    return lo, hi


def held_out_seed(config: ml_collections.ConfigDict) -> int:
    """The generator seed of the held-out set used during training: never the training seed."""
    return int(config.data.generator_seed) + HELD_OUT_SEED_OFFSET


def check_data_config(config: ml_collections.ConfigDict) -> None:
    dc = config.data
    if dc.seq_len != 81:
        raise ValueError(f"config.data.seq_len must be 81 for Sudoku (one token per cell), got {dc.seq_len}.")
    givens_range(config)
    if bool(dc.get("noise_givens", False)) and layout_of(config) != "in_place":
        raise ValueError(
            "config.data.noise_givens=True trains on whole solution grids and only fits the in-place layout "
            f"(config.diffusion.objective='pretrain'), not {layout_of(config)!r}; set it to False."
        )


def build_data(config: ml_collections.ConfigDict) -> SudokuData:
    check_data_config(config)
    dc = config.data
    lo, hi = givens_range(config)
    cache_dir = dc.cache_dir or "default"
    train = generator.generate_dataset(
        int(dc.num_train), (lo, hi), seed=int(dc.generator_seed), unique=bool(dc.unique), cache_dir=cache_dir
    )
    if int(dc.get("hard_count", 0)):
        train = with_hard_puzzles(train, dc, cache_dir)
    held_out = generator.generate_dataset(
        int(dc.num_eval), (lo, hi), seed=held_out_seed(config), unique=True, cache_dir=cache_dir
    )
    vocab = SudokuVocab()
    train_fixed = train["puzzles"] != 0
    return SudokuData(
        tokenizer=vocab,
        train_tokens=vocab.encode(train["solutions"]),
        # noise_givens: every cell of the solution is noised at level t (81 loss positions per row instead of the
        # blanks only); solving still holds a puzzle's givens fixed, which is then a partly unmasked grid.
        train_fixed=np.zeros_like(train_fixed) if dc.get("noise_givens", False) else train_fixed,
        eval_puzzles=held_out["puzzles"],
        eval_solutions=held_out["solutions"],
    )


def with_hard_puzzles(train: dict[str, np.ndarray], dc: ml_collections.ConfigDict, cache_dir) -> dict[str, np.ndarray]:
    """The training puzzles plus `data.hard_count` generated hard ones (`hard_puzzles.generate_hard_dataset`, cached),
    those above `data.hard_max_guesses` guesses dropped when it is set."""
    from hackable_diffusion.tasks.sudoku import hard_puzzles  # numba (its fast solver) loads for data.hard_count only

    spec = hard_puzzles.HardSpec(
        givens=(int(dc.hard_givens_min), int(dc.hard_givens_max)),
        min_guesses=int(dc.hard_min_guesses),
        rule=str(dc.hard_rule),
        climb_steps=int(dc.hard_climb),
    )
    hard = hard_puzzles.generate_hard_dataset(
        int(dc.hard_count), spec, seed=int(dc.hard_seed), cache_dir=cache_dir, progress=_generation_progress()
    )
    keep = np.ones(len(hard["puzzles"]), bool)
    if int(dc.hard_max_guesses):
        keep = (hard["guesses"] <= int(dc.hard_max_guesses)) & hard["guesses_complete"]
    print(
        f"training set: {len(train['puzzles'])} puzzles + {int(keep.sum())} of {len(keep)} hard ones "
        f"({spec.rule} guesses {spec.min_guesses}..{int(dc.hard_max_guesses) or 'any'})",
        flush=True,
    )
    return {k: np.concatenate([train[k], hard[k][keep]]) for k in ("puzzles", "solutions")}


def _generation_progress():
    """A `generate_hard_dataset` progress callback printing puzzles made, rate and ETA (only when not cached)."""
    started = time.perf_counter()

    def report(done: int, total: int) -> None:
        rate = done / max(time.perf_counter() - started, 1e-9)
        eta = (total - done) / max(rate, 1e-9)
        print(f"  hard puzzles {done:,}/{total:,} ({rate:.2f}/s, ETA {eta:.0f} s)", flush=True)

    return report


def make_train_iterator(
    tokens: Int[np.ndarray, "n l"],
    fixed: Bool[np.ndarray, "n l"],
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    augment_symmetry: bool = False,
):
    """`data.text.make_fixed_rows_iterator` over (tokens, fixed) rows; `augment_symmetry` maps every row by its own
    random element of the Sudoku group (`symmetry.RandomSymmetry`)."""
    if augment_symmetry and np.shape(tokens)[-1] != 81:
        raise ValueError(f"augment_symmetry needs rows of the 81 cells, got length {np.shape(tokens)[-1]}.")
    return text_lib.make_fixed_rows_iterator(
        tokens, fixed, batch_size, seed, process_index, process_count,
        random_map=RandomSymmetry() if augment_symmetry else None,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Puzzle sets for evaluation
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GeneratedPuzzles:
    """`count` unique-solution puzzles with `givens` = (lo, hi) givens from generator seed `seed` (duplicates
    dropped); the seed must differ from the run's training seed. `solver_class` "singles" or "search" keeps only the
    puzzles of that class of the exact solver (`solver.solver_class`) among the `count` generated."""

    givens: tuple[int, int]
    count: int
    seed: int
    solver_class: str | None = None

    def __post_init__(self):
        lo, hi = self.givens
        if not 17 <= lo <= hi <= 80:
            raise ValueError(f"givens must satisfy 17 <= low <= high <= 80, got {self.givens}.")
        if self.count < 1:
            raise ValueError(f"the number of puzzles must be >= 1, got {self.count}.")
        if self.solver_class not in (None, "singles", "search"):
            raise ValueError(f"solver_class={self.solver_class!r} must be None (all), 'singles' or 'search'.")

    @property
    def label(self) -> str:
        kept = f", {self.solver_class} class only" if self.solver_class else ""
        return f"generated {self.givens[0]}-{self.givens[1]} givens, {self.count} puzzles, seed {self.seed}{kept}"

    def load(self, *, train_seed: int | None = None, cache_dir: str = "default") -> dict[str, np.ndarray]:
        if train_seed is not None and self.seed == train_seed:
            raise ValueError(
                f"puzzle seed {self.seed} is the run's training generator seed; pick another seed for held-out puzzles."
            )
        data = generator.generate_dataset(self.count, self.givens, seed=self.seed, unique=True, cache_dir=cache_dir)
        _, first = np.unique(data["puzzles"], axis=0, return_index=True)
        keep = np.sort(first)
        if self.solver_class:
            keep = keep[exact_solver.solver_class(data["puzzles"][keep]) == self.solver_class]
        return {"puzzles": data["puzzles"][keep], "solutions": data["solutions"][keep]}


def random_subset(data: dict[str, np.ndarray], n: int, seed: int) -> dict[str, np.ndarray]:
    """A seeded random subset of `n` rows, kept in file order (the Kaggle file is sorted by level)."""
    total = len(data["puzzles"])
    if not 1 <= n <= total:
        raise ValueError(f"a subset of {n} puzzles: the set has {total}; ask for 1..{total}.")
    pick = np.sort(np.random.default_rng(seed).choice(total, n, replace=False))
    return {k: (v[pick] if isinstance(v, np.ndarray) else v) for k, v in data.items()}


@dataclasses.dataclass(frozen=True)
class PuzzleFile:
    """Puzzles and solutions (and a `level` column when there is one) from a CSV file: a path, or the name of a file
    that ships with the package (kaggle3m_curated_5000.csv) or lies in $HD_DATA_DIR; `subset` > 0: a seeded random
    `subset` of its rows (`random_subset`, seed `subset_seed`)."""

    path: str
    subset: int = 0
    subset_seed: int = 1

    @property
    def label(self) -> str:
        return self.path + (f", random subset of {self.subset} (seed {self.subset_seed})" if self.subset else "")

    def load(self, *, train_seed: int | None = None, cache_dir: str = "default") -> dict[str, np.ndarray]:
        del train_seed, cache_dir
        path = self.path if pathlib.Path(self.path).is_file() else text_lib.data_file(self.path)
        data = csv_io.read_sudoku_csv(path)
        data = {k: data[k] for k in ("puzzles", "solutions", "level") if k in data}
        return random_subset(data, self.subset, self.subset_seed) if self.subset else data


def training_overlap(
    config: ml_collections.ConfigDict, puzzles: Int[np.ndarray, "n 81"]
) -> Bool[np.ndarray, "n"] | None:
    """True for each puzzle that is in the run's cached training set; None when that cache is not on this machine."""
    dc = config.data
    path = generator.dataset_cache_path(
        int(dc.num_train),
        (int(dc.givens_min), int(dc.givens_max)),
        int(dc.generator_seed),
        bool(dc.unique),
        dc.get("cache_dir") or "default",
    )
    if path is None or not path.exists():
        return None
    with np.load(path) as cached:
        train = {row.tobytes() for row in cached["puzzles"].astype(np.int8)}
    return np.array([row.astype(np.int8).tobytes() in train for row in puzzles], bool)


def load_held_out(
    puzzle_set: GeneratedPuzzles | PuzzleFile, config: ml_collections.ConfigDict, *, limit: int = 0
) -> tuple[dict[str, np.ndarray], int | None]:
    """The puzzles of `puzzle_set` (the first `limit` when > 0) minus any that the run's training set holds (a puzzle
    training saw is no test), and how many were dropped (None when the training cache is not on this machine)."""
    puzzles = puzzle_set.load(
        train_seed=int(config.data.generator_seed),
        cache_dir=config.data.get("cache_dir") or "default",  # the run's own cache, as training used
    )
    if limit:
        puzzles = {k: v[:limit] for k, v in puzzles.items()}
    seen = training_overlap(config, puzzles["puzzles"])
    if seen is not None and seen.any():
        puzzles = {k: v[~seen] for k, v in puzzles.items()}
    return puzzles, None if seen is None else int(seen.sum())
