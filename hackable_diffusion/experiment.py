"""Turns a config (plain values) into the objects of one experiment: data, model, process, objective, sampler.

Names in the config are looked up in small registries (schedules, time samplers, selection rules, early stopping);
everything built is a frozen dataclass, so a notebook can build the same pieces by hand and swap any of them.
`train.py`, `sample.py` and `evaluate.py` all start here, from the config saved in the workdir, so sampling and
evaluation reuse exactly the model shape, process and tokenizer that training used.

Sudoku (`config.data.task == "sudoku"`, `configs/sudoku.py`): masking diffusion over the 81 cells in place, as in
Ye et al. 2024 and Kim et al. 2025, with DiffusionGemma's token layout for the specials.
There is no tokenizer: `SudokuVocab` is a fixed vocabulary of 13 ids, PAD/EOS/BOS/MASK = 0..3 and digit d as id
d + 3 (4..12), so the specials keep their toolbox-wide ids. Givens are `fixed` (attended, never corrupted, not in
the loss); a puzzle is solved by `sampling.canvas.denoise_canvas` over an empty KV cache with the givens fixed.
Training puzzles are generated (`data.sudoku.generate_dataset`, cached); the held-out set used during training comes
from another generator seed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax import Array
from jaxtyping import Bool, Int

from hackable_diffusion.data import sudoku as sudoku_lib
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, Tokenizer
from hackable_diffusion.diffusion import losses
from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.diffusion.processes import MaskingProcess, NoiseProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import TIME_SAMPLERS, make_schedule
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling import generate as gen_lib
from hackable_diffusion.sampling.canvas import DiffusionSampler, denoise_canvas, row_keys
from hackable_diffusion.sampling.constraints import make_constraint
from hackable_diffusion.sampling.early_stopping import make_early_stopping
from hackable_diffusion.sampling.selection import make_selection
from hackable_diffusion.sampling.temperature import AnnealedTemperature
from hackable_diffusion.sampling.views import make_views, sudoku_views, unrelabel_grids

# ----------------------------------------------------------------------------------------------------------------
# Sudoku: vocabulary, data, iterator
# ----------------------------------------------------------------------------------------------------------------

SUDOKU_DIGIT_OFFSET = 3  # digit d (1..9) is token d + 3 (4..12)
SUDOKU_FORBIDDEN = (0, 1, 2, 3)  # the sampler never writes PAD, EOS, BOS or MASK into a grid


@dataclasses.dataclass(frozen=True)
class SudokuVocab:
    """The fixed Sudoku vocabulary: PAD, EOS, BOS, MASK (0..3) and the digits 1..9 as ids 4..12."""

    @property
    def vocab_size(self) -> int:
        return 4 + 9

    def encode(self, grids: Int[np.ndarray, "*b 81"]) -> Int[np.ndarray, "*b 81"]:
        """Digits -> ids 4..12, blanks (0) -> MASK_ID; int32."""
        g = np.asarray(grids).astype(np.int32)
        if g.shape[-1:] != (81,) or g.min(initial=0) < 0 or g.max(initial=0) > 9:
            raise ValueError(f"grids must be (..., 81) with cells 0 (blank) .. 9, got shape {g.shape}.")
        return np.where(g == 0, np.int32(MASK_ID), g + SUDOKU_DIGIT_OFFSET).astype(np.int32)

    def decode(self, tokens: Int[np.ndarray, "*b 81"]) -> Int[np.ndarray, "*b 81"]:
        """Ids 4..12 -> digits 1..9, every other id -> blank (0); int8."""
        t = np.asarray(tokens)
        digit = (t >= 1 + SUDOKU_DIGIT_OFFSET) & (t <= 9 + SUDOKU_DIGIT_OFFSET)
        return np.where(digit, t - SUDOKU_DIGIT_OFFSET, 0).astype(np.int8)


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


def _sudoku_givens_range(dc: ml_collections.ConfigDict) -> tuple[int, int]:
    lo, hi = int(dc.givens_min), int(dc.givens_max)
    if not 17 <= lo <= hi <= 80:
        raise ValueError(f"config.data.givens_min/givens_max must satisfy 17 <= min <= max <= 80, got {lo}, {hi}.")
    return lo, hi


def sudoku_eval_seed(config: ml_collections.ConfigDict) -> int:
    """The generator seed of the held-out set used during training: never the training seed."""
    return int(config.data.generator_seed) + 1_000_003


def build_sudoku_data(config: ml_collections.ConfigDict) -> SudokuData:
    dc = config.data
    if dc.seq_len != 81:
        raise ValueError(f"config.data.seq_len must be 81 for Sudoku (one token per cell), got {dc.seq_len}.")
    lo, hi = _sudoku_givens_range(dc)
    noise_givens = bool(dc.get("noise_givens", False))
    if noise_givens and sudoku_format(config) != "in_place":
        raise ValueError(
            "config.data.noise_givens=True trains on whole solution grids and only fits the in-place layout "
            f"(config.diffusion.objective='pretrain'), not {sudoku_format(config)!r}; set it to False."
        )
    cache_dir = dc.cache_dir or "default"
    train = sudoku_lib.generate_dataset(
        int(dc.num_train), (lo, hi), seed=int(dc.generator_seed), unique=bool(dc.unique), cache_dir=cache_dir
    )
    held_out = sudoku_lib.generate_dataset(
        int(dc.num_eval), (lo, hi), seed=sudoku_eval_seed(config), unique=True, cache_dir=cache_dir
    )
    vocab = SudokuVocab()
    train_fixed = train["puzzles"] != 0
    return SudokuData(
        tokenizer=vocab,
        train_tokens=vocab.encode(train["solutions"]),
        # noise_givens: every cell of the solution is noised at level t (81 loss positions per row instead of the
        # blanks only); solving still holds a puzzle's givens fixed, which is then a partly unmasked grid.
        train_fixed=np.zeros_like(train_fixed) if noise_givens else train_fixed,
        eval_puzzles=held_out["puzzles"],
        eval_solutions=held_out["solutions"],
    )


@dataclasses.dataclass(frozen=True)
class _SplitTokensAndFixed:
    """(b, 2*81) rows of [tokens | fixed] -> {"tokens": int32 (b, 81), "fixed": bool (b, 81)}."""

    length: int

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = batch["tokens"]
        return {"tokens": rows[:, : self.length], "fixed": rows[:, self.length :].astype(bool)}


def make_sudoku_train_iterator(
    tokens: Int[np.ndarray, "n l"],
    fixed: Bool[np.ndarray, "n l"],
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
):
    """`data.text.make_train_iterator` over (tokens, fixed) rows: shuffled, repeated, checkpointable (grain)."""
    import grain

    tokens, fixed = np.asarray(tokens), np.asarray(fixed)
    if tokens.shape != fixed.shape or tokens.ndim != 2:
        raise ValueError(f"tokens and fixed must be (n, l) arrays of one shape, got {tokens.shape}, {fixed.shape}.")
    rows = np.concatenate([tokens.astype(np.int32), fixed.astype(np.int32)], axis=1)
    dataset = text_lib.make_train_dataset(rows, batch_size, seed, process_index, process_count)
    dataset = dataset.map(_SplitTokensAndFixed(tokens.shape[1]))
    return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))


SUDOKU_FORMATS = {"pretrain": "in_place", "sft": "canvas", "ar": "ar"}


def sudoku_format(config: ml_collections.ConfigDict) -> str:
    """How a Sudoku run lays out a puzzle, from `config.diffusion.objective`:

    in_place (`pretrain`): one bidirectional canvas of 81 cells, givens fixed, blanks noised (Ye et al.; Kim et al.).
    canvas (`sft`): DiffusionGemma's layout, the puzzle (blanks as MASK) is a causal prompt of 81 tokens and the
      solution is one canvas of 81 denoised against the prompt's KV cache.
    ar (`ar`): the same [puzzle; solution] sequence, causal, the solution's cells predicted left to right.
    """
    objective = "ar" if config.diffusion.process == "none" else config.diffusion.objective
    if objective not in SUDOKU_FORMATS:
        raise ValueError(
            f"config.diffusion.objective={objective!r} must be one of {sorted(SUDOKU_FORMATS)} for Sudoku."
        )
    return SUDOKU_FORMATS[objective]


def sudoku_prompt(tokens: Int[Array, "b 81"], fixed: Bool[Array, "b 81"]) -> Int[Array, "b 81"]:
    """The puzzle as a prompt: the givens' tokens, MASK at the blanks."""
    return jnp.where(fixed, tokens, MASK_ID).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class SudokuCanvasObjective:
    """`CanvasSFTObjective` on Sudoku rows: prompt = the puzzle, one canvas = the solution (givens included, so the
    decoder learns to copy them from the prompt)."""

    inner: obj_lib.CanvasSFTObjective

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array):
        tokens, fixed = batch["tokens"], batch["fixed"]
        b, n = tokens.shape
        sft_batch = {
            "prompt": sudoku_prompt(tokens, fixed),
            "prompt_mask": jnp.ones((b, n), bool),
            "canvas": tokens,
            "canvas_id": jnp.zeros((b, n), jnp.int32),
            "canvas_mask": jnp.ones((b, n), bool),
            "num_canvases": jnp.ones((b,), jnp.int32),
        }
        return self.inner(params, sft_batch, rng)


