"""tasks/capabilities.py: each shipped task declares exactly the capabilities it has, the generic code paths that read
one (distillation's teacher sampler, RL's trajectory scorer, lm-eval's puzzle requests) choose by `isinstance` and
refuse a stub task without it in one line naming the capability, and no generic module compares a task's name."""

import dataclasses
import pathlib
import re

import pytest

from hackable_diffusion import builders, recipes
from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.distill import settings as distill_settings
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.distill import command as distill_command
from hackable_diffusion.rl import command as rl_command
from hackable_diffusion.rl.scorers import TrajectoryScorer
from hackable_diffusion.tasks import capabilities, get_task
from hackable_diffusion.tasks.capabilities import (
    CutsCompletionsAtEos,
    GeneratesText,
    HasCanvasSampler,
    RecordsCommitOrder,
    RestrictsRolloutTokens,
    RewardTask,
    ScoresLmEvalPuzzles,
)

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hackable_diffusion"
MASK_ID = 3
DECLARED = {  # task -> the capabilities it has; it must lack every other one
    "text": {GeneratesText},
    "sudoku": {HasCanvasSampler, RewardTask, RecordsCommitOrder, RestrictsRolloutTokens, ScoresLmEvalPuzzles},
    "countdown": {RewardTask, CutsCompletionsAtEos, RestrictsRolloutTokens},
}
CAPABILITIES = (
    HasCanvasSampler,
    RewardTask,
    RecordsCommitOrder,
    CutsCompletionsAtEos,
    RestrictsRolloutTokens,
    ScoresLmEvalPuzzles,
    GeneratesText,
)


@dataclasses.dataclass(frozen=True)
class StubExperiment:
    """The parts of an `Experiment` that the capability checks read."""

    task: object
    process: object = None
    config: object = None
    model: object = None
    objective: object = None
    is_autoregressive: bool = False


class PlainTask:
    """A task with no capability at all."""

    name = "plain"


class RewardOnlyTask(PlainTask):
    """The RL hooks of `RewardTask`, but rollouts that record no commit order."""

    name = "reward_only"

    def rl_prompts(self, exp):
        return []

    def rollout(self, exp, params, prompts, *, seed, config):
        return prompts

    def reward(self, prompts, completions):
        return []

    def policy_rows(self, exp, prompts, completions):
        return {}


class OwnSamplerTask(PlainTask):
    """`HasCanvasSampler`: a sampler that forbids token 7, which the generic one does not."""

    name = "own_sampler"

    def __init__(self):
        self.calls = 0

    def canvas_sampler(self, exp, config):
        self.calls += 1
        return builders.build_sampler(config, exp.process).replace(forbidden_tokens=(7,))


class PuzzleTask(PlainTask):
    """`ScoresLmEvalPuzzles`: its answerer records the arguments it was made with."""

    name = "puzzles"

    def lm_eval_puzzle_answerer(self, exp, params, *, seed, batch_size):
        return ("answerer", seed, batch_size)


def one_line_error(call, *words: str) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


@pytest.mark.parametrize("name", sorted(DECLARED))
@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.__name__)
def test_each_task_has_exactly_the_capabilities_it_declares(name, capability):
    assert isinstance(get_task(name), capability) == (capability in DECLARED[name])


def test_require_names_the_capability_the_task_lacks_in_one_line():
    capabilities.require(get_task("sudoku"), RecordsCommitOrder, "a trajectory scorer")  # has it: nothing
    message = one_line_error(
        lambda: capabilities.require(get_task("text"), RewardTask, "RL", "train a task with a reward"),
        "RL needs",
        "RewardTask",
        "'text' task lacks it",
        "train a task with a reward",
    )
    assert message.endswith(".")


def distill_setup():
    config = distill_settings.distill_sections(
        recipes.text_config("shakespeare", "masking"),
        checkpoint="unused",
        method="trajectory",
        teacher_steps=4,
        student_steps=2,
        steps=4,
        batch_size=8,
        pool_size=16,
        peak_lr=1e-3,
    )
    return config, distill_command.check_distill_config(config), MaskingProcess(12, LinearSchedule(), MASK_ID)


def test_distillation_teaches_with_the_tasks_own_sampler_only_when_it_has_one():
    config, method, process = distill_setup()
    own = OwnSamplerTask()
    sampler = distill_command.teacher_sampler(StubExperiment(own, process), config, method)
    assert own.calls == 1 and sampler.forbidden_tokens == (7,) and sampler.num_steps == 4
    generic = distill_command.teacher_sampler(StubExperiment(PlainTask(), process), config, method)
    assert generic.forbidden_tokens == builders.build_sampler(config, process).forbidden_tokens != (7,)
    assert generic.num_steps == 4


