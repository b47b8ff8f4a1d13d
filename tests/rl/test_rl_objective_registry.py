"""An RL objective is one file: the registry finds it, its fields are its config section, the command checks and builds
it from that section without naming it, and each registered objective documents its paper and where it differs."""

import importlib
import pathlib
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hackable_diffusion import cli
from hackable_diffusion.rl import command
from hackable_diffusion.rl import objectives as rl_objectives
from hackable_diffusion.rl import settings as rl_settings

NEW_OBJECTIVE = '''
"""A test objective: REINFORCE on the scorer's summed log-probs, advantages scaled by `scale`."""

import dataclasses
from typing import Any

import jax.numpy as jnp

from hackable_diffusion.rl.objectives.base import PolicyObjective, register, score


@register
@dataclasses.dataclass(frozen=True)
class ScaledReinforce(PolicyObjective):
    scorer: Any
    scale: float = 1.0
    kl_beta: float = 0.0

    name = "scaled_reinforce"
    run_kinds = ("diffusion",)

    @classmethod
    def check_settings(cls, section):
        if section["scale"] <= 0:
            raise ValueError(f"config.rl.scaled_reinforce.scale={section['scale']} must be > 0.")

    def __call__(self, params, batch, rng):
        log_probs, _, _ = score(self.scorer, params, batch)
        per_row = jnp.sum(log_probs * batch["completion"], axis=-1)
        loss = -jnp.mean(self.scale * batch["advantages"] * per_row)
        return loss, {"loss": loss}
'''


@pytest.fixture
def new_objective_file(tmp_path):
    """One new file in the objectives package (a second directory on the package's path, so the source tree stays
    untouched), imported the way the package imports its own files."""
    (tmp_path / "scaled_reinforce.py").write_text(textwrap.dedent(NEW_OBJECTIVE))
    rl_objectives.__path__.append(str(tmp_path))
    try:
        yield importlib.import_module("hackable_diffusion.rl.objectives.scaled_reinforce")
    finally:
        rl_objectives.__path__.remove(str(tmp_path))
        rl_objectives.OBJECTIVES.pop("scaled_reinforce", None)
        sys.modules.pop("hackable_diffusion.rl.objectives.scaled_reinforce", None)


def rl_config(*overrides: str) -> ml_collections.ConfigDict:
    task = ml_collections.ConfigDict(dict(seed=0, data=dict(task="text"), optimizer={}, train={}))
    return cli.parse_config_overrides(rl_settings.rl_sections(task, checkpoint="unused"), list(overrides))


def test_a_new_objective_is_one_file_from_the_command_line_to_its_loss(new_objective_file):
    cls = new_objective_file.ScaledReinforce
    assert rl_objectives.OBJECTIVES["scaled_reinforce"] is cls
    assert cls.settings() == {"scale": 1.0}  # the fields the run does not supply
    config = rl_config("--config.rl.objective=scaled_reinforce", "--config.rl.scaled_reinforce.scale=0.25")
    assert config.rl.scaled_reinforce.scale == 0.25
    command.check_rl_config(config, autoregressive=False)
    with pytest.raises(ValueError, match="needs a diffusion run; this run is autoregressive: use one of"):
        command.check_rl_config(config, autoregressive=True)  # its declared run kinds, checked generically
    with pytest.raises(ValueError, match="scaled_reinforce.scale=-1.0 must be > 0"):
        command.check_rl_config(
            rl_config("--config.rl.objective=scaled_reinforce", "--config.rl.scaled_reinforce.scale=-1")
        )

    def scorer(params, tokens, completion, prompt_masked):
        return params["logp"] * jnp.ones(tokens.shape), jnp.zeros(tokens.shape), {}

    section = command.objective_section(config.rl, cls)
    objective = cls.build(section, rl_objectives.RunPieces(scorer=scorer, group_size=2, kl_beta=0.0))
    assert objective == cls(scorer, scale=0.25, kl_beta=0.0)
    completion = np.array([[0, 1, 1], [0, 1, 0]], bool)
    batch = dict(
        tokens=np.zeros((2, 3), np.int32), completion=completion, prompt_masked=np.zeros((2, 3), bool),
        advantages=np.array([1.0, -1.0], np.float32),
    )  # fmt: skip
    loss, _ = objective({"logp": jnp.float32(-2.0)}, batch, jax.random.key(0))
    # -mean(0.25 * A * sum_t log pi) = -mean(0.25 * [1 * -4, -1 * -2]) = 0.25
    assert float(loss) == pytest.approx(0.25)