@dataclasses.dataclass(frozen=True)
class SudokuAutoregressiveObjective:
    """Causal next-token loss over [puzzle; solution], counted on the 81 solution cells only."""

    model: T.Transformer

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array):
        del rng
        tokens, fixed = batch["tokens"], batch["fixed"]
        b, n = tokens.shape
        seq = jnp.concatenate([sudoku_prompt(tokens, fixed), tokens], axis=1)
        logits, aux = T.forward(self.model, params, seq, causal=True)
        targets = jnp.concatenate([jnp.zeros((b, n), bool), jnp.ones((b, n), bool)], axis=1)
        per_example, _ = losses.autoregressive_cross_entropy(logits, seq, targets)
        nats = jnp.mean(per_example)
        loss = nats + obj_lib._aux_loss(aux)
        return loss, {"loss": loss, "ar_loss": nats, "nll_bits_per_token": nats / math.log(2)}


@dataclasses.dataclass(frozen=True)
class Experiment:
    config: ml_collections.ConfigDict
    model: T.Transformer
    process: NoiseProcess | None  # None for the autoregressive baseline
    objective: Any
    tokenizer: Tokenizer | SudokuVocab
    data: text_lib.TextData | SudokuData

    @property
    def is_autoregressive(self) -> bool:
        return self.process is None


def build_process(config: ml_collections.ConfigDict, vocab_size: int) -> NoiseProcess | None:
    d = config.diffusion
    if d.process == "none":
        return None
    schedule = make_schedule(d.schedule, eps=d.schedule_eps)
    if d.process == "masking":
        return MaskingProcess(vocab_size=vocab_size, schedule=schedule, mask_id=MASK_ID)
    if d.process == "uniform":
        return UniformProcess(vocab_size=vocab_size, schedule=schedule, excluded_ids=tuple(d.excluded_ids))
    raise ValueError(f"config.diffusion.process={d.process!r} must be 'uniform', 'masking' or 'none'.")


def _token_reweight(d: ml_collections.ConfigDict) -> tuple[float, float] | None:
    """(alpha, gamma) of MGDM's token reweighting, or None for the plain loss (also for runs saved before the keys)."""
    alpha, gamma = float(d.get("token_reweight_alpha", 1.0)), float(d.get("token_reweight_gamma", 0.0))
    return None if (alpha, gamma) == (1.0, 0.0) else (alpha, gamma)


def build_objective(config: ml_collections.ConfigDict, model: T.Transformer, process: NoiseProcess | None):
    d = config.diffusion
    if d.objective == "ar" or process is None:
        return obj_lib.AutoregressiveObjective(model)
    if d.time_sampler not in TIME_SAMPLERS:
        raise ValueError(f"config.diffusion.time_sampler={d.time_sampler!r} is not one of {sorted(TIME_SAMPLERS)}.")
    sampler_cls = TIME_SAMPLERS[d.time_sampler]
    times = sampler_cls(d.t_min, d.t_max)
    common = dict(
        time_sampler=times,
        loss=d.loss,
        encoder_ar_weight=d.encoder_ar_weight,
        self_condition_prob=d.self_condition_prob,
        null_signal=d.null_signal,
    )
    token_reweight = _token_reweight(d)
    if d.objective == "pretrain":
        return obj_lib.DiffusionPretrainObjective(
            model, process, canvas_len=d.canvas_len or None, token_reweight=token_reweight, **common
        )
    if token_reweight is not None:
        raise ValueError(
            "config.diffusion.token_reweight_alpha/gamma apply to objective='pretrain' with loss='masked_ce' only; "
            "reset them to 1 and 0."
        )
    if d.objective == "sft":
        return obj_lib.CanvasSFTObjective(model, process, canvas_len=d.canvas_len, **common)
    raise ValueError(f"config.diffusion.objective={d.objective!r} must be 'pretrain', 'sft' or 'ar'.")


