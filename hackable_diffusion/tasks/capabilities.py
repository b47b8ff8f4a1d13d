"""What some tasks can do beyond `tasks.Task`: one `typing.Protocol` per capability, checked with `isinstance`.

A task has a capability when it defines the protocol's members (no registration, no flag that other tasks set to
False). Generic code asks `isinstance(exp.task, Capability)` before it calls a member, never the task's name, and
`require` gives its one-line error when a task lacks one.

| capability | read by | tasks |
|---|---|---|
| `HasCanvasSampler` | `distill.command.teacher_sampler` (else the run's generic sampler) | sudoku |
| `RewardTask` | `rl.command.setup`, `rl.rollouts.RolloutStream` | sudoku, countdown |
| `RecordsCommitOrder` | `rl.command.build_objective` (`rl.scorer='trajectory'`), `rl.rollouts.RolloutStream` | sudoku |
| `CutsCompletionsAtEos` | `rl.command.check_rl_config` (`rl.stop_at_eos=True`) | countdown |
| `RestrictsRolloutTokens` | `rl.command.build_objective` (the scorers' `forbidden_tokens`) | sudoku, countdown |
| `ScoresLmEvalPuzzles` | `evals.lm_eval_adapter.request_answerers` | sudoku |
| `GeneratesText` | `sample`, `serve.command.load_engine`, `evals.scoring.Scorer` (and so the lm-eval adapter) | text |
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: the entry points import this module before their flags are parsed
    import ml_collections
    import numpy as np
    from jaxtyping import Float, Int

    from hackable_diffusion.experiment import Experiment
    from hackable_diffusion.sampling.generate import GenerationResult
    from hackable_diffusion.sampling.sampler import DiffusionSampler


@runtime_checkable
class HasCanvasSampler(Protocol):
    """A task that samples with a canvas sampler of its own (Sudoku: the in-place sampler with the solver's rules and
    symmetry views). Read by `distill.command.teacher_sampler`: the teacher's trajectories come from this sampler;
    a task without it gets the run's generic sampler (`builders.build_sampler`)."""

    def canvas_sampler(self, exp: Experiment, config: ml_collections.ConfigDict) -> DiffusionSampler:
        """The sampler, with the sampler (and task) settings of `config`."""


@runtime_checkable
class RewardTask(Protocol):
    """A task that reinforcement learning from a verifiable reward can train (`python -m hackable_diffusion.rl`).
    Checked by `rl.command.setup`; `rl.rollouts.RolloutStream` calls the four hooks."""

    def rl_prompts(self, exp: Experiment) -> Any:
        """The prompts RL trains on: an array with one problem per row, in the task's own encoding."""

    def rollout(self, exp: Experiment, params: Any, prompts: Any, *, seed: int, config: Any) -> Any:
        """One completion per prompt row from the run's jitted sampler (`config.sampler`: RL sets the temperature);
        row i's randomness depends on (seed, i) alone."""

    def reward(self, prompts: Any, completions: Any) -> Float[np.ndarray, " n"]:
        """float32 (n,): 1.0 for an exactly right completion, 0.0 for a wrong or malformed one (never an exception);
        a task may accept keyword options such as Sudoku's `shaped=True` partial credit (< 1)."""

    def policy_rows(self, exp: Experiment, prompts: Any, completions: Any) -> dict[str, np.ndarray]:
        """`{"tokens": int32 (n, l), "completion": bool (n, l)}`: the sequence the policy scores and which of its
        positions the sampler generated (in place: the blanks; AR: the continuation after the prompt); rows that
        score less than the sampler wrote also give `masked`, every written position."""


@runtime_checkable
class RecordsCommitOrder(RewardTask, Protocol):
    """A `RewardTask` whose rollouts record the sampler pass that wrote each completion token (Sudoku's in-place
    sampler). Read by `rl.command.build_objective`, which refuses `rl.scorer='trajectory'` without it, and by
    `rl.rollouts.RolloutStream`, which calls these two for a trajectory scorer."""

    def rollout_with_commit_order(
        self, exp: Experiment, params: Any, prompts: Any, *, seed: int, config: Any
    ) -> tuple[Any, Int[np.ndarray, "n l"]]:
        """`rollout`'s completions and, per completion token, the sampler pass that wrote it (-1 where none did)."""

    def policy_rows(
        self, exp: Experiment, prompts: Any, completions: Any, commit_pass: Any = None
    ) -> dict[str, np.ndarray]:
        """`RewardTask.policy_rows`; with `commit_pass=` the rows also carry it as `commit_pass` int32 (n, l)."""


