"""lm-evaluation-harness's own command line with the toolbox's model (`hackable_diffusion`) registered and the
toolbox's offline tasks on the include path:

  python -m hackable_diffusion.evals.harness --model hackable_diffusion \\
      --model_args workdir=runs/quickstart,num_draws=8 --tasks hd_shakespeare_next_line,hd_shakespeare_perplexity

Every argument is lm-eval's (`--tasks`, `--limit`, `--num_fewshot`, `--output_path`, `--log_samples`, ...); see
`python -m hackable_diffusion.evals.harness run --help`. `--include_path` defaults to the tasks that ship with the
package (`evals/lm_eval_tasks/`); pass your own to add more. lm-eval 0.4 discovers models only inside its own package
(no plugin entry point), which is why the harness runs through this module rather than the bare `lm_eval` script.
Needs the `eval` extra: pip install -e '.[eval]'.
"""

import pathlib
import sys

TASKS_DIR = pathlib.Path(__file__).parent / "lm_eval_tasks"


def main(argv: list[str] | None = None) -> None:
    try:
        from lm_eval.__main__ import cli_evaluate

        from hackable_diffusion.evals import lm_eval_adapter  # noqa: F401  (registers the model)
    except ImportError as err:
        sys.exit(f"error: the lm-eval harness is not installed ({err}); pip install -e '.[eval]'.")
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--include_path" or a.startswith("--include_path=") for a in args) and "--help" not in args:
        args += ["--include_path", str(TASKS_DIR)]
    sys.argv = [sys.argv[0], *args]
    cli_evaluate()


if __name__ == "__main__":
    main()