def check_config(config: ml_collections.ConfigDict) -> None:
    """Every check of a training config that needs no data and no compilation, so that a bad value stops the command
    before anything is written to the workdir: loop sizes, the optimizer schedule, the model shape, the process,
    objective and sampler, the mesh and batch divisibility, and that the corpus files exist. Raises ValueError (or
    FileNotFoundError for data) naming the key and how to fix it."""
    import jax

    from hackable_diffusion.training import optimizers, sharding

    t, d = config.train, config.data
    positive = {
        "train.num_steps": t.num_steps,
        "train.grad_accum_steps": t.grad_accum_steps,
        "train.keep_checkpoints": t.keep_checkpoints,
        "data.batch_size": d.batch_size,
    }
    for key, value in positive.items():
        if int(value) < 1:
            raise ValueError(f"config.{key}={value} must be >= 1.")
    for key in ("log_every", "eval_every", "checkpoint_every"):
        if int(t[key]) < 0:
            raise ValueError(f"config.train.{key}={t[key]} must be >= 0 (0 turns it off).")
    if not 0.0 <= float(t.ema_decay) < 1.0:
        raise ValueError(f"config.train.ema_decay={t.ema_decay} must be in [0, 1) (0: no EMA).")
    if d.task not in ("text", "sudoku"):
        raise ValueError(f"config.data.task={d.task!r} must be 'text' or 'sudoku'.")
    resolved = optimizer_config(config)
    if int(resolved.warmup_steps) > int(resolved.total_steps):
        raise ValueError(
            f"config.optimizer.warmup_steps={resolved.warmup_steps} is longer than the run "
            f"({resolved.total_steps} steps); lower it or raise config.train.num_steps."
        )
    optimizers.make_optimizer(resolved)  # the optimizer name and schedule
    vocab = int(config.model.get("vocab_size") or 0) or 256
    model = build_model(config, vocab)
    process = build_process(config, vocab)
    build_objective(config, model, process)
    if process is not None:
        build_sampler(config, process)
    if d.task == "sudoku":
        _sudoku_givens_range(d)
        sudoku_format(config)
    else:
        text_lib.check_corpus(d.corpus, d.tokenizer, d.data_dir or None)
    mesh = sharding.mesh_shape(config.mesh, jax.device_count())
    shards = mesh[0] * mesh[1]  # data x fsdp split the batch
    global_batch = int(d.batch_size) * jax.process_count()
    if global_batch % shards:
        raise ValueError(
            f"the global batch ({d.batch_size} per process x {jax.process_count()} processes = {global_batch}) is "
            f"not divisible by the mesh's data x fsdp = {shards} devices; set config.data.batch_size to a multiple "
            f"of {shards // math.gcd(shards, jax.process_count())} or change config.mesh."
        )


def build_text_data(config: ml_collections.ConfigDict, workdir: str) -> text_lib.TextData:
    dc = config.data
    return text_lib.build_text_data(
        dc.corpus, dc.tokenizer, dc.vocab_size or None, dc.seq_len, workdir, data_dir=dc.data_dir or None
    )


def build_model(config: ml_collections.ConfigDict, vocab_size: int) -> T.Transformer:
    shape = config.model.to_dict()
    shape["vocab_size"] = vocab_size
    return T.Transformer(TransformerConfig.from_dict(shape))


def build(config: ml_collections.ConfigDict, workdir: str) -> Experiment:
    if config.data.task not in ("text", "sudoku"):
        raise ValueError(f"config.data.task={config.data.task!r} must be 'text' or 'sudoku'.")
    if config.data.task == "sudoku":
        layout = sudoku_format(config)
        if layout == "in_place" and config.diffusion.process != "masking":
            raise ValueError(
                "Sudoku in place (objective='pretrain') needs config.diffusion.process='masking' (givens are fixed "
                f"tokens, blanks start masked); got {config.diffusion.process!r}. For a uniform process use the "
                "canvas layout: config.diffusion.objective='sft' (configs/sudoku_canvas.py)."
            )
        if layout == "in_place" and config.diffusion.canvas_len:
            raise ValueError("Sudoku in place is one canvas of 81 cells: set config.diffusion.canvas_len=0.")
        if layout == "canvas" and config.diffusion.canvas_len != 81:
            raise ValueError(
                "The Sudoku canvas layout denoises the solution as one canvas: set config.diffusion.canvas_len=81."
            )
        data = build_sudoku_data(config)
    else:
        data = build_text_data(config, workdir)
    vocab_size = data.tokenizer.vocab_size
    if config.get("init", {}).get("kind") == "hf":  # a pretrained checkpoint keeps its own (maybe padded) vocabulary
        vocab_size = max(int(config.model.vocab_size), vocab_size)
    model = build_model(config, vocab_size)
    process = build_process(config, vocab_size)
    objective = build_objective(config, model, process)
    if config.data.task == "sudoku" and sudoku_format(config) == "canvas":
        objective = SudokuCanvasObjective(objective)
    elif config.data.task == "sudoku" and sudoku_format(config) == "ar":
        objective = SudokuAutoregressiveObjective(model)
    return Experiment(
        config=config,
        model=model,
        process=process,
        objective=objective,
        tokenizer=data.tokenizer,
        data=data,
    )


def _json_object(text: str, key: str) -> dict[str, Any]:
    """The JSON object in `config.sampler.<key>` ('' = no arguments), or an error that says how to write one."""
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError as err:
        value = err
    if not isinstance(value, dict):
        raise ValueError(
            f"config.sampler.{key} must be a JSON object like '{{\"gamma\": 0.1}}', got {text!r}"
            + (f" ({value})." if isinstance(value, json.JSONDecodeError) else ".")
        )
    return value


