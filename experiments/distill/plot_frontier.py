"""Few-step students against their teacher at matched diversity: gen. perplexity against bigram entropy.

  python experiments/distill/plot_frontier.py --out results/text/frontier_masking --teacher teacher@16 \
      --rows results/text/temperatures_8_16steps.jsonl,results/text/steps_frontier_cooled.jsonl,results/text/trajectory_dilated_600.jsonl,results/text/temperatures_4steps.jsonl,results/text/steps_frontier_dilated.jsonl,results/text/trajectory_dilated_600_budgets.jsonl \
      --students trajectory_dilated_600@4,trajectory_dilated@4,teacher_dilated@4,trajectory_dilated_600@2,trajectory_dilated@2

A model's frontier at a budget is its gen. perplexity against the bigram entropy of its samples over the temperature
schedules it was measured at (the rows of `experiments/distill/steps_frontier.py` with that `model` and `steps_per_canvas`:
its own schedule and each `--cooled` one). Cooling a sampler trades entropy for perplexity along its frontier, so a
student whose samples are only colder than the teacher's lands on the teacher's frontier; its gain is its distance
below it at equal bigram entropy. Unigram entropy of characters barely moves with temperature (a student can repeat
character pairs at the teacher's character frequencies); bigram entropy does.

`matched_excess` compares two frontiers: both interpolated linearly in log gen. perplexity (gen. nats per token)
between measured points, it reports the student's relative excess `ppl_student / ppl_teacher - 1` at every measured
entropy of either frontier inside the entropies both cover, and the worst (largest) of them. Between two such
entropies both log perplexities are straight lines, so their difference is too and the worst over the whole overlap
is one of these points: the figure is exact for the interpolated frontiers, not sampled. Nothing is extrapolated: a
student whose entropies lie outside the teacher's range has no matched figure (`worst_excess` None). The acceptance
measure of a few-step student: `worst_excess <= 0.02` (at or below the teacher's frontier within +2%) over the
teacher's whole entropy range (`teacher_coverage` 1; `meets_over_teacher_range`): a student that reaches only part of
it is compared there and reported with the share it covers.

Rows of several files are pooled when they come from the same prompts (the same `--seed`, `--num_prompts`,
`--prompt_len`, `--new_tokens` and `--ar` in each file's command line; other files are refused); a row measured in two
files (same label and budget) is kept once. Writes FILE.png (the teacher's frontier and each student's, the worst
excess in the legend) and FILE.jsonl (its command line, then one row per student: the overlap, the matched points,
the worst excess) and prints one JSON line per student.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import re
import shlex
from typing import Sequence

from hackable_diffusion import cli

ENTROPY = "gen_bigram_entropy_bits"
PROMPT_SET = ("seed", "num_prompts", "prompt_len", "new_tokens", "ar")  # the flags that fix which texts were scored


@dataclasses.dataclass(frozen=True)
class Frontier:
    """One model's (entropy, gen. perplexity) points at one budget, in increasing entropy."""

    name: str
    entropy: tuple[float, ...]
    ppl: tuple[float, ...]

    def __post_init__(self):
        if not self.entropy or len(self.entropy) != len(self.ppl):
            raise ValueError(f"frontier {self.name!r}: needs >= 1 point and one perplexity per entropy.")
        if any(b <= a for a, b in zip(self.entropy, self.entropy[1:])):
            raise ValueError(
                f"frontier {self.name!r}: entropies {self.entropy} must strictly increase (sort the points; "
                "two schedules at one entropy: keep one)."
            )
        if any(not p > 0 for p in self.ppl):
            raise ValueError(f"frontier {self.name!r}: perplexities {self.ppl} must be > 0.")

    @classmethod
    def from_points(cls, name: str, points: Sequence[tuple[float, float]]) -> Frontier:
        """From (entropy, perplexity) pairs in any order; of points at one entropy (schedules that draw the same
        samples, e.g. equal starting temperatures at 1 step) the lowest perplexity."""
        best: dict[float, float] = {}
        for x, y in points:
            best[float(x)] = min(float(y), best.get(float(x), math.inf))
        xs = sorted(best)
        return cls(name, tuple(xs), tuple(best[x] for x in xs))

    def ppl_at(self, entropy: float) -> float:
        """Gen. perplexity at `entropy`, linear in log perplexity between the measured points; inside the range only."""
        xs, ys = self.entropy, self.ppl
        if not xs[0] - 1e-12 <= entropy <= xs[-1] + 1e-12:
            raise ValueError(f"frontier {self.name!r}: entropy {entropy} outside its range [{xs[0]}, {xs[-1]}].")
        if entropy in xs:
            return ys[xs.index(entropy)]
        for i in range(len(xs) - 1):
            if entropy <= xs[i + 1]:
                w = (entropy - xs[i]) / (xs[i + 1] - xs[i])
                return math.exp((1 - w) * math.log(ys[i]) + w * math.log(ys[i + 1]))
        return ys[-1]


