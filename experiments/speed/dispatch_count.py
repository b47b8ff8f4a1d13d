"""How often generation goes back to the host: compiled programs launched from Python by one `generate` call, with its
loop over canvases on the host (the default) and compiled on the device (`on_device=True`), from a `jax.profiler`
trace.

  python experiments/speed/dispatch_count.py [--canvases 4] [--steps 4]

A tiny random model (batch 1, canvases of 8, fixed steps, no early stopping). One JSON line per loop: the programs
launched (`ExecuteHelperOnSingleDevice` events on the Python thread) and which jitted functions they were. Counts, not
times: the trace is of the second (compiled) call.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import tempfile

import jax

from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling.early_stopping import NoEarlyStop
from hackable_diffusion.sampling.generate import generate
from hackable_diffusion.sampling.sampler import DiffusionSampler


def launches(run) -> tuple[int, dict[str, int]]:
    run()  # compile
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            jax.block_until_ready(run().tokens)
        data = jax.profiler.ProfileData.from_file(sorted(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True))[-1])
    programs, functions = 0, collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if line.name != "python":
                continue
            for event in line.events:
                if event.name == "CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice":
                    programs += 1
                elif event.name.startswith("PjitFunction("):
                    functions[event.name[len("PjitFunction(") : -1]] += 1
    return programs, dict(functions.most_common())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--canvases", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    model = T.Transformer(TransformerConfig.from_dict(presets.tiny(vocab_size=64, moe=False)))
    params = T.init_params(model, jax.random.key(0))
    sampler = DiffusionSampler.diffusiongemma(64, num_steps=args.steps, canvas_length=8, early_stopping=NoEarlyStop())
    for on_device in (False, True):

        def run(on_device=on_device):
            return generate(
                model,
                params,
                [[2, 5, 6]],
                sampler=sampler,
                key=0,
                max_new_tokens=8 * args.canvases,
                stop_tokens=(),
                on_device=on_device,
            )

        programs, functions = launches(run)
        print(
            json.dumps(
                {
                    "benchmark": "dispatch_count",
                    "canvas_loop": "device" if on_device else "host",
                    "canvases": args.canvases,
                    "steps_per_canvas": args.steps,
                    "programs_launched": programs,
                    "jitted_calls": functions,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
