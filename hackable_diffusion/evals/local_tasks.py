"""Offline lm-eval tasks built from the toolbox's own data: the documents of the task definitions in
`evals/lm_eval_tasks/` (each YAML names one builder here through its `custom_dataset`).

Built deterministically (fixed seeds) from held-out text only, never from what a run trains on:
- tiny Shakespeare's validation split (the last 10% of the characters; ships with the package);
- the Penn Treebank's valid/test splits (Mikolov's files in `$HD_DATA_DIR/ptb/`, not redistributed).

Tasks:
- `*_next_line` (multiple choice, log-likelihood): a few lines of context, the true next line among `num_choices`
  lines drawn from elsewhere in the split (lines that also follow `context_lines` lines, so of the answer's kind); accuracy and length-normalised accuracy.
- `*_perplexity` (rolling log-likelihood): passages (Shakespeare: speeches; PTB: groups of sentences); word and
  byte perplexity, bits per byte.
- `hd_shakespeare_continuation` (generation until a newline): a speaker and the first line of a speech; the target is
  the second line; exact match and chrF.
- `hd_sudoku_solve` (generation, for Sudoku runs): a puzzle as 81 characters (`.` = blank) generated with the toolbox's
  exact solver (unique solution, 30-36 givens, generator seed 7: `evaluate`'s default held-out seed);
  the answer is the 81 digits; `solved` checks the rules and the givens (the solver check), `exact_match` compares with
  the unique solution.

Lines with a character that the training split never holds are left out, so a run's tokenizer (fitted on the
training split) can encode every document.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from hackable_diffusion.data import text as text_lib
from hackable_diffusion.tasks.sudoku import generator, grids
from hackable_diffusion.tasks.sudoku.grids import grid_to_text, text_to_grid


def _known_characters() -> set[str]:
    return set(text_lib.load_shakespeare("train"))


def _encodable(line: str, known: set[str]) -> bool:
    return set(line) <= known


def next_line_docs(
    lines: Sequence[str], *, count: int, context_lines: int, num_choices: int, seed: int, min_chars: int = 12
) -> list[dict]:
    """Multiple-choice documents {"context", "choices", "label"} from consecutive non-empty `lines`: the context is
    `context_lines` lines (each ending with a newline), the answer the line after them, the distractors other lines
    of the split (different from the answer, at least `min_chars` long)."""
    if num_choices < 2 or context_lines < 1 or count < 1:
        raise ValueError(
            f"need num_choices >= 2, context_lines >= 1, count >= 1; got {num_choices}, {context_lines}, {count}."
        )
    rng = random.Random(seed)
    starts = [
        i
        for i in range(len(lines) - context_lines)
        if all(lines[i : i + context_lines + 1]) and len(lines[i + context_lines]) >= min_chars
    ]
    # Distractors of the answer's kind: lines that themselves follow `context_lines` lines (not speaker names or
    # headings, which a model tells apart from verse by their form alone).
    pool = sorted({lines[i + context_lines] for i in starts})
    if len(starts) < count or len(pool) < num_choices:
        raise ValueError(f"the split has {len(starts)} usable windows and {len(pool)} lines; asked for {count} docs.")
    docs = []
    for i in sorted(rng.sample(starts, count)):
        answer = lines[i + context_lines]
        distractors: list[str] = []
        while len(distractors) < num_choices - 1:
            pick = rng.choice(pool)
            if pick != answer and pick not in distractors:
                distractors.append(pick)
        label = rng.randrange(num_choices)
        choices = distractors[:label] + [answer] + distractors[label:]
        docs.append(
            {
                "context": "".join(line + "\n" for line in lines[i : i + context_lines]),
                "choices": choices,
                "label": label,
            }
        )
    return docs


def shakespeare_lines() -> list[str]:
    """The validation split's lines, without those holding a character the training split lacks (as empty lines, so
    that no window spans them)."""
    known = _known_characters()
    return [line if _encodable(line, known) else "" for line in text_lib.load_shakespeare("validation").split("\n")]


def shakespeare_speeches(count: int) -> list[str]:
    """The first `count` speeches of the validation split (speaker line + text, blank-line separated), whole."""
    known = _known_characters()
    speeches = [s.strip("\n") + "\n" for s in text_lib.load_shakespeare("validation").split("\n\n")[1:]]
    speeches = [s for s in speeches if s.count("\n") >= 2 and _encodable(s, known)]
    if len(speeches) < count:
        raise ValueError(f"the validation split has {len(speeches)} whole speeches; asked for {count}.")
    return speeches[:count]


def shakespeare_continuation_docs(count: int, seed: int) -> list[dict]:
    """{"context": speaker line + first line of a speech (newline-terminated), "target": the speech's second line}."""
    known = _known_characters()
    rng = random.Random(seed)
    speeches = [s.split("\n") for s in text_lib.load_shakespeare("validation").split("\n\n")[1:]]
    usable = [s for s in speeches if len(s) >= 3 and all(s[:3]) and _encodable("\n".join(s[:3]), known)]
    if len(usable) < count:
        raise ValueError(f"the validation split has {len(usable)} speeches of 2+ lines; asked for {count}.")
    return [
        {"context": s[0] + "\n" + s[1] + "\n", "target": s[2]}
        for s in sorted(rng.sample(usable, count), key=speeches.index)
    ]


def ptb_lines(split: str) -> list[str]:
    """PTB sentences as the PTB runs see them (one per line; `$HD_DATA_DIR/ptb/ptb.{split}.txt`)."""
    return [line if line.strip() else "" for line in text_lib.load_ptb(split)]


def ptb_passages(split: str, count: int, sentences: int) -> list[str]:
    lines = [line for line in ptb_lines(split) if line]
    if len(lines) < count * sentences:
        raise ValueError(f"PTB {split} has {len(lines)} sentences; asked for {count} x {sentences}.")
    return ["".join(line + "\n" for line in lines[i * sentences : (i + 1) * sentences]) for i in range(count)]


def sudoku_solve_docs(count: int, givens: tuple[int, int], seed: int) -> list[dict]:
    """{"puzzle": 81 characters, "solution": 81 digits} for `count` generated unique-solution puzzles."""
    data = generator.generate_dataset(count, givens, seed=seed, unique=True, num_workers=1, cache_dir=None)
    return [
        {"puzzle": grid_to_text(p), "solution": grid_to_text(s)} for p, s in zip(data["puzzles"], data["solutions"])
    ]


def sudoku_answer_scores(doc: dict, answer: str) -> dict[str, float]:
    """`solved`: the answer's 81 digits obey the rules and keep the puzzle's givens; `exact_match`: it equals the
    stored solution (the same for unique puzzles). An answer with fewer than 81 cells scores 0 on both."""
    try:
        grid = text_to_grid(answer)
    except ValueError:
        return {"solved": 0.0, "exact_match": 0.0}
    puzzle = text_to_grid(doc["puzzle"])
    solved = bool(grids.is_valid_solution(grid) and grids.respects_givens(grid, puzzle))
    return {"solved": float(solved), "exact_match": float(grid_to_text(grid) == doc["solution"])}
