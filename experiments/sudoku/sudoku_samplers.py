"""The Sudoku sampler table: which unmasking order solves puzzles, at which step budget (Kim et al. 2025's ordering).

  python experiments/sudoku/sudoku_samplers.py --workdir runs/sudoku --ar_workdir runs/sudoku_ar \
      [--num 1000] [--kaggle kaggle3m_curated_5000.csv] [--out results/sudoku]

For the trained in-place model (configs/sudoku.py) it solves
  (a) `--num` held-out generated puzzles with 30-36 givens (generator seed 7, unique solutions),
  (b) `--num` held-out generated puzzles with 24-29 givens (seed 8),
with vanilla ancestral sampling, top-probability, top-probability margin and entropy ordering at several step budgets,
the entropy bound (gamma sweep) and the confidence threshold (tau sweep), plus the AR model (configs/sudoku_ar.py,
81 greedy cached decode steps after the puzzle's prefill). The Kaggle sample that ships with the package (c) is solved by every diffusion
setting at the 12- and 81-step budgets (`KAGGLE_BUDGETS`) and by the AR model, on a seeded random subset of
`--kaggle_limit` puzzles, split by its `level` column; the best setting is also run on `--kaggle_best_limit`
puzzles (0: the whole file). The adaptive rules (entropy bound, threshold) get at most 12 steps here; below that
they stop as soon as no blank is left. The repair rows (`config.solver.repair_rounds`, more compute at inference) blank
every cell that repeats a digit in its row, column or box after a decode and re-decode those cells, for up to R more
rounds; their forward passes per puzzle include every round. The restart rows (`config.solver.restarts`) solve a puzzle
whose grid still breaks a rule again from scratch, tokens at `RESTART_TEMPERATURE` and the decision order shuffled by
Gumbel noise on the margin scores (`RESTART_GUMBEL_SCALE`), up to K times; every attempt's passes count.
The views rows (`config.solver.views`) average the model over K relabelled copies of the grid at every pass (the same
passes, K times the network evaluations). The parallel-attempts rows (`config.solver.parallel_attempts`) solve K symmetric
copies of each puzzle side by side and keep one that abides by the rules (passes: the slowest copy's; network
evaluations: all K).
`--merge` adds the chosen settings to an existing table of the same checkpoint and sets. `--resume_from LOG` takes
the rows that an interrupted run already printed (its stdout, one JSON line per row) instead of solving them again.
Generated puzzles that the training set holds are dropped (the count is recorded). Speed: puzzles per second of the
best diffusion setting with <= 12 passes on (a) vs the AR model, at batch 1 and batch 100, measured side by side.

Writes results/sudoku/samplers.{json,md,png}: one row per setting with exact-grid accuracy, blank accuracy and mean
forward passes per puzzle on each set; the plot is accuracy against forward passes.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

from hackable_diffusion import cli
from hackable_diffusion.tasks.sudoku.data import random_subset

SETTINGS = [  # (label, selection, its arguments, step budget[, repairs[, restarts[, rules[, views[, attempts]]]]])
    ("ancestral", "ancestral", {}, 12),
    ("ancestral", "ancestral", {}, 24),
    ("top-probability", "top_k_top_probability", {}, 12),
    ("top-prob. margin", "top_k_margin", {}, 6),
    ("top-prob. margin", "top_k_margin", {}, 12),
    ("top-prob. margin", "top_k_margin", {}, 24),
    ("top-prob. margin", "top_k_margin", {}, 81),  # more compute at inference: about one cell per pass
    ("entropy", "top_k_entropy", {}, 12),
    ("entropy bound g=0.1", "entropy_bound", {"gamma": 0.1}, 12),
    ("entropy bound g=1", "entropy_bound", {"gamma": 1.0}, 12),
    ("threshold t=0.9", "threshold", {"tau": 0.9}, 12),
    ("threshold t=0.5", "threshold", {"tau": 0.5}, 12),
    ("ReMDM cap eta=0.008", "remdm_cap", {}, 24),  # remasking (Wang et al. 2025) on ancestral unmasking
    # Repair (config.solver.repair_rounds): re-decode the cells that break a Sudoku rule, up to R more rounds
    ("margin + 2 repairs", "top_k_margin", {}, 12, 2),
    ("margin + 8 repairs", "top_k_margin", {}, 24, 8),
    ("margin + 8 repairs", "top_k_margin", {}, 81, 8),
    # Restarts (config.solver.restarts): solve a grid that still breaks a rule again from the puzzle (see RESTART_*)
    ("margin + 4 restarts", "top_k_margin", {}, 12, 0, 4),
    ("margin + 4 restarts", "top_k_margin", {}, 81, 0, 4),
    # Also decide every cell whose margin reaches 0.99 (config.sampler.selection.also_above): fewer passes, adaptive
    ("margin + sure cells >= 0.99", "top_k_margin", {"also_above": 0.99}, 12),
    # The rules as a logit constraint (config.solver.rules): no digit a decided peer holds (tasks/sudoku/rules.py)
    ("margin + rules", "top_k_margin", {}, 12, 0, 0, True),
    ("margin + rules", "top_k_margin", {}, 81, 0, 0, True),
    ("ancestral + rules", "ancestral", {}, 12, 0, 0, True),
    ("margin + rules + 4 restarts", "top_k_margin", {}, 12, 0, 4, True),
    ("margin + rules", "top_k_margin", {}, 6, 0, 0, True),
    # Rules + sure cells, up to one cell per pass: passes adapt to the puzzle (mean and max are both reported)
    ("margin + rules + sure >= 0.99", "top_k_margin", {"also_above": 0.99}, 81, 0, 0, True),
    ("margin + rules + sure >= 0.99", "top_k_margin", {"also_above": 0.99}, 12, 0, 0, True),
    # Symmetry views (config.solver.views=K, tasks/sudoku/symmetry.py): each pass averages the model over K relabelled grids
    ("margin + 8 symmetry views", "top_k_margin", {}, 12, 0, 0, False, 8),
    ("margin + rules + sure >= 0.99 + 8 views", "top_k_margin", {"also_above": 0.99}, 81, 0, 0, True, 8),
    # Parallel attempts (config.solver.parallel_attempts=K): K symmetric copies solved side by side, one that abides kept
    ("margin + rules + sure >= 0.99 + 8 attempts", "top_k_margin", {"also_above": 0.99}, 12, 0, 0, True, 1, 8),
]
# Restart attempts draw tokens at T 1 and add Gumbel noise (scale 0.1) to the margin scores, so that they decide cells
# in another order. Tuned on generated:24-29:200:11 (not an evaluation set), margin 81 + 4 restarts: no restart 62.5%;
# T 0.5 62.5%, T 1 64.5%; T 1 with Gumbel 0.1 74.0%, 0.3 66.0%.
RESTART_TEMPERATURE = 1.0
RESTART_GUMBEL_SCALE = 0.1
KAGGLE_BUDGETS = (12, 81)  # step budgets also scored on the Kaggle subset
# The markdown's note under the table for each option some row used (row key -> paragraph)
ROW_NOTES = {
    "rules": 'Rows with "rules": the Sudoku rule as a logit constraint (`config.solver.rules=True`): at every '
    "step a cell may not take a digit that a given or decided cell of its row, column or box holds, so the model's "
    "probabilities are renormalised over the legal digits before sampling and ranking. Inference-time use of the "
    "rules, like restarts; the other rows use the model alone.",
    "views": 'Rows with "views": every pass runs the model on K relabelled copies of the grid in one batch (bands, '
    "stacks, rows and columns inside them permuted, transposed, digits relabelled; `config.solver.views=K`) and "
    "decides from the mean of their log-probabilities mapped back: the same passes, K times the network evaluations "
    "(`network_evaluations_per_puzzle` in the JSON).",
    "parallel_attempts": 'Rows with "parallel attempts": K symmetric copies of each puzzle (the same group as the views, '
    "another seed; copy 0 the puzzle itself) are solved side by side in the same batches, each grid is mapped back, "
    "and the first that is complete, keeps the givens and breaks no rule is kept (`config.solver.parallel_attempts=K`). "
    "The passes shown are the slowest copy's (the copies run in lockstep, so this is the sequential depth); the "
    "network evaluations add all K copies (`network_evaluations_per_puzzle` in the JSON).",
}


def load_set(puzzle_set, config) -> dict:
    from hackable_diffusion.tasks.sudoku.data import load_held_out

    data, dropped = load_held_out(puzzle_set, config)
    data["dropped_as_in_training"] = dropped or 0
    return data


def score(exp, params, data, config, batch_size=250) -> dict:
    from hackable_diffusion.tasks.sudoku.held_out import evaluate_puzzles

    out = evaluate_puzzles(
        exp,
        params,
        data["puzzles"],
        data["solutions"],
        levels=data.get("level"),
        batch_size=batch_size,
        config=config,
    )
    keep = (
        "accuracy",
        "blank_accuracy",
        "cell_accuracy",
        "forward_passes_per_puzzle",
        "max_forward_passes_per_puzzle",
        "network_evaluations_per_puzzle",  # passes x symmetry views, summed over parallel attempts
        "puzzles_per_second",
    )
    row = {k: out[k] for k in keep}
    row.update({k: v for k, v in out.items() if k.startswith("accuracy_level_")})
    row.update({k: out[k] for k in ("accuracy_easy", "accuracy_medium", "accuracy_hard") if k in out})
    return row


def speed(exp, params, puzzles, config, batch: int, count: int) -> float:
    from hackable_diffusion.tasks.sudoku.inference import solve_puzzles

    solution = solve_puzzles(exp, params, puzzles[:count], batch_size=batch, config=config)
    return len(puzzles[:count]) / solution.seconds


def row_rules(row: dict) -> bool:
    """Rows store `rules` (older tables: `constraint="sudoku"`)."""
    return bool(row.get("rules", row.get("constraint") == "sudoku"))


def row_views(row: dict) -> int:
    """Rows store `views` as a count (older tables: `"sudoku:K"`, or "" for none)."""
    views = row.get("views") or 1
    return int(views.rsplit(":", 1)[-1]) if isinstance(views, str) else int(views)


def restart_gumbel_scale(row: dict) -> float:
    """Rows store `restart_gumbel_scale` (older tables: `restart_selection_kwargs`, a JSON string)."""
    if "restart_gumbel_scale" in row:
        return float(row["restart_gumbel_scale"])
    return float(json.loads(row.get("restart_selection_kwargs") or "{}").get("gumbel_scale", 0.0))


def row_selection_args(row: dict) -> dict:
    """Rows store the selection rule's arguments as a dict (older tables: a JSON string)."""
    args = row.get("kwargs") or {}
    return json.loads(args) if isinstance(args, str) else dict(args)


