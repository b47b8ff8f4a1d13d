"""Few-step distillation methods: what a k-step student learns from one N-step teacher trajectory.

A teacher trajectory is the canvas before the first step and after each of the teacher's N denoising steps,
(N + 1, b, c). The student will denoise in k = N / m steps, so its step i starts where the teacher stood after i * m
of its steps: state_i = trajectory[i * m], i = 0 .. k - 1. Each method turns a trajectory into k training rows per
canvas: the state the student reads, a target token per position and a weight per position (0: not in the loss).
The student's loss is the weighted cross-entropy of its one-pass logits at the state (`student_loss.py`).

* `TrajectoryDistillation` follows Self-Distillation Through Time (SDTT; Deschenaux & Gulcehre, ICLR 2025) for masking
  runs: one student step does what m teacher steps did. Targets are the tokens the teacher decided during its steps
  i*m .. (i+1)*m - 1 (positions masked in state_i and decided in state_{i+1}), weight 1; every other position still
  masked at state_i gets the teacher's final token with weight `rest_weight`. Deliberate differences: SDTT matches
  the teacher's soft distribution after two of its steps and doubles the step size round by round; here the target
  is the sampled token of the whole m-step span in one round (the teacher runs at its own temperature, so the targets
  are draws from its joint, and their average over trajectories is its marginal).
* `ConsistencyDistillation` follows the idea of DUO's discrete consistency distillation (Sahoo et al., ICML 2025):
  with a deterministic teacher (tokens drawn near-greedily) the trajectory is a function of its start, so every
  state along it should map to the same end: targets are the teacher's final tokens at every position the state has
  not settled (masking: still masked; uniform: every free position), weight 1. Deliberate differences: DUO distils a
  uniform-state model through its Gaussian-relaxed deterministic sampler; here the teacher is the toolbox's own
  sampler at temperature ~0 and the method runs for masking and uniform runs alike (for masking runs the randomness
  of the output then comes from the prompt alone: the steps frontier reports unigram/bigram entropy for that).

* `FixedOrderDistillation` is sequence-level knowledge distillation (Kim & Rush, EMNLP 2016) in the student's own
  decoding order: the teacher's final canvases are the data, and the student learns to write them in k steps of the
  `dilated` order (DUS, Luxembourg et al. 2025; `sampling/selection.py`), which is fixed in advance, so the state
  each student step starts from is known without the teacher having walked through it: the positions of earlier
  steps hold the teacher's tokens, every other free position holds noise (masking: the mask token; uniform: a token
  drawn from the process's prior, fresh per row), and the targets are the teacher's tokens at the positions of this
  step (weight 1) and at later ones (`rest_weight`). Any teacher sampler serves (its best one), and it applies to
  uniform runs, whose student then samples with `sampler.commit` (a decided token stays, the rest is re-noised each
  step, the states it was trained on). Deliberate difference from the trajectory method: the teacher's intermediate
  canvases are not read, only where it ended.

Fixed positions (puzzle givens, infill context) never carry a target.

* `ReverseKLDistillation` needs no teacher trajectories: the student samples on-policy and a policy gradient moves
  it towards the teacher's likelihood (`reverse_kl.py`, DiDi-Instruct's idea with the teacher's ELBO as the density).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Bool, Float, Int

from hackable_diffusion.sampling.scores import dilated_rank

def student_grid(num_teacher_steps: int, num_student_steps: int) -> int:
    """m, the teacher steps per student step; ValueError unless the student's steps divide the teacher's."""
    if num_student_steps < 1 or num_teacher_steps < num_student_steps or num_teacher_steps % num_student_steps:
        raise ValueError(
            f"config.distill.student_steps={num_student_steps} must divide config.distill.teacher_steps="
            f"{num_teacher_steps} (the student's step i starts where the teacher stood after i * N / k steps)."
        )
    return num_teacher_steps // num_student_steps


@dataclasses.dataclass(frozen=True)
class StudentRows:
    """k training rows per canvas: states (b, k, c), targets (b, k, c), weights (b, k, c) float32."""

    states: Int[np.ndarray, "b k c"]
    targets: Int[np.ndarray, "b k c"]
    weights: Float[np.ndarray, "b k c"]


def _states(trajectory: np.ndarray, m: int, k: int) -> np.ndarray:
    return np.stack([trajectory[i * m] for i in range(k)], axis=1)  # (b, k, c)


def _check(trajectory: np.ndarray, fixed: np.ndarray) -> None:
    if trajectory.ndim != 3 or fixed.shape != trajectory.shape[1:]:
        raise ValueError(
            f"trajectory must be (N + 1, b, c) and fixed (b, c); got {trajectory.shape} and {fixed.shape}."
        )


@dataclasses.dataclass(frozen=True)
class TrajectoryDistillation:
    """SDTT-style (see the module docstring): student step i learns the tokens of teacher steps i*m .. (i+1)*m - 1."""

    student_steps: int
    rest_weight: float = 0.0
    name = "trajectory"
    greedy_teacher = False  # the teacher samples at its own temperature
    on_policy = False  # trains on cached teacher trajectories

    def __post_init__(self):
        if self.rest_weight < 0:
            raise ValueError(f"config.distill.rest_weight={self.rest_weight} must be >= 0.")

    def check_process(self, persistent: bool) -> None:
        if not persistent:
            raise ValueError(
                "config.distill.method='trajectory' needs a masking run (decided tokens stay decided); a uniform run "
                "re-noises every undecided position each step: use method='consistency'."
            )

    def __call__(
        self, trajectory: Int[np.ndarray, "n1 b c"], fixed: Bool[np.ndarray, "b c"], mask_id: int
    ) -> StudentRows:
        _check(trajectory, fixed)
        k = self.student_steps
        m = student_grid(trajectory.shape[0] - 1, k)
        states = _states(trajectory, m, k)
        after = np.stack([trajectory[(i + 1) * m] for i in range(k)], axis=1)
        final = np.broadcast_to(trajectory[-1][:, None], states.shape)
        open_ = (states == mask_id) & ~fixed[:, None]
        decided = open_ & (after != mask_id)
        targets = np.where(decided, after, final)
        weights = np.where(decided, 1.0, np.where(open_, self.rest_weight, 0.0)).astype(np.float32)
        return StudentRows(states.astype(np.int32), targets.astype(np.int32), weights)


@dataclasses.dataclass(frozen=True)
class ConsistencyDistillation:
    """DUO-style consistency (see the module docstring): every state of a greedy trajectory maps to its end."""

    student_steps: int
    name = "consistency"
    greedy_teacher = True
    on_policy = False

    def check_process(self, persistent: bool) -> None:
        del persistent  # both processes

    def __call__(
        self, trajectory: Int[np.ndarray, "n1 b c"], fixed: Bool[np.ndarray, "b c"], mask_id: int | None
    ) -> StudentRows:
        _check(trajectory, fixed)
        k = self.student_steps
        m = student_grid(trajectory.shape[0] - 1, k)
        states = _states(trajectory, m, k)
        final = np.broadcast_to(trajectory[-1][:, None], states.shape)
        free = ~np.broadcast_to(fixed[:, None], states.shape)
        open_ = free if mask_id is None else free & (states == mask_id)
        return StudentRows(states.astype(np.int32), final.astype(np.int32), open_.astype(np.float32))


def dilated_decision_steps(free: Bool[np.ndarray, "b c"], num_steps: int) -> Int[np.ndarray, "b c"]:
    """The step (from 0) at which the `dilated` rule (the dilated order, an even count per step) decides each free
    position of a canvas sampled in `num_steps` steps; -1 at fixed positions. Mirrors `TopK(DilatedOrder(),
    EvenCount())` on a sampler that keeps its decisions: after step i, (i + 1) * (n // S) + min(i + 1, n % S) of the
    row's n free positions are decided, taken in the dilated order."""
    free = np.asarray(free, bool)
    b, c = free.shape
    rank = dilated_rank(c)
    order = np.argsort(np.where(free, rank, c + rank), axis=1, kind="stable")  # free positions first, by rank
    place = np.empty((b, c), np.int64)
    np.put_along_axis(place, order, np.broadcast_to(np.arange(c), (b, c)), axis=1)
    n = free.sum(axis=1)
    done = np.arange(1, num_steps + 1)[None, :]
    decided_after = done * (n // num_steps)[:, None] + np.minimum(done, (n % num_steps)[:, None])  # (b, S)
    step = np.sum(place[:, :, None] >= decided_after[:, None, :], axis=-1)
    return np.where(free, step, -1).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class FixedOrderDistillation:
    """Sequence-level distillation in the dilated order (see the module docstring): student step i reads the teacher's
    end canvas at the positions of steps < i and noise elsewhere, and learns its tokens at the positions of step i."""

    student_steps: int
    rest_weight: float = 0.0
    name = "fixed_order"
    greedy_teacher = False  # the teacher samples at its own temperature
    on_policy = False
    needs_noise = True  # uniform runs: the states' undecided positions hold draws from the prior (`noise`)
    student_rule = "dilated"

    def __post_init__(self):
        if self.rest_weight < 0:
            raise ValueError(f"config.distill.rest_weight={self.rest_weight} must be >= 0.")

    def check_process(self, persistent: bool) -> None:
        del persistent  # both processes: a uniform student samples with sampler.commit

    def __call__(
        self,
        trajectory: Int[np.ndarray, "n1 b c"],
        fixed: Bool[np.ndarray, "b c"],
        mask_id: int | None,
        noise: Int[np.ndarray, "b k c"] | None = None,
    ) -> StudentRows:
        _check(trajectory, fixed)
        k = self.student_steps
        final = trajectory[-1]
        b, c = final.shape
        if mask_id is None and (noise is None or noise.shape != (b, k, c)):
            raise ValueError(f"a uniform run's fixed-order rows need noise tokens of shape {(b, k, c)}.")
        step = dilated_decision_steps(~np.asarray(fixed, bool), k)[:, None, :]  # (b, 1, c)
        now = np.arange(k)[None, :, None]
        written = np.asarray(fixed, bool)[:, None, :] | ((step >= 0) & (step < now))
        filler = np.full((b, k, c), mask_id, np.int32) if mask_id is not None else noise
        states = np.where(written, final[:, None, :], filler)
        weights = np.where(step == now, 1.0, np.where(step > now, self.rest_weight, 0.0)).astype(np.float32)
        targets = np.broadcast_to(final[:, None, :], (b, k, c))
        return StudentRows(states.astype(np.int32), targets.astype(np.int32), weights)


@dataclasses.dataclass(frozen=True)
class ReverseKLDistillation:
    """On-policy reverse KL to the teacher's likelihood (`reverse_kl.py`): G student samples per prompt, each scored
    by its exact path log-probability and the teacher's ELBO from `elbo_draws` passes, its logits divided by
    `target_temperature` (0: the sampler's temperature at each noise level); `target_sharpness` beta aims at
    p_teacher^beta; `shared_noise`: a prompt's G samples share their ELBO draws' noise (common random numbers);
    `exact_entropy`: the student's log q terms by their exact conditional expectations (Rao-Blackwell)."""

    student_steps: int
    group_size: int = 4
    elbo_draws: int = 4
    target_sharpness: float = 1.0
    target_temperature: float = 1.0
    shared_noise: bool = False
    exact_entropy: bool = False
    name = "reverse_kl"
    greedy_teacher = False
    on_policy = True  # no teacher trajectories: the student's own samples, scored by the teacher

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"config.distill.group_size={self.group_size} must be >= 2 (the leave-one-out baseline).")
        if self.elbo_draws < 1:
            raise ValueError(f"config.distill.elbo_draws={self.elbo_draws} must be >= 1.")
        if not self.target_sharpness > 0:
            raise ValueError(f"config.distill.target_sharpness={self.target_sharpness} must be > 0.")
        if self.target_temperature < 0:
            raise ValueError(
                f"config.distill.target_temperature={self.target_temperature} must be > 0, or 0 for the sampler's own "
                "temperature at each noise level."
            )

    def check_process(self, persistent: bool) -> None:
        if not persistent:
            raise ValueError(
                "config.distill.method='reverse_kl' needs a masking run (a path's probability is a product over "
                "committed tokens); a uniform run re-noises positions: use method='consistency'."
            )


DistillationMethod = TrajectoryDistillation | ConsistencyDistillation | FixedOrderDistillation | ReverseKLDistillation
#: config.distill.method -> its class; a method's dataclass fields are read from the keys of config.distill of the same
#: name (the settings default each to the field's default), so a method with new parameters is this file alone
METHODS = {
    cls.name: cls
    for cls in (TrajectoryDistillation, ConsistencyDistillation, ReverseKLDistillation, FixedOrderDistillation)
}


def method_settings() -> dict[str, object]:
    """Every method's fields with their defaults (the first method to name a field gives its default): the keys a
    `config.distill` section may hold for them."""
    settings: dict[str, object] = {}
    for cls in METHODS.values():
        for field in dataclasses.fields(cls):  # a field without a default (student_steps) is the run's key: None
            settings.setdefault(field.name, None if field.default is dataclasses.MISSING else field.default)
    return settings


def build_method(section) -> DistillationMethod:
    """The method `section.method` names, built from the section's keys named as its fields: `cls(**those keys)`."""
    name = str(section["method"])
    if name not in METHODS:
        raise ValueError(f"config.distill.method={name!r} must be one of {tuple(METHODS)}.")
    cls = METHODS[name]
    given = {f.name: section[f.name] for f in dataclasses.fields(cls) if f.name in section}
    return cls(**given)
