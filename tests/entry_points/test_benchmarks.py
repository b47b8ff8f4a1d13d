"""Benchmark scripts in experiments/ run end to end at a tiny size and print the figures they promise (no timing is
asserted: the machines are shared and noisy)."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_decode_bench_prints_a_line_per_step_count_with_bandwidth_and_flop_fractions(tmp_path):
    args = [sys.executable, "experiments/speed/decode_bench.py", "--model", "tiny", "--prompt", "8", "--canvas", "8"]
    args += ["--canvases", "2", "--repeats", "1", "--bandwidth_mib", "16", "--matmul_n", "256", "--steps", "2,3"]
    args += ["--selection", "dilated", "--process", "masking,uniform"]
    run = subprocess.run(
        [*args, "--weights", "native,fp8", "--first_canvas", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    combinations = [("masking", 2), ("masking", 3), ("uniform", 2), ("uniform", 3)]
    assert [(line["weights"][:4], line["process"], line["steps_per_canvas"]) for line in lines] == [
        ("floa", *c) for c in combinations * 2
    ]
    assert all(line["selection"] == "dilated" for line in lines)
    native, fp8 = lines[:4], lines[4:]
    assert all(line["weights"] == "float32" for line in native)
    first = native[0]["first_canvas"]["2"]  # a 2-token first canvas at ceil(2 steps x 2 / 8) = 1 step
    assert first["first_canvas_steps"] == 1 and first["ttft_s"] > 0 and first["tokens_per_s"] > 0
    assert "first_canvas" not in fp8[0]  # generation figures of FP8 come from the step programs
    assert all(line["weights"].startswith("float8_e4m3fn") for line in fp8)
    for line in lines:
        for program in ("canvas", "ar"):
            figures = line[program]
            for key in ("tokens_per_s", "bytes_per_step", "gbps", "frac_bw_peak", "frac_flops_peak", "ttft_s"):
                assert figures[key] > 0, (program, key)
        # a canvas step reads the weights once for 8 tokens and does 8 tokens' FLOPs: more of both than one AR step
        assert line["canvas"]["flops_per_step"] > 7 * line["ar"]["flops_per_step"]
        assert line["canvas"]["bytes_per_step"] >= line["ar"]["bytes_per_step"]
        assert line["ratio"] == pytest.approx(line["canvas"]["tokens_per_s"] / line["ar"]["tokens_per_s"])
        assert line["measured_peaks"]["memory_gbps"] > 0 and line["measured_peaks"]["matmul_tflops"] > 0
    assert (tmp_path / "decode_bench.md").read_text().count("| tiny |") == 8
    # FP8 values (1 byte) plus float32 scales, against float32 weights: well under half the bytes per step
    assert fp8[0]["canvas"]["bytes_per_step"] < 0.5 * native[0]["canvas"]["bytes_per_step"]
    bad = subprocess.run(
        [sys.executable, "experiments/speed/decode_bench.py", "--model", "nope"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )
    assert bad.returncode != 0 and "unknown --model 'nope'" in bad.stderr
