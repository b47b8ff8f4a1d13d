"""A schedule's fields set on the command line reach the built noise process: `python -m hackable_diffusion.train`'s
own flag parsing of `--config.diffusion.schedule.*` overrides of configs/quickstart.py, stopped after the config
check (nothing trained, nothing written); a field the named schedule does not take stops the check on one line."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from hackable_diffusion import builders, cli, experiment
from hackable_diffusion.diffusion.schedules import PolynomialSchedule

REPO = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "configs" / "quickstart.py")
# power 3, not PolynomialSchedule's default 2, so that a dropped override would show
POWER_3 = ["--config.diffusion.schedule.name=polynomial", "--config.diffusion.schedule.power=3.0"]

# Runs the train entry point as `python -m` does; `experiment.check_config` (the first thing `train.run` does, before
# anything is written) is wrapped to report the schedule of the process the parsed config builds, then exit.
_TRAIN_UNTIL_CHECKED = """
import json, runpy, sys
from hackable_diffusion import builders, experiment

check_config = experiment.check_config

def check_and_report(config):
    check_config(config)
    schedule = builders.build_process(config, 256).schedule
    print("SCHEDULE " + json.dumps({"class": type(schedule).__name__, "power": getattr(schedule, "power", None)}))
    sys.exit(0)

experiment.check_config = check_and_report
sys.argv = ["hackable_diffusion.train", *sys.argv[1:]]
runpy.run_module("hackable_diffusion.train", run_name="__main__", alter_sys=True)
"""


def test_the_train_command_line_builds_a_polynomial_schedule_of_power_three(tmp_path):
    workdir = tmp_path / "run"
    environment = {k: v for k, v in os.environ.items() if k != "HD_TRACEBACK"}
    out = subprocess.run(
        [sys.executable, "-c", _TRAIN_UNTIL_CHECKED, "--config", QUICKSTART, f"--workdir={workdir}", *POWER_3],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("SCHEDULE ")]
    assert json.loads(line.removeprefix("SCHEDULE ")) == {"class": "PolynomialSchedule", "power": 3.0}
    assert not workdir.exists()


def test_the_same_overrides_in_process_and_a_field_the_schedule_does_not_take():
    config = cli.parse_config_overrides(cli.load_config_file(QUICKSTART), POWER_3)
    experiment.check_config(config)
    schedule = builders.build_process(config, 256).schedule
    assert isinstance(schedule, PolynomialSchedule) and schedule.power == 3.0

    linear = cli.parse_config_overrides(cli.load_config_file(QUICKSTART), POWER_3[1:])  # name stays linear
    with pytest.raises(ValueError) as error:
        experiment.check_config(linear)
    assert str(error.value) == (
        "schedule 'linear' (LinearSchedule) does not take ['power'] (schedules that do: power: polynomial); "
        "its fields are ['eps']."
    )
