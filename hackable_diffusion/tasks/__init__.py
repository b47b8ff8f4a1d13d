"""Tasks: what a run learns and how it is scored, behind one small protocol.

The generic layers (models, diffusion, sampling, training) know nothing of a task. A task supplies the data (and its
tokenizer), adapts the generic objective to its rows, feeds the training loop, scores the model during and after
training, and may hand the sampler a constraint or symmetry views. Three tasks ship:

* `text` (`tasks/text_task.py`; its scores in `tasks/text.py`): packed text corpora (tiny Shakespeare, PTB),
  likelihood (ELBO / exact NLL) in bits per token / character or perplexity per word, samples and their generative
  perplexity.
* `sudoku` (`tasks/sudoku/`): puzzles solved in place, as a canvas after a prompt, or left to right; the solver loop
  (repairs, restarts, a pass budget, parallel attempts), the rules constraint, the symmetry views and DiffusionGemma's
  Sudoku metrics.
* `countdown` (`tasks/countdown/`): reach a target with arithmetic over given numbers, answered in place or left to
  right, scored by an exact verifier that also gives the reward of reinforcement learning.

What only some tasks can do is a capability (`tasks/capabilities.py`): a `typing.Protocol` that a task has by
defining its members, which generic code checks with `isinstance(exp.task, Capability)` (never the task's name):
`HasCanvasSampler` (distillation's teacher), `RewardTask` (the RL hooks: prompts, a rollout with the run's own
sampler, the reward, the rows the policy scored), `RecordsCommitOrder` (RL's trajectory scorer),
`CutsCompletionsAtEos` (`rl.stop_at_eos`), `ScoresLmEvalPuzzles` (lm-eval's puzzle requests) and `GeneratesText`
(`sample`, `serve`, lm-eval's text requests).

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
    """What every task supplies to `experiment.build`, `train.py`, `evaluate.py` and the saved-config loader. What
    only some tasks supply is a capability of `tasks.capabilities` (`HasCanvasSampler`, `RewardTask`,
    `RecordsCommitOrder`, `CutsCompletionsAtEos`, `ScoresLmEvalPuzzles`, `GeneratesText`), each a runtime-checkable
    protocol that the code reading it checks with `isinstance`."""

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


TASKS = {
    "text": "hackable_diffusion.tasks.text_task:TextTask",
    "sudoku": "hackable_diffusion.tasks.sudoku.task:SudokuTask",
    "countdown": "hackable_diffusion.tasks.countdown.task:CountdownTask",
}


def get_task(name: str) -> Task:
    """The task `config.data.task` names."""
    if name not in TASKS:
        raise ValueError(f"config.data.task={name!r} must be one of {sorted(TASKS)}.")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)()