@dataclasses.dataclass(frozen=True)
class Matched:
    """A student frontier against a teacher frontier at equal entropy (see the module docstring)."""

    student: str
    teacher: str
    overlap: tuple[float, float] | None  # the entropies both frontiers cover; None: disjoint
    points: tuple[tuple[float, float, float, float], ...]  # (entropy, student ppl, teacher ppl, relative excess)
    worst_excess: float | None  # the largest relative excess over the overlap; None: no overlap
    teacher_coverage: float = 0.0  # the share of the teacher's entropy range the overlap spans (1: all of it)

    def meets(self, tolerance: float = 0.02) -> bool:
        """At or below the teacher's frontier within `tolerance` over the whole overlap (False without one)."""
        return self.worst_excess is not None and self.worst_excess <= tolerance

    def meets_over_teacher_range(self, tolerance: float = 0.02) -> bool:
        """`meets`, and the overlap spans the teacher's whole entropy range: the acceptance of a few-step student
        (at or below the teacher over the teacher's own range, not only where the student reaches)."""
        return self.meets(tolerance) and self.teacher_coverage >= 1 - 1e-9


def matched_excess(student: Frontier, teacher: Frontier) -> Matched:
    """The student's relative gen.-perplexity excess over the teacher at equal entropy, at every measured entropy of
    either frontier inside their overlap, and the worst of them."""
    lo, hi = max(student.entropy[0], teacher.entropy[0]), min(student.entropy[-1], teacher.entropy[-1])
    if lo > hi:
        return Matched(student.name, teacher.name, None, (), None)
    xs = sorted({x for x in (*student.entropy, *teacher.entropy) if lo <= x <= hi} | {lo, hi})
    points = []
    for x in xs:
        s, t = student.ppl_at(x), teacher.ppl_at(x)
        points.append((x, s, t, s / t - 1))
    span = teacher.entropy[-1] - teacher.entropy[0]
    coverage = (hi - lo) / span if span > 0 else 1.0  # a one-point teacher is covered by any overlap
    return Matched(student.name, teacher.name, (lo, hi), tuple(points), max(p[3] for p in points), coverage)


def model_of(row: dict) -> str:
    """A row's model: its `model` field (one per model across its temperature schedules); rows written before that
    field existed: the label without the `_TMAX/MIN[^EXPONENT]` that `--cooled` appends."""
    return row.get("model") or re.sub(r"_T[0-9.]+/[0-9.]+(\^[0-9.]+)?$", "", row["label"])


def frontier_from_rows(rows: Sequence[dict], spec: str, entropy_key: str = ENTROPY) -> Frontier:
    """The frontier of `spec` = MODEL@STEPS: every row of that model at that many steps per canvas."""
    model, _, steps = spec.partition("@")
    if not model or not steps.isdigit():
        raise ValueError(f"frontier {spec!r}: write MODEL@STEPS, e.g. teacher@16.")
    at = [r for r in rows if r.get("steps_per_canvas") == int(steps) and model_of(r) == model]
    if not at:
        have = sorted({f"{model_of(r)}@{r['steps_per_canvas']}" for r in rows if r.get("steps_per_canvas")})
        raise ValueError(f"frontier {spec!r}: no rows of that model at that budget; the rows hold {', '.join(have)}.")
    missing = [r["label"] for r in at if entropy_key not in r]
    if missing:
        raise ValueError(f"frontier {spec!r}: rows {missing} have no {entropy_key!r}.")
    return Frontier.from_points(spec, [(r[entropy_key], r["gen_ppl"]) for r in at])


def prompt_set(command: str) -> dict[str, str]:
    """The flags of a `steps_frontier.py` command line that fix its prompts and scorer (defaults where absent)."""
    found = {"seed": "0", "num_prompts": "32", "prompt_len": "64", "new_tokens": "64", "ar": ""}
    for arg in shlex.split(command):
        key, eq, value = arg.removeprefix("--").partition("=")
        if eq and key in found:
            found[key] = value
    return found