def build_sampler(config: ml_collections.ConfigDict, process: NoiseProcess, **overrides: Any) -> DiffusionSampler:
    s = config.sampler
    sampler = DiffusionSampler(
        process=process,
        selection=make_selection(s.selection, **_json_object(s.selection_kwargs, "selection_kwargs")),
        temperature=AnnealedTemperature(s.min_temperature, s.max_temperature, s.temperature_exponent),
        early_stopping=make_early_stopping(s.early_stopping),
        num_steps=s.num_steps,
        canvas_length=s.canvas_len,
        null_signal=config.diffusion.null_signal,
        forbidden_tokens=(0, 2, 3),  # never generate PAD, BOS or MASK
        score_temperature=s.get("score_temperature", 0.0) or None,  # 0 = score the sampling distribution
        sc_temperature=s.get("sc_temperature", 0.0)
        or None,  # 0 = feed back the sampling distribution (docs/reference.md §1.6)
        constraint=make_constraint(str(s.get("constraint", "") or "")),
        views=make_views(str(s.get("views", "") or "")),
    )
    return sampler.replace(**overrides) if overrides else sampler


def sample_texts(
    exp: Experiment, params, prompts: list[str], *, seed: int = 0, max_new_tokens: int | None = None
) -> tuple[list[str], gen_lib.GenerationResult]:
    """Generates a continuation of each prompt with the experiment's sampler (diffusion) or AR decoding."""
    s = exp.config.sampler
    max_new = max_new_tokens or s.max_new_tokens
    ids = [[BOS_ID] + exp.tokenizer.encode(p) for p in prompts]
    trained = int(exp.config.data.get("seq_len") or 0)
    longest = max(len(row) for row in ids)
    if trained and longest + max_new > 2 * trained:
        print(
            f"warning: prompt ({longest} tokens) + {max_new} new tokens is far longer than the {trained}-token "
            "sequences the model was trained on; positions it never saw may degrade the output.",
            flush=True,
        )
    if exp.is_autoregressive:
        result = gen_lib.generate_ar(
            exp.model,
            params,
            ids,
            key=seed,
            max_new_tokens=max_new,
            sampling=gen_lib.ARSampling(temperature=s.ar_temperature),
            forbidden_tokens=(0, 2, 3),
        )
    else:
        sampler = build_sampler(exp.config, exp.process)
        max_new = int(math.ceil(max_new / sampler.canvas_length) * sampler.canvas_length)
        result = gen_lib.generate(
            exp.model, params, ids, sampler=sampler, key=seed, max_new_tokens=max_new, stop_tokens=(EOS_ID,)
        )
    texts = [exp.tokenizer.decode(np.asarray(row)) for row in result.tokens]
    return texts, result


def generative_perplexity(
    scorer: Experiment,
    params,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    batch_size: int = 16,
) -> dict[str, float]:
    """Generative perplexity: the NLL of generated `continuations` under an autoregressive `scorer` run, conditioned
    on their `prompts` (token ids of the scorer's tokenizer, BOS included in the prompt), counted on the
    continuation tokens only (up to and including the first EOS). Returns nats/bits per token, the perplexity and the
    unigram entropy of the continuations (a collapsed, repetitive sampler scores a low perplexity *and* a low
    entropy)."""
    if not scorer.is_autoregressive:
        raise ValueError("generative_perplexity needs an autoregressive scorer run (config.diffusion.process='none').")
    if len(prompts) != len(continuations) or not prompts:
        raise ValueError(f"need as many prompts as continuations (>= 1), got {len(prompts)} and {len(continuations)}.")
    rows, targets = [], []
    for prompt, cont in zip(prompts, continuations):
        cont = list(cont)
        if EOS_ID in cont:
            cont = cont[: cont.index(EOS_ID) + 1]
        rows.append(list(prompt) + cont)
        targets.append([False] * len(prompt) + [True] * len(cont))
    width = max(len(r) for r in rows)
    tokens = np.zeros((len(rows), width), np.int32)
    target = np.zeros((len(rows), width), bool)
    for i, (row, tgt) in enumerate(zip(rows, targets)):
        tokens[i, : len(row)], target[i, : len(row)] = row, tgt

    @jax.jit
    def score(p, tok, tgt):
        logits, _ = T.forward(scorer.model, p, tok, token_mask=tok != 0, causal=True)
        per_example, count = losses.autoregressive_cross_entropy(logits, tok, tgt)
        return per_example * count, count

    nats, count = 0.0, 0
    for start in range(0, len(rows), batch_size):
        tok, tgt = tokens[start : start + batch_size], target[start : start + batch_size]
        pad = batch_size - len(tok)
        if pad:  # one compiled shape: pad with empty rows (no targets)
            tok = np.concatenate([tok, np.zeros((pad, width), np.int32)])
            tgt = np.concatenate([tgt, np.zeros((pad, width), bool)])
        total, n = score(params, jnp.asarray(tok), jnp.asarray(tgt))
        nats += float(np.sum(total))
        count += int(np.sum(n))
    counts = np.bincount(tokens[target], minlength=scorer.tokenizer.vocab_size).astype(float)
    probs = counts[counts > 0] / counts.sum()
    per_token = nats / max(count, 1)
    return {
        "gen_nats_per_token": per_token,
        "gen_bits_per_token": per_token / math.log(2),
        "gen_ppl": float(math.exp(per_token)),
        "gen_tokens": count,
        "gen_unigram_entropy_bits": float(-(probs * np.log2(probs)).sum()),
    }


def flops_per_token(model: T.Transformer, seq_len: int) -> float:
    """Training FLOPs per token of one forward+backward pass (6 N + attention), N = active matmul parameters."""
    from hackable_diffusion.models.param_count import count_params

    cfg = model.cfg
    counts = count_params(cfg)
    # Matmul parameters per token: active minus the embedding lookup (the layers, run depth_loops times), plus the tied
    # head (V x D matmul).
    layers = counts["active_params_per_token"] - counts["embedding_params"]
    n = layers * cfg.depth_loops + cfg.vocab_size * cfg.embed_dim
    attn = 0
    for layer_type in cfg.layer_types():
        head_dim = cfg.global_attn_head_dim if layer_type == "global" else cfg.head_dim
        span = seq_len if layer_type == "global" else min(seq_len, 2 * cfg.sliding_window)
        attn += 2 * 2 * cfg.num_heads * head_dim * span  # QK^T and PV, forward
    return float(3 * (2 * n + attn * cfg.depth_loops))


