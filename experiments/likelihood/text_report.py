"""The Text results: likelihood, generative perplexity, loss curves and quality vs speed for trained runs.

  python experiments/likelihood/text_report.py --runs runs/shakespeare_uniform,runs/shakespeare_masking,runs/shakespeare_ar \
      --ar runs/shakespeare_ar [--out results/text]

For each run: the validation bound over the whole split (AR: exact NLL, one pass; diffusion: the ELBO, Monte-Carlo
passes with fresh noise, at least 3, until the standard error over passes is < 1% of the value or `--max_repeats`), in bits per
character (Shakespeare) or perplexity per word (PTB), with the tokens the run saw in training; the generative
perplexity under the AR run of `--num_samples` samples of `--new_tokens` tokens (the run's own sampler; the AR run at
its own temperature) and their unigram entropy. For the diffusion runs, quality vs speed: the sampler's step budget
and entropy bound swept, tokens/s (batch `--num_samples`, after a compiling call) against generative perplexity.

Writes results/text/{report.json,table.md,loss.png,quality_speed.png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import numpy as np

SWEEP = [  # (num_steps, entropy-bound gamma, min_count) for the quality-vs-speed plot
    (4, 0.1, None),
    (8, 0.1, None),
    (16, 0.1, None),
    (32, 0.1, None),
    (64, 0.1, None),
    (64, 0.01, None),
    (64, 1.0, None),
    # min_count "even": the budget's parallel decisions spread over its steps, not left to the last one
    (8, 0.1, "even"),
    (12, 0.1, "even"),
    (16, 0.1, "even"),
    (32, 0.1, "even"),
]


def tokens_seen(config) -> int:
    return int(config.train.num_steps * config.data.batch_size * config.data.seq_len)


def likelihood(exp, params, max_repeats: int) -> dict:
    from hackable_diffusion.tasks import text

    runs = []
    while True:
        runs.append(text.evaluate_likelihood(exp, params, seed=len(runs)))
        if exp.is_autoregressive:
            break
        if len(runs) >= 3:  # at least three passes for the SE estimate itself
            per = np.asarray([r["bits_per_token"] for r in runs])
            se = per.std(ddof=1) / np.sqrt(len(per))
            if se < 0.01 * per.mean() or len(runs) >= max_repeats:
                break
    out = {k: float(np.mean([r[k] for r in runs])) for k in runs[0] if isinstance(runs[0][k], (int, float))}
    out["repeats"] = len(runs)
    if len(runs) > 1:
        per = np.asarray([r["bits_per_token"] for r in runs])
        out["bits_per_token_se"] = float(per.std(ddof=1) / np.sqrt(len(per)))
        # within-pass SE (over batches) averaged, as a conservative alternative
        out["bits_per_token_se_within_pass"] = float(
            np.mean([r["bits_per_token_se"] for r in runs]) / np.sqrt(len(runs))
        )
    if exp.is_autoregressive:  # exact: no Monte-Carlo error; the across-batch spread is the data's
        out["bits_per_token_se_data"] = out.pop("bits_per_token_se")
        out["bits_per_token_se"] = 0.0
    out["se_relative"] = out["bits_per_token_se"] / out["bits_per_token"]
    return out


def sample_and_score(exp, params, ar, ar_params, num_samples: int, new_tokens: int, seed: int = 0) -> dict:
    from hackable_diffusion.data.tokenizers import BOS_ID
    from hackable_diffusion.tasks import text

    prompts = [exp.config.sampler.prompt] * num_samples
    text.sample_texts(exp, params, prompts, seed=seed + 1, max_new_tokens=new_tokens)  # compile
    start = time.perf_counter()
    texts, result = text.sample_texts(exp, params, prompts, seed=seed, max_new_tokens=new_tokens)
    seconds = time.perf_counter() - start
    out = text.generative_perplexity(
        ar, ar_params, [[BOS_ID] + ar.tokenizer.encode(p) for p in prompts], [ar.tokenizer.encode(t) for t in texts]
    )
    out["tokens_per_s"] = float(np.sum(result.lengths)) / seconds
    out["forward_passes"] = int(result.forward_passes)
    if result.steps is not None:
        steps = np.asarray(result.steps)
        out["mean_steps_per_canvas"] = float(steps[steps > 0].mean())
    out["sample"] = prompts[0] + texts[0][:240]
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="runs/shakespeare_uniform,runs/shakespeare_masking,runs/shakespeare_ar")
    parser.add_argument("--ar", default="runs/shakespeare_ar")
    parser.add_argument("--out", default="results/text")
    parser.add_argument("--max_repeats", type=int, default=6)
    parser.add_argument("--num_samples", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--no_sweep", action="store_true")
    parser.add_argument("--merge", action="store_true", help="keep the other runs of an existing report.json")
    args = parser.parse_args()

    from hackable_diffusion import cli, recipes
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.training import metrics

    cli.quiet_library_logs()
    ar = exp_lib.from_workdir(args.ar)
    ar_params, _ = toolbox.load_params(ar, args.ar)
    report = {
        "command": cli.argparse_command("experiments/likelihood/text_report.py", args),
        "runs": {},
    }
    previous = pathlib.Path(args.out) / "report.json"
    if args.merge and previous.exists():
        report["runs"] = json.loads(previous.read_text())["runs"]
        report["merged"] = "rows merged into an earlier report of the other runs"
    for workdir in [w for w in args.runs.split(",") if w]:
        exp = exp_lib.from_workdir(workdir)
        params, step = toolbox.load_params(exp, workdir)
        name = pathlib.Path(workdir).name
        row = {
            "workdir": workdir,
            "model": "autoregressive" if exp.is_autoregressive else f"diffusion/{exp.config.diffusion.process}",
            "checkpoint_step": step,
            "tokens_seen": tokens_seen(exp.config) * step // max(exp.config.train.num_steps, 1),
        }
        start = time.perf_counter()
        row["likelihood"] = likelihood(exp, params, args.max_repeats)
        row["samples"] = sample_and_score(exp, params, ar, ar_params, args.num_samples, args.new_tokens)
        if not exp.is_autoregressive and not args.no_sweep:
            sweep = []
            for steps, gamma, min_count in SWEEP:
                selection = recipes.selection(
                    "entropy_bound", gamma=gamma, **({"min_count": min_count} if min_count else {})
                )
                over = {"sampler.num_steps": steps, "sampler.selection": selection}
                swept = dataclasses.replace(exp, config=cli.override(exp.config, over))
                point = sample_and_score(swept, params, ar, ar_params, args.num_samples, args.new_tokens)
                point.update(num_steps=steps, gamma=gamma, min_count=min_count)
                point.pop("sample")
                sweep.append(point)
                print(json.dumps({"run": name, **point}), flush=True)
            row["sweep"] = sweep
        row["curve"] = metrics.read_metrics(workdir, "eval")  # a resumed run's redone steps replace the first ones
        row["seconds"] = time.perf_counter() - start
        report["runs"][name] = row
        print(json.dumps({k: v for k, v in row.items() if k not in ("curve", "sweep")}), flush=True)

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    write_table(report, out / "table.md")
    plot_curves(report, out / "loss.png")
    plot_quality_speed(report, out / "quality_speed.png")
    print(f"wrote {out}/{{report.json,table.md,loss.png,quality_speed.png}}", flush=True)


def write_table(report: dict, path: pathlib.Path):
    lines = [
        f"Made by `{report['command']}`" + (f" ({report['merged']})." if report.get("merged") else "."),
        "",
        "| run | model | tokens seen | validation bound | SE (rel.) | gen. ppl (under AR) | unigram entropy (bits) | "
        "tokens/s (batch of samples) | mean steps / canvas |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["runs"].items():
        lk, s = r["likelihood"], r["samples"]
        bound = (
            f"{lk['bits_per_char']:.3f} bits/char" if "bits_per_char" in lk else f"{lk['ppl_per_word']:.1f} ppl/word"
        )
        kind = "NLL" if r["model"] == "autoregressive" else "ELBO"
        steps = f"{s['mean_steps_per_canvas']:.1f}" if "mean_steps_per_canvas" in s else "–"
        se = "exact" if kind == "NLL" else f"{100 * lk['se_relative']:.2f}%"
        lines.append(
            f"| {name} | {r['model']} | {r['tokens_seen'] / 1e6:.2f}M | {kind} {bound} | "
            f"{se} | {s['gen_ppl']:.2f} | {s['gen_unigram_entropy_bits']:.2f} | "
            f"{s['tokens_per_s']:.0f} | {steps} |"
        )
    lines += ["", "Samples:", ""]
    for name, r in report["runs"].items():
        lines.append(f"- **{name}**: `{r['samples']['sample']!r}`")
    path.write_text("\n".join(lines) + "\n")


def plot_curves(report: dict, path: pathlib.Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in report["runs"].items():
        per_step = r["tokens_seen"] / max(r["checkpoint_step"], 1)
        pts = [(c["step"] * per_step / 1e6, c.get("bits_per_char", c["bits_per_token"])) for c in r["curve"]]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"{name} ({'NLL' if r['model'] == 'autoregressive' else 'ELBO'})")
    ax.set_xlabel("training tokens (millions)")
    per_char = any("bits_per_char" in c for r in report["runs"].values() for c in r["curve"])
    ax.set_ylabel(f"validation bits per {'character' if per_char else 'token'} (subset of the split)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def plot_quality_speed(report: dict, path: pathlib.Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in report["runs"].items():
        if "sweep" in r:
            for min_count in sorted({p.get("min_count") or "" for p in r["sweep"]}):
                series = [p for p in r["sweep"] if (p.get("min_count") or "") == min_count]
                pts = sorted((p["tokens_per_s"], p["gen_ppl"], p["num_steps"], p["gamma"]) for p in series)
                label = name + (f", min_count {min_count}" if min_count else "")
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker="o", ls="--" if min_count else "-", label=label
                )
                for x, y, steps, gamma in pts:
                    ax.annotate(f"{steps}/{gamma:g}", (x, y), fontsize=6)
        else:
            s = r["samples"]
            kind = "AR" if r["model"] == "autoregressive" else "its own sampler, no sweep"
            ax.scatter([s["tokens_per_s"]], [s["gen_ppl"]], marker="x", s=80, label=f"{name} ({kind})")
    ax.set_xscale("log")
    ax.set_xlabel("tokens/s (this CPU)")
    ax.set_ylabel("generative perplexity under the AR run")
    ax.set_title("labels: max steps per canvas / entropy bound")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
