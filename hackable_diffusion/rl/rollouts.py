"""Rollout batches for RL: prompts from the task, completions from the run's own sampler, rewards from the task.

`RolloutStream` is the data iterator of an RL run (`training.loop.train` draws one batch per optimizer step). Every
`inner_updates` (mu) steps it makes a new rollout: the next K prompts (`Task.rl_prompts`, a seeded permutation per
epoch), each repeated G times, completed by `Task.rollout` with the current weights (the task's jitted sampler at
the rollout temperature; row i's randomness is its own, so the G copies differ), scored by `Task.reward`, turned
into group-relative advantages and into the rows the policy scores (`Task.policy_rows`); these hooks are the task's
`tasks.capabilities.RewardTask`. For each inner update j it
draws the prompt mask (each prompt position masked with probability `prompt_mask_prob`, diffusion runs only) and,
when the objective needs them, precomputes the old policy's per-token log-probs under that mask, and the
reference's when a KL term is on (`reference_params`; without one, the KL metric compares with the old policy, and
an objective without old log-probs reports no KL). The mu batches of a rollout then go to the optimizer one per step.

Dynamic sampling (`dynamic_sampling` = D > 0; DAPO, Yu et al. 2025): a rollout is made of up to 1 + D draws, each
of the next K prompts x G completions. After each draw the groups whose G rewards all tie are set aside; drawing
stops once K informative groups are held or after 1 + D draws, and the batch keeps the first K informative groups
(`advantages.select_informative_groups`), filled up with the draws' first tied groups when fewer were found, so it
is always K x G rows (one compiled update step). The batch reports its draws (`draws`) and, as before, which
groups are informative (`valid`). With D = 0 a rollout is one draw and every group is kept, tied or not.

The stream reads the current weights through `before_step` (the loop calls it before drawing each batch, also on a
resumed run). Its checkpointed state is the rollout counter, the draw counter (the prompt position in units of K:
it equals the rollout counter without dynamic sampling), the inner index and, mid-rollout, the rollout's arrays
themselves (exact bytes), so a run resumed anywhere replays the same batches: a draw's randomness and prompts are
functions of (seed, draw index) alone, the prompt masks of (seed, rollout index).

A trajectory scorer (`scorers.TrajectoryScorer`, `needs_commit_pass`) also needs the pass at which the sampler wrote
each completion token: the stream then asks the task for it (`rollout_with_commit_order`, the task's
`tasks.capabilities.RecordsCommitOrder`) and puts it in the rows (`policy_rows(..., commit_pass=...)`) as
`commit_pass`. When the task's rows score less than the sampler wrote
(`rl.stop_at_eos` in place: `completion` ends at the first EOS), they also hold `masked`, every written position: the
scorers keep all of them masked, and the batch carries it.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion.rl.advantages import group_advantages, informative_groups, select_informative_groups

PyTree = Any


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """`config.rl`'s rollout fields: K prompts x G completions per rollout, mu updates per rollout, at most
    `dynamic_sampling` extra draws of K x G to fill the batch with informative groups (0: off)."""

    prompts_per_rollout: int
    group_size: int
    inner_updates: int = 1
    prompt_mask_prob: float = 0.0
    advantage_scale: str = "none"  # d1 and wd1: r - mean; "std": divided by the group std
    seed: int = 0
    dynamic_sampling: int = 0

    def __post_init__(self):
        if self.prompts_per_rollout < 1 or self.group_size < 1 or self.inner_updates < 1:
            raise ValueError(
                f"config.rl: prompts_per_rollout={self.prompts_per_rollout}, group_size={self.group_size} and "
                f"inner_updates={self.inner_updates} must each be >= 1."
            )
        if not 0.0 <= self.prompt_mask_prob < 1.0:
            raise ValueError(f"config.rl.prompt_mask_prob={self.prompt_mask_prob} must lie in [0, 1).")
        if self.dynamic_sampling < 0:
            raise ValueError(
                f"config.rl.dynamic_sampling={self.dynamic_sampling} must be >= 0 (the most extra draws per rollout; "
                "0 turns dynamic sampling off)."
            )

    @property
    def batch_rows(self) -> int:
        return self.prompts_per_rollout * self.group_size


def prompt_indices(num_prompts: int, draw: int, per_rollout: int, seed: int) -> np.ndarray:
    """The prompts of draw `draw` (the rollout index without dynamic sampling): consecutive slices of one seeded
    permutation per epoch."""
    positions = np.arange(draw * per_rollout, (draw + 1) * per_rollout)
    epochs, offsets = np.divmod(positions, num_prompts)
    out = np.empty(per_rollout, np.int64)
    for epoch in np.unique(epochs):  # one permutation per epoch the rollout touches (one or two)
        here = epochs == epoch
        out[here] = np.random.default_rng([seed, int(epoch)]).permutation(num_prompts)[offsets[here]]
    return out


def _encode(arrays: dict[str, np.ndarray]) -> str:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _decode(text: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(base64.b64decode(text))) as data:
        return {k: data[k] for k in data.files}


class RolloutStream:
    """The RL run's batches (see the module docstring); `prepare(step, state)` is the loop's `before_step` hook."""

    def __init__(
        self,
        *,
        exp: Any,
        settings: RolloutSettings,
        rollout_config: ml_collections.ConfigDict,
        scorer: Callable[..., Any],
        policy_params: Callable[[PyTree], PyTree],
        reference_params: Callable[[PyTree], PyTree] | None,
        needs_old_log_probs: bool,
        reward_kwargs: dict[str, Any] | None = None,
    ):
        self.exp, self.task, self.settings = exp, exp.task, settings
        self.rollout_config = rollout_config
        self.prompts = np.asarray(self.task.rl_prompts(exp))
        if len(self.prompts) == 0:
            raise ValueError(f"the {self.task.name} task gave no prompts for RL.")
        self.policy_params, self.reference_params = policy_params, reference_params
        self.needs_old = needs_old_log_probs
        self.reward_kwargs = dict(reward_kwargs or {})
        self.needs_order = bool(getattr(scorer, "needs_commit_pass", False))  # a trajectory scorer
        # tokens, completion, mask[, order][, masked=the positions the sampler wrote (`rl.stop_at_eos`)]
        self._score = jax.jit(lambda params, *rows, **masked: scorer(params, *rows, **masked)[0])
        self.rollout_index, self.draw_index, self.inner = 0, 0, 0
        self._cached: dict[str, np.ndarray] | None = None
        self._state_params: PyTree = None
        self._last_return: float | None = None
        self.last_rollout: dict[str, np.ndarray] | None = None  # the batch's prompts, completions, rewards, for reports

    # -- the loop's hooks ---------------------------------------------------------------------------------------
    def prepare(self, step: int, state) -> None:
        del step
        self._state_params = state.params

    def start_prefetch(self) -> None:  # called by grain's checkpoint handler after a restore
        pass

    def get_state(self) -> bytes:
        state = {"rollout_index": self.rollout_index, "draw_index": self.draw_index, "inner": self.inner}
        if self._cached is not None and self.inner:
            state["cached"] = _encode(self._cached)
        return json.dumps(state).encode()

    def set_state(self, state: bytes) -> None:
        data = json.loads(state.decode() if isinstance(state, bytes) else state)
        self.rollout_index, self.inner = int(data["rollout_index"]), int(data["inner"])
        self.draw_index = int(data.get("draw_index", self.rollout_index))  # saved before dynamic sampling: one each
        self._cached = _decode(data["cached"]) if "cached" in data else None
        if self.inner and self._cached is None:
            raise ValueError("the RL data state is mid-rollout but holds no rollout arrays; the checkpoint is damaged.")
        if self._cached is not None and "draws" not in self._cached:
            self._cached["draws"] = np.ones_like(self._cached["rewards"])

    def __iter__(self):
        return self

    # -- batches ------------------------------------------------------------------------------------------------
    def __next__(self) -> dict[str, np.ndarray]:
        now = time.perf_counter()
        update_seconds = now - self._last_return if self._last_return is not None else 0.0
        if self.inner == 0:
            if self._state_params is None:
                raise RuntimeError("RolloutStream needs the current weights: pass its prepare() as before_step.")
            self._cached = self.make_rollout(self._state_params, self.rollout_index, self.draw_index)
            self.rollout_index += 1
            self.draw_index += int(self._cached["draws"][0])
        cached, j = self._cached, self.inner
        batch = {k: v for k, v in cached.items() if not k.startswith("inner_") and not k.startswith("report_")}
        for key in ("prompt_masked", "old_log_probs", "ref_log_probs"):
            batch[key] = cached[f"inner_{key}"][j]
        batch["update_seconds"] = np.full((len(batch["rewards"]),), update_seconds, np.float32)
        self.inner = (self.inner + 1) % self.settings.inner_updates
        self._last_return = time.perf_counter()
        return batch

    def draw_groups(self, params: PyTree, draw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(prompts, completions, rewards, commit passes) of draw `draw`: its K prompts, each repeated G times,
        completed and scored with `params` (the policy's weights) and randomness that depends on (seed, draw) alone;
        the commit passes (the pass at which the sampler wrote each completion token) are recorded for a trajectory
        scorer only (else an empty (n, 0) array)."""
        s = self.settings
        chosen = prompt_indices(len(self.prompts), draw, s.prompts_per_rollout, s.seed)
        prompts = np.repeat(self.prompts[chosen], s.group_size, axis=0)
        seed = int(np.random.default_rng([s.seed, draw, 1]).integers(2**31 - 1))
        if self.needs_order:
            completions, order = self.task.rollout_with_commit_order(
                self.exp, params, prompts, seed=seed, config=self.rollout_config
            )
            completions, order = np.asarray(completions), np.asarray(order, np.int32)
        else:
            completions = np.asarray(
                self.task.rollout(self.exp, params, prompts, seed=seed, config=self.rollout_config)
            )
            order = np.zeros((len(completions), 0), np.int32)
        rewards = np.asarray(self.task.reward(prompts, completions, **self.reward_kwargs), np.float32)
        return prompts, completions, rewards, order

    def make_rollout(self, state_params: PyTree, rollout: int, first_draw: int | None = None) -> dict[str, np.ndarray]:
        """One rollout's arrays (every inner update's masks and log-probs included, `draws` the draws it made, from
        `first_draw` on: by default `rollout`, the draw index without dynamic sampling); see the module docstring."""
        s = self.settings
        start = time.perf_counter()
        first_draw = rollout if first_draw is None else first_draw
        params = self.policy_params(state_params)
        drawn: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        informative = 0
        for draw in range(first_draw, first_draw + 1 + s.dynamic_sampling):
            drawn.append(self.draw_groups(params, draw))
            informative += int(informative_groups(drawn[-1][2].reshape(-1, s.group_size)).sum())
            if informative >= s.prompts_per_rollout:
                break
        draws = len(drawn)
        prompts, completions, rewards, order = (np.concatenate(parts) for parts in zip(*drawn))
        kept = select_informative_groups(rewards.reshape(-1, s.group_size), s.prompts_per_rollout)
        kept_rows = (kept[:, None] * s.group_size + np.arange(s.group_size)).reshape(-1)  # group-major, as drawn
        prompts, completions, rewards, order = (x[kept_rows] for x in (prompts, completions, rewards, order))
        advantages, valid_groups = group_advantages(rewards.reshape(-1, s.group_size), scale=s.advantage_scale)
        if self.needs_order:
            rows = self.task.policy_rows(self.exp, prompts, completions, commit_pass=order)
            commit_pass = {"commit_pass": np.asarray(rows["commit_pass"], np.int32)}
        else:
            rows, commit_pass = self.task.policy_rows(self.exp, prompts, completions), {}
        tokens, completion = np.asarray(rows["tokens"], np.int32), np.asarray(rows["completion"], bool)
        scored = (jnp.asarray(tokens), jnp.asarray(completion))
        written = {"masked": np.asarray(rows["masked"], bool)} if "masked" in rows else {}  # completion cut at EOS
        written_jnp = {k: jnp.asarray(v) for k, v in written.items()}
        extra = (jnp.asarray(commit_pass["commit_pass"]),) if commit_pass else ()  # a trajectory scorer's 5th argument
        n, length = tokens.shape
        masks = np.zeros((s.inner_updates, n, length), bool)
        if s.prompt_mask_prob > 0:
            rng = np.random.default_rng([s.seed, rollout, 2])
            masks = (rng.random((s.inner_updates, n, length)) < s.prompt_mask_prob) & ~completion[None]
            if written:
                masks &= ~written["masked"][None]
        old = np.zeros((s.inner_updates, n, length), np.float32)
        ref = np.zeros((s.inner_updates, n, length), np.float32)
        reference = self.reference_params(state_params) if self.reference_params is not None else None
        for j in range(s.inner_updates):
            jm = jnp.asarray(masks[j])
            if self.needs_old:
                old[j] = np.asarray(self._score(params, *scored, jm, *extra, **written_jnp))
            if reference is not None:
                ref[j] = np.asarray(self._score(reference, *scored, jm, *extra, **written_jnp))
            elif self.needs_old:
                ref[j] = old[j]  # no KL term: the KL metric measures the drift from the rollout-time policy
        has_reference = reference is not None or self.needs_old
        seconds = time.perf_counter() - start
        self.last_rollout = {
            "prompts": prompts,
            "completions": completions,
            "rewards": rewards,
            "draws": np.asarray(draws),
            "informative_groups": np.asarray(int(valid_groups.sum())),
        }
        return {
            "tokens": tokens,
            "completion": completion,
            **written,
            **commit_pass,
            "advantages": advantages.reshape(-1),
            "valid": np.repeat(valid_groups, s.group_size).astype(np.float32),
            "rewards": rewards,
            "solved": (rewards >= 1.0).astype(np.float32),
            "rollout_seconds": np.full((n,), seconds, np.float32),
            "draws": np.full((n,), draws, np.float32),
            "has_reference": np.full((n,), float(has_reference), np.float32),
            "inner_prompt_masked": masks,
            "inner_old_log_probs": old,
            "inner_ref_log_probs": ref,
        }
