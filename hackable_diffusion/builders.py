"""Config values -> objects: the model, the noise process, the loss, the objective, the sampler, the optimizer section.

A config holds plain values so that every one can be overridden on the command line (`--config.diffusion.loss=elbo`);
each function here is the one factory that turns a section into frozen dataclasses (`diffusion.schedules`,
`diffusion.training_losses`, `diffusion.objectives`, `sampling.selection`, `sampling.canvas.DiffusionSampler`), so a
notebook can build the same pieces by hand and swap any of them. Where a config names a class (a schedule, a time
sampler, a loss, a selection rule, an early-stopping rule) there is one lookup with an error listing the choices.
Tasks (`tasks/`) add their own pieces: a constraint and views for the sampler, a wrapper around the objective.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from hackable_diffusion.data.tokenizers import MASK_ID, NEVER_GENERATED
from hackable_diffusion.diffusion import adaptation as adaptation_lib
from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.diffusion.processes import MaskingProcess, NoiseProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import make_time_sampler, schedule_from_config
from hackable_diffusion.diffusion.training_losses import DiffusionLoss, make_diffusion_loss
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling.canvas import DiffusionSampler
from hackable_diffusion.sampling.constraints import LogitConstraint
from hackable_diffusion.sampling.draws import BlockedInverseCdf, GumbelMax, make_draw
from hackable_diffusion.sampling.early_stopping import EarlyStopping, make_early_stopping
from hackable_diffusion.sampling.selection import SelectionRule, make_selection
from hackable_diffusion.sampling.temperature import AnnealedTemperature
from hackable_diffusion.sampling.views import PermutationViews

#: config.diffusion.process -> (vocab_size, schedule, diffusion section) -> the process; "none": the autoregressive
#: baseline, no process
PROCESSES = {
    "uniform": lambda vocab_size, schedule, d: UniformProcess(
        vocab_size=vocab_size, schedule=schedule, excluded_ids=tuple(d.excluded_ids)
    ),
    "masking": lambda vocab_size, schedule, d: MaskingProcess(
        vocab_size=vocab_size, schedule=schedule, mask_id=MASK_ID
    ),
    "none": None,
}


def build_model(config: ml_collections.ConfigDict, vocab_size: int) -> T.Transformer:
    shape = config.model.to_dict()
    shape["vocab_size"] = vocab_size
    return T.Transformer(TransformerConfig.from_dict(shape))


def build_process(config: ml_collections.ConfigDict, vocab_size: int) -> NoiseProcess | None:
    """The noise process of `config.diffusion` (None for the autoregressive baseline, process "none")."""
    d = config.diffusion
    if d.process not in PROCESSES:
        raise ValueError(f"config.diffusion.process={d.process!r} must be one of {tuple(PROCESSES)}.")
    make = PROCESSES[d.process]
    if make is None:
        return None
    return make(vocab_size, schedule_from_config(d.schedule), d)  # the schedule: `name` + that class's fields


def build_loss(config: ml_collections.ConfigDict) -> DiffusionLoss:
    """`config.diffusion.loss` with its arguments: masked_ce takes token_reweight_alpha / token_reweight_gamma."""
    d = config.diffusion
    alpha, gamma = float(d.get("token_reweight_alpha", 1.0)), float(d.get("token_reweight_gamma", 0.0))
    if d.loss == "masked_ce":
        return make_diffusion_loss("masked_ce", alpha=alpha, gamma=gamma)
    if (alpha, gamma) != (1.0, 0.0):
        raise ValueError(
            f"config.diffusion.token_reweight_alpha/gamma weigh masked_ce's per-position CE; loss={d.loss!r} has none. "
            "Set config.diffusion.loss='masked_ce', or reset them to 1 and 0."
        )
    return make_diffusion_loss(d.loss)


def build_objective(config: ml_collections.ConfigDict, model: T.Transformer, process: NoiseProcess | None):
    """The training objective of `config.diffusion`: pretraining (one canvas or block diffusion), canvas SFT, or the
    autoregressive baseline."""
    d = config.diffusion
    if d.objective not in OBJECTIVES:
        raise ValueError(f"config.diffusion.objective={d.objective!r} must be one of {tuple(OBJECTIVES)}.")
    adaptation = build_adaptation(config)
    if adaptation is not None and (d.objective != "pretrain" or process is None):
        raise ValueError(
            "config.adaptation schedules a diffusion pretraining run (diffusion.objective='pretrain' with a noise "
            f"process); this config has objective={d.objective!r}, process={d.process!r}. Remove config.adaptation."
        )
    if d.objective == "ar" or process is None:
        return obj_lib.AutoregressiveObjective(model)
    common = dict(
        time_sampler=make_time_sampler(d.time_sampler, **_interval(d)),
        loss=build_loss(config),
        encoder_ar_weight=d.encoder_ar_weight,
        self_condition_prob=d.self_condition_prob,
        null_signal=d.null_signal,
    )
    return OBJECTIVES[d.objective](model, process, d, adaptation, common)


def _pretrain(model, process, d, adaptation, common):
    shift = bool(d.get("token_shift", False))  # configs saved before the key existed have no token shift
    return obj_lib.DiffusionPretrainObjective(
        model, process, canvas_len=d.canvas_len or None, adaptation=adaptation, token_shift=shift, **common
    )


def _canvas_sft(model, process, d, adaptation, common):
    del adaptation  # refused above for every objective but pretraining
    if d.get("token_shift", False):
        raise ValueError(
            "config.diffusion.token_shift is implemented for diffusion pretraining (objective='pretrain'); "
            f"objective={d.objective!r} does not take it. Set diffusion.token_shift=False."
        )
    return obj_lib.CanvasSFTObjective(model, process, canvas_len=d.canvas_len, **common)


#: config.diffusion.objective -> (model, process, diffusion section, adaptation, shared arguments) -> the objective of
#: a diffusion run ("ar", or any objective of a run without a process, is the autoregressive baseline)
OBJECTIVES = {"pretrain": _pretrain, "sft": _canvas_sft, "ar": None}


def build_adaptation(config: ml_collections.ConfigDict) -> adaptation_lib.Adaptation | None:
    """The schedules of `config.adaptation` (`recipes.adaptation_section`), None when the section is absent (every
    config without it, and runs saved before it existed) or every schedule is off."""
    section = config.get("adaptation")
    if section is None:
        return None
    adaptation = adaptation_lib.from_section(section.to_dict())
    if adaptation.canvas is not None:
        seq_len = int(config.data.seq_len)
        bad = [s for s in adaptation.canvas.sizes if seq_len % s]
        if bad:
            raise ValueError(
                f"config.adaptation.canvas_sizes {bad} do not divide config.data.seq_len={seq_len}: every canvas size "
                "must tile the training sequence."
            )
    return adaptation if adaptation.active else None


def _interval(d: ml_collections.ConfigDict) -> dict[str, float]:
    """The time sampler's interval arguments from t_min / t_max (clipped_uniform calls them beta / omega)."""
    if d.time_sampler == "clipped_uniform":
        return dict(beta=d.t_min, omega=d.t_max)
    return dict(t_min=d.t_min, t_max=d.t_max)


