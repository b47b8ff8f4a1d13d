"""experiments/distill/plot_frontier.py: a student's frontier against the teacher's at equal bigram entropy, on synthetic
frontiers with hand-computed excesses; rows pooled only from one prompt set; the plot and rows file it writes."""

import json
import math

import pytest
from plot_frontier import Frontier, frontier_from_rows, load_rows, main, matched_excess, model_of

TEACHER = Frontier.from_points("teacher@16", [(7.0, 20.0), (6.0, 10.0), (8.0, 40.0)])


def test_a_frontier_interpolates_log_perplexity_and_refuses_what_it_did_not_measure():
    assert TEACHER.entropy == (6.0, 7.0, 8.0)
    assert TEACHER.ppl_at(6.5) == pytest.approx(math.sqrt(10 * 20))  # straight in log perplexity
    assert TEACHER.ppl_at(8.0) == pytest.approx(40.0)
    with pytest.raises(ValueError, match=r"entropy 8.5 outside its range \[6.0, 8.0\]"):
        TEACHER.ppl_at(8.5)
    with pytest.raises(ValueError, match="must strictly increase"):
        Frontier("f", (7.0, 6.0), (1.0, 2.0))
    with pytest.raises(ValueError, match="must be > 0"):
        Frontier("f", (6.0,), (0.0,))
    # two schedules that drew the same samples: one point, the lower perplexity
    assert Frontier.from_points("f", [(6.0, 12.0), (6.0, 11.0)]).ppl == (11.0,)


def test_a_student_a_constant_factor_below_the_teacher_is_that_factor_below_everywhere():
    student = Frontier.from_points("s", [(6.0, 9.0), (7.5, 0.9 * math.sqrt(20 * 40))])
    m = matched_excess(student, TEACHER)
    assert m.overlap == (6.0, 7.5)
    assert [p[0] for p in m.points] == [6.0, 7.0, 7.5]  # the knots of both frontiers inside the overlap
    assert m.worst_excess == pytest.approx(-0.1) and m.meets()
    assert m.teacher_coverage == pytest.approx(0.75) and not m.meets_over_teacher_range()  # [6, 7.5] of [6, 8]
    whole = matched_excess(Frontier.from_points("s", [(5.5, 7.0), (8.5, 50.0)]), TEACHER)
    assert whole.teacher_coverage == pytest.approx(1.0) and whole.overlap == (6.0, 8.0)


def test_the_worst_excess_is_found_at_a_teacher_knot_between_student_points():
    # the teacher bends at 6.5 (10 -> 10 -> 20); a straight student from (6, 10) to (7, 20) passes sqrt(200) there
    teacher = Frontier.from_points("t", [(6.0, 10.0), (6.5, 10.0), (7.0, 20.0)])
    student = Frontier.from_points("s", [(6.0, 10.0), (7.0, 20.0)])
    m = matched_excess(student, teacher)
    assert m.worst_excess == pytest.approx(math.sqrt(200) / 10 - 1)  # +41%, at neither student point
    assert not m.meets(0.02)


def test_partial_overlap_single_points_and_disjoint_frontiers():
    # a student from 5.5 to 6.5 bits is compared on [6, 6.5] only; nothing is extrapolated
    student = Frontier.from_points("s", [(5.5, 8.0), (6.5, 14.0)])
    m = matched_excess(student, TEACHER)
    assert m.overlap == (6.0, 6.5)
    expected_at_6 = math.exp(0.5 * math.log(8.0) + 0.5 * math.log(14.0)) / 10.0 - 1
    assert m.worst_excess == pytest.approx(max(expected_at_6, 14.0 / math.sqrt(200) - 1))
    assert m.teacher_coverage == pytest.approx(0.25)  # [6, 6.5] of the teacher's [6, 8]
    assert m.meets(1.0) and not m.meets_over_teacher_range(1.0)  # below it where compared, but not over its range
    one = matched_excess(Frontier.from_points("one", [(7.0, 20.3)]), TEACHER)
    assert one.overlap == (7.0, 7.0) and one.worst_excess == pytest.approx(0.015) and one.meets(0.02)
    assert not one.meets(0.01)
    assert one.teacher_coverage == 0.0 and not one.meets_over_teacher_range(0.02)
    apart = matched_excess(Frontier.from_points("cold", [(5.0, 5.0), (5.9, 8.0)]), TEACHER)
    assert apart.overlap is None and apart.points == () and apart.worst_excess is None and not apart.meets()
    assert apart.teacher_coverage == 0.0