def config_of(base, row: dict, temperature: float):
    """The run's config with the row's sampler (`config.sampler`) and solver (`config.solver`) settings."""
    from hackable_diffusion import recipes
    from hackable_diffusion.tasks.sudoku.recipes import solver_section

    config = base.copy_and_resolve_references()
    config.sampler.selection = recipes.selection(row["selection"], **row_selection_args(row))
    config.sampler.num_steps = int(row["max_steps"])
    if temperature:
        config.sampler.min_temperature = config.sampler.max_temperature = temperature
    config.solver = solver_section(
        rules=row_rules(row),
        views=row_views(row),
        parallel_attempts=int(row.get("parallel_attempts", 1)),
        repair_rounds=int(row.get("repair_rounds", 0)),
        restarts=int(row.get("restarts", 0)),
        restart_temperature=RESTART_TEMPERATURE,
        restart_gumbel_scale=RESTART_GUMBEL_SCALE,
    )
    return config


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="runs/sudoku")
    parser.add_argument("--ar_workdir", default="runs/sudoku_ar", help="'' to skip the AR row and the speed test")
    parser.add_argument("--num", type=int, default=1000)
    parser.add_argument(
        "--kaggle",
        default="kaggle3m_curated_5000.csv",
        help="a CSV path or the name of a shipped data file ('' = no Kaggle column)",
    )
    parser.add_argument("--kaggle_limit", type=int, default=500, help="random subset for the sweep (0 = all)")
    parser.add_argument("--kaggle_best_limit", type=int, default=0, help="random subset for the best setting (0 = all)")
    parser.add_argument("--out", default="results/sudoku")
    parser.add_argument("--settings", default="", help="comma-separated indices into SETTINGS (default: all)")
    parser.add_argument(
        "--resume_from",
        default="",
        help="stdout of an earlier run of this script with the same checkpoint, --num and Kaggle options: rows with "
        "the same settings are taken from it instead of solved again",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature for every setting (0: the run's config)"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="add the chosen settings to --out's samplers.json (same model) instead of replacing it; keeps its AR "
        "row, speed lines and whole-file Kaggle figure (not re-measured)",
    )
    args = parser.parse_args()

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.tasks.sudoku.data import GeneratedPuzzles, PuzzleFile

    cli.quiet_library_logs()
    exp = exp_lib.from_workdir(args.workdir)
    params, step = toolbox.load_params(exp, args.workdir)
    if args.merge:  # check before hours of solving that the rows will belong to the stored table
        check_merge(pathlib.Path(args.out) / "samplers.json", args, step)
    puzzle_sets = {
        "a_30_36": GeneratedPuzzles((30, 36), args.num, 7),
        "b_24_29": GeneratedPuzzles((24, 29), args.num, 8),
    }
    sets = {name: load_set(puzzle_set, exp.config) for name, puzzle_set in puzzle_sets.items()}
    kaggle = None
    if args.kaggle:
        kaggle = load_set(PuzzleFile(args.kaggle), exp.config)
    kaggle_subset = kaggle
    if kaggle is not None and args.kaggle_limit and args.kaggle_limit < len(kaggle["puzzles"]):
        # a seeded random subset (the file is sorted by level) for the sweep; the best setting gets the whole file
        kaggle_subset = random_subset(kaggle, args.kaggle_limit, seed=0)
    chosen = [SETTINGS[int(i)] for i in args.settings.split(",")] if args.settings else SETTINGS

    def overrides_of(row: dict):
        return config_of(exp.config, row, args.temperature)

    done = rows_printed(pathlib.Path(args.resume_from), step) if args.resume_from else {}
    rows = []
    for label, selection, kwargs, steps, *more in chosen:
        row = {
            "model": "diffusion (in place)",
            "sampler": label,
            "selection": selection,
            "kwargs": kwargs,
            "max_steps": steps,
            "repair_rounds": more[0] if more else 0,
            "restarts": more[1] if len(more) > 1 else 0,
            "rules": more[2] if len(more) > 2 else False,
            "views": more[3] if len(more) > 3 else 1,
        }
        if len(more) > 4 and more[4] > 1:  # only when used, so that rows printed before the option keep their key
            row["parallel_attempts"] = more[4]
        if row["restarts"]:
            row["restart_temperature"] = RESTART_TEMPERATURE
            row["restart_gumbel_scale"] = RESTART_GUMBEL_SCALE
        if (key := setting_key(row)) in done:
            print(f"resumed: {label} <= {steps} from {args.resume_from}", flush=True)
            rows.append(done[key])
            continue
        row["checkpoint_step"] = step
        overrides = overrides_of(row)
        start = time.perf_counter()
        for name, data in sets.items():
            row[name] = score(exp, params, data, overrides)
        if kaggle is not None and steps in KAGGLE_BUDGETS:
            row["kaggle"] = score(exp, params, kaggle_subset, overrides)
        row["seconds"] = time.perf_counter() - start
        print(json.dumps(row), flush=True)
        rows.append(row)

    ar_row, ar = None, None
    if args.ar_workdir and pathlib.Path(args.ar_workdir).exists() and not args.merge:
        ar = exp_lib.from_workdir(args.ar_workdir)
        ar_params, ar_step = toolbox.load_params(ar, args.ar_workdir)
        ar_row = {
            "model": "autoregressive",
            "sampler": "greedy, left to right",
            "selection": "ar",
            "kwargs": "",
            "max_steps": 81,
            "checkpoint_step": ar_step,
        }
        for name, data in sets.items():
            ar_row[name] = score(ar, ar_params, data, ar.config)
        if kaggle is not None:
            ar_row["kaggle"] = score(ar, ar_params, kaggle_subset, ar.config)
        print(json.dumps(ar_row), flush=True)

    out = pathlib.Path(args.out)
    if args.merge:
        merge_into(out / "samplers.json", rows, args, step)
        return
    # Speed: the best <= 12-pass diffusion setting on (a) vs AR, side by side (interleaved), batch 1 and 100.
    cheap = [r for r in rows if r["a_30_36"]["forward_passes_per_puzzle"] <= 12.0]
    best = max(cheap or rows, key=lambda r: (r["a_30_36"]["accuracy"], r["b_24_29"]["accuracy"]))
    best_overrides = overrides_of(best)
    full_kaggle = None
    if kaggle is not None and kaggle_subset is not kaggle:  # the best setting on the whole file
        big = kaggle
        if args.kaggle_best_limit and args.kaggle_best_limit < len(kaggle["puzzles"]):
            big = random_subset(kaggle, args.kaggle_best_limit, seed=1)
        full_kaggle = dict(sampler=f"{best['sampler']} <= {best['max_steps']}", puzzles=int(len(big["puzzles"])))
        full_kaggle.update(score(exp, params, big, best_overrides))
        print(json.dumps({"kaggle_full": full_kaggle}), flush=True)
    speeds = []
    if ar is not None:
        puzzles = sets["a_30_36"]["puzzles"]
        # the best <= 12-pass setting, and the fewest-pass setting whose accuracy on (a) is still >= the AR model's
        # (the speed comparison "at equal or better accuracy")
        timed = [best]
        as_good = [r for r in rows if r["a_30_36"]["accuracy"] >= ar_row["a_30_36"]["accuracy"]]
        if as_good:
            fastest = min(as_good, key=lambda r: (r["a_30_36"]["forward_passes_per_puzzle"], -r["a_30_36"]["accuracy"]))
            if fastest is not best:
                timed.append(fastest)
        for setting in timed:
            overrides = overrides_of(setting)
            for batch, count in ((1, 20), (100, 300)):
                d, a = [], []
                for _ in range(2):
                    d.append(speed(exp, params, puzzles, overrides, batch, count))
                    a.append(speed(ar, ar_params, puzzles, ar.config, batch, count))
                line = {
                    "batch": batch,
                    "puzzles": count,
                    "diffusion_sampler": f"{setting['sampler']} <= {setting['max_steps']}",
                    "diffusion_accuracy_a": setting["a_30_36"]["accuracy"],
                    "ar_accuracy_a": ar_row["a_30_36"]["accuracy"],
                    "diffusion_puzzles_per_s": float(np.median(d)),
                    "ar_puzzles_per_s": float(np.median(a)),
                }
                line["ratio"] = line["diffusion_puzzles_per_s"] / line["ar_puzzles_per_s"]
                print(json.dumps(line), flush=True)
                speeds.append(line)

    out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": cli.argparse_command("experiments/sudoku/sudoku_samplers.py", args, skip=("", 0, None)),
        "workdir": args.workdir,
        "checkpoint_step": step,
        # tokens drawn at this temperature; cells ranked by logits / score_temperature (0: by the sampling logits)
        "sampling_temperature": args.temperature or float(exp.config.sampler.max_temperature),
        "score_temperature": float(exp.config.sampler.score_temperature),
        "sets": {
            name: {
                "puzzles_from": puzzle_sets[name].label,
                "puzzles": int(len(d["puzzles"])),
                "dropped_as_in_training": d["dropped_as_in_training"],
            }
            for name, d in sets.items()
        },
        "kaggle": None
        if kaggle is None
        else {
            "file": args.kaggle,
            "puzzles_in_sweep": int(len(kaggle_subset["puzzles"])),
            "full_file_best": full_kaggle,
        },
        "rows": rows,
        "ar": ar_row,
        "speed": speeds,
    }
    (out / "samplers.json").write_text(json.dumps(result, indent=1))
    write_markdown(result, out / "samplers.md")
    plot(result, out / "samplers.png")
    print(f"wrote {out}/samplers.{{json,md,png}}", flush=True)


