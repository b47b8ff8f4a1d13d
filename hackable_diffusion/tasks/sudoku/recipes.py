"""Config builders of the Sudoku task (configs/sudoku*.py), its `config.solver` section, and the upgrade of configs
saved before the section existed.

`config.solver` holds the inference-time settings of the solver loop (`inference.SolverSettings`): the rules constraint,
symmetry views, parallel attempts, repairs, restarts and the pass budget. All default to the model alone.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import ml_collections

from hackable_diffusion import recipes
from hackable_diffusion.models import presets
from hackable_diffusion.tasks.sudoku.inference import SolverSettings
from hackable_diffusion.tasks.sudoku.structure import grid_prior


def solver_section(**overrides: Any) -> ml_collections.ConfigDict:
    """`config.solver` with `inference.SolverSettings`' defaults (the model alone), updated with `overrides`."""
    section = dataclasses.asdict(SolverSettings())
    unknown = sorted(set(overrides) - set(section))
    if unknown:
        raise ValueError(f"unknown solver settings {unknown}; valid: {sorted(section)}.")
    return ml_collections.ConfigDict({**section, **overrides})


def sudoku_model(vocab_size: int = 13, grid_side: int = 9, grid_attention_bias: float = 4.0) -> dict[str, Any]:
    """4.54M parameters, bidirectional, every layer global (81 cells need no sliding window), dense FFN.

    Derived from the 26B-A4B dictionary (qk-norm, softcap, gated-GELU FFN); full RoPE on the global layers (the
    reference rotates a quarter of the global head: with no absolute position embedding, the cell's row/column
    has to come from positions) and separate K and V projections. Two Sudoku priors, neither in DiffusionGemma:
    learned row/column/box input embeddings and a learned per-head attention-logit bias for cells in the same
    row/column/box (the grid structure prior, `structure.grid_prior`; `grid_attention_bias` is the initial value
    of `model.structure_attention_bias`, heads start assigned round-robin to row, column, box, none). In a 500-step probe (margin 12 on 300 held-out 24-50-givens puzzles): no bias 44.7%
    exact, initial bias 2: 74.3%, 4: 79.7%, 6: 78.3%, 8: 79.0%.
    """
    return presets.puzzle(
        vocab_size,
        81,
        **grid_prior(grid_side, grid_attention_bias),
        depth_loops=1,  # > 1: the 6 layers applied again, same weights (in-place layout only): configs/sudoku_looped.py
    )


def sudoku_in_place_config(*, steps: int = 4800, depth_loops: int = 1) -> ml_collections.ConfigDict:
    """The in-place masking recipe of configs/sudoku.py (its docstring holds the probes behind each setting):
    batch 32, unweighted masked CE, lr 2e-3 -> 1e-4 after 100 warm-up steps, EMA 0.999; `depth_loops` > 1 applies
    the 6 layers that many times per pass with the same weights (configs/sudoku_looped.py)."""
    c = sudoku_config(steps=steps, batch_size=32)
    c.model.depth_loops = depth_loops
    c.diffusion.loss = "masked_ce"  # unweighted CE over the masked cells, pooled over the batch
    c.optimizer.peak_lr = 2e-3
    c.optimizer.end_lr = 1e-4
    c.optimizer.warmup_steps = 100
    c.train.ema_decay = 0.999  # evaluation and sampling use the EMA weights
    c.train.log_every = 50
    c.train.eval_every = 500
    c.train.checkpoint_every = 500
    return c


def sudoku_config(
    *,
    model: dict[str, Any] | None = None,
    steps: int = 3000,
    batch_size: int = 64,
    num_train: int = 200_000,
    givens: tuple[int, int] = (24, 50),
    layout: str = "in_place",
    process: str = "masking",
) -> ml_collections.ConfigDict:
    """Sudoku on generated unique puzzles (`generator.generate_dataset`, cached), in one of three layouts
    (`layouts.py`):

    in_place: masking diffusion over the 81 cells (Ye et al. 2024; Kim et al. 2025), givens fixed, blanks noised, one
      bidirectional pass per step.
    canvas: DiffusionGemma's formulation, the puzzle as a causal prompt and the solution as one 81-cell canvas
      (`process` "uniform" or "masking"; canvas CE / ELBO plus the encoder's AR loss).
    ar: the same backbone causal over [puzzle; solution], cells left to right (greedy decoding, 81 cached steps).
    """
    if layout not in ("in_place", "canvas", "ar"):
        raise ValueError(f"layout={layout!r} must be 'in_place', 'canvas' or 'ar'.")
    c = recipes.base_config()
    c.model = ml_collections.ConfigDict(model or sudoku_model())
    c.data.task = "sudoku"
    c.data.corpus = ""
    c.data.tokenizer = ""
    c.data.seq_len = 81
    c.data.batch_size = batch_size
    c.data.num_train = num_train
    c.data.num_eval = 256  # held-out generated puzzles scored during training (another generator seed)
    c.data.givens_min, c.data.givens_max = givens
    c.data.unique = True
    c.data.noise_givens = False  # in place only: True noises all 81 cells of the solution (givens too) in training
    c.data.augment_symmetry = False  # True: every training row mapped by a random Sudoku symmetry (symmetry.py)
    c.data.generator_seed = 0
    c.data.cache_dir = ""  # "" = $HACKABLE_DIFFUSION_CACHE or ~/.cache/hackable_diffusion
    c.data.update(hard_data_section())
    c.diffusion.process = {"in_place": "masking", "canvas": process, "ar": "none"}[layout]
    c.diffusion.objective = {"in_place": "pretrain", "canvas": "sft", "ar": "ar"}[layout]
    c.diffusion.canvas_len = 81 if layout == "canvas" else 0
    c.diffusion.loss = "canvas_ce" if (layout == "canvas" and process == "uniform") else "elbo"
    c.diffusion.excluded_ids = (0, 1, 2, 3) if process == "uniform" else ()  # uniform noise over the 9 digits
    c.train.num_steps = steps
    c.eval.num_batches = 2
    c.eval.batch_size = 64
    c.eval.num_samples = 0
    c.eval.num_puzzles = 64  # held-out puzzles solved at each evaluation
    c.sampler.selection = recipes.selection("top_k_margin")  # Kim et al. 2025: top-probability margin
    c.sampler.early_stopping = recipes.early_stopping("none")  # a row stops when no blank is left
    c.sampler.num_steps = 12
    c.sampler.canvas_len = 81
    c.sampler.min_temperature = 0.1
    c.sampler.max_temperature = 0.1
    # Rank cells by the model's own probabilities (Kim et al.), not by the T=0.1 ones, which saturate at 1: margin at
    # 12 steps on held-out 30-36-givens puzzles, 1500-step run: 13.0% scoring at T 0.1, 53.5% scoring at T 1.
    c.sampler.score_temperature = 1.0
    c.sampler.prompt = ""
    c.sampler.ar_temperature = 0.0  # AR layout: greedy
    if layout == "canvas" and process == "uniform":
        c.sampler.selection = recipes.selection("entropy_bound", gamma=0.1)  # DiffusionGemma's uniform sampler
    c.solver = solver_section()
    return c


