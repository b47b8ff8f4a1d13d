"""The Countdown task (`config.data.task="countdown"`): `tasks.Task` for arithmetic puzzles with a verifiable answer.

Countdown as d1 (Zhao et al. 2025, "d1: Scaling Reasoning in Diffusion Large Language Models via Reinforcement
Learning") and TinyZero use it: given 3-4 numbers and a target, write an expression over the numbers (each at most
once; + - * / and parentheses) equal to the target. d1 prompts an instruction-tuned LLaDA in natural language and
scores the equation in its answer; here a small model is trained from scratch on a fixed character vocabulary
(`vocab.py`), with the problem as a short prompt and the bare expression as the completion (`layouts.py`): masking
diffusion in place, or the autoregressive baseline on the same backbone. Problems are generated with difficulty
knobs (`problems.py`), and answers are checked exactly with rationals (`expressions.py`), where TinyZero's reward
evaluates them in floating point.

Scores (`held_out.py`, which `evaluation.py` shares): the exact-answer rate overall and by the number of given numbers,
problems per second, forward passes per problem, and the held-out loss. For reinforcement learning from the verifier
the task has the capabilities `RewardTask` (`rl_prompts`, `rollout`, `reward`, `policy_rows`) and
`CutsCompletionsAtEos` (`rl.stop_at_eos`) and `RestrictsRolloutTokens` of `tasks/capabilities.py`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import ml_collections
import numpy as np
from jaxtyping import Bool, Float, Int

from hackable_diffusion.data.tokenizers import EOS_ID
from hackable_diffusion.tasks.countdown import data as data_lib
from hackable_diffusion.tasks.countdown import evaluation, layouts, rewards
from hackable_diffusion.tasks.countdown.held_out import evaluate_problems, held_out_loss, held_out_scores
from hackable_diffusion.tasks.countdown.inference import forbidden_tokens, solve_problems
from hackable_diffusion.tasks.countdown.recipes import countdown_config
from hackable_diffusion.tasks.puzzle_task import PuzzleTask

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class CountdownTask(PuzzleTask):
    name: ClassVar[str] = "countdown"
    layouts: ClassVar = layouts
    data: ClassVar = data_lib
    evaluation: ClassVar = evaluation
    eval_count_key: ClassVar[str] = "num_problems"
    completion_end_id: ClassVar[int] = EOS_ID  # `CutsCompletionsAtEos`: a completion ends at its first EOS

    def check_sampler(self, config: ml_collections.ConfigDict) -> None:
        if int(config.sampler.num_steps) < 1:
            raise ValueError(f"config.sampler.num_steps={config.sampler.num_steps} must be >= 1.")

    def held_out_loss(self, exp: Experiment, params, num_batches: int) -> dict:
        return held_out_loss(exp, params, num_batches=num_batches)

    def held_out_scores(self, exp: Experiment, params, num: int) -> dict:
        return held_out_scores(exp, params, num)

    def report(self, exp: Experiment, params) -> str:
        num = min(exp.config.eval.num_problems or 16, len(exp.data.eval_problems))
        problems = exp.data.eval_problems.subset(np.arange(num))
        out = evaluate_problems(exp, params, problems, seed=exp.config.seed, batch_size=exp.config.eval.batch_size)
        example = out["examples"][0]
        return (
            f"Solved held-out Countdown problems: exact {out['accuracy']:.3f} over {out['count']} problems "
            f"({out['forward_passes_per_problem']:.1f} forward passes each); e.g. {example['prompt']} -> "
            f"{example['answer']!r} ({'right' if example['correct'] else 'wrong'})"
        )

    def default_config(self) -> ml_collections.ConfigDict:
        return countdown_config()

    # -- RL from the verifier: `RewardTask`, `CutsCompletionsAtEos`, `RestrictsRolloutTokens` (tasks/capabilities.py)
    def rl_prompts(self, exp: Experiment) -> Int[np.ndarray, "n p"]:
        """The training problems' prompts as int32 token rows."""
        return data_lib.prompt_rows(exp.data.train_problems, int(exp.config.data.prompt_len))

    def rollout(
        self, exp: Experiment, params, prompts: Int[np.ndarray, "n p"], *, seed: int, config
    ) -> Int[np.ndarray, "n c"]:
        """One sampled completion per prompt row (int32), with the sampler settings of `config`."""
        batch_size = int(config.eval.batch_size)
        return solve_problems(exp, params, prompts, seed=seed, batch_size=batch_size, config=config)

    def rollout_forbidden_tokens(self, exp: Experiment) -> tuple[int, ...]:
        """`RestrictsRolloutTokens`: what the layout's sampler never draws (`inference.forbidden_tokens`)."""
        return forbidden_tokens(exp.config)

    def reward(self, prompts: Int[np.ndarray, "n p"], completions: Int[np.ndarray, "n c"]) -> Float[np.ndarray, " n"]:
        """1.0 for an exact answer, 0.0 otherwise (malformed included); float32, never raises on token content."""
        return rewards.row_rewards(prompts, completions)

    def policy_rows(
        self, exp: Experiment, prompts: Int[np.ndarray, "n p"], completions: Int[np.ndarray, "n c"]
    ) -> dict[str, np.ndarray]:
        """{"tokens": int32 (n, P + C), "completion": bool (n, P + C)}: the row the policy scored and the positions
        it generated: in place, all C (the sampler writes the PAD tail too), or with `rl.stop_at_eos` those up to
        and including the first EOS, as d1 scores LLaDA's, plus "masked": all C, which the scorer keeps masked (the
        scored pass must not see where the completion ended); AR, up to and including the first EOS (the sampler
        stops there and pads: those positions were never drawn, and AR training leaves them out)."""
        d = exp.config.data
        ar = layouts.layout_of(exp.config) == "ar"
        cut = ar or bool(exp.config.get("rl", {}).get("stop_at_eos", False))
        rows = policy_rows(prompts, completions, int(d.prompt_len), int(d.completion_len), stop_at_eos=cut)
        if cut and not ar:
            rows["masked"] = policy_rows(prompts, completions, int(d.prompt_len), int(d.completion_len))["completion"]
        return rows


def policy_rows(
    prompts: Int[np.ndarray, "n p"],
    completions: Int[np.ndarray, "n c"],
    prompt_len: int,
    completion_len: int,
    *,
    stop_at_eos: bool = False,
) -> dict[str, np.ndarray]:
    """The rows [prompt; completion] and the completion positions the policy drew: all C, or with `stop_at_eos` those
    up to and including the first EOS (all C when there is none), as d1 and wd1 mask their completions."""
    prompts, completions = np.asarray(prompts, np.int32), np.asarray(completions, np.int32)
    n = len(prompts)
    if prompts.shape != (n, prompt_len) or completions.shape != (n, completion_len):
        raise ValueError(
            f"prompts must be (n, {prompt_len}) and completions (n, {completion_len}), got {prompts.shape} and "
            f"{completions.shape}."
        )
    completion: Bool[np.ndarray, "n l"] = np.zeros((n, prompt_len + completion_len), bool)
    drawn = np.ones((n, completion_len), bool)
    if stop_at_eos:
        is_eos = completions == EOS_ID
        drawn = (np.cumsum(is_eos, axis=1) - is_eos) == 0  # nothing before it is an EOS: up to the first, included
    completion[:, prompt_len:] = drawn
    return {"tokens": np.concatenate([prompts, completions], axis=1), "completion": completion}
