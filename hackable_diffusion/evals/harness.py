"""lm-evaluation-harness's own command line with the toolbox's model (`hackable_diffusion`) registered and the
toolbox's offline tasks on the include path:

  python -m hackable_diffusion.evals.harness --model hackable_diffusion \\
      --model_args workdir=runs/quickstart,num_draws=8 --tasks hd_shakespeare_next_line,hd_shakespeare_perplexity

Every argument is lm-eval's (`--tasks`, `--limit`, `--num_fewshot`, `--output_path`, `--log_samples`, ...); see
`python -m hackable_diffusion.evals.harness run --help`. `--include_path` defaults to the tasks that ship with the
package (`evals/lm_eval_tasks/`); pass your own to add more. lm-eval 0.4 discovers models only inside its own package
(no plugin entry point), which is why the harness runs through this module rather than the bare `lm_eval` script.
Needs the `eval` extra: pip install -e '.[eval]'.

Before lm-eval loads anything, an evaluation (`run`, the default command) checks its settings: lm-eval's own checks,
the model args of `--model hackable_diffusion` (`lm_eval_adapter.check_model_args`: the workdir and its config keys)
and that every `--tasks` file exists; lm-eval itself refuses an unknown task name before it loads the model, and the
error then names the closest tasks. A bad input, there or later (a ValueError, a missing file), prints `error: <what is wrong and how to fix it>` on one line
and exits 2 like the toolbox's other commands (HD_TRACEBACK=1 shows the traceback).
"""

import contextlib
import difflib
import glob
import io
import logging
import os
import pathlib
import sys

TASKS_DIR = pathlib.Path(__file__).parent / "lm_eval_tasks"
MODEL_NAME = "hackable_diffusion"


def task_names(tasks) -> list[str]:
    """lm-eval's `--tasks` value as a list of names (comma- or space-separated, as lm-eval splits them)."""
    if tasks is None:
        return []
    return tasks.split(",") if isinstance(tasks, str) else [t for task in tasks for t in str(task).split(",")]


def check_tasks(tasks, include_path: str | None) -> None:
    """The checks that cost nothing: every `--tasks` entry ending in .yaml is an existing file (FileNotFoundError
    otherwise). Task names are left to lm-eval, which refuses unknown ones before it loads the model ("Tasks not
    found"); `unknown_tasks_message` then turns its error into one that names the closest tasks."""
    del include_path  # the names under it are matched by lm-eval
    files = [n for n in task_names(tasks) if n.endswith(".yaml")]
    missing_files = [n for n in files if not glob.glob(str(pathlib.Path(n).absolute()))]
    if missing_files:
        raise FileNotFoundError(f"--tasks {', '.join(missing_files)}: no such task file; check the path.")


UNKNOWN_TASKS = "Tasks not found: "  # how lm-eval's task check starts its error


def unknown_tasks_message(error: str, include_path: str | None) -> str:
    """lm-eval's "Tasks not found: a, b" as the toolbox's message, with the closest task names (lm-eval's full task
    index is built here, on the error path only)."""
    from lm_eval.tasks import TaskManager

    unknown = [n.strip() for n in error[len(UNKNOWN_TASKS) :].split(",") if n.strip()]
    manager = TaskManager(include_path=include_path)
    close = sorted({c for n in unknown for c in difflib.get_close_matches(n, manager.all_tasks, n=3, cutoff=0.6)})
    hint = f" Closest: {', '.join(close)}." if close else ""
    if include_path and pathlib.Path(include_path).resolve() == TASKS_DIR.resolve():
        where = "lm-eval's tasks nor the toolbox's (hd_*)"
    elif include_path:
        where = f"lm-eval's tasks nor those under --include_path {include_path}"
    else:
        where = "lm-eval's tasks"
    return (
        f"--tasks {','.join(unknown)}: not among {where}.{hint} List the names with python -m "
        "hackable_diffusion.evals.harness ls tasks."
    )


def check_run(namespace) -> None:
    """The checks of an evaluation before lm-eval loads the model or its tasks (see the module docstring)."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.evals import lm_eval_adapter

    quiet = logging.getLogger("lm_eval")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # lm-eval logs its warnings (--limit, ...) once, when it runs
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # a --config file's settings, printed again by lm-eval
            config = EvaluatorConfig.from_cli(namespace)
    finally:
        quiet.setLevel(level)
    if config.model == MODEL_NAME:
        lm_eval_adapter.check_model_args(config.model_args or {})
    check_tasks(config.tasks, config.include_path)


def main(argv: list[str] | None = None) -> None:
    try:
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging

        from hackable_diffusion.evals import lm_eval_adapter  # noqa: F401  (registers the model)
    except ImportError as err:
        sys.exit(f"error: the lm-eval harness is not installed ({err}); pip install -e '.[eval]'.")
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion import cli

    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--include_path" or a.startswith("--include_path=") for a in args) and "--help" not in args:
        args += ["--include_path", str(TASKS_DIR)]
    sys.argv = [sys.argv[0], *args]
    # lm_eval.__main__.cli_evaluate, with the checks between parsing and running
    setup_logging()
    parser = HarnessCLI()
    namespace = parser.parse_args()  # lm-eval's own flags and their errors (usage, exit 2)
    show_traceback = bool(os.environ.get(cli.TRACEBACK_ENV))
    try:
        if getattr(namespace, "command", None) == "run":
            check_run(namespace)
            cli.use_compilation_cache()
        parser.execute(namespace)
    except cli.USER_ERRORS as err:
        if show_traceback:
            raise
        message = " ".join(str(err).split())
        if message.startswith(UNKNOWN_TASKS):
            message = unknown_tasks_message(message, getattr(namespace, "include_path", None))
        cli.fail(cli.traceback_hint(message))


if __name__ == "__main__":
    main()
