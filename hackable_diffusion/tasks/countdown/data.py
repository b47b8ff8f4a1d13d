"""Countdown training data: generated problems as [prompt; completion] token rows with the prompt marked `fixed`, a
held-out set from another generator seed (minus any problem of the training set), and the grain pipeline.

A prompt is the numbers and the target, "3,7,25,50=75", right-padded with PAD to `data.prompt_len` tokens; the
completion is the reference answer, EOS, then PAD to `data.completion_len` tokens (`layouts.py`).
"""

from __future__ import annotations

import dataclasses
import re

import ml_collections
import numpy as np
from jaxtyping import Bool, Int

from hackable_diffusion.data import text as text_lib
from hackable_diffusion.tasks.countdown import problems as problems_lib
from hackable_diffusion.tasks.countdown.vocab import CountdownVocab

HELD_OUT_SEED_OFFSET = 1_000_003  # the held-out set's generator seed = the training generator seed + this
_PROMPT = re.compile(r"([1-9][0-9]*(?:,[1-9][0-9]*)*)=([1-9][0-9]*)")


@dataclasses.dataclass(frozen=True, eq=False)
class CountdownData:
    """Training rows (tokens, `fixed` = the prompt), the training problems and a held-out generated set."""

    tokenizer: CountdownVocab
    train_tokens: Int[np.ndarray, "n l"]
    train_fixed: Bool[np.ndarray, "n l"]
    train_problems: problems_lib.CountdownProblems
    eval_problems: problems_lib.CountdownProblems

    @property
    def train_sequences(self) -> np.ndarray:
        return self.train_tokens


def prompt_text(numbers: tuple[int, ...], target: int) -> str:
    return ",".join(str(int(n)) for n in numbers) + f"={int(target)}"


def parse_prompt(text: str) -> tuple[tuple[int, ...], int] | None:
    """(numbers, target) of a prompt "3,7,25,50=75", or None when it is not one."""
    match = _PROMPT.fullmatch(text) if isinstance(text, str) and len(text) <= 256 else None
    if match is None:
        return None
    return tuple(int(v) for v in match.group(1).split(",")), int(match.group(2))


def problem_spec(config: ml_collections.ConfigDict) -> problems_lib.ProblemSpec:
    """The difficulty knobs of `config.data` (ValueError naming the key when one is out of range)."""
    d = config.data
    try:
        return problems_lib.ProblemSpec(
            num_numbers=tuple(d.num_numbers),
            number_range=(d.number_min, d.number_max),
            target_range=(d.target_min, d.target_max),
            allow_division=bool(d.allow_division),
            use_all_numbers=bool(d.use_all_numbers),
        )
    except ValueError as err:
        raise ValueError(f"config.data (num_numbers, number_min/max, target_min/max): {err}") from None


def longest_prompt(spec: problems_lib.ProblemSpec) -> int:
    """Tokens of the longest prompt the knobs allow: every number and the target at their most digits."""
    k, digits = spec.max_numbers, len(str(spec.number_range[1]))
    return k * digits + (k - 1) + 1 + len(str(spec.target_range[1]))


def longest_completion(spec: problems_lib.ProblemSpec) -> int:
    """Tokens of the longest answer the solver can write, with its EOS: k numbers, k - 1 operators and at most
    k - 2 pairs of parentheses (the outermost operation never needs any, each other one at most one pair)."""
    k, digits = spec.max_numbers, len(str(spec.number_range[1]))
    return k * digits + (k - 1) + 2 * max(k - 2, 0) + 1


def held_out_seed(config: ml_collections.ConfigDict) -> int:
    return int(config.data.generator_seed) + HELD_OUT_SEED_OFFSET


def check_data_config(config: ml_collections.ConfigDict) -> None:
    d = config.data
    spec = problem_spec(config)
    prompt_len, completion_len = int(d.prompt_len), int(d.completion_len)
    if prompt_len < longest_prompt(spec) or completion_len < longest_completion(spec):
        raise ValueError(
            f"config.data.prompt_len={prompt_len} / completion_len={completion_len} must hold the longest prompt "
            f"({longest_prompt(spec)} tokens) and the longest answer with its EOS ({longest_completion(spec)}) of "
            "these knobs; raise them or narrow the ranges."
        )
    if int(d.seq_len) != prompt_len + completion_len:
        raise ValueError(
            f"config.data.seq_len={d.seq_len} must be prompt_len + completion_len = {prompt_len + completion_len}."
        )
    if int(d.num_train) < 1 or int(d.num_eval) < 1:
        raise ValueError(f"config.data.num_train={d.num_train} and num_eval={d.num_eval} must be >= 1.")


def generate(config: ml_collections.ConfigDict, n: int, seed: int) -> problems_lib.CountdownProblems:
    """`n` problems of the run's knobs from generator seed `seed`, cached as the run's config says."""
    spec = problem_spec(config)
    return problems_lib.generate_problems(
        n,
        seed,
        num_numbers=spec.num_numbers,
        number_range=spec.number_range,
        target_range=spec.target_range,
        allow_division=spec.allow_division,
        use_all_numbers=spec.use_all_numbers,
        cache_dir=config.data.get("cache_dir") or "default",
    )


def without_training_problems(
    problems: problems_lib.CountdownProblems, train: problems_lib.CountdownProblems
) -> tuple[problems_lib.CountdownProblems, int]:
    """The problems that are not in the training set (a problem training saw is no test), and how many were dropped."""
    seen = set(train.problem_keys())
    keep = np.array([key not in seen for key in problems.problem_keys()], bool)
    return problems.subset(np.flatnonzero(keep)), int((~keep).sum())


def prompt_rows(problems: problems_lib.CountdownProblems, prompt_len: int) -> Int[np.ndarray, "n p"]:
    vocab = CountdownVocab()
    rows = [
        vocab.encode_padded(prompt_text(problems.numbers_of(i), problems.targets[i]), prompt_len)
        for i in range(len(problems))
    ]
    return np.stack(rows).astype(np.int32)


def completion_rows(problems: problems_lib.CountdownProblems, completion_len: int) -> Int[np.ndarray, "n c"]:
    vocab = CountdownVocab()
    rows = [vocab.encode_padded(str(answer), completion_len, eos=True) for answer in problems.solutions]
    return np.stack(rows).astype(np.int32)


def training_rows(
    problems: problems_lib.CountdownProblems, prompt_len: int, completion_len: int
) -> tuple[Int[np.ndarray, "n l"], Bool[np.ndarray, "n l"]]:
    """[prompt; completion] token rows and `fixed` = the prompt positions."""
    tokens = np.concatenate([prompt_rows(problems, prompt_len), completion_rows(problems, completion_len)], axis=1)
    fixed = np.zeros(tokens.shape, bool)
    fixed[:, :prompt_len] = True
    return tokens, fixed


def build_data(config: ml_collections.ConfigDict) -> CountdownData:
    check_data_config(config)
    d = config.data
    train = generate(config, int(d.num_train), int(d.generator_seed))
    held_out, _ = without_training_problems(generate(config, int(d.num_eval), held_out_seed(config)), train)
    tokens, fixed = training_rows(train, int(d.prompt_len), int(d.completion_len))
    return CountdownData(CountdownVocab(), tokens, fixed, train, held_out)


def make_train_iterator(
    tokens: Int[np.ndarray, "n l"],
    fixed: Bool[np.ndarray, "n l"],
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
):
    """`data.text.make_fixed_rows_iterator` over (tokens, fixed) rows: shuffled, repeated, checkpointable (grain)."""
    return text_lib.make_fixed_rows_iterator(tokens, fixed, batch_size, seed, process_index, process_count)