def rl_config(scorer: str):
    config = rl_settings.rl_sections(recipes.text_config("shakespeare", "masking"), checkpoint="unused")
    config.rl.scorer = scorer
    return config


def test_the_trajectory_scorer_needs_a_task_that_records_the_commit_order():
    process = MaskingProcess(12, LinearSchedule(), MASK_ID)
    config = rl_config("trajectory")
    one_line_error(
        lambda: rl_command.build_objective(config, StubExperiment(RewardOnlyTask(), process)),
        "config.rl.scorer='trajectory'",
        "RecordsCommitOrder",
        "'reward_only' task lacks it",
        "use 'mean_field'",
    )
    objective = rl_command.build_objective(config, StubExperiment(get_task("sudoku"), process))
    assert isinstance(objective.scorer, TrajectoryScorer)
    mean_field = rl_command.build_objective(rl_config("mean_field"), StubExperiment(RewardOnlyTask(), process))
    assert not isinstance(mean_field.scorer, TrajectoryScorer)  # no commit order needed


def test_lm_eval_asks_the_task_for_its_puzzle_answerer_and_refuses_a_task_with_neither_capability():
    pytest.importorskip("lm_eval")
    from hackable_diffusion.evals import lm_eval_adapter

    scorer, answerer = lm_eval_adapter.request_answerers(StubExperiment(PuzzleTask()), None, seed=5, batch_size=8)
    assert scorer is None and answerer == ("answerer", 5, 64)  # at least 64 puzzles a solver batch
    one_line_error(
        lambda: lm_eval_adapter.request_answerers(StubExperiment(PlainTask()), None),
        "GeneratesText",
        "ScoresLmEvalPuzzles",
        "'plain' task has neither",
    )
    scorer, answerer = lm_eval_adapter.request_answerers(StubExperiment(get_task("text")), None, batch_size=4)
    assert answerer is None and scorer.batch_size == 4


def test_no_generic_module_compares_a_task_name_or_probes_a_task_for_undeclared_hooks():
    pattern = re.compile(r"task\.name\s*(==|!=)|(getattr|hasattr)\(\s*(exp\.|self\.)?task\b")
    generic = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "tasks"]
    generic += [PACKAGE / "tasks" / "__init__.py", PACKAGE / "tasks" / "capabilities.py"]
    found = [
        f"{p.relative_to(PACKAGE)}:{i}"
        for p in generic
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_the_scorers_take_the_ids_the_tasks_rollouts_never_draw():
    """`RestrictsRolloutTokens`: every scorer RL builds removes the ids the task's sampler never draws (Sudoku: the
    non-digits; Countdown: BOS in place, PAD, BOS and MASK left to right); a task without it removes none."""
    from hackable_diffusion import cli
    from hackable_diffusion.data.tokenizers import BOS_ID, PAD_ID
    from hackable_diffusion.tasks.sudoku.vocab import NON_DIGIT_IDS

    process = MaskingProcess(12, LinearSchedule(), MASK_ID)
    from hackable_diffusion.tasks.sudoku.inference import SolverSettings, puzzle_sampler
    from hackable_diffusion.tasks.sudoku.recipes import sudoku_config

    sampler = puzzle_sampler(sudoku_config(), process, SolverSettings())  # what Sudoku's rollouts draw with
    for scorer in ("mean_field", "trajectory"):
        built = rl_command.build_objective(rl_config(scorer), StubExperiment(get_task("sudoku"), process))
        assert built.scorer.forbidden_tokens == tuple(NON_DIGIT_IDS) == tuple(sampler.forbidden_tokens)
    plain = rl_command.build_objective(rl_config("mean_field"), StubExperiment(RewardOnlyTask(), process))
    assert plain.scorer.forbidden_tokens == ()
    ar_config = cli.load_config_file("configs/rl_countdown.py:ar")
    ar = StubExperiment(get_task("countdown"), process, config=ar_config, is_autoregressive=True)
    assert rl_command.build_objective(ar_config, ar).scorer.forbidden_tokens == (PAD_ID, BOS_ID, MASK_ID)
    in_place_config = cli.load_config_file("configs/rl_countdown.py")
    in_place = StubExperiment(get_task("countdown"), process, config=in_place_config)
    assert rl_command.build_objective(in_place_config, in_place).scorer.forbidden_tokens == (BOS_ID,)