def objective_passes(config: ml_collections.ConfigDict) -> float:
    """Forward passes over the sequence per training step: 1 (AR, one canvas), 2 (encoder + decoder), +1 with
    self-conditioning (its first pass runs without gradients, counted fully here)."""
    d = config.diffusion
    if d.objective == "ar" or d.process == "none":
        return 1.0
    passes = 1.0 if (d.objective == "pretrain" and not d.canvas_len) else 2.0
    if d.self_condition_prob > 0 and config.model.get("self_conditioning", False):
        passes += 1.0
    return passes


def evaluate_likelihood(
    exp: Experiment, params, *, num_batches: int | None = None, seed: int = 0, batch_size: int | None = None
) -> dict[str, float]:
    """Validation NLL (AR) or ELBO (diffusion) in bits per token, per character (Shakespeare) or perplexity per word
    (PTB), with the Monte-Carlo standard error over batches (diffusion)."""
    batch_size = batch_size or exp.config.eval.batch_size
    batches = text_lib.make_eval_batches(exp.data.eval_sequences, batch_size)
    if num_batches:
        batches = batches[:num_batches]
    key_name = "nll_bits_per_token" if exp.is_autoregressive else "elbo_bits_per_token"
    fn = jax.jit(exp.objective)
    bits, tokens = [], []
    for i, batch in enumerate(batches):
        _, metrics = fn(params, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.key(seed * 100003 + i))
        n = float(np.sum(batch["weights"] > 0))
        bits.append(float(metrics[key_name]) * n)
        tokens.append(n)
    bits, tokens = np.asarray(bits), np.asarray(tokens)
    per_token = bits.sum() / tokens.sum()
    per_batch = bits / tokens
    se = float(np.std(per_batch, ddof=1) / np.sqrt(len(per_batch))) if len(per_batch) > 1 else float("nan")
    out = {"bits_per_token": float(per_token), "bits_per_token_se": se, "eval_tokens": int(tokens.sum())}
    full = exp.data.eval_num_tokens
    covered = tokens.sum() / max(full, 1)
    if exp.data.eval_num_chars:
        out["bits_per_char"] = float(per_token * full / exp.data.eval_num_chars)
    if exp.data.eval_num_words:
        out["ppl_per_word"] = float(2 ** (per_token * full / exp.data.eval_num_words))
    out["fraction_of_split"] = float(covered)
    return out


def workdir_path(workdir: str) -> pathlib.Path:
    path = pathlib.Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def optimizer_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The optimizer section with `total_steps` resolved (0 means `train.num_steps`)."""
    cfg = config.optimizer.copy_and_resolve_references()
    if not cfg.total_steps:
        cfg.total_steps = config.train.num_steps
    return cfg


def load_params(exp: Experiment, workdir: str, *, use_ema: bool = True, step: int | None = None):
    """Parameters of the latest (or given) checkpoint in `workdir/checkpoints`, on the default device.

    Returns (params, step). The EMA parameters are used when the run kept them and `use_ema`.
    """
    from hackable_diffusion.training import checkpointing, optimizers
    from hackable_diffusion.training.train_state import TrainState

    config = exp.config
    if config.get("init", {}).get("kind") == "hf":  # a run made from a Hugging Face checkpoint: its weights
        from hackable_diffusion.models import hf_convert

        return hf_convert.load_hf(config.init.checkpoint, dtype=exp.model.cfg.param_dtype).params, 0
    optimizer = optimizers.make_optimizer(optimizer_config(config))
    with_ema = config.train.ema_decay > 0

    def create():
        params = T.init_params(exp.model, jax.random.key(0))
        return TrainState.create(params, optimizer, jax.random.key(0), use_ema=with_ema)

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), jax.eval_shape(create))
    ckpt = checkpointing.Checkpointer(str(pathlib.Path(workdir) / "checkpoints"), async_save=False)
    try:
        if step is None:
            restored = ckpt.restore_latest(abstract)
            if restored is None:
                raise FileNotFoundError(
                    f"No checkpoint in {workdir}/checkpoints: train first with python -m "
                    f"hackable_diffusion.train --config ... --workdir {workdir}."
                )
            state, step = restored
        else:
            state = ckpt.restore(step, abstract)
    finally:
        ckpt.close()
    params = state.ema_params if (use_ema and state.ema_params is not None) else state.params
    return params, int(step)


HF_PREFIX = "hf:"  # --workdir hf:DIR: a Hugging Face checkpoint directory used as a run


def hf_experiment_config(path: str) -> ml_collections.ConfigDict:
    """The toolbox config of a run made from a Hugging Face checkpoint: its model shape, and the sampler its
    generation_config.json describes (DiffusionGemma: uniform noise over the whole vocabulary as transformers draws it,
    entropy bound, linear temperature, stable-and-confident stopping, its canvas length); a Gemma-4 causal LM is an
    autoregressive run. Data: tiny Shakespeare through the checkpoint's own tokenizer."""
    import dataclasses as dc

    from hackable_diffusion import recipes
    from hackable_diffusion.models import hf_convert

    hf = hf_convert.read_config(path)
    cfg, info = hf_convert.config_from_hf(hf)
    model = dc.asdict(cfg)
    diffusion = info.model_type == hf_convert.DIFFUSION_GEMMA
    canvas = int(info.canvas_length or 256)
    config = recipes.text_config(
        "shakespeare", "uniform" if diffusion else "none", canvas_len=canvas, seq_len=canvas * 2
    )
    config.model = ml_collections.ConfigDict(model)
    config.data.tokenizer = "pretrained"
    config.diffusion.excluded_ids = ()  # transformers draws noise over every token id
    config.init = ml_collections.ConfigDict(dict(kind="hf", checkpoint=str(pathlib.Path(path).resolve())))
    generation_file = pathlib.Path(path) / hf_convert.GENERATION_CONFIG_FILE
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    s = config.sampler
    s.num_steps = int(generation.get("max_denoising_steps") or 48)
    bound = (generation.get("sampler_config") or {}).get("entropy_bound", 0.1)
    s.selection, s.selection_kwargs = "entropy_bound", json.dumps({"gamma": float(bound)})
    s.min_temperature = float(generation.get("t_min") or 0.4)
    s.max_temperature = float(generation.get("t_max") or 0.8)
    s.early_stopping = "transformers"
    s.canvas_len, s.max_new_tokens, s.prompt = canvas, canvas, ""
    return config


