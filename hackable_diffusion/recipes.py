"""Config builders shared by the files in `configs/` (md4 / big_vision style `ml_collections` configs).

A config file composes these: the weights it starts from (`init_section`, random init by default), a model shape
from `models.presets`, a data section, a diffusion section (process, schedule, time sampler, objective, loss), the
optimizer, the training loop, the mesh, evaluation and the sampler used for evaluation samples. Every field is a
plain value so that any of them can be overridden on the command line (`--config.diffusion.process=masking`,
`--config.sampler.selection.gamma=0.05`); `hackable_diffusion.builders` turns the values into objects. A task adds
its own sections (Sudoku: `config.solver`, `tasks/sudoku/recipes.py`).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import ml_collections
from ml_collections import config_dict

from hackable_diffusion.builders import PROCESSES, objective_passes
from hackable_diffusion.diffusion import schedules
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import presets

SELECTION_ARGUMENTS = {  # every argument a selection rule takes (None: the rule's own default)
    "gamma": float,  # entropy_bound: the entropy budget per step
    "min_count": str,  # entropy_bound: a count rule giving a floor ("even", "cosine", ...)
    "count": str,  # top-k rules: "schedule" | "cosine" | "even" | "power"
    "count_exponent": float,  # count="power": the exponent
    "gumbel_scale": float,  # top-k rules: Gumbel noise on the ranking scores
    "also_above": float,  # top-k rules: also decide every position whose score is above this (sure cells)
    "tau": float,  # threshold: the confidence threshold
    "eta": float,  # remdm_cap / remdm_rescale: the remasking rate
}


EARLY_STOPPING_ARGUMENTS = {  # every argument an early-stopping rule takes (None: the rule's own default)
    "threshold": float,  # entropy, diffusiongemma, transformers: the mean-entropy bound
    "strict": bool,  # entropy: entropy < threshold instead of <=
    "against": str,  # token_stability: "input" | "output" | "previous_argmax"
}
DRAW_ARGUMENTS = {"block": int}  # blocked_inverse_cdf: ids per block
# Parameters a run may add to the weights it starts from (`init.allow_new`, comma-separated globs, `*` crossing "/"):
# the self-conditioner, which DiffusionGemma's recipe adds to a model trained without one (Gemma-4, an AR run).
ALLOW_NEW = "self_conditioner/*"


def rule_section(
    kind: str, rule: str, arguments: dict[str, type], args: dict[str, Any], name_key: str = "rule"
) -> ml_collections.ConfigDict:
    """A config section naming a rule (at `name_key`) with every argument it may take as a typed placeholder, so that
    `--config.sampler.<kind>.<argument>=value` parses on the command line; `builders` turns it into the object."""
    unknown = sorted(set(args) - set(arguments))
    if unknown:
        raise ValueError(f"unknown {kind} arguments {unknown}; valid: {sorted(arguments)}.")
    section = {name: config_dict.placeholder(type_) for name, type_ in arguments.items()}
    section[name_key] = rule
    out = ml_collections.ConfigDict(section)
    for name, value in args.items():
        out[name] = value
    return out


def selection(rule: str, **args: Any) -> ml_collections.ConfigDict:
    """`config.sampler.selection`: a rule of `sampling.selection.SELECTION_RULES` and its arguments."""
    return rule_section("selection", rule, SELECTION_ARGUMENTS, args)


def early_stopping(rule: str, **args: Any) -> ml_collections.ConfigDict:
    """`config.sampler.early_stopping`: a rule of `sampling.early_stopping.EARLY_STOPPING` and its arguments."""
    return rule_section("early_stopping", rule, EARLY_STOPPING_ARGUMENTS, args)


def draw(rule: str, **args: Any) -> ml_collections.ConfigDict:
    """`config.sampler.draw`: a draw of `sampling.draws.DRAWS` and its arguments."""
    return rule_section("draw", rule, DRAW_ARGUMENTS, args)


def schedule_section(
    name: str = schedules.DEFAULT_SCHEDULE_SECTION["name"], **fields: Any
) -> ml_collections.ConfigDict:
    """`config.diffusion.schedule`: a schedule of `diffusion.schedules.SCHEDULES` (`name`) and every field any schedule
    takes (`schedules.schedule_arguments`), None meaning that class's default; `schedules.schedule_from_config` builds
    it and refuses a field the named class does not take. The keys come from the schedule classes themselves, so a
    schedule added in `diffusion/schedules.py` is settable here with nothing to edit."""
    return rule_section("schedule", name, schedules.schedule_arguments(), fields, name_key="name")


def init_section(kind: str = "scratch", checkpoint: str = "") -> ml_collections.ConfigDict:
    """`config.init`: the weights a run starts from, one section for `train`, `sft` and `rl`
    (`checkpoints.base_weights`; `--init_from KIND:PATH` sets kind and checkpoint). `train` keeps its own model shape
    and recipe and loads the source strictly (every parameter loaded or allowed new); `sft` and `rl` take the source's
    shape (and `inherit_diffusion`: its diffusion recipe)."""
    return ml_collections.ConfigDict(
        dict(
            kind=kind,  # "scratch" | "toolbox" | "params" | "gemma" | "hf"
            checkpoint=checkpoint,  # toolbox workdir (or checkpoints/) | params dir | gemma orbax dir | HF directory
            weights="ema",  # toolbox: "ema" takes the EMA weights when the run kept them, "raw" the trained ones
            step=0,  # toolbox: the checkpoint step to start from (0: the latest complete one)
            allow_new=ALLOW_NEW,  # globs on parameter paths that may start from random init (not in the source)
            inherit_diffusion=True,  # sft: take the noise process and loss recipe of the source run
            tokenizer_dir="",  # gemma/scratch: a saved tokenizer; "" = char tokenizer fitted on the corpus
            ignore_unexpected=False,  # gemma/hf: skip checkpoint tensors the model has no place for (e.g. other towers)
            decoder_window="",  # hf: "" = the convention config.json records, else "per_token"; "cache_tail" = transformers'
            dtype="",  # hf: parameter dtype ("" = the checkpoint's, e.g. bfloat16)
        )
    )


def adaptation_section(
    *,
    canvas_sizes: tuple[int, ...] = (),
    canvas_boundaries: tuple[int, ...] = (),
    mask_anneal_steps: tuple[int, ...] = (),
    ar_loss_weights: tuple[float, ...] = (),
    ar_loss_steps: tuple[int, ...] = (),
) -> ml_collections.ConfigDict:
    """`config.adaptation`: schedules over the training step for a diffusion run that starts from an autoregressive
    one (`diffusion.adaptation`, docs/training.md "Adapting an AR model"); () turns a schedule off. Configs without
    the section (every config but the `*_from_ar` ones, and runs saved before it existed) train without schedules."""
    return ml_collections.ConfigDict(
        dict(
            canvas_sizes=tuple(canvas_sizes),  # CanvasCurriculum (LLaDA 2.0): sizes, the last = diffusion.canvas_len
            canvas_boundaries=tuple(canvas_boundaries),  # the step at which each next size starts
            mask_anneal_steps=tuple(mask_anneal_steps),  # MaskAnnealing (DiffuLLaMA): (begin, end) steps
            ar_loss_weights=tuple(ar_loss_weights),  # ArLossDecay: (start, end) weight of the encoder AR loss
            ar_loss_steps=tuple(ar_loss_steps),  # ArLossDecay: (begin, end) steps
        )
    )


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.init = init_section()  # scratch: random init; a run can start from weights (docs/training.md)
    c.model = ml_collections.ConfigDict(presets.tiny())
    c.data = ml_collections.ConfigDict(
        dict(
            task="text",  # a task of hackable_diffusion.tasks: "text" (packed corpus) | "sudoku"
            corpus="shakespeare",  # "shakespeare" | "ptb"
            tokenizer="char",  # "char" | "spm"
            vocab_size=0,  # spm only (0 = char tokenizer decides)
            seq_len=128,
            batch_size=16,  # per process
            data_dir="",  # "" = the files shipped with the package, then $HD_DATA_DIR (data.text.data_file)
            train_fraction=1.0,  # text: train on this leading share of the training split (data-constrained studies)
        )
    )
    c.diffusion = ml_collections.ConfigDict(
        dict(
            process="uniform",
            schedule=schedule_section(**schedules.DEFAULT_SCHEDULE_SECTION),  # name + that class's fields
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
            token_shift=False,  # True: position i predicted from the logits at i - 1 (diffusion/token_shift.py)
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
            selection=selection("entropy_bound"),  # the rule and its arguments (sampling.selection)
            early_stopping=early_stopping("diffusiongemma"),  # the rule and its arguments (sampling.early_stopping)
            min_temperature=0.4,
            max_temperature=0.8,
            temperature_exponent=1.0,
            score_temperature=0.0,  # 0: selection scores the sampling distribution; > 0: logits / this (1 = model's)
            sc_temperature=0.0,  # self-conditioned models: 0 feeds back the sampling distribution (DiffusionGemma); > 0
            # feeds back logits / this (1 = the model's own probabilities, as training feeds back the raw logits)
            draw=draw("gumbel_max"),  # how candidates are drawn (sampling.draws): gumbel_max (the reference's) or
            # blocked_inverse_cdf (the same distribution, cheaper, other tokens for the same seed; its `block`)
            vocab_chunk=0,  # 0: the canvas step works on whole-vocabulary arrays; N > 0: it scans the vocabulary in
            # chunks of N ids, holding no [batch, canvas, vocab] float32 array but the logits (sampling.vocab_chunks)
            commit=False,  # uniform process: True keeps accepted tokens and re-noises only undecided positions
            num_steps=32,
            canvas_len=32,
            max_new_tokens=128,
            prompt="ROMEO:",
            ar_temperature=0.8,
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
        raise ValueError(f"process={process!r} is not one of {tuple(PROCESSES)}.")
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


def quickstart_config(process: str = "masking") -> ml_collections.ConfigDict:
    """The quickstart (configs/quickstart.py: block masking diffusion, configs/quickstart_ar.py: its AR twin): the
    1.37M-parameter `presets.quickstart` MoE on tiny Shakespeare, 300 steps of 16 x 128 tokens, canvases of 32."""
    c = text_config(
        "shakespeare", process, model=presets.quickstart(), steps=300, seq_len=128, batch_size=16, canvas_len=32
    )
    c.optimizer.peak_lr = 3e-3
    c.optimizer.warmup_steps = 30
    c.train.log_every = 25
    c.train.eval_every = 150
    c.train.checkpoint_every = 100
    c.eval.num_batches = 4
    c.sampler.num_steps = 32
    c.sampler.max_new_tokens = 128
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


def adaptation_experiment(corpus: str, process: str, *, fraction: float = 0.25) -> ml_collections.ConfigDict:
    """A `text_experiment` diffusion run started from the matching autoregressive run (`runs/{corpus}_ar`, trained by
    configs/{corpus}_ar.py) with the schedules of `from_ar_run` on, its training FLOPs `fraction` of the AR run's.
    Masking runs also use the token shift, which gained 0.39-0.41 bits/char of ELBO in the quickstart-size ablation
    (results/text/README.md); the uniform recipe's self-conditioning does not take it."""
    c = text_experiment(corpus, process, moe=False)
    shift = process == "masking"
    return from_ar_run(c, f"runs/{corpus}_ar", int(c.train.num_steps), compute_fraction=fraction, token_shift=shift)


