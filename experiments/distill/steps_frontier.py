"""Quality against denoising steps per canvas: a teacher and its distilled students, side by side.

  python experiments/distill/steps_frontier.py --teacher runs/quickstart \
      --students runs/distill_qs_trajectory:trajectory,runs/distill_qs_consistency:consistency \
      --ar runs/quickstart_ar --steps 1,2,4,8,16,32 --out results/text/steps_frontier

For every model and every step budget S in `--steps` (the teacher's: `--teacher_steps`, default the same), continues `--num_prompts` prompts (the first `--prompt_len`
tokens of validation sequences at seeded offsets, the same for every model) by `--new_tokens` tokens with the model's
own sampler at S steps per canvas (early stopping off, so every canvas takes exactly S passes) and measures:
  * generative perplexity under the autoregressive run `--ar` (the continuation re-encoded with its tokenizer),
  * the diversity of the continuations (a collapsed few-step student can score a low perplexity with repetitive
    text): unigram, bigram and trigram entropy in bits, distinct-2 and distinct-3 (distinct n-grams over all
    n-grams, Li et al. 2016) and seq-rep-4 (the share of a continuation's 4-grams that repeat an earlier 4-gram of
    the same continuation, averaged over continuations; Welleck et al. 2020), all over the scorer's tokens
    (`tasks.text_evaluation`: `ngram_entropy_bits`, `distinct_n`, `repetition_rate`),
  * tokens/s at batch `--num_prompts` (a compiling call first, then a timed one; other jobs on the machine change it).
`--min_count even` sets the selection floor of every diffusion model whose rule is the entropy bound (without one it
spends a budget below the canvas length one position per step and decides the rest in its last step; the other rules
count their positions per step themselves). A student named RUN@STEP is
measured at that kept checkpoint (to pick a stopping step on the frontier).
`--config.sampler.<key>=value` arguments change the students' samplers (e.g. their temperature), not the teacher's.
`--cooled MAX/MIN[^EXPONENT],...` measures every diffusion model also at these temperature schedules (its sampler
anneals from MAX at full noise to MIN at none, as T(t) = MIN + (MAX - MIN)(1 - (1 - t)^EXPONENT)), and
`--teacher_rules dilated,...` the teacher also under other selection rules (their own defaults; `dilated+commit`: a
uniform sampler that keeps what it accepts), at the same budgets: a student that only learned to sample colder lands
on the teacher's curve, so a student's gain is its distance below the cooled teacher at equal entropy
(FILE_plane.png: gen. perplexity against unigram entropy, one panel per budget). Bigram entropy separates them better
than unigram entropy (characters keep their frequencies while pairs repeat): FILE_frontier.png draws each model's
frontier, gen. perplexity against bigram entropy over its temperature schedules, at every budget against the
teacher's at the largest budget, and the summary line gives each one's worst relative excess over that teacher at
equal bigram entropy (`experiments/distill/plot_frontier.py`: `matched_excess`; None where their entropies do not overlap)
and the share of the teacher's bigram-entropy range where they overlap (the acceptance asks for all of it).
The AR run's own samples are one more row (its temperature, one pass per token). Writes FILE.jsonl (one row per
model and budget), FILE.png (gen. perplexity and entropies against steps per canvas) and prints one JSON line with
the gen. perplexity of each model at each budget and the worst excesses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import numpy as np

from hackable_diffusion import cli


def prompts_from(exp, num: int, length: int, seed: int) -> list[str]:
    from hackable_diffusion.data.tokenizers import SPECIAL_IDS

    rows = exp.data.eval_sequences
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(rows), size=num, replace=len(rows) < num)
    out = []
    for i in chosen:
        ids = [int(t) for t in rows[i][:length] if int(t) not in SPECIAL_IDS]
        out.append(exp.tokenizer.decode(ids))
    return out


def with_steps(exp, steps: int, floor: str = ""):
    """The run at `steps` per canvas, early stopping off; `floor`: the selection rule's `min_count` (e.g. "even")."""
    from hackable_diffusion import recipes

    config = exp.config.copy_and_resolve_references()
    config.sampler.num_steps = steps
    config.sampler.early_stopping = recipes.early_stopping("none")
    if floor and config.sampler.selection.rule == "entropy_bound":  # the one rule with a floor (others count)
        config.sampler.selection.min_count = floor
    return dataclasses.replace(exp, config=config)


