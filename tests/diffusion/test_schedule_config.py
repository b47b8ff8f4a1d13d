"""The schedule's config section (`config.diffusion.schedule`: `name` and the class's fields) from every side that
reads it: the recipes' default, a schedule added in `diffusion/schedules.py` alone and set by overrides, runs saved
when the schedule was a bare name with `diffusion.schedule_eps` (they build the same schedule, resume and take the
new overrides), the saved config of a run, and a fine-tune inheriting the whole section (`sft.INHERITED_DIFFUSION`)."""

import dataclasses
import json

import jax.numpy as jnp
import pytest

from hackable_diffusion import builders, cli, recipes, run_config, sft
from hackable_diffusion import sft
from hackable_diffusion.checkpoints import base_weights
from hackable_diffusion.diffusion import schedules as S


def built_schedule(config) -> S.Schedule:
    """The schedule of the noise process the config builds (what training and sampling use)."""
    return builders.build_process(config, 64).schedule


def saved_before_schedule_sections(tmp_path, name: str, eps: float):
    """A workdir whose config.json holds the diffusion keys as runs saved them before the schedule section existed."""
    config = recipes.base_config().to_dict()
    del config["diffusion"]["schedule"]
    config["diffusion"].update(schedule=name, schedule_eps=eps)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return config


def test_the_default_section_builds_the_linear_schedule_of_every_recipe():
    config = recipes.base_config()
    assert config.diffusion.schedule.to_dict() == {
        "name": "linear", "eps": 1e-4, "power": None, "sigma_min": None, "sigma_max": None,
    }  # fmt: skip
    assert built_schedule(config) == S.LinearSchedule(eps=1e-4)
    assert "schedule_eps" not in config.diffusion
    assert recipes.schedule_section("polynomial", power=3.0).power == 3.0
    with pytest.raises(ValueError, match=r"unknown schedule arguments \['pwoer'\]; valid: \['eps', 'power'"):
        recipes.schedule_section("polynomial", pwoer=3.0)


def test_a_schedule_added_in_schedules_py_alone_is_set_from_the_command_line(monkeypatch):
    """Registering a subclass with a field is the whole change: the section gets a typed slot for the field, an
    override sets it, and the built process carries the class with that value."""

    @dataclasses.dataclass(frozen=True)
    class ExponentialSchedule(S.Schedule):
        rate: float = 1.0

        def _a(self, t):
            return (jnp.exp(-self.rate * t) - jnp.exp(-self.rate)) / (1.0 - jnp.exp(-self.rate))

        def _a_prime(self, t):
            return -self.rate * jnp.exp(-self.rate * t) / (1.0 - jnp.exp(-self.rate))

    monkeypatch.setitem(S.SCHEDULES, "exponential", ExponentialSchedule)
    overrides = ["--config.diffusion.schedule.name=exponential", "--config.diffusion.schedule.rate=4.0"]
    config = cli.parse_config_overrides(recipes.base_config(), overrides)
    assert built_schedule(config) == ExponentialSchedule(rate=4.0, eps=1e-4)
    with pytest.raises(ValueError, match=r"'linear' \(LinearSchedule\) does not take \['rate'\]"):
        built_schedule(cli.parse_config_overrides(recipes.base_config(), overrides[1:]))


@pytest.mark.parametrize(
    "name, eps, expected",
    [
        ("linear", 1e-4, S.LinearSchedule(eps=1e-4)),
        ("loglinear", 1e-4, S.LogLinearSchedule(eps=1e-4)),  # the saved eps, not the class default 1e-3
        ("md4_cosine", 1e-3, S.MD4CosineSchedule(eps=1e-3)),
    ],
)
def test_a_run_saved_with_a_bare_schedule_name_and_schedule_eps_builds_the_same_schedule(tmp_path, name, eps, expected):
    saved_before_schedule_sections(tmp_path, name, eps)
    loaded = run_config.load_saved_config(str(tmp_path))
    assert "schedule_eps" not in loaded.diffusion
    assert loaded.diffusion.schedule.name == name and loaded.diffusion.schedule.eps == eps
    assert built_schedule(loaded) == expected == S.make_schedule(name, eps=eps)  # what the old builder made
    # its overrides parse on the loaded config (typed slots, not JSON's untyped None)
    changed = cli.parse_config_overrides(
        loaded, ["--config.diffusion.schedule.name=polynomial", "--config.diffusion.schedule.power=2.0"]
    )
    assert built_schedule(changed) == S.PolynomialSchedule(power=2.0, eps=eps)


def test_an_old_run_resumes_and_a_new_run_saves_and_reloads_its_section(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    saved_before_schedule_sections(old, "linear", 1e-4)
    run_config.check_same_run(recipes.base_config(), old)  # the current config continues the old run

    config = cli.parse_config_overrides(
        recipes.base_config(), ["--config.diffusion.schedule.name=polynomial", "--config.diffusion.schedule.power=3"]
    )
    new = tmp_path / "new"
    assert run_config.save_config(config, new / "config.json") == {}
    assert run_config.save_config(config, new / "config.json") == {}  # the same command again records nothing
    assert built_schedule(run_config.load_saved_config(str(new))) == S.PolynomialSchedule(power=3.0, eps=1e-4)


@pytest.mark.parametrize("source_format", ["section", "bare_name"])
def test_a_fine_tune_inherits_the_source_runs_whole_schedule_section(tmp_path, source_format):
    assert "schedule" in sft.INHERITED_DIFFUSION and "schedule_eps" not in sft.INHERITED_DIFFUSION
    if source_format == "section":
        source = recipes.base_config()
        source.diffusion.schedule = recipes.schedule_section("polynomial", power=3.0, eps=1e-3)
        run_config.save_config(source, tmp_path / "config.json")
        expected = S.PolynomialSchedule(power=3.0, eps=1e-3)
    else:
        saved_before_schedule_sections(tmp_path, "loglinear", 1e-4)
        expected = S.LogLinearSchedule(eps=1e-4)
    source_config = run_config.load_saved_config(str(tmp_path))
    model = builders.build_model(source_config, 64)
    base = base_weights.Base(model, None, None, "toolbox:source", source_config=source_config)

    fine_tune = sft.sft_config()
    fine_tune.diffusion.schedule = recipes.schedule_section("geometric", sigma_max=5.0)  # replaced by the source's
    resolved = sft.resolve_config(fine_tune, base)
    assert built_schedule(resolved) == expected
    assert "schedule_eps" not in resolved.diffusion

    fine_tune.init.inherit_diffusion = False
    assert built_schedule(sft.resolve_config(fine_tune, base)) == S.GeometricSchedule(sigma_max=5.0)
