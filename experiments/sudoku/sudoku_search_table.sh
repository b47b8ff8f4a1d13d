#!/usr/bin/env bash
# The rows of results/sudoku/README.md "Search: puzzles that need guessing": one `evaluate` call per row,
# each JSON line tagged with its row label and appended to results/sudoku/search_rows.jsonl.
#   bash experiments/sudoku/sudoku_search_table.sh RUN [ROW ...]     (RUN: an in-place Sudoku workdir; no ROW: all)
#   OUT=results/sudoku/search_rows_hard.jsonl bash experiments/sudoku/sudoku_search_table.sh runs/sudoku_hard ROW ...
#   EXTRA="--step=50" bash experiments/sudoku/sudoku_search_table.sh RUN ROW ...   (EXTRA: more evaluate flags for every row)
set -euo pipefail
RUN=${1:?usage: sudoku_search_table.sh RUN [ROW ...]}
shift
OUT=${OUT:-results/sudoku/search_rows.jsonl}
H1="--givens=17,25 --num_puzzles=600 --puzzle_seed=17 --solver_class=search"
H2="--givens=22,28 --num_puzzles=800 --puzzle_seed=22 --solver_class=search"
KAGGLE="--data kaggle3m_curated_5000.csv --subset=1000 --subset_seed=1"
EASY="--givens=30,36 --num_puzzles=1000 --puzzle_seed=7"
SAMPLER="--config.sampler.num_steps=12 --config.sampler.selection.also_above=0.99 --config.solver.rules=True"
SAMPLER_NO_SURE="--config.sampler.num_steps=12 --config.sampler.selection.also_above=1.0 --config.solver.rules=True"
SEARCH="--config.solver.rules=True --config.solver.search=True --config.solver.pass_budget=64"
PACED12="--config.solver.rules=True --config.solver.search=True --config.solver.pass_budget=12 --config.solver.search_paced=True"
PACED16="--config.solver.rules=True --config.solver.search=True --config.solver.pass_budget=16 --config.solver.search_paced=True"
declare -A ROWS=(
  [sampler_h1]="$H1 $SAMPLER"
  [sampler_h2]="$H2 $SAMPLER"
  [sampler_kaggle]="$KAGGLE $SAMPLER"
  [sampler_easy]="$EASY $SAMPLER"
  [sampler_no_sure_h1]="$H1 $SAMPLER_NO_SURE"
  [sampler_no_sure_easy]="$EASY $SAMPLER_NO_SURE"
  [search_h1]="$H1 $SEARCH"
  [search_h2]="$H2 $SEARCH"
  [search_kaggle]="$KAGGLE $SEARCH"
  [search_easy]="$EASY $SEARCH"
  [rules_only_h1]="$H1 $SEARCH --config.solver.search_scores=uniform --config.solver.search_branch=fewest"
  [rules_only_h2]="$H2 $SEARCH --config.solver.search_scores=uniform --config.solver.search_branch=fewest"
  [rules_only_kaggle]="$KAGGLE $SEARCH --config.solver.search_scores=uniform --config.solver.search_branch=fewest"
  [search128_easy]="$EASY --config.solver.rules=True --config.solver.search=True --config.solver.pass_budget=128"
  [cells5_h1]="$H1 $SEARCH --config.solver.search_cells_per_branch=5"
  [cells5_h2]="$H2 $SEARCH --config.solver.search_cells_per_branch=5"
  [fewest_h1]="$H1 $SEARCH --config.solver.search_branch=fewest"
  [paced12_h1]="$H1 $PACED12"
  [paced12_h2]="$H2 $PACED12"
  [paced12_kaggle]="$KAGGLE $PACED12"
  [paced12_easy]="$EASY $PACED12"
  [attempts4_h1]="$H1 $SEARCH --config.solver.parallel_attempts=4"
  [attempts4_h2]="$H2 $SEARCH --config.solver.parallel_attempts=4"
  [attempts4_kaggle]="$KAGGLE $SEARCH --config.solver.parallel_attempts=4"
  [attempts4_easy]="$EASY $SEARCH --config.solver.parallel_attempts=4"
  [paced12_attempts4_h1]="$H1 $PACED12 --config.solver.parallel_attempts=4"
  [paced12_attempts4_h2]="$H2 $PACED12 --config.solver.parallel_attempts=4"
  [paced12_attempts4_kaggle]="$KAGGLE $PACED12 --config.solver.parallel_attempts=4"
  [paced12_attempts4_easy]="$EASY $PACED12 --config.solver.parallel_attempts=4"
  [paced12_attempts8_kaggle]="$KAGGLE $PACED12 --config.solver.parallel_attempts=8"
  [paced16_attempts4_kaggle]="$KAGGLE $PACED16 --config.solver.parallel_attempts=4"
  [paced16_attempts4_h1]="$H1 $PACED16 --config.solver.parallel_attempts=4"
  [paced16_attempts4_easy]="$EASY $PACED16 --config.solver.parallel_attempts=4"
)
ORDER=(search_h1 search_h2 sampler_h1 sampler_h2 sampler_no_sure_h1 sampler_no_sure_easy rules_only_h1 rules_only_h2
  search_easy search128_easy sampler_easy
  search_kaggle sampler_kaggle rules_only_kaggle cells5_h1 cells5_h2 fewest_h1 paced12_h1 paced12_h2 paced12_kaggle
  paced12_easy attempts4_h1 attempts4_h2 attempts4_kaggle attempts4_easy paced12_attempts4_h1 paced12_attempts4_h2
  paced12_attempts4_kaggle paced12_attempts4_easy paced12_attempts8_kaggle paced16_attempts4_kaggle paced16_attempts4_h1
  paced16_attempts4_easy)
for row in "${@:-${ORDER[@]}}"; do
  args="${ROWS[$row]:?unknown row $row; rows: ${ORDER[*]}} ${EXTRA:-}"
  command="python -m hackable_diffusion.evaluate --workdir $RUN $args"
  echo "$row: $command" >&2
  line=$(python -m hackable_diffusion.evaluate --workdir "$RUN" $args | tail -1)
  python - "$row" "$command" "$line" >> "$OUT" <<'PY'
import json, sys
row, command, line = sys.argv[1:]
print(json.dumps({"row": row, "command": command, **json.loads(line)}))
PY
done