def load_rows(paths: Sequence[str | pathlib.Path]) -> list[dict]:
    """The rows of `steps_frontier.py` files measured on the same prompts, each (label, budget) once."""
    rows: dict[tuple, tuple[dict, str]] = {}
    reference = None
    for path in map(pathlib.Path, paths):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not lines or "command" not in lines[0]:
            raise ValueError(f"{path}: not a steps_frontier.py rows file (its first line holds the command).")
        prompts = prompt_set(lines[0]["command"])
        if reference is None:
            reference = (path, prompts)
        elif prompts != reference[1]:
            raise ValueError(
                f"{path} scores other prompts than {reference[0]} ({prompts} against {reference[1]}): "
                "compare frontiers from one prompt set."
            )
        for row in lines[1:]:
            key = (row["label"], row.get("steps_per_canvas"))
            if key in rows and not math.isclose(rows[key][0]["gen_ppl"], row["gen_ppl"], rel_tol=1e-9):
                raise ValueError(
                    f"{row['label']} at {key[1]} steps: gen. ppl {row['gen_ppl']} in {path}, "
                    f"{rows[key][0]['gen_ppl']} in {rows[key][1]}: the files measured different models."
                )
            rows.setdefault(key, (row, str(path)))
    return [row for row, _ in rows.values()]


def plot_frontiers(teacher: Frontier, students: Sequence[Frontier], path: pathlib.Path, title: str = "") -> None:
    """The teacher's frontier (black) and each student's, the student's worst excess over the teacher in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(teacher.entropy, teacher.ppl, "-o", color="k", lw=2, label=f"{teacher.name} (teacher)")
    for student in students:
        worst = matched_excess(student, teacher).worst_excess
        note = "no overlap" if worst is None else f"worst {worst:+.1%}"
        ax.plot(student.entropy, student.ppl, "-s" if len(student.entropy) > 1 else "s", label=f"{student.name}: {note}")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("bigram entropy of the samples (bits)")
    ax.set_ylabel("generative perplexity under the AR run")
    ax.set_title(title or "gen. perplexity against bigram entropy", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", required=True, help="FILE.jsonl,... written by steps_frontier.py on one prompt set")
    parser.add_argument("--teacher", required=True, help="MODEL@STEPS, e.g. teacher@16")
    parser.add_argument("--students", required=True, help="MODEL@STEPS,...")
    parser.add_argument("--out", required=True, help="FILE: writes FILE.png and FILE.jsonl")
    parser.add_argument("--tolerance", type=float, default=0.02, help="the acceptance bound on the worst excess")
    parser.add_argument("--title", default="", help="the plot's title (default: the teacher and the prompt set)")
    args = parser.parse_args(argv)
    try:
        rows = load_rows([p for p in args.rows.split(",") if p])
        teacher = frontier_from_rows(rows, args.teacher)
        students = [frontier_from_rows(rows, spec) for spec in args.students.split(",") if spec]
    except (ValueError, OSError) as err:
        cli.fail(str(err))
    out = pathlib.Path(args.out)
    if out.suffix in (".png", ".jsonl"):
        out = out.with_suffix("")
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    for student in students:
        m = matched_excess(student, teacher)
        result = {
            "student": m.student,
            "teacher": m.teacher,
            "overlap_bits": list(m.overlap) if m.overlap else None,
            "worst_excess": m.worst_excess,
            "meets": m.meets(args.tolerance),
            "teacher_range_covered": m.teacher_coverage,
            "meets_over_teacher_range": m.meets_over_teacher_range(args.tolerance),
            "points": [dict(zip(("entropy_bits", "student_ppl", "teacher_ppl", "excess"), p)) for p in m.points],
        }
        results.append(result)
        print(cli.json_line(result), flush=True)
    command = cli.argparse_command("experiments/distill/plot_frontier.py", args)
    with (out.parent / (out.name + ".jsonl")).open("w") as f:
        f.write(json.dumps({"command": command, "teacher_points": list(zip(teacher.entropy, teacher.ppl))}) + "\n")
        for result in results:
            f.write(cli.json_line(result) + "\n")
    if not args.title:  # the teacher's run and the prompt set
        prompts = prompt_set(json.loads(pathlib.Path(args.rows.split(",")[0]).read_text().splitlines()[0])["command"])
        run = next((r["run"] for r in rows if model_of(r) == args.teacher.partition("@")[0] and "run" in r), "")
        args.title = f"{args.teacher} {run}: {prompts['num_prompts']} prompts, seed {prompts['seed']}"
    plot_frontiers(teacher, students, out.parent / (out.name + ".png"), args.title)
    return results


if __name__ == "__main__":
    main()