def measure(exp, params, prompts, new_tokens: int, ar, ar_params, seed: int) -> dict:
    from hackable_diffusion.data.tokenizers import BOS_ID
    from hackable_diffusion.tasks import text, text_evaluation

    text.sample_texts(exp, params, prompts, seed=seed + 1, max_new_tokens=new_tokens)  # compile
    start = time.perf_counter()
    texts, result = text.sample_texts(exp, params, prompts, seed=seed, max_new_tokens=new_tokens)
    seconds = time.perf_counter() - start
    conts = [ar.tokenizer.encode(t) for t in texts]
    out = text.generative_perplexity(ar, ar_params, [[BOS_ID] + ar.tokenizer.encode(p) for p in prompts], conts)
    out.update(text_evaluation.diversity(conts))
    out["tokens_per_s"] = float(np.sum(result.lengths)) / seconds
    out["forward_passes"] = int(result.forward_passes)
    if result.steps is not None:
        used = np.asarray(result.steps)
        out["mean_steps_per_canvas"] = float(used[used > 0].mean()) if (used > 0).any() else 0.0
    out["sample"] = prompts[0][-40:] + " || " + texts[0][:160]
    return out


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = list(dict.fromkeys(r["label"] for r in rows if r["label"] != "ar"))
    for label in labels:
        pts = sorted((r["steps_per_canvas"], r) for r in rows if r["label"] == label)
        xs = [p[0] for p in pts]
        left.plot(xs, [p[1]["gen_ppl"] for p in pts], marker="o", label=label)
        (line,) = right.plot(xs, [p[1]["gen_unigram_entropy_bits"] for p in pts], marker="o", label=f"{label} unigram")
        right.plot(xs, [p[1]["gen_bigram_entropy_bits"] for p in pts], marker="s", ls="--", color=line.get_color())
    for r in rows:
        if r["label"] == "ar":
            left.axhline(r["gen_ppl"], color="grey", ls=":", label="AR samples")
            right.axhline(r["gen_unigram_entropy_bits"], color="grey", ls=":")
            right.axhline(r["gen_bigram_entropy_bits"], color="grey", ls="-.")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("denoising steps per canvas")
        ax.grid(alpha=0.3)
    left.set_yscale("log")
    left.set_ylabel("generative perplexity under the AR run")
    right.set_ylabel("entropy of the samples (bits; dashed: bigram)")
    left.legend(fontsize=8)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def plot_plane(rows: list[dict], path: pathlib.Path) -> None:
    """Gen. perplexity against unigram entropy, one panel per budget: each model (the teacher, the teacher under
    another rule, each student) one curve through its own and its cooled temperature schedules."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted({r["steps_per_canvas"] for r in rows if r["steps_per_canvas"]})
    fig, axes = plt.subplots(1, len(budgets), figsize=(4 * len(budgets), 3.6), squeeze=False)
    for ax, steps in zip(axes[0], budgets):
        at = [r for r in rows if r["steps_per_canvas"] == steps]
        for model in dict.fromkeys(r.get("model", r["label"]) for r in at if r["label"] != "ar"):
            curve = sorted(
                (r for r in at if r.get("model", r["label"]) == model), key=lambda r: r["gen_unigram_entropy_bits"]
            )
            xs, ys = [r["gen_unigram_entropy_bits"] for r in curve], [r["gen_ppl"] for r in curve]
            ax.plot(xs, ys, "-o", color="k" if model == "teacher" else None, label=model)
            for r, x, y in zip(curve, xs, ys):
                if r["label"] != model:
                    ax.annotate(r["label"].removeprefix(model + "_"), (x, y), fontsize=6)
        ax.set_yscale("log")
        ax.set_title(f"{steps} steps per canvas", fontsize=9)
        ax.set_xlabel("unigram entropy of the samples (bits)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("generative perplexity under the AR run")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def frontiers_against_teacher(rows: list[dict]):
    """The teacher's frontier (gen. perplexity against bigram entropy over its temperature schedules) at its largest
    budget, and every other model's at every budget with its `plot_frontier.matched_excess` against it."""
    from plot_frontier import frontier_from_rows, matched_excess, model_of

    budgets = [r["steps_per_canvas"] for r in rows if model_of(r) == "teacher"]
    teacher = frontier_from_rows(rows, f"teacher@{max(budgets)}")
    specs = dict.fromkeys(f"{model_of(r)}@{r['steps_per_canvas']}" for r in rows if r["steps_per_canvas"])
    others = [frontier_from_rows(rows, spec) for spec in specs if spec != teacher.name]
    return teacher, [(f, matched_excess(f, teacher)) for f in others]