def test_a_section_key_the_objective_lacks_and_a_flat_key_of_an_older_config_are_refused():
    with pytest.raises(ValueError, match=r"unknown config.rl.wd1 keys \['psy'\]; valid keys: \['negative_w"):
        config = rl_config("--config.rl.objective=wd1")
        with config.rl.wd1.unlocked():
            config.rl.wd1.psy = 2.0
        command.check_rl_config(config)
    config = rl_config()
    with config.rl.unlocked():
        config.rl.wd1_psi = 2.0
    with pytest.raises(ValueError, match=r"rl.wd1_psi -> rl.wd1.psi"):
        command.check_rl_config(config)


def test_a_saved_run_with_flat_objective_keys_loads_into_the_sections():
    from hackable_diffusion import run_config

    saved = ml_collections.ConfigDict(dict(rl=dict(objective="wd1", clip_eps=0.2, wd1_psi=0.5, elbo_draws=2)))
    run_config.upgrade_saved_rl(saved)
    assert "clip_eps" not in saved.rl and "wd1_psi" not in saved.rl
    assert saved.rl.diffu_grpo.clip_eps == saved.rl.ar_grpo.clip_eps == 0.2 and saved.rl.wd1.psi == 0.5
    assert saved.rl.elbo.draws == saved.rl.expert_iteration.draws == 2


@pytest.mark.parametrize("name", sorted(rl_objectives.OBJECTIVES))
def test_each_objective_is_its_own_documented_file(name):
    cls = rl_objectives.OBJECTIVES[name]
    module = sys.modules[cls.__module__]
    assert pathlib.Path(module.__file__).stem == name  # the file is named as config.rl.objective names it
    assert "Differs" in module.__doc__ or "differs" in module.__doc__  # where it deliberately leaves its paper
    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "rl.md").read_text()
    assert f"| `{name}` |" in docs  # the objective table of docs/rl.md
    assert rl_settings.rl_sections(
        ml_collections.ConfigDict(dict(data={}, optimizer={}, train={})), checkpoint="x"
    ).rl[name].to_dict() == cls.settings()


def test_each_objective_declares_what_it_needs_from_a_run():
    """The declarations the command checks a config against, as docs/rl.md's objective table states them."""
    declared = {
        name: (cls.run_kinds, cls.grouped, cls.has_kl, cls.normalization_kind, cls.trajectory_scorer,
               cls.needs_old_log_probs)
        for name, cls in rl_objectives.OBJECTIVES.items()
    }  # fmt: skip
    both = ("diffusion", "autoregressive")
    assert declared == {
        "diffu_grpo": (("diffusion",), True, True, "clipped", True, True),
        "ar_grpo": (("autoregressive",), True, True, "clipped", False, True),
        "wd1": (both, True, True, "wd1", True, False),
        "elbo": (("diffusion",), True, True, None, False, False),
        "expert_iteration": (both, False, False, None, False, False),
    }
    base = rl_objectives.PolicyObjective
    assert (base.run_kinds, base.grouped, base.has_kl, base.normalization_kind, base.trajectory_scorer) == (
        both, True, True, None, False
    )  # what a new objective declares by saying nothing
    assert base.check_settings({"anything": 1}) is None  # the default check accepts its section


def test_the_run_pieces_default_to_no_kl_the_papers_normalisation_and_no_run_objective():
    run = rl_objectives.RunPieces(scorer=None, group_size=4)
    assert (run.kl_beta, run.normalization, run.objective) == (0.0, "paper", None)
    with pytest.raises(AttributeError):  # frozen: objectives are built from it inside jitted code's closures
        run.kl_beta = 1.0