def adaptation_steps(config: ml_collections.ConfigDict, ar_steps: int, compute_fraction: float) -> int:
    """Steps of `config` (same batch and sequence as the AR run) whose training FLOPs are `compute_fraction` of
    `ar_steps` AR steps: a diffusion step runs `builders.objective_passes` passes over the sequence (block masking:
    2, the encoder and the decoder), an AR step one."""
    return max(8, int(round(ar_steps * compute_fraction / objective_passes(config))))


def from_ar_run(
    c: ml_collections.ConfigDict,
    ar_run: str,
    ar_steps: int,
    *,
    compute_fraction: float = 0.25,
    schedules: bool = True,
    token_shift: bool = False,
) -> ml_collections.ConfigDict:
    """Turns a from-scratch block-diffusion config into one adapted from its AR twin `ar_run` (same backbone, batch
    and sequence, `ar_steps` steps): AR + adaptation cost (1 + compute_fraction) AR runs in training FLOPs
    (`adaptation_steps`), with a shorter warm-up and a lower learning rate.

    schedules: the `adaptation_section` schedules (docs/training.md "Adapting an AR model"). Over the first quarter
    the decoder's attention anneals from causal to block-bidirectional (DiffuLLaMA) while the canvas grows 4 -> 16
    (LLaDA 2.0's warm-up); the whole sequence is one canvas (MDLM) until 5/8 of the run (stable), then the canvas
    decays to the target (decay); the encoder's AR loss decays over the first 3/4 (masking: 1 -> 0; uniform, whose
    DiffusionGemma recipe keeps an AR loss of weight 1: 2 -> 1). False: the plain objective from the AR weights.
    token_shift: `diffusion.token_shift` (Fast-dLLM v2; diffusion/token_shift.py)."""
    steps = adaptation_steps(c, ar_steps, compute_fraction)
    c.init = init_section("toolbox", ar_run)
    c.train.num_steps = steps
    c.train.eval_every = c.train.checkpoint_every = max(1, steps // 2)
    c.optimizer.peak_lr, c.optimizer.end_lr, c.optimizer.warmup_steps = 1e-3, 1e-4, max(1, steps // 10)
    c.diffusion.token_shift = bool(token_shift)
    if not schedules:
        return c
    q = max(1, steps // 8)
    target, seq_len = int(c.diffusion.canvas_len), int(c.data.seq_len)
    weights = (2.0, 1.0) if c.diffusion.encoder_ar_weight else (1.0, 0.0)
    c.diffusion.encoder_ar_weight = 0.0  # the AR-loss schedule replaces it
    c.adaptation = adaptation_section(
        canvas_sizes=(4, 16, seq_len, target),
        canvas_boundaries=(q, 2 * q, 5 * q),
        mask_anneal_steps=(0, 2 * q),
        ar_loss_weights=weights,
        ar_loss_steps=(0, 6 * q),
    )
    return c


def upgrade_saved_diffusion(config: ml_collections.ConfigDict) -> None:
    """Brings the diffusion section of a saved config to the current keys (in place): a schedule saved as a bare name
    with `diffusion.schedule_eps` (before its fields were settable) becomes the section `{name, eps}`, which builds
    the same schedule; a saved section gets its typed placeholders back (JSON keeps None, not the type), so that
    `--config.diffusion.schedule.<field>=value` parses on the saved config too."""
    d = config.diffusion
    saved = d.get("schedule", schedules.DEFAULT_SCHEDULE_SECTION["name"])
    if isinstance(saved, str):
        fields = {"name": saved}
        if d.get("schedule_eps") is not None:
            fields["eps"] = float(d.schedule_eps)
    else:
        fields = {key: value for key, value in saved.items() if value is not None}
    with d.unlocked():
        for key in ("schedule", "schedule_eps"):
            if key in d:
                del d[key]
        d.schedule = schedule_section(**fields)


def upgrade_saved_sampler(config: ml_collections.ConfigDict) -> None:
    """Brings the sampler section of a saved config to the current keys (in place): a selection saved as a name with
    its arguments as JSON (`selection="top_k_margin"`, `selection_kwargs='{"count": "power:2"}'`) becomes the
    structured section; keys this version does not have are dropped (a task moves its own first); keys added since
    take their defaults, which reproduce how samplers behaved before the key existed."""
    saved = config.sampler.to_dict()
    rule = saved.pop("selection", None)
    args = saved.pop("selection_kwargs", None)
    if isinstance(rule, str):
        parsed = json.loads(args) if args else {}
        if isinstance(parsed.get("count"), str) and ":" in parsed["count"]:
            name, exponent = parsed["count"].split(":", 1)
            parsed["count"], parsed["count_exponent"] = name, float(exponent)
        section = selection(rule, **parsed)
    else:
        section = selection(rule["rule"], **{k: v for k, v in rule.items() if k != "rule" and v is not None})
    sections = {  # rules saved as a bare name (before their arguments were settable) become sections
        "early_stopping": (early_stopping, saved.pop("early_stopping", "diffusiongemma")),
        "draw": (draw, saved.pop("draw", "gumbel_max")),
    }
    current = base_config().sampler
    with config.unlocked():
        config.sampler = ml_collections.ConfigDict(
            {**current.to_dict(), **{k: v for k, v in saved.items() if k in current}}
        )
        config.sampler.selection = section
        for key, (make, value) in sections.items():
            rule, args = (value, {}) if isinstance(value, str) else (value["rule"], value)
            config.sampler[key] = make(rule, **{k: v for k, v in args.items() if k != "rule" and v is not None})


def from_weights(config: ml_collections.ConfigDict, checkpoint: str, lora_rank: int) -> ml_collections.ConfigDict:
    """A copy of `config` that starts from a toolbox run (`init`), full or LoRA (`lora`, rank 0: full). A deep copy,
    so the sampler's typed placeholders (e.g. `selection.min_count`) stay settable on the command line."""
    c = copy.deepcopy(config)
    c.init = init_section("toolbox", checkpoint)
    c.lora = ml_collections.ConfigDict(
        dict(rank=lora_rank, alpha=float(max(2 * lora_rank, 1)), targets=lora_lib.DEFAULT_TARGETS,
             include_experts=False, freeze_router=False)
    )  # fmt: skip
    return c


def constant_lr_schedule(
    c: ml_collections.ConfigDict, peak_lr: float, steps: int, *, warmup: int, **train: int
) -> ml_collections.ConfigDict:
    """A constant learning rate after a short warm-up, no weight decay, no EMA, `steps` steps; `train` sets the
    logging, evaluation and checkpoint intervals."""
    c.optimizer.update(dict(peak_lr=peak_lr, end_lr=peak_lr, warmup_steps=min(warmup, steps), total_steps=0))
    c.optimizer.weight_decay = 0.0
    c.train.update(dict(num_steps=steps, ema_decay=0.0, **train))
    return c


SAMPLER_REPORT_KEYS = (  # the diffusion sampler settings printed with every result
    "num_steps",
    "min_temperature",
    "max_temperature",
    "score_temperature",
    "sc_temperature",
    "early_stopping",
    "draw",
    "vocab_chunk",
    "commit",
)


def sampler_report(config: ml_collections.ConfigDict) -> dict:
    """The sampler settings of a result: the selection rule with the arguments that are set, and the main knobs."""
    def plain(value):  # a rule section: its rule and the arguments that are set
        is_section = isinstance(value, ml_collections.ConfigDict)
        return {k: v for k, v in value.items() if v is not None} if is_section else value

    knobs = {k: plain(config.sampler.get(k)) for k in SAMPLER_REPORT_KEYS}
    return {"selection": plain(config.sampler.selection), **knobs}