@runtime_checkable
class CutsCompletionsAtEos(Protocol):
    """A task whose completions end at an end token, so that `rl.stop_at_eos=True` can score each one up to and
    including its first (d1's masking of LLaDA's completions; Countdown). Read by `rl.command.check_rl_config`, which
    refuses `rl.stop_at_eos=True` for a task without it; the task's `policy_rows` makes the cut."""

    completion_end_id: int  # the token id that ends a completion


@runtime_checkable
class RestrictsRolloutTokens(Protocol):
    """A task whose rollouts never draw some token ids: the sampler removes their logits before every draw (Sudoku:
    every non-digit; Countdown: BOS in place, PAD, BOS and MASK left to right). Read by `rl.command.build_objective`,
    which removes the same ids from the scorers' softmax, so that a scored log-prob is over the support the sampler
    drew from; a task without it is scored over the whole vocabulary (the diffusion scorers less the mask token)."""

    def rollout_forbidden_tokens(self, exp: Experiment) -> tuple[int, ...]:
        """The ids the run's rollouts (`RewardTask.rollout`, this run's layout) never draw."""


class LmEvalPuzzleAnswerer(Protocol):
    """What `ScoresLmEvalPuzzles.lm_eval_puzzle_answerer` returns: it answers puzzle texts with the run's solver and
    keeps what the answers cost."""

    exp: Experiment
    seed: int

    def __call__(self, contexts: Sequence[str], progress: Callable[[int], None] | None = None) -> list[str]:
        """One answer text per request context; `progress(n)` after every n answered."""

    def info(self) -> dict:
        """The solver settings and the forward passes per answered puzzle, for lm-eval's model info."""


@runtime_checkable
class ScoresLmEvalPuzzles(Protocol):
    """A task whose runs answer lm-eval generation requests that hold a puzzle as text (Sudoku: the `hd_sudoku_solve`
    task of `evals/lm_eval_tasks/`) with the run's own solver, and no log-likelihood requests. Read by
    `evals.lm_eval_adapter.request_answerers`, which asks the task for its answerer instead of the text scorer."""

    def lm_eval_puzzle_answerer(
        self, exp: Experiment, params: Any, *, seed: int, batch_size: int
    ) -> LmEvalPuzzleAnswerer:
        """The answerer of the run's puzzle requests (`batch_size` puzzles a solver batch)."""


@runtime_checkable
class GeneratesText(Protocol):
    """A task whose rows are text of the run's tokenizer, so that a text prompt can be continued (the text task).
    Read by `python -m hackable_diffusion.sample`, the server (`serve.command.load_engine`) and the lm-eval text
    scorer (`evals.scoring.Scorer`, which generates through it), which refuse a run whose task lacks it."""

    def generate_tokens(
        self,
        exp: Experiment,
        params: Any,
        prompts: Any,
        *,
        key: Any,
        max_new_tokens: int,
        prompt_mask: Any = None,
        return_trajectory: bool = False,
    ) -> GenerationResult:
        """The run's own decoding after token-id prompts (`sampling.generate`'s `prompts`, `prompt_mask`, `key`)."""


def require(task: Any, capability: type, needed_by: str, fix: str = "") -> None:
    """Nothing when `task` has `capability`; else a one-line ValueError naming the capability, what needs it
    (`needed_by`) and, when given, what to do instead (`fix`)."""
    if isinstance(task, capability):
        return
    instead = f": {fix}" if fix else ""
    raise ValueError(
        f"{needed_by} needs a task with the {capability.__name__} capability (hackable_diffusion.tasks.capabilities); "
        f"the {task.name!r} task lacks it{instead}."
    )
