"""Countdown scores from token rows: the verifiable reward of each [prompt; completion] pair and the exact-answer
rate overall and by difficulty label.

The reward reads the problem back from the prompt tokens ("3,7,25,50=75") and the answer from the completion up to
its first EOS or PAD (`CountdownVocab.strict_text`: a BOS, MASK or unknown id before the end makes it no answer), then
asks the exact verifier (`expressions.verify`). Anything malformed scores 0.0; nothing raises.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Float, Int

from hackable_diffusion.tasks.countdown import expressions
from hackable_diffusion.tasks.countdown.data import parse_prompt
from hackable_diffusion.tasks.countdown.vocab import CountdownVocab


def row_reward(prompt: Int[np.ndarray, " p"], completion: Int[np.ndarray, " c"]) -> float:
    """1.0 when the completion is an exact answer to the prompt's problem, else 0.0 (never raises)."""
    try:
        vocab = CountdownVocab()
        problem = parse_prompt(vocab.strict_text(np.asarray(prompt).astype(np.int64)) or "")
        answer = vocab.strict_text(np.asarray(completion).astype(np.int64))
        if problem is None or answer is None:
            return 0.0
        numbers, target = problem
        return expressions.reward(numbers, target, answer)
    except Exception:  # noqa: BLE001  (a malformed row is a wrong answer, never an error)
        return 0.0


def row_rewards(prompts: Int[np.ndarray, "n p"], completions: Int[np.ndarray, "n c"]) -> Float[np.ndarray, " n"]:
    """`row_reward` of every row pair; float32 (n,)."""
    prompts, completions = np.asarray(prompts), np.asarray(completions)
    if prompts.ndim != 2 or completions.ndim != 2 or len(prompts) != len(completions):
        raise ValueError(
            f"prompts and completions must be (n, P) and (n, C) arrays of one n, got {prompts.shape} and "
            f"{completions.shape}."
        )
    return np.array([row_reward(p, c) for p, c in zip(prompts, completions)], np.float32)


def accuracy_by_label(correct: np.ndarray, labels: np.ndarray) -> dict[str, float | int]:
    """`accuracy` and `count` over all problems, and `accuracy_<label>` / `count_<label>` per label ("3 numbers"
    becomes `accuracy_3_numbers`)."""
    correct = np.asarray(correct, bool)
    out: dict[str, float | int] = {"accuracy": float(correct.mean()) if len(correct) else 0.0, "count": len(correct)}
    for label in sorted(set(np.asarray(labels).tolist())):
        rows = np.asarray(labels) == label
        name = str(label).replace(" ", "_")
        out[f"accuracy_{name}"] = float(correct[rows].mean())
        out[f"count_{name}"] = int(rows.sum())
    return out