def hf_run_dir(path: str) -> pathlib.Path:
    """A run directory standing for a Hugging Face checkpoint (config.json + the checkpoint's tokenizer), kept under
    `$HACKABLE_DIFFUSION_CACHE/hf_runs/` so that the checkpoint directory itself is never written to. The weights
    stay in the checkpoint: `load_params` reads them from there."""
    import hashlib
    import os

    from hackable_diffusion import cli
    from hackable_diffusion.data.tokenizers import PretrainedTokenizer

    source = pathlib.Path(path).resolve()
    cache = pathlib.Path(
        os.environ.get("HACKABLE_DIFFUSION_CACHE", pathlib.Path.home() / ".cache" / "hackable_diffusion")
    )
    run = cache / "hf_runs" / (source.name + "-" + hashlib.sha256(str(source).encode()).hexdigest()[:12])
    if not (run / "tokenizer").is_dir():
        PretrainedTokenizer.from_directory(source).save(run / "tokenizer", metadata={"kind": "pretrained"})
    cli.save_config(hf_experiment_config(str(source)), run / "config.json")
    return run


def from_workdir(workdir: str) -> Experiment:
    """Rebuilds the experiment of a training run from its saved config and tokenizer."""
    from hackable_diffusion import cli

    return build(cli.load_saved_config(workdir), workdir)


# ----------------------------------------------------------------------------------------------------------------
# Sudoku: solving and held-out scores
# ----------------------------------------------------------------------------------------------------------------


def with_sampler_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]) -> ml_collections.ConfigDict:
    """A copy of `config` with `config.sampler.KEY = value` for each override; strings are cast to the key's type."""
    from hackable_diffusion import recipes

    config = config.copy_and_resolve_references()
    defaults = recipes.base_config().sampler  # keys added after a run was saved take their default
    for key, value in overrides.items():
        if key not in config.sampler:
            if key not in defaults:
                raise ValueError(f"Unknown sampler key {key!r}; valid keys: {sorted(config.sampler.keys())}.")
            config.sampler[key] = defaults[key]
        current = config.sampler[key]
        if isinstance(value, str) and not isinstance(current, str):
            try:
                value = type(current)(float(value)) if isinstance(current, (int, float)) else type(current)(value)
            except ValueError:
                raise ValueError(f"sampler.{key}={value!r} must be a {type(current).__name__}.") from None
        config.sampler[key] = value
    return config


@dataclasses.dataclass(frozen=True)
class SudokuSolution:
    """predictions: (n, 81) grids; steps: denoising steps (forward passes) each puzzle used; seconds: wall time of
    the solving calls after one compile/warm-up batch; batch_forward_passes: model calls over all batches;
    network_passes: each puzzle's passes summed over its parallel attempts (= steps with one attempt; with more, `steps`
    is the slowest attempt's, since the attempts run side by side)."""

    predictions: np.ndarray
    steps: np.ndarray
    seconds: float
    batch_forward_passes: int
    network_passes: np.ndarray


def _restart_overrides(config: ml_collections.ConfigDict, layout: str) -> dict[str, Any]:
    """Sampler overrides of a restart attempt: tokens at `restart_temperature`; for the diffusion layouts, the
    selection arguments updated with `restart_selection_kwargs` (e.g. Gumbel noise on the ranking scores, so that the
    attempt decides cells in another order)."""
    s = config.sampler
    temperature = float(s.get("restart_temperature", 1.0))
    if layout == "ar":
        return {"ar_temperature": temperature}
    kwargs = _json_object(s.selection_kwargs, "selection_kwargs")
    kwargs.update(_json_object(str(s.get("restart_selection_kwargs", "") or ""), "restart_selection_kwargs"))
    return {"min_temperature": temperature, "max_temperature": temperature, "selection_kwargs": json.dumps(kwargs)}