def _set_arguments(section: ml_collections.ConfigDict) -> dict[str, Any]:
    """The arguments of a rule section that are set (None: the rule's own default)."""
    return {k: v for k, v in section.items() if k != "rule" and v is not None}


def build_selection(section: ml_collections.ConfigDict) -> SelectionRule:
    """`config.sampler.selection`: the rule's name (`rule`) and its arguments."""
    return make_selection(section.rule, **_set_arguments(section))


def build_early_stopping(section: ml_collections.ConfigDict) -> EarlyStopping:
    """`config.sampler.early_stopping`: the rule's name and its arguments (e.g. `threshold` of `entropy`)."""
    return make_early_stopping(section.rule, **_set_arguments(section))


def build_draw(section: ml_collections.ConfigDict) -> GumbelMax | BlockedInverseCdf:
    """`config.sampler.draw`: the draw's name and its arguments (`block` of `blocked_inverse_cdf`)."""
    return make_draw(section.rule, **_set_arguments(section))


def build_sampler(
    config: ml_collections.ConfigDict,
    process: NoiseProcess,
    *,
    constraint: LogitConstraint | None = None,
    views: PermutationViews | None = None,
    **overrides: Any,
) -> DiffusionSampler:
    """The diffusion sampler of `config.sampler`; a task adds its constraint and views, `overrides` replace fields."""
    s = config.sampler
    sampler = DiffusionSampler(
        process=process,
        selection=build_selection(s.selection),
        temperature=AnnealedTemperature(s.min_temperature, s.max_temperature, s.temperature_exponent),
        early_stopping=build_early_stopping(s.early_stopping),
        num_steps=s.num_steps,
        canvas_length=s.canvas_len,
        null_signal=config.diffusion.null_signal,
        forbidden_tokens=NEVER_GENERATED,
        score_temperature=s.get("score_temperature", 0.0) or None,  # 0 = score the sampling distribution
        sc_temperature=s.get("sc_temperature", 0.0) or None,  # 0 = feed back the sampling distribution
        draw=build_draw(s.draw),
        vocab_chunk=s.get("vocab_chunk", 0),  # 0 = whole-vocabulary arrays; N = scan the vocabulary in chunks of N
        commit=bool(s.get("commit", False)),  # uniform process: accepted tokens stay decided
        constraint=constraint,
        views=views,
        token_shift=bool(config.diffusion.get("token_shift", False)),  # the model's training decides it
    )
    return sampler.replace(**overrides) if overrides else sampler


def build_adapter(config: ml_collections.ConfigDict) -> lora_lib.LoRA | None:
    """The LoRA adapter of `config.lora` (None for full fine-tuning, rank 0); `freeze_router` leaves the router out."""
    lc = config.lora
    if lc.rank == 0:
        return None
    targets = tuple(lc.targets)
    if targets == (lora_lib.ALL_LINEAR,):
        targets = lora_lib.ALL_LINEAR
    if lc.get("freeze_router", False):
        if targets == lora_lib.ALL_LINEAR:
            targets = lora_lib.DEFAULT_TARGETS
        targets = tuple(t for t in targets if "router" not in t)
    return lora_lib.LoRA(
        rank=int(lc.rank),
        alpha=float(lc.alpha) if lc.alpha else None,
        targets=targets,
        include_experts=bool(lc.include_experts),
    )


def optimizer_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The optimizer section with `total_steps` resolved (0 means `train.num_steps`)."""
    cfg = config.optimizer.copy_and_resolve_references()
    if not cfg.total_steps:
        cfg.total_steps = config.train.num_steps
    return cfg


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
