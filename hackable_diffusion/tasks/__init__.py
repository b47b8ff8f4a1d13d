"""Tasks: what a run learns and how it is scored, behind one small protocol.

The generic layers (models, diffusion, sampling, training) know nothing of a task. A task supplies the data (and its
tokenizer), adapts the generic objective to its rows, feeds the training loop, scores the model during and after
training, and may hand the sampler a constraint or symmetry views. Three tasks ship:

* `text` (`tasks/text.py`): packed text corpora (tiny Shakespeare, PTB), likelihood (ELBO / exact NLL) in bits per
  token / character or perplexity per word, samples and their generative perplexity.
* `sudoku` (`tasks/sudoku/`): puzzles solved in place, as a canvas after a prompt, or left to right; the solver loop
  (repairs, restarts, a pass budget, parallel attempts), the rules constraint, the symmetry views and DiffusionGemma's
  Sudoku metrics.
* `countdown` (`tasks/countdown/`): reach a target with arithmetic over given numbers, answered in place or left to
  right, scored by an exact verifier that also gives the reward of reinforcement learning.

A task that can be post-trained from a verifiable reward (`python -m hackable_diffusion.rl`) also has the RL hooks of
`RewardTask`: its prompts, a rollout with the run's own sampler, the reward, and the rows the policy scored.

`config.data.task` names the task; `get_task` is the one lookup. Each task owns its evaluation (`Task.evaluation_from_flags`: the flags
`python -m hackable_diffusion.evaluate` takes for its runs), so the evaluate command itself is task-free.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol

import ml_collections

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment

EvalFn = Callable[[Any, Any], Mapping[str, float]]


class Task(Protocol):
    """What a task supplies to `experiment.build`, `train.py`, `evaluate.py` and the saved-config loader."""

    name: str

    def check_config(self, config: ml_collections.ConfigDict) -> None:
        """Every check of the task's config keys that needs no data; raises ValueError naming the key."""

    def upgrade_saved_config(self, config: ml_collections.ConfigDict) -> None:
        """Brings a config saved by an older version of the toolbox to the current keys (in place)."""

    def build_data(self, config: ml_collections.ConfigDict, workdir: str) -> Any:
        """The task's data; it has a `tokenizer` with `vocab_size` (and `train_sequences` for the progress line)."""

    def adapt_objective(self, config: ml_collections.ConfigDict, model: Any, objective: Any) -> Any:
        """The generic objective (`builders.build_objective`), wrapped or replaced for the task's rows."""

    def train_iterator(self, exp: Experiment, process_index: int, process_count: int) -> Iterator[dict]:
        """This process's rows of each global batch: a checkpointable (grain) iterator."""

    def eval_fn(self, exp: Experiment, workdir: str) -> EvalFn:
        """`eval_fn(params, ema_params) -> metrics`, run every `train.eval_every` steps."""

    def report(self, exp: Experiment, params: Any) -> str:
        """What `train` prints at the end (a sample, solved puzzles)."""

    def default_config(self) -> ml_collections.ConfigDict:
        """A config of the task: it stands in for a run's saved config when a command line is only checked."""

    def define_evaluation_flags(self, flag_values: Any) -> None:
        """Defines the absl flags `evaluate` takes for the task's runs (in `flag_values`)."""

    def evaluation_from_flags(self, flag_values: Any) -> Evaluation:
        """The evaluation those flags describe."""


class Evaluation(Protocol):
    """What `evaluate` runs on a run of the task: `(exp, params, seed=, load_run=) -> a JSON-able dict`; `load_run`
    loads another run as (experiment, params), e.g. an autoregressive scorer."""

    def __call__(self, exp: Experiment, params: Any, *, seed: int, load_run: Callable[[str], tuple]) -> dict: ...


class RewardTask(Task, Protocol):
    """The hooks `rl.rollouts.RolloutStream` calls (Sudoku and Countdown have them; text has no verifiable reward)."""

    def rl_prompts(self, exp: Experiment) -> Any:
        """The prompts RL trains on: an array with one problem per row, in the task's own encoding."""

    def rollout(self, exp: Experiment, params: Any, prompts: Any, *, seed: int, config: Any) -> Any:
        """One completion per prompt row from the run's jitted sampler (`config.sampler`: RL sets the temperature);
        row i's randomness depends on (seed, i) alone. A task whose `records_commit_order` is True also takes
        `record_order=True` and then returns (completions, the sampler pass that wrote each completion token, -1 where
        none did), which RL's trajectory scorer reads."""

    def reward(self, prompts: Any, completions: Any) -> Any:
        """float32 (n,): 1.0 for an exactly right completion, 0.0 for a wrong or malformed one (never an exception);
        a task may accept keyword options such as Sudoku's `shaped=True` partial credit (< 1)."""

    def policy_rows(self, exp: Experiment, prompts: Any, completions: Any) -> dict:
        """`{"tokens": int32 (n, l), "completion": bool (n, l)}`: the sequence the policy scores and which of its
        positions the sampler generated (in place: the blanks; AR: the continuation after the prompt). With
        `commit_pass=` (a task that records the order) the rows also carry it as `commit_pass` (n, l)."""


TASKS = {
    "text": "hackable_diffusion.tasks.text:TextTask",
    "sudoku": "hackable_diffusion.tasks.sudoku.task:SudokuTask",
    "countdown": "hackable_diffusion.tasks.countdown.task:CountdownTask",
}


def get_task(name: str) -> Task:
    """The task `config.data.task` names."""
    if name not in TASKS:
        raise ValueError(f"config.data.task={name!r} must be one of {sorted(TASKS)}.")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)()