def solve_sudoku(
    exp: Experiment,
    params,
    puzzles: Int[np.ndarray, "n 81"],
    *,
    seed: int = 0,
    batch_size: int = 256,
    sampler_overrides: dict[str, Any] | None = None,
) -> SudokuSolution:
    """Fills the blanks of `puzzles` (0 = blank) with the experiment's sampler, givens fixed, over an empty cache.

    Row i's randomness is fold_in(key(seed), i), so a puzzle's answer does not depend on the batch it is in. The
    last batch is padded with inactive rows so that every batch has one compiled shape.

    `sampler.repair_rounds` = R > 0 (in place and canvas layouts): after the decode, every non-given cell that repeats
    a digit in its row, column or box is blanked and the blanks are decoded again with the other cells held, for up
    to R rounds; a complete grid without a conflict that keeps a unique puzzle's givens is its solution, so this
    spends more passes only where the answer is certainly wrong. `steps` counts every round's passes.

    `sampler.restarts` = K > 0 (any layout; more compute at inference, verifier-guided): a row whose grid still breaks
    a rule after its repairs is solved again from the puzzle, with fresh randomness and tokens drawn at
    `sampler.restart_temperature` (at the first attempt's temperature the model would mostly repeat itself) and the
    selection arguments merged with `sampler.restart_selection_kwargs` (e.g. Gumbel noise on the ranking), up to K
    times; the first rule-abiding attempt is kept, otherwise the attempt with the fewest conflicting cells. Rows
    that abide by the rules are never touched, and every attempt's passes count.

    `sampler.parallel_attempts` = K > 1 (more compute at inference, verifier-guided, in width instead of depth): each
    puzzle is also solved as K - 1 symmetric copies of itself (bands, stacks, rows and columns inside them permuted,
    transposed, digits relabelled: `views.sudoku_views(K, seed=ATTEMPT_SYMMETRY_SEED)`, copy 0 the puzzle itself),
    all in the same batches; each copy's grid is mapped back, and the first that is complete, keeps the givens and
    breaks no rule is kept (for a unique puzzle that is its solution), otherwise the one with the fewest blank,
    conflicting and given-breaking cells. A puzzle's `steps` is its slowest copy's passes (they run in lockstep);
    `network_passes` adds all K. Every other option applies to each copy, restarts and pass budget included.

    `sampler.pass_budget` = B > 0 caps the forward passes of every puzzle at B, restarts included: a row is restarted
    only while its passes so far plus an attempt's most (`num_steps` x (1 + repair_rounds), each decode of the canvas
    layout one more for its prefill; the AR layout 81 + 1) fit in B. With selection that decides sure cells early
    (`selection_kwargs={"also_above": ...}`) most rows finish their first attempt in a few passes, which leaves room
    for another attempt inside the same budget.
    """
    import time

    if not isinstance(exp.tokenizer, SudokuVocab):
        raise ValueError("solve_sudoku needs a Sudoku experiment (config.data.task='sudoku').")
    puzzles = np.asarray(puzzles)
    if puzzles.ndim != 2 or puzzles.shape[1] != 81 or len(puzzles) == 0:
        raise ValueError(f"puzzles must be a non-empty (n, 81) array, got shape {puzzles.shape}.")
    layout = sudoku_format(exp.config)
    config = with_sampler_overrides(exp.config, sampler_overrides or {})
    attempts = int(config.sampler.get("parallel_attempts", 1))
    if attempts < 1:
        raise ValueError(f"sampler.parallel_attempts={attempts} must be >= 1 (1: one attempt per puzzle).")
    if attempts > 1:
        return _solve_in_parallel_attempts(
            exp, params, puzzles, attempts, seed=seed, batch_size=batch_size, sampler_overrides=sampler_overrides
        )
    rounds = int(config.sampler.get("repair_rounds", 0))
    scope = str(config.sampler.get("repair_scope", "cells"))
    if scope not in ("cells", "units"):
        raise ValueError(
            f"sampler.repair_scope={scope!r} must be 'cells' (the repeated digits) or 'units' (their rows, "
            "columns and boxes)."
        )
    if layout == "ar" and str(config.sampler.get("constraint", "") or ""):
        raise ValueError("sampler.constraint acts on a diffusion step's logits; the AR layout has no such sampler.")
    if layout != "in_place" and str(config.sampler.get("views", "") or ""):
        raise ValueError(
            f"sampler.views relabels the canvas but not a prompt; it needs the in-place layout, not {layout!r}."
        )
    if rounds and layout == "ar":
        raise ValueError("sampler.repair_rounds re-decodes cells in place; the AR layout has no such sampler.")
    restarts = int(config.sampler.get("restarts", 0))
    restart_temperature = float(config.sampler.get("restart_temperature", 1.0))
    if restarts < 0 or rounds < 0:
        raise ValueError(f"sampler.restarts={restarts} and sampler.repair_rounds={rounds} must be >= 0.")
    if restarts and restart_temperature <= 0:
        raise ValueError(
            f"sampler.restart_temperature={restart_temperature} must be > 0: a restart needs fresh randomness."
        )
    # the most passes one attempt can take: AR prefill + 81 cells; in place num_steps per decode; canvas + 1 prefill
    per_decode = int(config.sampler.num_steps) + (1 if layout == "canvas" else 0)
    attempt_passes = 82 if layout == "ar" else per_decode * (1 + rounds)
    pass_budget = int(config.sampler.get("pass_budget", 0))
    if pass_budget < 0 or (pass_budget and pass_budget < attempt_passes):
        raise ValueError(
            f"sampler.pass_budget={pass_budget} must be 0 (no cap) or at least one attempt's passes ({attempt_passes}"
            " with num_steps, repair_rounds and the layout's prefill); lower sampler.num_steps or raise the budget."
        )
    vocab = exp.tokenizer
    n = len(puzzles)
    b = max(1, min(int(batch_size), n))

    def make_decoder(cfg):
        if layout == "ar":
            return gen_lib.ARSampling(temperature=float(cfg.sampler.ar_temperature))
        return build_sampler(cfg, exp.process, canvas_length=81, forbidden_tokens=SUDOKU_FORBIDDEN)

    first_decoder = make_decoder(config)
    restart_decoder = (
        make_decoder(with_sampler_overrides(config, _restart_overrides(config, layout))) if restarts else None
    )
    empty_cache = init_cache(exp.model.cfg, b, 1)  # in place: no prefix, every slot invalid

    def run(chunk: np.ndarray, keys: jax.Array, decoder):
        """Solves up to b puzzles (0 = blank): (grids, steps per row, forward passes of the batch)."""
        real = len(chunk)
        padded = np.concatenate([chunk, np.repeat(chunk[-1:], b - real, axis=0)]) if real < b else chunk
        keys = jnp.concatenate([keys, jnp.repeat(keys[-1:], b - real, axis=0)]) if real < b else keys
        fixed = jnp.asarray(padded != 0)
        tokens = jnp.asarray(vocab.encode(padded))  # givens as digits, blanks as MASK: the prompt, too
        active = jnp.asarray(np.arange(b) < real)
        if layout == "ar":  # prefill the puzzle, then 81 cached decode steps
            out = gen_lib.generate_ar(
                exp.model,
                params,
                tokens,
                key=keys,
                max_new_tokens=81,
                sampling=decoder,
                stop_tokens=(),
                forbidden_tokens=SUDOKU_FORBIDDEN,
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
                fixed=fixed if config.sampler.get("fix_givens", True) else None,
                fixed_tokens=tokens,
            )
            grids, used, forward_passes = out.tokens, out.steps[:, 0] + 1, out.forward_passes  # + 1: the prefill
        else:
            canvas = decoder.initial_canvas(keys, b, fixed=fixed, fixed_tokens=tokens)
            result = denoise_canvas(
                exp.model, params, empty_cache, canvas, keys, sampler=decoder, fixed=fixed, active=active
            )
            grids, used, forward_passes = result.canvas, result.steps, result.forward_passes
        return vocab.decode(np.asarray(grids)[:real]), np.asarray(used)[:real], int(forward_passes)

    def solve_all(grids: np.ndarray, keys: jax.Array, decoder):
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
        preds, steps, passes = solve_all(given, row_keys(base_key, n)[rows], decoder)
        for round_index in range(rounds):
            # Repair: blank every non-given cell that repeats a digit in its row, column or box and re-decode those
            # cells with the rest held; rows without a conflict are final.
            bad = sudoku_lib.conflicting_cells(preds, whole_units=scope == "units") & (given == 0)
            todo = np.flatnonzero(bad.any(axis=-1))
            if not len(todo):
                break
            round_keys = row_keys(jax.random.fold_in(base_key, round_index + 1), n)[rows[todo]]
            fixed_preds, fixed_steps, round_passes = solve_all(np.where(bad[todo], 0, preds[todo]), round_keys, decoder)
            preds[todo], steps[todo] = fixed_preds, steps[todo] + fixed_steps
            passes += round_passes
        return preds, steps, passes

    warm_up_keys = row_keys(jax.random.key(seed), n)[:b]
    for decoder in (first_decoder, restart_decoder):  # compile (and warm up) outside the timed loop
        if decoder is not None:
            run(puzzles[:b], warm_up_keys, decoder)
    start_time = time.perf_counter()
    preds, steps, passes = attempt(np.arange(n), jax.random.key(seed), first_decoder)
    conflicts = sudoku_lib.conflicting_cells(preds).sum(axis=-1)
    for restart_index in range(restarts):
        # Restart (verifier-guided): a grid that breaks a rule is certainly wrong; solve its puzzle again afresh.
        fits = steps + attempt_passes <= pass_budget if pass_budget else True
        todo = np.flatnonzero((conflicts > 0) & fits)
        if not len(todo):
            break
        base_key = jax.random.fold_in(jax.random.key(seed), 10_000 + restart_index)
        new_preds, new_steps, restart_passes = attempt(todo, base_key, restart_decoder)
        new_conflicts = sudoku_lib.conflicting_cells(new_preds).sum(axis=-1)
        better = new_conflicts < conflicts[todo]
        preds[todo[better]], conflicts[todo[better]] = new_preds[better], new_conflicts[better]
        steps[todo] += new_steps
        passes += restart_passes
    seconds = time.perf_counter() - start_time
    return SudokuSolution(preds, steps, seconds, passes, network_passes=steps)