def test_a_name_is_registered_once_and_run_kinds_are_checked():
    wd1 = rl_objectives.OBJECTIVES["wd1"]
    assert rl_objectives.register(wd1) is wd1  # the same class again: no change
    impostor = type("Impostor", (rl_objectives.PolicyObjective,), {"name": "wd1"})
    with pytest.raises(ValueError, match="two RL objectives are named 'wd1'"):
        rl_objectives.register(impostor)
    for kinds in ((), ("convolutional",), ("diffusion", "convolutional")):
        odd = type("Odd", (rl_objectives.PolicyObjective,), {"name": "odd", "run_kinds": kinds})
        with pytest.raises(ValueError, match="run_kinds"):
            rl_objectives.register(odd)
    assert rl_objectives.OBJECTIVES["wd1"] is wd1 and "odd" not in rl_objectives.OBJECTIVES


@pytest.mark.parametrize(
    "objective, key, bad, good",
    [
        ("diffu_grpo", "clip_eps", (0.0, -0.5), (1e-4, 0.2)),
        ("ar_grpo", "clip_eps", (0.0,), (0.2,)),
        ("wd1", "zero_tied_groups", ("yes", 1), (True, False)),
        ("elbo", "draws", (0, 2.5, True), (1, 8)),
        ("expert_iteration", "draws", (0, -1, 1.5), (1, 2)),
    ],
)
def test_each_objective_checks_its_own_section(objective, key, bad, good):
    cls = rl_objectives.OBJECTIVES[objective]
    for value in good:
        cls.check_settings({**cls.settings(), key: value})
    for value in bad:
        with pytest.raises(ValueError, match=f"config.rl.{objective}.{key}="):
            cls.check_settings({**cls.settings(), key: value})


def test_the_trajectory_scorer_is_accepted_where_declared():
    for name, cls in rl_objectives.OBJECTIVES.items():
        if "diffusion" not in cls.run_kinds:
            continue
        config = rl_config(f"--config.rl.objective={name}", "--config.rl.scorer=trajectory")
        config.rl.prompt_mask_prob = 0.0
        config.rl.group_size = 8 if cls.grouped else 1
        if cls.trajectory_scorer:
            command.check_rl_config(config, autoregressive=False)
        else:
            with pytest.raises(ValueError, match="config.rl.scorer='trajectory' is for"):
                command.check_rl_config(config, autoregressive=False)


class InPlaceLoss:
    """A run objective trained in place (one canvas): a per-example loss and the masking ELBO."""

    canvas_len = None

    def train_loss_per_example(self, params, rows, key):
        return jnp.zeros(rows["tokens"].shape[:1])

    def elbo_per_example(self, params, rows, key):
        return jnp.zeros(rows["tokens"].shape[:1]), jnp.ones(rows["tokens"].shape[:1])


class CanvasLoss(InPlaceLoss):
    canvas_len = 8


class LossWithoutCanvasLength:
    def train_loss_per_example(self, params, rows, key):
        return jnp.zeros(rows["tokens"].shape[:1])


def test_expert_iteration_trains_an_in_place_run_with_its_own_loss_and_any_other_with_the_scorer():
    cls = rl_objectives.OBJECTIVES["expert_iteration"]
    section = {"draws": 3}
    built = {
        kind: cls.build(section, rl_objectives.RunPieces(scorer="scorer", group_size=1, objective=own))
        for kind, own in (("in_place", InPlaceLoss()), ("canvas", CanvasLoss()), ("ar", None),
                          ("unknown", LossWithoutCanvasLength()))
    }  # fmt: skip
    assert isinstance(built["in_place"].objective, InPlaceLoss)
    assert built["canvas"].objective is built["ar"].objective is built["unknown"].objective is None
    assert all(o.draws == 3 and o.scorer == "scorer" for o in built.values())


def test_the_elbo_objective_needs_the_runs_masking_elbo():
    cls = rl_objectives.OBJECTIVES["elbo"]
    run = rl_objectives.RunPieces(scorer="scorer", group_size=4, kl_beta=0.1, objective=InPlaceLoss())
    built = cls.build({"draws": 2}, run)
    assert (built.draws, built.kl_beta, built.scorer) == (2, 0.1, "scorer")
    for own in (None, LossWithoutCanvasLength()):
        with pytest.raises(ValueError, match="needs a run trained in place with the masking ELBO"):
            cls.build({"draws": 2}, rl_objectives.RunPieces(scorer="scorer", group_size=4, objective=own))
    with pytest.raises(ValueError, match="needs an in-place run"):
        cls.build({"draws": 2}, rl_objectives.RunPieces(scorer="scorer", group_size=4, objective=CanvasLoss()))
