"""ELBO sanity check on a distribution small enough to enumerate: `hackable_diffusion.diffusion.enumerable_toy`.

Exact models of a non-factorised distribution over the 81 sequences of length 4 over {0, 1, 2}: the masking ELBO
equals the NLL, the uniform ELBO bounds it (Monte Carlo with its standard error, and by quadrature).

Usage: python experiments/likelihood/elbo_toy.py [--num_samples 1000000] [--seed 0] [--schedule linear]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json

from enumerable_toy import run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_samples", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schedule", default="linear")
    args = parser.parse_args()
    print(json.dumps(run(args.num_samples, args.seed, args.schedule)))


if __name__ == "__main__":
    main()
