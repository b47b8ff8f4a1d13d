"""What `python -m hackable_diffusion.evaluate` measures on a Countdown run: generated held-out problems answered
with the run's sampler, scored by the exact verifier.

The problems come from the generator (`--num_problems`, `--problem_seed`, a seed other than the run's training
generator seed) with the run's difficulty knobs unless a flag sets one (`--countdown_numbers=4`,
`--countdown_number_range=1,100`, `--countdown_target_range=1,999`, `--countdown_division=false`); problems of the
training set are dropped. The result carries the exact-answer rate overall and by label ("3 numbers" /
"4 numbers"), forward passes per problem, problems per second after one compile batch, and a few examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from absl import flags

from hackable_diffusion.recipes import sampler_report
from hackable_diffusion.tasks.countdown import data as data_lib
from hackable_diffusion.tasks.countdown import problems as problems_lib
from hackable_diffusion.tasks.countdown.layouts import layout_of
from hackable_diffusion.tasks.countdown.held_out import evaluate_problems

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class SolveProblems:
    """Answers `num_problems` generated problems (generator seed `seed`) with a Countdown run; a knob left None takes
    the run's value."""

    num_problems: int = 1000
    seed: int = 7
    num_numbers: tuple[int, ...] | None = None
    number_range: tuple[int, int] | None = None
    target_range: tuple[int, int] | None = None
    allow_division: bool | None = None
    batch_size: int = 0  # 0 = 256

    def __post_init__(self):
        if self.num_problems < 1:
            raise ValueError(f"--num_problems={self.num_problems} must be >= 1.")
        if self.batch_size < 0:
            raise ValueError(f"--batch_size={self.batch_size} must be >= 0 (0: 256 problems a batch).")

    def spec(self, config) -> problems_lib.ProblemSpec:
        """The knobs of the problems: the flags' where set, else the run's."""
        run = data_lib.problem_spec(config)
        return dataclasses.replace(
            run,
            num_numbers=self.num_numbers or run.num_numbers,
            number_range=self.number_range or run.number_range,
            target_range=self.target_range or run.target_range,
            allow_division=run.allow_division if self.allow_division is None else self.allow_division,
        )

    def __call__(self, exp: Experiment, params: Any, *, seed: int, load_run: Callable[[str], tuple]) -> dict:
        del load_run  # a Countdown evaluation reads no other run
        config = exp.config
        exp.task.check_config(config)
        if self.seed == int(config.data.generator_seed):
            raise ValueError(
                f"--problem_seed={self.seed} is the run's training generator seed; pick another seed for held-out "
                "problems."
            )
        spec = self.spec(config)
        longest = data_lib.longest_prompt(spec)
        if longest > int(config.data.prompt_len) or data_lib.longest_completion(spec) > int(config.data.completion_len):
            raise ValueError(
                f"problems with these knobs need prompts of {longest} and answers of "
                f"{data_lib.longest_completion(spec)} tokens; the run's rows hold {config.data.prompt_len} and "
                f"{config.data.completion_len}."
            )
        generated = problems_lib.generate_problems(
            self.num_problems,
            self.seed,
            **dataclasses.asdict(spec),
            cache_dir=config.data.get("cache_dir") or "default",
        )
        problems, dropped = data_lib.without_training_problems(generated, exp.data.train_problems)
        if not len(problems):
            raise ValueError("every generated problem is in the training set; ask for more or other problems.")
        scores = evaluate_problems(exp, params, problems, seed=seed, batch_size=self.batch_size or 256)
        head = {
            "problems": dataclasses.asdict(spec) | {"num_problems": self.num_problems, "seed": self.seed},
            "dropped_as_in_training": dropped,
            "layout": layout_of(config),
            "sampler": sampler_report(config),
        }
        return {**head, **scores}


def define_flags(flag_values: flags.FlagValues) -> None:
    """The flags `evaluate` takes for a Countdown run."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_integer("num_problems", 1000, "countdown: how many problems to generate.", **fv)
    flags.DEFINE_integer(
        "problem_seed", 7, "countdown: the generator seed of the problems (not the training seed).", **fv
    )
    flags.DEFINE_list(
        "countdown_numbers", None, "countdown: how many numbers a problem gives, e.g. 3,4 (default: the run's).", **fv
    )
    flags.DEFINE_list(
        "countdown_number_range", None, "countdown: LO,HI of the given numbers (default: the run's).", **fv
    )
    flags.DEFINE_list("countdown_target_range", None, "countdown: LO,HI of the targets (default: the run's).", **fv)
    flags.DEFINE_enum(
        "countdown_division", "run", ["run", "true", "false"], "countdown: allow division (run: as the run).", **fv
    )


def _integers(name: str, values: list[str] | None, count: int | None) -> tuple[int, ...] | None:
    if not values:
        return None
    try:
        out = tuple(int(v) for v in values)
    except ValueError:
        raise ValueError(f"--{name}={','.join(values)} must be integers.") from None
    if count is not None and len(out) != count:
        raise ValueError(f"--{name}={','.join(values)} must be {count} integers LO,HI.")
    return out


def from_flags(flag_values: flags.FlagValues) -> SolveProblems:
    """The evaluation the flags describe (`batch_size` is a flag of `evaluate` itself)."""
    f = flag_values
    division = {"run": None, "true": True, "false": False}[f.countdown_division]
    return SolveProblems(
        num_problems=f.num_problems,
        seed=f.problem_seed,
        num_numbers=_integers("countdown_numbers", f.countdown_numbers, None),
        number_range=_integers("countdown_number_range", f.countdown_number_range, 2),
        target_range=_integers("countdown_target_range", f.countdown_target_range, 2),
        allow_division=division,
        batch_size=f.batch_size,
    )
