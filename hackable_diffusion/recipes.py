"""Config builders shared by the files in `configs/` (md4 / big_vision style `ml_collections` configs).

A config file composes these: a model shape from `models.presets`, a data section, a diffusion section (process,
schedule, time sampler, objective, loss), the optimizer, the training loop, the mesh, evaluation and the sampler used
for evaluation samples. Every field is a plain value so that any of them can be overridden on the command line
(`--config.diffusion.process=masking`); `hackable_diffusion.experiment` turns the values into objects.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from hackable_diffusion.models import presets

PROCESSES = ("uniform", "masking", "none")  # "none": the autoregressive baseline
OBJECTIVES = ("pretrain", "sft", "ar")


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict(presets.tiny())
    c.data = ml_collections.ConfigDict(
        dict(
            task="text",  # "text" (packed corpus) | "sudoku"
            corpus="shakespeare",  # "shakespeare" | "ptb"
            tokenizer="char",  # "char" | "spm"
            vocab_size=0,  # spm only (0 = char tokenizer decides)
            seq_len=128,
            batch_size=16,  # per process
            data_dir="",  # "" = the files shipped with the package, then $HD_DATA_DIR (data.text.data_file)
        )
    )
    c.diffusion = ml_collections.ConfigDict(
        dict(
            process="uniform",
            schedule="linear",
            schedule_eps=1e-4,
            excluded_ids=(0, 1, 2, 3),  # ids uniform noise never produces (PAD, EOS, BOS, MASK); () = the reference
            objective="pretrain",
            canvas_len=32,  # 0 = one canvas per sequence (MD4/MDLM)
            loss="elbo",  # "elbo" | "canvas_ce" | "masked_ce" (masking only)
            time_sampler="antithetic",  # "uniform" | "antithetic" | "clipped_uniform"
            t_min=0.0,
            t_max=1.0,
            encoder_ar_weight=0.0,
            self_condition_prob=0.0,
            null_signal="zeros",
            token_reweight_alpha=1.0,  # masked_ce only: each masked position's CE times alpha (1 - p)^gamma (MGDM)
            token_reweight_gamma=0.0,  # 0 with alpha 1: plain masked_ce
        )
    )
    c.optimizer = ml_collections.ConfigDict(
        dict(
            name="adamw",
            peak_lr=3e-3,
            end_lr=3e-4,
            warmup_steps=50,
            total_steps=0,  # 0: train.num_steps
            weight_decay=0.01,
            b1=0.9,
            b2=0.99,
            eps=1e-8,
            clip_norm=1.0,
        )
    )
    c.train = ml_collections.ConfigDict(
        dict(
            num_steps=500,
            grad_accum_steps=1,
            ema_decay=0.0,
            log_every=25,
            eval_every=250,
            checkpoint_every=250,
            keep_checkpoints=3,
            peak_flops=0.0,  # FLOP/s the MFU divides by; 0 = this machine's calibrated matmul peak (training/metrics.py)
        )
    )
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, expert=1, tensor=1))
    c.eval = ml_collections.ConfigDict(dict(num_batches=8, batch_size=32, num_samples=2))
    c.sampler = ml_collections.ConfigDict(
        dict(
            selection="entropy_bound",  # any key of sampling.selection.SELECTION_RULES
            selection_kwargs='{"gamma": 0.1}',  # JSON: the rule's arguments, e.g. '{"tau": 0.9}' for "threshold"
            early_stopping="diffusiongemma",  # any key of sampling.early_stopping.EARLY_STOPPING
            min_temperature=0.4,
            max_temperature=0.8,
            temperature_exponent=1.0,
            score_temperature=0.0,  # 0: selection scores the sampling distribution; > 0: logits / this (1 = model's)
            sc_temperature=0.0,  # self-conditioned models: 0 feeds back the sampling distribution (DiffusionGemma); > 0
            # feeds back logits / this (1 = the model's own probabilities, as training feeds back the raw logits)
            num_steps=32,
            canvas_len=32,
            max_new_tokens=128,
            prompt="ROMEO:",
            ar_temperature=0.8,
            repair_rounds=0,  # Sudoku only: re-decode cells that break a rule, up to this many rounds
            repair_scope="cells",  # "cells": the repeated digits; "units": every cell of their rows/columns/boxes
            restarts=0,  # Sudoku only: solve a grid that still breaks a rule again from the puzzle, up to this many times
            restart_temperature=1.0,  # token temperature of those fresh attempts (diversity; the first keeps its own)
            restart_selection_kwargs="",  # JSON merged into selection_kwargs for restarts, e.g. '{"gumbel_scale": 0.1}'
            pass_budget=0,  # Sudoku only: most forward passes per puzzle, restarts included (0 = no cap)
            constraint="",  # "sudoku": a digit a decided cell of the row/column/box holds is excluded (constraints.py)
            views="",  # "sudoku:K": each step averages the model over K symmetric copies of the grid (views.py)
            parallel_attempts=1,  # Sudoku only: solve K symmetric copies of each puzzle side by side, keep one that
            # abides by the rules (experiment.solve_sudoku); passes = the slowest copy's, network evaluations x K
        )
    )
    return c


def text_config(
    corpus: str = "shakespeare",
    process: str = "uniform",
    *,
    model: dict[str, Any] | None = None,
    steps: int = 500,
    seq_len: int = 128,
    batch_size: int = 16,
    canvas_len: int = 32,
    diffusiongemma_recipe: bool | None = None,
) -> ml_collections.ConfigDict:
    """A text pretraining experiment. `process="uniform"` defaults to DiffusionGemma's recipe (canvas CE, encoder
    AR loss, self-conditioning); "masking" to the MD4/MDLM ELBO over block canvases; "none" to the AR baseline."""
    if process not in PROCESSES:
        raise ValueError(f"process={process!r} is not one of {PROCESSES}.")
    c = base_config()
    c.model = ml_collections.ConfigDict(model or presets.tiny())
    c.data.corpus = corpus
    c.data.seq_len = seq_len
    c.data.batch_size = batch_size
    if corpus == "ptb":
        c.data.tokenizer, c.data.vocab_size = "spm", 2048
        c.sampler.prompt = "the company said"
    c.diffusion.process = process
    c.diffusion.canvas_len = canvas_len
    c.sampler.canvas_len = canvas_len
    c.train.num_steps = steps
    recipe = process == "uniform" if diffusiongemma_recipe is None else diffusiongemma_recipe
    if process == "none":
        c.diffusion.objective = "ar"
    elif recipe:
        c.diffusion.loss = "canvas_ce"
        c.diffusion.encoder_ar_weight = 1.0
        c.diffusion.self_condition_prob = 0.5
        c.diffusion.time_sampler = "uniform"
        c.diffusion.t_min, c.diffusion.t_max = 1e-4, 1.0 - 1e-4
        c.model.self_conditioning = True
    return c


def sudoku_model(vocab_size: int = 13, grid_embeddings: int = 9, grid_attention_bias: float = 4.0) -> dict[str, Any]:
    """About 4.8M parameters, bidirectional, every layer global (81 cells need no sliding window), dense FFN.

    Derived from the 26B-A4B dictionary (qk-norm, softcap, gated-GELU FFN); full RoPE on the global layers (the
    reference rotates a quarter of the global head: with no absolute position embedding, the cell's row/column
    has to come from positions) and separate K and V projections. Two Sudoku priors, neither in DiffusionGemma:
    learned row/column/box input embeddings (`grid_embeddings`) and a learned per-head attention-logit bias for cells
    in the same row/column/box (`grid_attention_bias`, its initial value; heads start assigned round-robin to row,
    column, box, none). In a 500-step probe (margin 12 on 300 held-out 24-50-givens puzzles): no bias 44.7%
    exact, initial bias 2: 74.3%, 4: 79.7%, 6: 78.3%, 8: 79.0%.
    """
    return presets.derived(
        vocab_size=vocab_size,
        embed_dim=256,
        num_layers=6,
        num_heads=8,
        head_dim=32,
        num_kv_heads=8,
        ffw_hidden=640,
        layer_pattern=("global",),
        sliding_window=81,
        global_head_dim=32,
        global_num_kv_heads=8,
        k_eq_v_global=False,
        rope_global_base=10_000.0,
        rope_global_proportion=1.0,
        moe=None,
        param_dtype="float32",
        compute_dtype="float32",
        grid_embeddings=grid_embeddings,
        grid_attention_bias=grid_attention_bias,
        self_conditioning=False,  # True with diffusion.self_condition_prob > 0: see configs/sudoku.py
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
    """Sudoku on generated unique puzzles (`data.sudoku.generate_dataset`, cached), in one of three layouts
    (`experiment.sudoku_format`):

    in_place: masking diffusion over the 81 cells (Ye et al. 2024; Kim et al. 2025), givens fixed, blanks noised, one
      bidirectional pass per step.
    canvas: DiffusionGemma's formulation, the puzzle as a causal prompt and the solution as one 81-cell canvas
      (`process` "uniform" or "masking"; canvas CE / ELBO plus the encoder's AR loss).
    ar: the same backbone causal over [puzzle; solution], cells left to right (greedy decoding, 81 cached steps).
    """
    if layout not in ("in_place", "canvas", "ar"):
        raise ValueError(f"layout={layout!r} must be 'in_place', 'canvas' or 'ar'.")
    c = base_config()
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
    c.data.generator_seed = 0
    c.data.cache_dir = ""  # "" = $HACKABLE_DIFFUSION_CACHE or ~/.cache/hackable_diffusion
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
    c.sampler.selection = "top_k_margin"  # Kim et al. 2025: top-probability margin
    c.sampler.selection_kwargs = ""
    c.sampler.early_stopping = "none"  # a row stops when no blank is left
    c.sampler.num_steps = 12
    c.sampler.canvas_len = 81
    c.sampler.min_temperature = 0.1
    c.sampler.max_temperature = 0.1
    # Rank cells by the model's own probabilities (Kim et al.), not by the T=0.1 ones, which saturate at 1: margin at
    # 12 steps on held-out 30-36-givens puzzles, 1500-step run: 13.0% scoring at T 0.1, 53.5% scoring at T 1.
    c.sampler.score_temperature = 1.0
    c.sampler.prompt = ""
    c.sampler.fix_givens = True  # canvas layout: hold the givens in the canvas too (infilling)
    c.sampler.ar_temperature = 0.0  # AR layout: greedy
    if layout == "canvas" and process == "uniform":
        c.sampler.selection = "entropy_bound"  # DiffusionGemma's sampler for the uniform process
        c.sampler.selection_kwargs = '{"gamma": 0.1}'
    return c


def text_experiment(corpus: str, process: str, *, moe: bool = False) -> ml_collections.ConfigDict:
    """The text comparison (configs/{shakespeare,ptb}_{uniform,masking,ar}[_moe].py): the ~5M-active-parameter
    `presets.mini` backbone, dense or MoE with equal active parameters, 800 steps of 8 x 256 tokens (1.64M tokens),
    canvases of 64. Only the process and objective differ between the three models of a corpus, so they see the same
    tokens; the diffusion objectives cost 2 (masking: encoder + decoder) or 3 (uniform: + self-conditioning) passes
    per token, so they take 2-3x the AR model's wall time."""
    c = text_config(corpus, process, model=presets.mini(moe=moe), steps=800, seq_len=256, batch_size=8, canvas_len=64)
    c.optimizer.peak_lr = 2e-3
    c.optimizer.end_lr = 2e-4
    c.optimizer.warmup_steps = 80
    c.train.log_every = 25
    c.train.eval_every = 200
    c.train.checkpoint_every = 200
    c.sampler.num_steps = 64
    return c