SETTING_KEYS = (
    "sampler",
    "selection",
    "max_steps",
    "repair_rounds",
    "restarts",
    "parallel_attempts",
)


def setting_key(row: dict) -> tuple:
    key = tuple(row.get(k, "") for k in SETTING_KEYS)
    return key + (json.dumps(row_selection_args(row), sort_keys=True), row_rules(row), row_views(row))


def rows_printed(log: pathlib.Path, step: int) -> dict[tuple, dict]:
    """The diffusion rows an earlier run printed to `log` (its stdout), by setting. A row that names another checkpoint
    step is refused; rows printed before rows carried their step are taken on trust, with a warning."""
    if not log.is_file():
        raise FileNotFoundError(f"--resume_from={log}: no such file (give the stdout of an earlier run).")
    found = {}
    for number, line in enumerate(log.read_text().splitlines(), 1):
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            print(f"--resume_from: line {number} is not complete JSON (an interrupted write?); skipped", flush=True)
            continue
        if row.get("model") != "diffusion (in place)" or "a_30_36" not in row:
            continue
        if "checkpoint_step" not in row:
            print(f"--resume_from: line {number} does not record its checkpoint; assumed step {step}", flush=True)
        elif row["checkpoint_step"] != step:
            raise ValueError(
                f"--resume_from={log} line {number} is from checkpoint step {row['checkpoint_step']}, this run is at "
                f"step {step}; rows of two checkpoints would be mixed in one table."
            )
        found[setting_key(row)] = row
    return found


