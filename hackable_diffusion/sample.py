"""Sampling entry point: loads the checkpoint and tokenizer that training saved and prints completions.

  python -m hackable_diffusion.sample --workdir runs/quickstart --prompt "ROMEO:" [--config.sampler.num_steps=16]
      [--config.sampler.selection.rule=threshold --config.sampler.selection.tau=0.9] [--show_canvas]

`--config.<path>=value` overrides any key of the run's saved config (workdir/config.json), in practice its sampler
section: the selection rule and its arguments, temperature, early stopping, step budget, canvas length,
max_new_tokens. `--show_canvas` redraws the canvas in the terminal after every denoising step. A prompt plus the new
tokens longer than `--max_context` (by default twice the trained sequence length, as `serve`) is refused before
anything is generated.
"""

from __future__ import annotations

import sys
import time

from absl import app, flags

from hackable_diffusion import cli, run_config
from hackable_diffusion.tasks.capabilities import GeneratesText, require

FLAGS = flags.FLAGS
_HAS_RUN = {"saved": False}  # whether --workdir held a saved config when the flags were defined


def define_flags(argv: list[str]):
    _, saved = cli.define_workdir_config_flag(argv)
    _HAS_RUN["saved"] = saved is not None
    flags.DEFINE_string(
        "workdir",
        None,
        "A training workdir (config.json, tokenizer/, checkpoints/), or hf:DIR for a Hugging Face checkpoint.",
    )
    flags.DEFINE_multi_string("prompt", None, "Prompt text; repeat the flag for a batch.")
    flags.DEFINE_integer("seed", 0, "Sampling seed (row i uses fold_in(seed, i)).")
    flags.DEFINE_bool("show_canvas", False, "Redraw the canvas in the terminal at every denoising step.")
    flags.DEFINE_float("show_delay_s", 0.15, "Pause between redrawn steps with --show_canvas.")
    flags.DEFINE_integer("max_new_tokens", 0, "Override the sampler's max_new_tokens (0 = keep).")
    flags.DEFINE_integer(
        "max_context", 0, "Most prompt + new tokens (0 = twice the trained sequence length, as serve's --max_context)."
    )


def check_context(exp, prompts: list[str], max_new_tokens: int, max_context: int = 0) -> None:
    """Raises ValueError when the longest prompt plus `max_new_tokens` is over the context (`max_context`, or 0:
    twice the run's trained sequence length, 4096 when the run does not say, as `serve.engine.Engine`), before
    anything is allocated."""
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.data.tokenizers import BOS_ID

    trained = int(exp.config.data.get("seq_len") or 0)
    context = int(max_context or (2 * trained if trained else 4096))
    longest = max(len([BOS_ID] + exp.tokenizer.encode(p)) for p in prompts)
    if longest + max_new_tokens > context:
        basis = "--max_context" if max_context else (f"twice the run's {trained}-token sequences" if trained else "")
        raise ValueError(
            f"the prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) is {longest + max_new_tokens} "
            f"tokens, over the context of {context}{f' ({basis})' if basis else ''}; lower --max_new_tokens, shorten "
            "the prompt, or raise --max_context."
        )


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

    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import hf_runs, toolbox
    from hackable_diffusion.tasks import text

    if FLAGS.workdir is None:
        raise app.UsageError("--workdir is required (a directory written by python -m hackable_diffusion.train).")
    if FLAGS.max_new_tokens < 0:
        raise app.UsageError(f"--max_new_tokens={FLAGS.max_new_tokens} must be >= 0 (0 = the sampler's own).")
    if FLAGS.max_context < 0:
        raise app.UsageError(f"--max_context={FLAGS.max_context} must be >= 0 (0 = twice the trained length).")
    cli.quiet_library_logs()
    workdir = hf_runs.resolve_workdir(FLAGS.workdir)  # hf:DIR -> the run directory that stands for the checkpoint
    if not _HAS_RUN["saved"]:
        run_config.load_saved_config(workdir)  # the clear error: the workdir holds no run
    config = FLAGS.config
    exp = exp_lib.build(config, workdir, inference=True)
    require(exp.task, GeneratesText, f"sampling {workdir} (sample prints text)", "its scores are evaluate's")
    prompts = FLAGS.prompt or [config.sampler.prompt]
    max_new = FLAGS.max_new_tokens or config.sampler.max_new_tokens
    check_context(exp, prompts, int(max_new), FLAGS.max_context)  # before the weights are read
    params, step = toolbox.load_params(exp, workdir)
    show = FLAGS.show_canvas and not exp.is_autoregressive
    start = time.perf_counter()
    texts, result = text.sample_texts(
        exp, params, prompts, seed=FLAGS.seed, max_new_tokens=max_new, return_trajectory=show
    )
    seconds = time.perf_counter() - start
    if show:
        show_trajectory(exp, result, prompts[0], FLAGS.show_delay_s)
    new_tokens = int(np.sum(result.lengths))
    kind = "autoregressive" if exp.is_autoregressive else f"diffusion/{config.sampler.selection.rule}"
    print(
        f"[checkpoint step {step}; {kind}; {new_tokens} tokens in {seconds:.2f}s incl. compile; "
        f"{result.forward_passes} forward passes]"
    )
    for prompt, text_out in zip(prompts, texts):
        print(f"{prompt}{text_out}\n")


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
