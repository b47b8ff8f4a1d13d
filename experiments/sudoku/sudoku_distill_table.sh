#!/usr/bin/env bash
# Exact Sudoku grids against passes with one attempt, for a teacher and its distilled students: one `evaluate` call per
# (run, passes), each JSON line tagged with the run's label and the passes, appended to $OUT.
#   bash experiments/sudoku/sudoku_distill_table.sh "1,2,3,4,6,12" runs/sudoku_hard:teacher runs/distill_sudoku:trajectory
#   SET="--givens=30,36 --num_puzzles=500 --puzzle_seed=7" OUT=... bash experiments/sudoku/sudoku_distill_table.sh ...
# The set defaults to 500 generated puzzles with 24-29 givens (generator seed 8, held out from every training seed);
# the sampler is the run's own (top-probability margin) with the rules as a logit constraint, early stopping as the
# run's, `--config.sampler.num_steps` = the passes.
set -euo pipefail
PASSES=${1:?usage: sudoku_distill_table.sh PASSES RUN:LABEL [RUN:LABEL ...]}
shift
OUT=${OUT:-results/sudoku/distill_rows.jsonl}
SET=${SET:---givens=24,29 --num_puzzles=500 --puzzle_seed=8}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$(dirname "$OUT")"
for item in "$@"; do
  run=${item%%:*}
  label=${item#*:}
  for passes in ${PASSES//,/ }; do
    # shellcheck disable=SC2086
    line=$("$PY" -m hackable_diffusion.evaluate --workdir "$run" $SET --config.solver.rules=True \
      --config.sampler.num_steps="$passes" | tail -1)
    "$PY" -c 'import json, sys; row = json.loads(sys.argv[1]); row.update(label=sys.argv[2], passes=int(sys.argv[3]), set=sys.argv[4]); print(json.dumps(row))' \
      "$line" "$label" "$passes" "$SET" | tee -a "$OUT"
  done
done