def check_merge(path: pathlib.Path, args, step: int) -> dict:
    """The stored table that --merge adds to, after checking it scored the same checkpoint on the same sets."""
    if not path.is_file():
        raise FileNotFoundError(f"--merge: {path} does not exist; run once without --merge to make the table.")
    result = json.loads(path.read_text())
    same_run = pathlib.Path(result["workdir"]).resolve() == pathlib.Path(args.workdir).resolve()
    if not same_run or result["checkpoint_step"] != step:
        raise ValueError(
            f"--merge: {path} holds {result['workdir']} at step {result['checkpoint_step']}, not {args.workdir} at "
            f"step {step}; run without --merge to make a new table."
        )
    stored = {
        "num": str(result["sets"]["a_30_36"]["puzzles_from"].split(", ")[1].split()[0])
        if "puzzles_from" in result["sets"]["a_30_36"]
        else result["sets"]["a_30_36"]["spec"].split(":")[2],  # tables made before `puzzles_from`
        "kaggle_limit": (result.get("kaggle") or {}).get("puzzles_in_sweep"),
        "temperature": result.get("sampling_temperature"),
    }
    asked = {"num": str(args.num), "kaggle_limit": args.kaggle_limit, "temperature": args.temperature or None}
    if stored["num"] != asked["num"] or (stored["kaggle_limit"] and stored["kaggle_limit"] != asked["kaggle_limit"]):
        raise ValueError(f"--merge: {path} was scored with {stored}; this run asks for {asked}. Use the same sets.")
    if asked["temperature"] is not None and asked["temperature"] != stored["temperature"]:
        raise ValueError(f"--merge: {path} drew tokens at {stored['temperature']}, not {asked['temperature']}.")
    return result


