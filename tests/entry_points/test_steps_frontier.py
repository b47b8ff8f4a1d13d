"""experiments/steps_frontier.py end to end on the shared tiny runs: a row per model and budget, the cooled teacher's
rows at their own temperatures, the teacher under another selection rule, both plots, and a malformed schedule refused
in one line."""

import json
import math
import pathlib
import subprocess
import sys

import pytest
from steps_frontier import bigram_entropy_bits, cooled_schedules

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_cooled_schedules_parse_and_refuse_what_is_not_max_over_min():
    assert cooled_schedules("0.6/0.3,0.5/0.5") == [(0.6, 0.3, None), (0.5, 0.5, None)]
    assert cooled_schedules("1.6/0.2^0.25") == [(1.6, 0.2, 0.25)]
    assert cooled_schedules("") == []
    for bad in ("0.6", "0.3/0.6", "a/b", "0.5/0", "0.6/0.3^0", "0.6/0.3^x", "0.6/0.3^"):
        with pytest.raises(ValueError, match="--cooled: temperature schedule .* must be MAX/MIN"):
            cooled_schedules(bad)


def test_bigram_entropy_of_a_hand_counted_sequence():
    # pairs of [1, 2, 1, 2]: (1, 2) twice, (2, 1) once -> entropy of (2/3, 1/3)
    expected = -(2 / 3) * math.log2(2 / 3) - (1 / 3) * math.log2(1 / 3)
    assert bigram_entropy_bits([[1, 2, 1, 2]]) == pytest.approx(expected)
    assert bigram_entropy_bits([[5]]) == 0.0


@pytest.mark.slow
def test_the_frontier_measures_the_teacher_cooled_beside_itself(trained_text_runs, tmp_path):
    out = tmp_path / "frontier.v2"  # a dot in the name is kept, not taken for a suffix
    args = [sys.executable, "experiments/steps_frontier.py", "--teacher", str(trained_text_runs["masking"])]
    args += ["--ar", str(trained_text_runs["none"]), "--steps", "1,2", "--num_prompts", "2", "--prompt_len", "8"]
    args += ["--new_tokens", "8", "--min_count", "even", "--teacher_rules", "dilated", "--cooled", "0.5/0.25^0.5"]
    args += ["--out", str(out)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "frontier.v2.jsonl").read_text().splitlines()[1:]]
    measured = {(r["label"], r["steps_per_canvas"]): r for r in rows}
    labels = ("teacher", "teacher_T0.5/0.25^0.5", "teacher_dilated", "teacher_dilated_T0.5/0.25^0.5")
    assert set(measured) == {(label, s) for label in labels for s in (1, 2)} | {("ar", None)}
    assert measured[("teacher_T0.5/0.25^0.5", 2)]["temperature"] == [0.5, 0.25]
    assert measured[("teacher_T0.5/0.25^0.5", 2)]["temperature_exponent"] == 0.5
    assert measured[("teacher_dilated_T0.5/0.25^0.5", 1)]["temperature"] == [0.5, 0.25]
    assert measured[("teacher", 2)]["temperature"] != [0.5, 0.25]
    assert measured[("teacher", 2)]["temperature_exponent"] == 1.0
    assert {r["model"] for r in rows if r["label"] != "ar"} == {"teacher", "teacher_dilated"}
    for row in rows:
        assert row["gen_ppl"] > 1 and row["gen_unigram_entropy_bits"] >= 0
    assert (tmp_path / "frontier.v2.png").stat().st_size and (tmp_path / "frontier.v2_plane.png").stat().st_size
    bad = subprocess.run([*args[:-2], "--cooled", "0.2/0.4", "--out", str(out)], capture_output=True, text=True,
                         timeout=300, cwd=REPO, check=False)  # fmt: skip
    assert bad.returncode != 0 and "temperature schedule '0.2/0.4' must be MAX/MIN" in bad.stderr