def rows_file(path, seed, rows):
    command = f"python experiments/distill/steps_frontier.py --teacher=runs/t --ar=runs/ar --num_prompts=8 --seed={seed}"
    path.write_text("\n".join(json.dumps(r) for r in [{"command": command}, *rows]) + "\n")
    return path


def row(label, steps, bigram, ppl, model=None):
    out = {"label": label, "steps_per_canvas": steps, "gen_bigram_entropy_bits": bigram, "gen_ppl": ppl}
    return out | ({"model": model} if model else {})


def test_rows_of_one_prompt_set_are_pooled_once_and_other_prompts_refused(tmp_path):
    a = rows_file(tmp_path / "a.jsonl", 0, [row("teacher", 16, 7.0, 20.0), row("teacher_T0.6/0.3", 16, 6.0, 10.0)])
    b = rows_file(tmp_path / "b.jsonl", 0, [row("teacher", 16, 7.0, 20.0, "teacher"), row("s", 4, 6.5, 13.0, "s")])
    rows = load_rows([a, b])
    assert len(rows) == 3
    # rows written before the `model` field: the label without its cooled schedule
    assert model_of(row("teacher_T0.6/0.3", 16, 6.0, 10.0)) == "teacher"
    assert model_of(row("x_T1.6/0.2^0.25", 4, 6.0, 10.0)) == "x"
    assert model_of(row("trajectory_T1", 4, 6.0, 10.0)) == "trajectory_T1"  # a label chosen by hand stays
    assert frontier_from_rows(rows, "teacher@16").entropy == (6.0, 7.0)
    with pytest.raises(ValueError, match=r"no rows of that model at that budget; the rows hold s@4, teacher@16"):
        frontier_from_rows(rows, "teacher@4")
    with pytest.raises(ValueError, match="write MODEL@STEPS"):
        frontier_from_rows(rows, "teacher")
    other = rows_file(tmp_path / "c.jsonl", 1, [row("s", 4, 6.6, 13.0, "s")])
    with pytest.raises(ValueError, match="scores other prompts than .*a.jsonl"):
        load_rows([a, other])
    clash = rows_file(tmp_path / "d.jsonl", 0, [row("teacher", 16, 7.0, 21.0, "teacher")])
    with pytest.raises(ValueError, match="the files measured different models"):
        load_rows([a, clash])


def test_the_command_writes_the_plot_and_one_row_per_student(tmp_path, capsys):
    a = rows_file(
        tmp_path / "a.jsonl",
        0,
        [row("teacher", 16, 7.0, 20.0, "teacher"), row("teacher_T0.6/0.3", 16, 6.0, 10.0, "teacher")]
        + [row("s", 4, 6.5, 15.0, "s"), row("s", 2, 5.0, 30.0, "s")],
    )
    out = tmp_path / "plots" / "frontier"
    results = main(["--rows", str(a), "--teacher", "teacher@16", "--students", "s@4,s@2", "--out", str(out)])
    assert (tmp_path / "plots" / "frontier.png").stat().st_size
    lines = [json.loads(line) for line in (tmp_path / "plots" / "frontier.jsonl").read_text().splitlines()]
    assert lines[0]["command"].startswith("python experiments/distill/plot_frontier.py --rows=")
    assert lines[1:] == results
    assert results[0]["worst_excess"] == pytest.approx(15.0 / math.sqrt(200) - 1) and not results[0]["meets"]
    assert results[1]["worst_excess"] is None and results[1]["overlap_bits"] is None
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == results
    with pytest.raises(SystemExit):
        main(["--rows", str(a), "--teacher", "teacher@8", "--students", "s@4", "--out", str(out)])
    assert "error: frontier 'teacher@8': no rows of that model at that budget" in capsys.readouterr().err
