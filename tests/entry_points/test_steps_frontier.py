"""experiments/distill/steps_frontier.py end to end on the shared tiny runs: a row per model and budget with its diversity
figures, the cooled teacher's rows at their own temperatures, the teacher under another selection rule, the plots,
each model's worst excess over the teacher's frontier, and a malformed schedule refused in one line."""

import json
import pathlib
import subprocess
import sys

import pytest
from steps_frontier import cooled_schedules, frontiers_against_teacher

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_cooled_schedules_parse_and_refuse_what_is_not_max_over_min():
    assert cooled_schedules("0.6/0.3,0.5/0.5") == [(0.6, 0.3, None), (0.5, 0.5, None)]
    assert cooled_schedules("1.6/0.2^0.25") == [(1.6, 0.2, 0.25)]
    assert cooled_schedules("") == []
    for bad in ("0.6", "0.3/0.6", "a/b", "0.5/0", "0.6/0.3^0", "0.6/0.3^x", "0.6/0.3^"):
        with pytest.raises(ValueError, match="--cooled: temperature schedule .* must be MAX/MIN"):
            cooled_schedules(bad)


def row(label, steps, bigram, ppl, model=None):
    out = {"label": label, "steps_per_canvas": steps, "gen_bigram_entropy_bits": bigram, "gen_ppl": ppl}
    return out | ({"model": model} if model else {})


def test_every_model_and_budget_is_matched_against_the_teacher_at_its_largest_budget():
    rows = [
        row("teacher", 16, 7.0, 20.0, "teacher"),
        row("teacher_T0.6/0.3", 16, 6.0, 10.0, "teacher"),
        row("teacher", 4, 8.0, 70.0, "teacher"),
        row("student", 4, 6.5, 12.0, "student"),
        row("student_T1/1", 4, 7.5, 30.0, "student"),
        row("student", 2, 5.0, 40.0, "student"),  # colder than the teacher ever sampled: no matched figure
        row("student_T1/1", 1, 8.0, 300.0, "student"),  # at 1 step schedules of one starting temperature coincide
        row("student_T1/0.5", 1, 8.0, 300.0, "student"),
        {"label": "ar", "steps_per_canvas": None, "gen_ppl": 3.0, "gen_bigram_entropy_bits": 7.8},
    ]
    teacher, matched = frontiers_against_teacher(rows)
    assert teacher.name == "teacher@16" and teacher.entropy == (6.0, 7.0) and teacher.ppl == (10.0, 20.0)
    excess = {f.name: m.worst_excess for f, m in matched}
    assert set(excess) == {"teacher@4", "student@4", "student@2", "student@1"}
    # the teacher at 6.5 bits: sqrt(10 * 20); the student's line from (6.5, 12) to (7.5, 30) at 7.0: sqrt(12 * 30)
    assert excess["student@4"] == pytest.approx(max(12 / 200**0.5, 360**0.5 / 20) - 1)
    assert excess["teacher@4"] is None and excess["student@2"] is None and excess["student@1"] is None


@pytest.mark.slow
def test_the_frontier_measures_the_teacher_cooled_beside_itself(trained_text_runs, tmp_path):
    out = tmp_path / "frontier.v2"  # a dot in the name is kept, not taken for a suffix
    args = [sys.executable, "experiments/distill/steps_frontier.py", "--teacher", str(trained_text_runs["masking"])]
    args += ["--ar", str(trained_text_runs["none"]), "--teacher_steps", "1,2", "--steps", "1", "--num_prompts", "2"]
    args += ["--prompt_len", "8", "--students", f"{trained_text_runs['masking']}:copy"]  # a student at --steps only
    args += ["--new_tokens", "8", "--min_count", "even", "--teacher_rules", "dilated", "--cooled", "0.5/0.25^0.5"]
    args += ["--out", str(out)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "frontier.v2.jsonl").read_text().splitlines()[1:]]
    measured = {(r["label"], r["steps_per_canvas"]): r for r in rows}
    labels = ("teacher", "teacher_T0.5/0.25^0.5", "teacher_dilated", "teacher_dilated_T0.5/0.25^0.5")
    students = {("copy", 1), ("copy_T0.5/0.25^0.5", 1)}
    assert set(measured) == {(label, s) for label in labels for s in (1, 2)} | students | {("ar", None)}
    assert measured[("teacher_T0.5/0.25^0.5", 2)]["temperature"] == [0.5, 0.25]
    assert measured[("teacher_T0.5/0.25^0.5", 2)]["temperature_exponent"] == 0.5
    assert measured[("teacher_dilated_T0.5/0.25^0.5", 1)]["temperature"] == [0.5, 0.25]
    assert measured[("teacher", 2)]["temperature"] != [0.5, 0.25]
    assert measured[("teacher", 2)]["temperature_exponent"] == 1.0
    assert {r["model"] for r in rows if r["label"] != "ar"} == {"teacher", "teacher_dilated", "copy"}
    for r in rows:
        assert r["gen_ppl"] > 1 and r["gen_unigram_entropy_bits"] >= 0
        assert r["gen_trigram_entropy_bits"] >= 0 and r["gen_bigram_entropy_bits"] >= 0
        assert 0 <= r["gen_distinct_2"] <= 1 and 0 <= r["gen_distinct_3"] <= 1 and 0 <= r["gen_seq_rep_4"] < 1
    for suffix in (".png", "_plane.png", "_frontier.png"):
        assert (tmp_path / f"frontier.v2{suffix}").stat().st_size
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    excess = summary["worst_excess_over_teacher@2_at_equal_bigram_entropy"]
    assert set(excess) == {"teacher@1", "teacher_dilated@1", "teacher_dilated@2", "copy@1"}
    covered = summary["share_of_teacher@2_bigram_range_compared"]
    assert set(covered) == set(excess) and all(0 <= v <= 1 for v in covered.values())
    bad = subprocess.run([*args[:-2], "--cooled", "0.2/0.4", "--out", str(out)], capture_output=True, text=True,
                         timeout=300, cwd=REPO, check=False)  # fmt: skip
    assert bad.returncode != 0 and "temperature schedule '0.2/0.4' must be MAX/MIN" in bad.stderr
    # the students alone (their teacher measured in another file on the same prompts, pooled by plot_frontier.py)
    alone = [*args[:4], "--ar", str(trained_text_runs["none"]), "--teacher_steps", "0", "--steps", "1"]
    alone += ["--num_prompts", "2", "--prompt_len", "8", "--new_tokens", "8", "--min_count", "even"]
    alone += ["--students", f"{trained_text_runs['masking']}:copy", "--out", str(tmp_path / "alone")]
    run = subprocess.run(alone, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "alone.jsonl").read_text().splitlines()[1:]]
    assert [(r["label"], r["steps_per_canvas"]) for r in rows] == [("copy", 1), ("ar", None)]
    assert measured[("copy", 1)]["gen_ppl"] == rows[0]["gen_ppl"]  # the same prompts, the same draws
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert not any(key.startswith("worst_excess") for key in summary) and not (tmp_path / "alone_frontier.png").exists()