ATTEMPT_SYMMETRY_SEED = 1  # the symmetries of parallel attempts (symmetry views inside a step use seed 0)


def sudoku_grid_symmetries(count: int, seed: int = ATTEMPT_SYMMETRY_SEED):
    """`count` elements of the Sudoku symmetry group acting on grids of digits (0 = blank stays blank), the first the
    identity: `views.sudoku_views` with the digits 1..9 as the relabelled ids."""
    return sudoku_views(count, seed, first_digit_id=1, vocab_size=10)


def _solve_in_parallel_attempts(
    exp: Experiment,
    params,
    puzzles: Int[np.ndarray, "n 81"],
    attempts: int,
    *,
    seed: int,
    batch_size: int,
    sampler_overrides: dict[str, Any] | None,
) -> SudokuSolution:
    """`sampler.parallel_attempts` (see `solve_sudoku`): K symmetric copies of every puzzle, solved side by side."""
    n = len(puzzles)
    group = sudoku_grid_symmetries(attempts)
    copies = np.asarray(group.to_views(jnp.asarray(puzzles))).astype(puzzles.dtype)  # copy k of puzzle i: row k*n + i
    inner = solve_sudoku(
        exp,
        params,
        copies,
        seed=seed,
        batch_size=batch_size,
        sampler_overrides={**(sampler_overrides or {}), "parallel_attempts": 1},
    )
    grids = unrelabel_grids(group, inner.predictions.reshape(attempts, n, 81))
    broken = (
        sudoku_lib.conflicting_cells(grids).sum(axis=-1)
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


def evaluate_sudoku(
    exp: Experiment,
    params,
    puzzles: Int[np.ndarray, "n 81"],
    solutions: Int[np.ndarray, "n 81"],
    *,
    levels: np.ndarray | None = None,
    seed: int = 0,
    batch_size: int = 256,
    sampler_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """DiffusionGemma's Sudoku metrics (`evals.sudoku_metrics`, split by givens, by `levels` when given, and by
    whether the exact solver needed a guess: `_solver_singles` / `_solver_search`) plus forward passes per puzzle
    and puzzles per second."""
    from hackable_diffusion.evals.sudoku_metrics import sudoku_metrics

    solution = solve_sudoku(exp, params, puzzles, seed=seed, batch_size=batch_size, sampler_overrides=sampler_overrides)
    metrics = sudoku_metrics(solution.predictions, puzzles, solutions, categories=levels, category_name="level")
    out: dict[str, Any] = dict(metrics)
    by_solver = sudoku_metrics(
        solution.predictions, puzzles, solutions, categories=sudoku_lib.solver_class(puzzles), category_name="solver"
    )
    out.update({k: v for k, v in by_solver.items() if "_solver_" in k})  # "singles" / "search": see solver_class
    out["forward_passes_per_puzzle"] = float(solution.steps.mean())
    out["max_forward_passes_per_puzzle"] = int(solution.steps.max())
    out["batch_forward_passes"] = solution.batch_forward_passes
    views = make_views(str(with_sampler_overrides(exp.config, sampler_overrides or {}).sampler.get("views", "") or ""))
    # network evaluations: a pass with K symmetry views runs the model on K copies of the grid (views.py)
    out["network_evaluations_per_puzzle"] = float(solution.network_passes.mean()) * (views.num_views if views else 1)
    out["puzzles_per_second"] = float(len(puzzles) / max(solution.seconds, 1e-9))
    out["solve_seconds"] = solution.seconds
    out["givens_kept"] = bool(sudoku_lib.respects_givens(solution.predictions, puzzles).all())
    return out


def evaluate_sudoku_elbo(
    exp: Experiment, params, *, num_batches: int | None = None, seed: int = 0, batch_size: int | None = None
) -> dict[str, float]:
    """The held-out loss bound in bits per blank cell: the masking ELBO over the blanks (in place); the canvas ELBO
    (canvas) or the exact NLL (AR) of all 81 solution cells, divided by the number of blanks."""
    batch_size = batch_size or exp.config.eval.batch_size
    layout = sudoku_format(exp.config)
    key = "nll_bits_per_token" if layout == "ar" else "elbo_bits_per_token"
    tokens = exp.tokenizer.encode(exp.data.eval_solutions)
    fixed = exp.data.eval_puzzles != 0
    fn = jax.jit(exp.objective)
    bits, count = 0.0, 0
    starts = list(range(0, len(tokens) - batch_size + 1, batch_size)) or [0]
    for i, start in enumerate(starts[:num_batches] if num_batches else starts):
        rows = slice(start, start + batch_size)
        batch = {"tokens": jnp.asarray(tokens[rows]), "fixed": jnp.asarray(fixed[rows])}
        _, metrics = fn(params, batch, jax.random.key(seed * 100003 + i))
        blanks = int((~fixed[start : start + batch_size]).sum())
        counted = blanks if layout == "in_place" else fixed[start : start + batch_size].size
        bits += float(metrics[key]) * counted
        count += blanks
    return {"elbo_bits_per_blank": bits / max(count, 1), "eval_blanks": count}
