#!/usr/bin/env bash
# One prepared GPU run of the decode benchmark: install the CUDA extra into its own virtual environment, record the
# device, driver and versions, then run experiments/speed/decode_bench.py at a mid-size preset and at the
# DiffusionGemma 26B-A4B shape (bf16 random weights created on the device, then FP8 weight-only), writing everything
# under $OUT.
#
#   OUT=/some/folder bash experiments/gpu_run.sh            # on a GPU machine
#   DRY_RUN=1 OUT=/tmp/x bash experiments/gpu_run.sh        # on a CPU: the same steps at tiny sizes, no install
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu/raw}
mkdir -p "$OUT"
# 2 and 4 steps per canvas: the budgets of a distilled student (python -m hackable_diffusion.distill); a canvas step
# costs the same whatever weights it runs, so random weights time the student's decoding as well as the teacher's
STEPS=${STEPS:-2,4,8,16,32,48}
if [[ -n "${DRY_RUN:-}" ]]; then
  PY=${PYTHON:-.venv/bin/python}
  MID=(--model tiny --prompt 8 --canvas 8 --canvases 2 --repeats 1 --bandwidth_mib 16 --matmul_n 256)
  BIG=(--model quickstart --prompt 16 --canvas 16 --canvases 2 --repeats 1 --bandwidth_mib 16 --matmul_n 256
    --attention_impl dot_product --canvas_loop both)
  STEPS=2,4
else
  python3 -m venv .venv-gpu
  .venv-gpu/bin/pip install -q -e '.[cuda12]'
  PY=.venv-gpu/bin/python
  MID=(--model small_moe --dtype bfloat16 --dispatch ragged)
  BIG=(--model diffusiongemma_26b_a4b --dtype bfloat16 --bandwidth_mib 4096 --attention_impl dot_product --canvas_loop both)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia_smi.csv" || true
fi
"$PY" -c "import jax, jaxlib, json; d = jax.devices()[0]; print(json.dumps({'jax': jax.__version__, 'jaxlib': jaxlib.__version__, 'platform': d.platform, 'device': d.device_kind, 'count': jax.device_count()}))" | tee "$OUT/versions.json"
"$PY" experiments/speed/decode_bench.py "${MID[@]}" --steps "$STEPS" --out "$OUT" 2>&1 | tee "$OUT/mid.log"
"$PY" experiments/speed/decode_bench.py "${BIG[@]}" --steps "$STEPS" --weights native,fp8 --out "$OUT" 2>&1 | tee "$OUT/big.log"
echo "done: $OUT/decode_bench.jsonl and $OUT/decode_bench.md"