def merge_into(path: pathlib.Path, rows: list, args, step: int):
    """Adds `rows` to an earlier table of the same checkpoint (a row with the same sampler and budget is replaced)."""
    result = check_merge(path, args, step)
    new = {(r["sampler"], r["max_steps"]) for r in rows}
    result["rows"] = [r for r in result["rows"] if (r["sampler"], r["max_steps"]) not in new] + rows
    result["command"] += " ; then rows added by " + cli.argparse_command(
        "experiments/sudoku/sudoku_samplers.py", args, skip=("", 0, None)
    )
    path.write_text(json.dumps(result, indent=1))
    write_markdown(result, path.with_suffix(".md"))
    plot(result, path.with_suffix(".png"))
    print(f"merged {len(rows)} rows into {path} (and its .md, .png)", flush=True)


def _pct(x):
    return f"{100 * x:.1f}"


def write_markdown(result: dict, path: pathlib.Path):
    lines = [
        f"Sudoku samplers — `{result['workdir']}` (step {result['checkpoint_step']}); made by `{result['command']}`.",
        "",
        f"Tokens drawn at temperature {result.get('sampling_temperature')}; cells ranked by "
        + (
            f"the model's logits at temperature {result['score_temperature']:g}"
            if result.get("score_temperature")
            else "the sampling distribution"
        )
        + " (`sampler.score_temperature`).",
        "",
        "Exact-grid accuracy % (mean forward passes per puzzle; where the rows also decide sure cells, so that the "
        "passes adapt to the puzzle, the most any puzzle took). (a) generated 30–36 givens, (b) generated 24–29 "
        "givens (held out, unique solutions), (c) a seeded random subset of the shared Kaggle file (all levels).",
        "",
        "| model | sampler | max steps | (a) 30–36 | (b) 24–29 | (c) Kaggle |",
        "|---|---|---:|---:|---:|---:|",
    ]
    rows = list(result["rows"]) + ([result["ar"]] if result["ar"] else [])
    for r in rows:
        cells = []
        for name in ("a_30_36", "b_24_29", "kaggle"):
            s = r.get(name)
            adaptive = s and "also_above" in row_selection_args(r) and "max_forward_passes_per_puzzle" in s
            passes = f"{s['forward_passes_per_puzzle']:.1f}" if s else ""
            passes += f", max {s['max_forward_passes_per_puzzle']}" if adaptive else ""
            cells.append(f"{_pct(s['accuracy'])} ({passes})" if s else "–")
        lines.append(f"| {r['model']} | {r['sampler']} | {r['max_steps']} | " + " | ".join(cells) + " |")
    restart_temperatures = sorted({r["restart_temperature"] for r in rows if r.get("restarts")})
    if restart_temperatures:
        lines += [
            "",
            "Restart rows: a grid that still breaks a rule is solved again from the puzzle, tokens drawn at "
            f"temperature {', '.join(f'{t:g}' for t in restart_temperatures)} (`config.solver.restart_temperature`) "
            "with Gumbel noise of scale "
            + ", ".join(sorted({f"{restart_gumbel_scale(r):g}" for r in rows if r.get("restarts")}))
            + " on the ranking scores (`config.solver.restart_gumbel_scale`), so that an attempt decides cells in "
            "another order; the passes include every attempt.",
        ]
    used = {
        "rules": row_rules,
        "views": lambda r: row_views(r) > 1,
        "parallel_attempts": lambda r: r.get("parallel_attempts", 1) > 1,
    }
    for key, note in ROW_NOTES.items():  # one paragraph per inference-time option that some row used
        if any(used[key](r) for r in rows):
            lines += ["", note]
    full = (result.get("kaggle") or {}).get("full_file_best")
    if full:
        lines += [
            "",
            f"The whole Kaggle file ({full['puzzles']} puzzles) with the best <= 12-pass setting on (a), "
            f"{full['sampler']}: **{_pct(full['accuracy'])}%** exact grids "
            f"({full['forward_passes_per_puzzle']:.1f} passes per puzzle); by level: "
            + ", ".join(
                f"{k[len('accuracy_level_') :]} {_pct(v)}%" for k, v in full.items() if k.startswith("accuracy_level_")
            )
            + ".",
        ]
    levels = sorted({k for r in rows if r.get("kaggle") for k in r["kaggle"] if k.startswith("accuracy_level_")})
    if levels:
        lines += [
            "",
            "Kaggle file by level (exact-grid accuracy %):",
            "",
            "| model | sampler | max steps | " + " | ".join(k[len("accuracy_level_") :] for k in levels) + " |",
            "|---|---|---:|" + "---:|" * len(levels),
        ]
        for r in rows:
            if r.get("kaggle"):
                lines.append(
                    f"| {r['model']} | {r['sampler']} | {r['max_steps']} | "
                    + " | ".join(_pct(r["kaggle"].get(k, float("nan"))) for k in levels)
                    + " |"
                )
    if result["speed"]:
        lines += [
            "",
            "Speed (puzzles/s, side by side on this machine):",
            "",
            "| batch | diffusion sampler | accuracy (a) % | diffusion | AR (81 cached steps) | AR accuracy (a) % | ratio |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for s in result["speed"]:
            acc = _pct(s["diffusion_accuracy_a"]) if "diffusion_accuracy_a" in s else "–"
            ar_acc = _pct(s["ar_accuracy_a"]) if "ar_accuracy_a" in s else "–"
            lines.append(
                f"| {s['batch']} | {s['diffusion_sampler']} | {acc} | {s['diffusion_puzzles_per_s']:.1f} | "
                f"{s['ar_puzzles_per_s']:.1f} | {ar_acc} | {s['ratio']:.2f} |"
            )
    path.write_text("\n".join(lines) + "\n")


def plot(result: dict, path: pathlib.Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for ax, name, title in zip(axes, ("a_30_36", "b_24_29"), ("(a) 30–36 givens", "(b) 24–29 givens")):
        by_label: dict[str, list] = {}
        for r in result["rows"]:
            by_label.setdefault(r["sampler"], []).append(
                (r[name]["forward_passes_per_puzzle"], 100 * r[name]["accuracy"])
            )
        for i, (label, pts) in enumerate(by_label.items()):
            pts.sort()
            marker = "os^D"[(i // 10) % 4]  # the colour cycle repeats after 10 series; the marker tells them apart
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=label)
        if result["ar"]:
            s = result["ar"][name]
            ax.scatter([s["forward_passes_per_puzzle"]], [100 * s["accuracy"]], marker="x", s=80, c="k", label="AR")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())  # 4, 6, 10 rather than 4 x 10^0
        ax.xaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("forward passes per puzzle")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("exact-grid accuracy (%)")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
