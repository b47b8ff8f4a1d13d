"""The data-constrained epoch study: AR vs block masking from scratch vs block masking adapted from the AR run, on
tiny Shakespeare for many epochs (Prabhudesai et al. 2025 report that with data repeated and enough compute, masked
diffusion overtakes AR).

  python experiments/likelihood/epoch_study.py --root runs/epoch_study --epochs 1,2,4,8,16,32,64 [--adapt_from_epoch 1]
  python experiments/likelihood/epoch_study.py --root runs/epoch_study --plot results/text/epoch_study.png
  python experiments/likelihood/epoch_study.py --root runs/epoch_study_mini --size mini --runs ar --epochs 1,2,3,4,6,8  # a pilot
  python experiments/likelihood/epoch_study.py --root runs/epoch_study_tenth --size mini --epochs 1,2,4,6,8,12,16,24 \
      --adapt_from_epoch 8 --override=--config.data.train_fraction=0.1   # data-constrained: the first 10% of the split

Stage by stage (one entry of `--epochs` at a time, in order), each run of configs/epoch_study.py is trained up to that
many epochs of the training split (`train` resumes its workdir with a larger `train.num_steps`; the constant learning
rate makes the extended run the same as one long run) and evaluated on the validation split (`evaluate`: the AR
run's exact NLL, the diffusion runs' ELBO). The adapted run starts from the AR run once that has trained
`--adapt_from_epoch` epochs, and its epochs and FLOPs count the AR epochs it started from. Rows go to ROOT/rows.jsonl
(run, epochs, step, bits/char and its standard error, training FLOPs from `training_flops_per_token` times the
objective's passes, wall seconds); a stage already in it is skipped, so the study resumes where it stopped, and any
`train` interrupted resumes from its last checkpoint. Long work: each `train` prints its own progress; this script
prints one JSON line per stage and, with `--plot`, draws bits/char against epochs and against training FLOPs.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
KINDS = ("ar", "masking", "adapted")


def read_rows(root: pathlib.Path) -> list[dict]:
    path = root / "rows.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_command(args: list[str], log: pathlib.Path) -> str:
    """Runs `python -m ...` in the repository; its output goes to `log`; returns stdout. Stops the study on failure."""
    with log.open("a") as out:
        done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, check=False)
        out.write(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(
            f"error: {' '.join(args[:2])} failed (exit {done.returncode}); see {log}:\n{done.stderr[-2000:]}"
        )
    return done.stdout


class Study:
    """What the study needs from the configs: steps per epoch and training FLOPs per step of each run."""

    def __init__(self, root: pathlib.Path, overrides: list[str], size: str = "quickstart"):
        import ast
        import tempfile

        sys.path.insert(0, str(REPO))
        from hackable_diffusion import builders, cli
        from hackable_diffusion import experiment as exp_lib
        from hackable_diffusion.models.param_count import training_flops_per_token

        def typed(value: str):
            try:
                return ast.literal_eval(value)
            except (ValueError, SyntaxError):
                return value

        parsed = {}
        for item in overrides:
            key, _, value = item.removeprefix("--config.").partition("=")
            parsed[key] = typed(value)
        self.root, self.overrides, self.size = root, overrides, size
        self.configs, self.flops_per_step = {}, {}
        for kind in KINDS:
            config = cli.override(cli.load_config_file(str(REPO / "configs" / f"epoch_study.py:{kind},{size}")), parsed)
            config.init.kind = "scratch"  # only the shapes are needed here, not the AR run's weights
            with tempfile.TemporaryDirectory() as tmp:
                exp = exp_lib.build(config, tmp)
            tokens = config.data.batch_size * config.data.seq_len
            passes = builders.objective_passes(config)
            per_token = training_flops_per_token(exp.model.cfg, config.data.seq_len)
            self.flops_per_step[kind] = tokens * passes * per_token
            self.configs[kind] = config
            self.sequences = len(exp.data.train_sequences)

    def steps(self, kind: str, epochs: float) -> int:
        return max(1, int(round(epochs * self.sequences / self.configs[kind].data.batch_size)))

    def train(self, kind: str, steps: int, log: pathlib.Path, init_from: str = "") -> None:
        config = f"--config=configs/epoch_study.py:{kind},{self.size}"
        args = ["hackable_diffusion.train", config, f"--workdir={self.root / kind}"]
        args += [f"--config.train.num_steps={steps}", *self.overrides]
        if init_from:
            args.append(f"--config.init.checkpoint={init_from}")
        run_command(args, log)

    def evaluate(self, kind: str, num_batches: int, log: pathlib.Path) -> dict:
        out = run_command(
            ["hackable_diffusion.evaluate", f"--workdir={self.root / kind}", f"--num_batches={num_batches}"], log
        )
        return json.loads(out.strip().splitlines()[-1])


def latest_step(workdir: pathlib.Path) -> int:
    steps = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
    return max(steps, default=0)


def run_study(args) -> None:
    root = pathlib.Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    epochs = [float(e) for e in args.epochs.split(",")]
    if epochs != sorted(epochs) or args.adapt_from_epoch not in epochs:
        raise SystemExit(
            f"error: --epochs must be increasing and contain --adapt_from_epoch={args.adapt_from_epoch}, got {epochs}."
        )
    runs = [kind for kind in args.runs.split(",") if kind]
    if not runs or set(runs) - set(KINDS) or ("adapted" in runs and "ar" not in runs):
        raise SystemExit(
            f"error: --runs must name runs of {KINDS} (the adapted run needs the AR run), got {args.runs!r}."
        )
    study = Study(root, args.override, args.size)
    done = {(r["run"], r["epochs"]) for r in read_rows(root)}
    log = root / "study.log"
    for stage in epochs:
        order = ["adapted", "ar", "masking"] if stage > args.adapt_from_epoch else ["ar", "masking"]
        # the adapted run starts before the AR run moves past its starting epoch
        for kind in (k for k in order if k in runs):
            if (kind, stage) in done:
                continue
            start = time.time()
            if kind == "adapted":
                ar_steps = study.steps("ar", args.adapt_from_epoch)
                own = study.steps("adapted", stage - args.adapt_from_epoch)
                if not latest_step(root / "adapted") and latest_step(root / "ar") != ar_steps:
                    raise SystemExit(
                        f"error: the adapted run starts from the AR run at {args.adapt_from_epoch} epochs (step "
                        f"{ar_steps}), but {root / 'ar'} is at step {latest_step(root / 'ar')}; use a new --root or "
                        "the --adapt_from_epoch of this study."
                    )
                study.train(kind, own, log, init_from=str(root / "ar"))
                flops = ar_steps * study.flops_per_step["ar"] + own * study.flops_per_step["adapted"]
                step = own
            else:
                step = study.steps(kind, stage)
                study.train(kind, step, log)
                flops = step * study.flops_per_step[kind]
            result = study.evaluate(kind, args.num_batches, log)
            row = dict(
                run=kind,
                epochs=stage,
                step=step,
                bits_per_char=result["bits_per_char"],
                bits_per_char_se=result.get("bits_per_token_se") or 0.0,
                train_flops=flops,
                eval_tokens=result.get("eval_tokens"),
                seconds=round(time.time() - start, 1),
            )
            with (root / "rows.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(pathlib.Path(args.root))
    if not rows:
        raise SystemExit(f"error: no rows in {args.root}/rows.jsonl yet; run the study first.")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for kind in KINDS:
        mine = sorted((r for r in rows if r["run"] == kind), key=lambda r: r["epochs"])
        if not mine:
            continue
        for ax, key in zip(axes, ("epochs", "train_flops")):
            ax.errorbar(
                [r[key] for r in mine],
                [r["bits_per_char"] for r in mine],
                yerr=[r["bits_per_char_se"] for r in mine],
                marker="o",
                label=kind,
            )
    for ax, label in zip(axes, ("epochs of the training split", "training FLOPs")):
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("validation bits/char (AR: NLL, diffusion: ELBO)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=100)
    best = {k: min((r["bits_per_char"] for r in rows if r["run"] == k), default=math.nan) for k in KINDS}
    print(json.dumps({"plot": args.plot, "best_bits_per_char": best}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="runs/epoch_study")
    parser.add_argument("--epochs", default="1,2,4,8,16,32,64")
    parser.add_argument("--adapt_from_epoch", type=float, default=1.0)
    parser.add_argument("--num_batches", type=int, default=0, help="validation batches per evaluation (0: all)")
    parser.add_argument(
        "--override", action="append", default=[], help="--config.KEY=VALUE passed to every train (e.g. a tiny model)"
    )
    parser.add_argument("--plot", default="", help="draw ROOT/rows.jsonl into this PNG instead of training")
    parser.add_argument("--size", default="quickstart", help="configs/epoch_study.py's backbone: quickstart | mini")
    parser.add_argument("--runs", default=",".join(KINDS), help="the runs to train, of ar,masking,adapted")
    args = parser.parse_args()
    plot(args) if args.plot else run_study(args)


if __name__ == "__main__":
    main()
