"""Sampling entry point: loads the checkpoint and tokenizer that training saved and prints completions.

  python -m hackable_diffusion.sample --workdir runs/quickstart --prompt "ROMEO:" [--sampler.num_steps=16]
      [--sampler.selection=threshold --sampler.selection_kwargs={"tau":0.9}] [--show_canvas]

`--sampler.*` overrides any field of the run's sampler section (saved in workdir/config.json): the selection rule
and its arguments, temperature, early stopping, step budget, canvas length, max_new_tokens. `--show_canvas` redraws
the canvas in the terminal after every denoising step.
"""

from __future__ import annotations

import sys
import time

from absl import app, flags
from ml_collections import config_flags

from hackable_diffusion import cli

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("workdir", None, "A training workdir (config.json, tokenizer/, checkpoints/).")
    flags.DEFINE_multi_string("prompt", None, "Prompt text; repeat the flag for a batch.")
    flags.DEFINE_integer("seed", 0, "Sampling seed (row i uses fold_in(seed, i)).")
    flags.DEFINE_bool("show_canvas", False, "Redraw the canvas in the terminal at every denoising step.")
    flags.DEFINE_float("show_delay_s", 0.15, "Pause between redrawn steps with --show_canvas.")
    flags.DEFINE_integer("max_new_tokens", 0, "Override the sampler's max_new_tokens (0 = keep).")


_SAMPLER = None  # defined in __main__ once the workdir's sampler section is known


def show_trajectory(exp, result, prompt: str, delay_s: float) -> None:
    """Redraws each canvas of row 0 after every denoising step (ANSI clear + home)."""
    committed = ""
    for canvas_index, trajectory in enumerate(result.trajectories or ()):
        for step, canvas in enumerate(trajectory):
            text = exp.tokenizer.decode(canvas[0], stop_at_eos=False)
            sys.stdout.write(
                f"\x1b[2J\x1b[H[canvas {canvas_index} step {step + 1}/{len(trajectory)}]\n"
                f"{prompt}{committed}\x1b[7m{text}\x1b[0m\n"
            )
            sys.stdout.flush()
            time.sleep(delay_s)
        committed += exp.tokenizer.decode(trajectory[-1][0], stop_at_eos=False)
    sys.stdout.write("\n")


def main(argv):
    del argv
    import numpy as np

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID
    from hackable_diffusion.sampling import generate as gen_lib

    cli.quiet_library_logs()
    config = cli.load_saved_config(FLAGS.workdir)
    config.sampler = _SAMPLER.value
    exp = exp_lib.build(config, FLAGS.workdir)
    params, step = exp_lib.load_params(exp, FLAGS.workdir)
    prompts = FLAGS.prompt or [config.sampler.prompt]
    max_new = FLAGS.max_new_tokens or config.sampler.max_new_tokens
    start = time.perf_counter()
    if FLAGS.show_canvas and not exp.is_autoregressive:
        sampler = exp_lib.build_sampler(config, exp.process)
        ids = [[BOS_ID] + exp.tokenizer.encode(p) for p in prompts]
        max_new = -(-max_new // sampler.canvas_length) * sampler.canvas_length
        result = gen_lib.generate(
            exp.model,
            params,
            ids,
            sampler=sampler,
            key=FLAGS.seed,
            max_new_tokens=max_new,
            stop_tokens=(EOS_ID,),
            return_trajectory=True,
        )
        show_trajectory(exp, result, prompts[0], FLAGS.show_delay_s)
        texts = [exp.tokenizer.decode(np.asarray(row)) for row in result.tokens]
    else:
        texts, result = exp_lib.sample_texts(exp, params, prompts, seed=FLAGS.seed, max_new_tokens=max_new)
    seconds = time.perf_counter() - start
    new_tokens = int(np.sum(result.lengths))
    kind = "autoregressive" if exp.is_autoregressive else f"diffusion/{config.sampler.selection}"
    print(
        f"[checkpoint step {step}; {kind}; {new_tokens} tokens in {seconds:.2f}s incl. compile; "
        f"{result.forward_passes} forward passes]"
    )
    for prompt, text in zip(prompts, texts):
        print(f"{prompt}{text}\n")


def _define_sampler_flag(argv):
    global _SAMPLER
    workdir = None
    for i, arg in enumerate(argv):
        if arg.startswith("--workdir="):
            workdir = arg.split("=", 1)[1]
        elif arg == "--workdir" and i + 1 < len(argv):
            workdir = argv[i + 1]
    if workdir is None:
        print(
            "error: --workdir is required (a directory written by python -m hackable_diffusion.train).", file=sys.stderr
        )
        sys.exit(2)
    try:
        sampler = cli.load_saved_config(workdir).sampler
        cli.check_overrides(sampler, argv, flag="sampler")
    except (FileNotFoundError, cli.ConfigKeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    _SAMPLER = config_flags.DEFINE_config_dict("sampler", sampler, "Sampler overrides (--sampler.KEY=VALUE).")


if __name__ == "__main__":
    define_flags()
    _define_sampler_flag(sys.argv)
    app.run(main)
