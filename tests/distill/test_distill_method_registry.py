"""A distillation method is one file (`distill/methods.py`): its dataclass fields are keys of `config.distill`, set
from the command line, and `check_distill_config` builds it from them by name."""

import dataclasses

import ml_collections
import numpy as np
import pytest

from hackable_diffusion import cli, recipes
from hackable_diffusion.distill import command
from hackable_diffusion.distill import methods as methods_lib
from hackable_diffusion.distill import settings as distill_settings


@dataclasses.dataclass(frozen=True)
class LastStepOnly:
    """A test method: only the student's last step is trained, toward the teacher's end canvas, with `weight`."""

    student_steps: int
    weight: float = 0.5
    name = "last_step_only"
    greedy_teacher = False
    on_policy = False

    def check_process(self, persistent: bool) -> None:
        del persistent

    def __call__(self, trajectory, fixed, mask_id):
        k = self.student_steps
        m = methods_lib.student_grid(trajectory.shape[0] - 1, k)
        states = np.stack([trajectory[i * m] for i in range(k)], axis=1)
        targets = np.broadcast_to(trajectory[-1][:, None], states.shape)
        weights = np.zeros(states.shape, np.float32)
        weights[:, -1] = self.weight * ~fixed
        return methods_lib.StudentRows(states, targets, weights)


def distill_config(*overrides: str) -> ml_collections.ConfigDict:
    config = distill_settings.distill_sections(recipes.text_config("shakespeare", "masking"), checkpoint="unused")
    return cli.parse_config_overrides(config, list(overrides))


def test_a_new_method_with_a_parameter_is_one_registry_entry(monkeypatch):
    monkeypatch.setitem(methods_lib.METHODS, "last_step_only", LastStepOnly)  # its class and entry: nothing else
    config = distill_config("--config.distill.method=last_step_only", "--config.distill.weight=0.25")
    method = command.check_distill_config(config)
    assert method == LastStepOnly(student_steps=config.distill.student_steps, weight=0.25)
    assert distill_config().distill.weight == 0.5  # the field's default reaches every config
    trajectory = np.arange(5 * 1 * 3).reshape(5, 1, 3)
    rows = method(trajectory, np.array([[True, False, False]]), mask_id=0)
    assert rows.weights[0, -1].tolist() == [0.0, 0.25, 0.25] and rows.weights[0, :-1].sum() == 0


def test_every_method_is_built_by_name_from_its_fields():
    config = distill_config()
    for name, cls in methods_lib.METHODS.items():
        with config.distill.unlocked():
            config.distill.method = name
        method = command.check_distill_config(config)
        assert type(method) is cls and method.name == name
        for field in dataclasses.fields(cls):
            assert getattr(method, field.name) == config.distill[field.name]  # the section's value, not a default
    with config.distill.unlocked():
        config.distill.method = "progressive"
    with pytest.raises(ValueError, match=r"config.distill.method='progressive' must be one of \('trajectory'"):
        command.check_distill_config(config)