def cooled_schedules(spec: str) -> list[tuple[float, float, float | None]]:
    """Parses "0.6/0.3,1.6/0.2^0.25" into [(0.6, 0.3, None), (1.6, 0.2, 0.25)]: the temperature at full noise, at
    none, and the annealing exponent (None: the run's own `sampler.temperature_exponent`)."""
    from hackable_diffusion.sampling.temperature import parse_annealed

    try:
        return [parse_annealed(item) for item in filter(None, spec.split(","))]
    except ValueError as err:
        raise ValueError(f"--cooled: {err}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True)
    parser.add_argument(
        "--students",
        default="",
        help="RUN[@STEP]:LABEL,... (label: default the folder name; @STEP: that kept checkpoint, default the latest)",
    )
    parser.add_argument(
        "--min_count",
        default="",
        help="every diffusion model's selection floor (sampler.selection.min_count), e.g. even: without one an "
        "entropy-bound sampler at fewer steps than canvas positions decides what is left in its last step",
    )
    parser.add_argument(
        "--cooled",
        default="",
        help="MAX/MIN[^EXPONENT],...: every diffusion model also at these temperature schedules (full noise / none; "
        "the annealing exponent, default the run's own: below 1 the temperature falls fast after the first step)",
    )
    parser.add_argument(
        "--teacher_rules",
        default="",
        help="RULE[+commit],...: the teacher again with each of these selection rules (e.g. dilated), measured at "
        "every budget; +commit: a uniform sampler that keeps what it accepted (sampler.commit)",
    )
    parser.add_argument("--ar", required=True, help="the autoregressive scorer run")
    parser.add_argument("--steps", default="1,2,4,8,16,32")
    parser.add_argument(
        "--teacher_steps",
        default="",
        help="the budgets of the teacher (and its --teacher_rules) when they differ from --steps, e.g. 16 while the "
        "students run at --steps 2,4 (default: --steps); 0: no teacher rows (measure the teacher in another run on "
        "the same prompts and pool the two files with experiments/distill/plot_frontier.py)",
    )
    parser.add_argument("--num_prompts", type=int, default=32)
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/text/steps_frontier")
    args, overrides = parser.parse_known_args()

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox

    cli.quiet_library_logs()
    budgets = [int(s) for s in args.steps.split(",") if s]
    teacher_budgets = [int(s) for s in args.teacher_steps.split(",") if s] or budgets
    if teacher_budgets == [0]:  # the students alone; their frontier is drawn against a teacher file's (plot_frontier.py)
        teacher_budgets = []
    try:
        cooled = cooled_schedules(args.cooled)
    except ValueError as err:
        cli.fail(str(err))
    # (run, checkpoint step, label, selection rule or None, is a student: the command line's overrides apply)
    models = [(args.teacher, None, "teacher", None, False)]
    models += [
        (args.teacher, None, f"teacher_{rule}", rule, False) for rule in filter(None, args.teacher_rules.split(","))
    ]
    for item in filter(None, args.students.split(",")):
        run, _, label = item.partition(":")
        run, _, at = run.partition("@")
        models.append((run, int(at) if at else None, label or pathlib.Path(run).name, None, True))
    ar = exp_lib.from_workdir(args.ar)
    ar_params, ar_step = toolbox.load_params(ar, args.ar)
    if not ar.is_autoregressive:
        cli.fail(f"--ar {args.ar} is not an autoregressive run.")
    teacher_exp = exp_lib.from_workdir(args.teacher)
    prompts = prompts_from(teacher_exp, args.num_prompts, args.prompt_len, args.seed)
    rows = []
    command = " ".join([cli.argparse_command("experiments/distill/steps_frontier.py", args), *overrides])
    for run, at, model, rule, is_student in models:
        base = exp_lib.from_workdir(run)
        params, step = toolbox.load_params(base, run, step=at)
        if is_student and overrides:
            base = dataclasses.replace(base, config=cli.parse_config_overrides(base.config, overrides))
        for temps in [None, *cooled]:
            config = base.config.copy_and_resolve_references()
            if rule:
                name, _, commit = rule.partition("+")
                if commit not in ("", "commit"):
                    cli.fail(f"--teacher_rules {rule!r}: write RULE or RULE+commit.")
                config.sampler.selection = {"rule": name}
                config.sampler.commit = bool(commit)
            label = model
            if temps:
                config.sampler.max_temperature, config.sampler.min_temperature, exponent = temps
                label += f"_T{temps[0]:g}/{temps[1]:g}"
                if exponent is not None:
                    config.sampler.temperature_exponent = exponent
                    label += f"^{exponent:g}"
            exp = dataclasses.replace(base, config=config)
            for steps in budgets if is_student else teacher_budgets:
                started = time.perf_counter()
                out = measure(
                    with_steps(exp, steps, args.min_count), params, prompts, args.new_tokens, ar, ar_params, args.seed
                )
                row = {
                    "label": label,
                    "model": model,
                    "run": run,
                    "checkpoint_step": int(step),
                    "steps_per_canvas": steps,
                }
                row.update(out)
                row["temperature"] = [
                    float(exp.config.sampler.max_temperature),
                    float(exp.config.sampler.min_temperature),
                ]
                row["temperature_exponent"] = float(exp.config.sampler.temperature_exponent)
                row["wall_seconds"] = time.perf_counter() - started
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "sample"}), flush=True)
    out = measure(ar, ar_params, prompts, args.new_tokens, ar, ar_params, args.seed)
    rows.append({"label": "ar", "run": args.ar, "checkpoint_step": int(ar_step), "steps_per_canvas": None, **out})
    path = pathlib.Path(args.out)
    if path.suffix in (".jsonl", ".png"):  # FILE names a stem: "runs/exp0.5" keeps its ".5"
        path = path.with_suffix("")
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / (path.name + ".jsonl")).open("w") as f:
        f.write(json.dumps({"command": command}) + "\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")
    plot(rows, path.parent / (path.name + ".png"))
    plot_plane(rows, path.parent / (path.name + "_plane.png"))
    from plot_frontier import plot_frontiers

    summary = {
        "gen_ppl": {
            r["label"] + (f"@{r['steps_per_canvas']}" if r["steps_per_canvas"] else ""): round(r["gen_ppl"], 2)
            for r in rows
        },
        "prompts": len(prompts),
        "new_tokens": args.new_tokens,
    }
    if teacher_budgets:
        teacher, matched = frontiers_against_teacher(rows)
        plot_frontiers(teacher, [f for f, _ in matched], path.parent / (path.name + "_frontier.png"))
        summary[f"worst_excess_over_{teacher.name}_at_equal_bigram_entropy"] = {
            f.name: m.worst_excess for f, m in matched
        }
        summary[f"share_of_{teacher.name}_bigram_range_compared"] = {
            f.name: round(m.teacher_coverage, 3) for f, m in matched
        }
    print(cli.json_line(summary), flush=True)


if __name__ == "__main__":
    main()
