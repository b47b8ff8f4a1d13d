"""What the puzzle tasks (Sudoku, Countdown) share: `PuzzleTask`, the part of `tasks.Task` that is the same for any
task whose rows are generated puzzles with a fixed prompt part and a verifiable answer.

A puzzle task is a package with the same roles in the same module names: `layouts.py` (how the rows are laid out and
the objective adapted to them: `check_layout`, `adapt_objective`), `data.py` (`check_data_config`, `build_data`, and
`make_train_iterator` over the (tokens, fixed) rows), `evaluation.py` (the flags of `evaluate`: `define_flags`,
`from_flags`) and `held_out.py` (the loss bound and the solved-puzzle scores that the training loop's evaluation and
`evaluate` share). A subclass names those modules and what differs: its sampler checks, its held-out scores, its
default config.
"""

from __future__ import annotations

import abc
import dataclasses
import types
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import ml_collections

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class PuzzleTask(abc.ABC):
    """`tasks.Task` for a puzzle package; a subclass sets the ClassVars and defines the three abstract methods (a
    subclass without them cannot be instantiated)."""

    name: ClassVar[str]
    layouts: ClassVar[types.ModuleType]  # check_layout(config), adapt_objective(config, model, objective)
    data: ClassVar[types.ModuleType]  # check_data_config, build_data, make_train_iterator
    evaluation: ClassVar[types.ModuleType]  # define_flags(flag_values), from_flags(flag_values)
    eval_count_key: ClassVar[str]  # the `config.eval` key: how many held-out puzzles each evaluation solves

    # -- what differs between the puzzle tasks -------------------------------------------------------------------------
    def check_sampler(self, config: ml_collections.ConfigDict) -> None:
        """The task's own sampler/solver checks (after the layout and data checks)."""

    @abc.abstractmethod
    def held_out_loss(self, exp: Experiment, params: Any, num_batches: int) -> dict:
        """The held-out loss bound on `num_batches` batches (the training loop's evaluation)."""

    @abc.abstractmethod
    def held_out_scores(self, exp: Experiment, params: Any, num: int) -> dict:
        """Scores of `num` held-out puzzles solved with the run's sampler."""

    @abc.abstractmethod
    def default_config(self) -> ml_collections.ConfigDict:
        """A config of the task (stands in for a saved config when a command line is only checked)."""

    def train_iterator_options(self, config: ml_collections.ConfigDict) -> dict:
        """Keyword arguments of the task's `data.make_train_iterator` beyond the rows, batch, seed and shard."""
        return {}

    # -- the same for every puzzle task --------------------------------------------------------------------------------
    def check_config(self, config: ml_collections.ConfigDict) -> None:
        self.layouts.check_layout(config)
        self.data.check_data_config(config)
        self.check_sampler(config)

    def upgrade_saved_config(self, config: ml_collections.ConfigDict) -> None:
        pass  # a task whose keys changed overrides this

    def build_data(self, config: ml_collections.ConfigDict, workdir: str):
        self.layouts.check_layout(config)
        return self.data.build_data(config)

    def adapt_objective(self, config, model, objective):
        return self.layouts.adapt_objective(config, model, objective)

    def train_iterator(self, exp: Experiment, process_index: int, process_count: int):
        return self.data.make_train_iterator(
            exp.data.train_tokens,
            exp.data.train_fixed,
            exp.config.data.batch_size,
            exp.config.seed,
            process_index=process_index,
            process_count=process_count,
            **self.train_iterator_options(exp.config),
        )

    def eval_fn(self, exp: Experiment, workdir: str):
        """The held-out loss bound on `eval.num_batches` batches, and with `eval.<eval_count_key>` > 0 that many
        held-out puzzles solved (single-process runs: the solver's loop runs on the host)."""
        config = exp.config

        def evaluate(params, ema_params):
            use = ema_params if ema_params is not None else params
            out = self.held_out_loss(exp, use, config.eval.num_batches)
            num = config.eval.get(self.eval_count_key, 0)
            if num and jax.process_count() == 1:
                out.update(self.held_out_scores(exp, use, num))
            return {k: v for k, v in out.items() if isinstance(v, (int, float))}

        return evaluate

    def define_evaluation_flags(self, flag_values) -> None:
        self.evaluation.define_flags(flag_values)

    def evaluation_from_flags(self, flag_values):
        return self.evaluation.from_flags(flag_values)
