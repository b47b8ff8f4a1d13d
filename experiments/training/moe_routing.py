"""How an MoE run's capacity-limited routing behaves as a function of the noise level: the fraction of token->expert
assignments dropped (over capacity; averaged over layers), and the load-balance and router z-loss terms, on
validation sequences corrupted at fixed levels t.

  python experiments/training/moe_routing.py --workdir runs/shakespeare_masking_moe [--levels 0,0.25,0.5,0.75,1] [--batches 4]
  python experiments/training/moe_routing.py --workdir runs/shakespeare_masking_moe --capacity_factor 4   # same weights, no drops

`--capacity_factor F` evaluates the trained weights with another per-expert capacity (E / k = dropless for sorted
dispatch): the per-level loss with and without drops on the same batches and noise says what the drops cost.

Why: with token-choice top-k routing (Switch / GShard), inputs that look alike go to the same experts. Under masking
noise a sizeable share of a batch is the same [MASK] token, so the drop rate can grow with t however well balanced the
router is on clean text. The capacity is shared by all b x l tokens of a forward pass: training draws one t per
sequence, so its batches mix levels, while a sampler's batch (and this script's) holds one level at a time. Prints one
JSON line per level (an autoregressive run: one line, no noise) with the drop rate, the auxiliary losses and the
training loss at that level (`diffusion_loss`; `loss` for an autoregressive run).
"""

from __future__ import annotations

import argparse
import json

from hackable_diffusion import run_config
from noise_level_analysis import routing_at_levels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--levels", default="0,0.1,0.25,0.5,0.75,0.9,1.0", help="noise levels t in [0, 1]")
    parser.add_argument("--batches", type=int, default=4, help="validation batches per level")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--capacity_factor", type=float, default=0.0, help="evaluate with this capacity factor (0 = the run's own)"
    )
    args = parser.parse_args()

    from hackable_diffusion import cli
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox

    cli.quiet_library_logs()
    config = run_config.load_saved_config(args.workdir)
    if config.model.get("moe") is None:
        raise SystemExit(f"{args.workdir} has no MoE layers (config model.moe is None); nothing to measure.")
    if args.capacity_factor < 0:
        raise SystemExit(f"--capacity_factor must be > 0 (or 0 for the run's own), got {args.capacity_factor}.")
    if args.capacity_factor:
        config.model.moe.capacity_factor = args.capacity_factor
    exp = exp_lib.build(config, args.workdir)
    params, step = toolbox.load_params(exp, args.workdir)
    levels = [float(x) for x in args.levels.split(",")]
    try:
        records = routing_at_levels(exp, params, levels, args.batches, args.seed)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    for record in records:
        head = {"workdir": args.workdir, "step": step, "capacity_factor": config.model.moe.capacity_factor}
        print(json.dumps(head | record), flush=True)


if __name__ == "__main__":
    main()
