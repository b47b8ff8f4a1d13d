#!/usr/bin/env bash
# The fewest-rule study of results/sudoku: the held-out set hard on the fewest-candidates rule (>= 30 guesses), the
# recommended recipe and the fewest-band curriculum (configs/sudoku_fewest.py) trained on top of it, and each one's
# search accuracy against its pass budget (to $BUDGET) on that set, per fewest band; the curriculum's last stage also
# with more loops at test than in training (depth_loops 3 and 4, at 64 passes).
#   bash experiments/sudoku/fewest_curriculum.sh            (every step; a step whose output exists is skipped,
#                                                             a training that stopped resumes from its checkpoint)
#   BUDGET=64 bash experiments/sudoku/fewest_curriculum.sh  (a shorter budget curve)
set -euo pipefail
PY=${PY:-python}
BUDGET=${BUDGET:-1024}
HELD_OUT=runs/sudoku_hard_fewest30/heldout.csv
[ -f "$HELD_OUT" ] || $PY experiments/sudoku/sudoku_hard_sets.py --train_n 0 --heldout_n 500 --rule fewest \
  --heldout_min_guesses 30 --heldout_climb 300 --out_dir runs/sudoku_hard_fewest30
train() {  # CONFIG WORKDIR STEPS: trains until the run's last checkpoint is at STEPS
  local last
  last=$(ls "$2/checkpoints" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -n 1 || true)
  if [ "${last:-0}" -lt "$3" ]; then $PY -m hackable_diffusion.train --config "$1" --workdir "$2"; fi
}
train configs/sudoku_hard.py runs/sudoku_hard 1600
train configs/sudoku_extreme.py:finetune runs/sudoku_extreme_ft 600
for k in 1 2 3; do train "configs/sudoku_fewest.py:$k" "runs/sudoku_fewest_$k" 600; done
curve() {  # WORKDIR LABEL [FLAGS...]
  local out="results/sudoku/budget_fewest/$2.jsonl"
  [ -f "$out" ] || $PY experiments/sudoku/sudoku_budget_curve.py --workdir "$1" --data "$HELD_OUT" --label "$2" \
    --out_dir results/sudoku/budget_fewest "${@:3}"
}
curve runs/sudoku_extreme_ft recipe --pass_budget "$BUDGET"
curve runs/sudoku_fewest_3 curriculum --pass_budget "$BUDGET"
for loops in 3 4; do curve runs/sudoku_fewest_3 "curriculum_loops$loops" --pass_budget 64 --config.model.depth_loops=$loops; done
$PY experiments/sudoku/sudoku_budget_curve.py --plot results/sudoku/budget_fewest/recipe.jsonl \
  results/sudoku/budget_fewest/curriculum.jsonl --guess_rule fewest --out results/sudoku/budget_curve_fewest.png
