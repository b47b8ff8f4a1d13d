"""Validation bits/char against the canvas size, one line per run, from `evaluate` JSON lines.

  for c in 1 4 16 32 64 128; do python -m hackable_diffusion.evaluate --workdir RUN --num_batches 4 \
      --config.diffusion.canvas_len=$c | tail -1 >> FILE.jsonl; done
  python experiments/likelihood/plot_canvas_curve.py FILE.jsonl --ar 2.611 --out FILE.png

A block-diffusion ELBO depends on the canvas it is evaluated with: a canvas of one token leaves nothing to denoise in
parallel (with the token shift it is the AR likelihood of the same network), a canvas of the whole sequence is one
MDLM canvas. Prints one JSON line: bits/char per run and canvas size.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", help="JSON lines of `python -m hackable_diffusion.evaluate` (text likelihood)")
    parser.add_argument("--ar", type=float, default=0.0, help="the AR run's NLL in bits/char, drawn as a line")
    parser.add_argument("--labels", default="", help="WORKDIR=LABEL,... (default: the workdir's folder name)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    labels = dict(item.split("=", 1) for item in args.labels.split(",") if item)
    curves: dict[str, dict[int, float]] = collections.defaultdict(dict)
    for line in pathlib.Path(args.rows).read_text().splitlines():
        row = json.loads(line)
        override = row.get("config_overrides", {}).get("diffusion.canvas_len")
        if override is not None:
            canvas = override[1]
        else:  # the run's own canvas (an override equal to it is not recorded)
            canvas = json.loads((pathlib.Path(row["workdir"]) / "config.json").read_text())["diffusion"]["canvas_len"]
        label = labels.get(row["workdir"], pathlib.Path(row["workdir"]).name)
        curves[label][int(canvas)] = float(row["bits_per_char"])
    print(json.dumps({label: {str(k): round(v, 3) for k, v in sorted(c.items())} for label, c in curves.items()}))
    if not args.out:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        sizes = sorted(curve)
        ax.plot(sizes, [curve[s] for s in sizes], marker="o", label=label)
    if args.ar:
        ax.axhline(args.ar, color="black", linestyle="--", label=f"AR run, exact NLL ({args.ar:.3f})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("canvas size (characters)")
    ax.set_ylabel("validation bits/char (diffusion: ELBO)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