_OLD_SOLVER_KEYS = (  # sampler keys of Sudoku runs saved before config.solver existed
    "repair_rounds",
    "repair_scope",
    "restarts",
    "restart_temperature",
    "pass_budget",
    "parallel_attempts",
    "fix_givens",
)


def hard_data_section() -> dict:
    """`config.data` keys that add generated hard puzzles (`hard_puzzles.py`, cached) to the training set: `hard_count`
    puzzles with `hard_givens` givens and at least `hard_min_guesses` exact-solver guesses under `hard_rule`; with
    `hard_max_guesses` > 0 only those with at most that many are kept (train on easier bands, test on harder ones);
    `hard_climb` hill-climb moves per grid before a new grid is drawn (random removal alone rarely reaches fewest-rule
    counts >= 30)."""
    return dict(
        hard_count=0,  # 0: none
        hard_givens_min=22,
        hard_givens_max=36,
        hard_min_guesses=10,
        hard_max_guesses=0,  # 0: no upper bound
        hard_rule="plain",  # the guess-counting rule: "plain" (first blank, singles only) | "fewest"
        hard_climb=0,  # hill-climb moves per grid (hard_puzzles.HardSpec.climb_steps): reaches fewest-rule bands >= 30
        hard_seed=0,
    )


def upgrade_saved_config(config: ml_collections.ConfigDict) -> None:
    """Moves the Sudoku settings of a config saved before `config.solver` existed out of `config.sampler` (in place):
    `constraint="sudoku"` -> `solver.rules=True`, `views="sudoku:K[:SEED]"` -> `solver.views=K, views_seed=SEED`,
    `restart_selection_kwargs='{"gumbel_scale": g}'` -> `solver.restart_gumbel_scale=g`, and the other solver keys
    as they were; a saved `config.solver` gains the keys added since, at their defaults."""
    missing_data = {key: value for key, value in hard_data_section().items() if key not in config.data}
    if missing_data:  # a run saved before hard puzzles could join the training set
        with config.data.unlocked():
            config.data.update(missing_data)
    s = config.sampler
    old = {key: s[key] for key in _OLD_SOLVER_KEYS if key in s}
    constraint = str(s.get("constraint", "") or "")
    views = str(s.get("views", "") or "")
    restart_args = str(s.get("restart_selection_kwargs", "") or "")
    with s.unlocked():
        for key in (*_OLD_SOLVER_KEYS, "constraint", "views", "restart_selection_kwargs"):
            if key in s:
                del s[key]
    if "solver" in config:  # a section saved before some keys existed: their defaults (the model alone) join it
        defaults = solver_section()
        missing = {key: defaults[key] for key in defaults if key not in config.solver}
        if missing:
            with config.solver.unlocked():
                config.solver.update(missing)
        return
    if constraint not in ("", "none", "sudoku"):
        raise ValueError(f"saved config: sampler.constraint={constraint!r} is not a known constraint.")
    old["rules"] = constraint == "sudoku"
    if views not in ("", "none"):
        parts = views.split(":")
        if parts[0] != "sudoku" or len(parts) not in (2, 3):
            raise ValueError(f"saved config: sampler.views={views!r} is not 'sudoku:K' or 'sudoku:K:SEED'.")
        old["views"] = int(parts[1])
        old["views_seed"] = int(parts[2]) if len(parts) == 3 else 0
    restart = json.loads(restart_args) if restart_args else {}
    if set(restart) - {"gumbel_scale"}:
        raise ValueError(f"saved config: restart_selection_kwargs={restart_args!r} holds more than gumbel_scale.")
    if restart:
        old["restart_gumbel_scale"] = float(restart["gumbel_scale"])
    with config.unlocked():
        config.solver = solver_section(**old)
