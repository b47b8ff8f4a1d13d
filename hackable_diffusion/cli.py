"""Command-line helpers shared by the entry points (`train`, `sample`, `evaluate`, `sft`): one override syntax, one
error style.

Every command takes `--config.<path>=value` overrides with ml_collections' own parsing and types: `train` and `sft`
of the config file named by `--config`, `sample` and `evaluate` of the run's saved `workdir/config.json` (so
`--config.sampler.num_steps=12` means the same thing everywhere). ml_collections reports a misspelt key with a
traceback from deep inside flag parsing; here an unknown key stops the command with one line naming the closest
existing keys. `run_command` gives every entry point the same behaviour: `--help` works without other flags and exits
0; a bad input prints `error: <what is wrong and how to fix it>` on one line and exits 2 (set HD_TRACEBACK=1 to see
the traceback). Every command keeps JAX's persistent compilation cache (`use_compilation_cache`; HD_COMPILATION_CACHE
moves it or, =0, turns it off; docs/compilation.md).
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import json
import os
import pathlib
import sys
from typing import Any, Callable, Mapping, NoReturn, Sequence

import ml_collections

from hackable_diffusion import run_config
from hackable_diffusion.training.workdir_lock import WorkdirLockedError


class ConfigKeyError(ValueError):
    """An override names a config key that does not exist."""


HELP_FLAGS = ("-h", "--help", "--helpshort", "--helpfull", "-?")
TRACEBACK_ENV = "HD_TRACEBACK"
CHECK_FLAGS_ENV = "HD_CHECK_FLAGS"  # =1: parse and check the command line, then exit 0 without running it
# bad input or a busy workdir, not a bug in the toolbox
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, WorkdirLockedError)


def flag_value(argv: Sequence[str], name: str) -> str | None:
    """The value of `--name=V` or `--name V` in argv (the last one wins), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
    return value


def define_config_file_flag(argv: Sequence[str], help_text: str) -> list[str]:
    """`--config FILE[:ARG]` plus `--config.<path>=value` overrides of it (train, sft, convert). The file is read once,
    here: unknown override keys are refused before absl parses anything, and the flag holds that config (absl applies
    the overrides to it). Returns argv without the `--config FILE` argument, for `run_command` to parse."""
    from ml_collections import config_flags

    path = flag_value(argv, "config")
    if path is None:
        config_flags.DEFINE_config_file("config", None, help_text)  # --help, or a command that will ask for it
        return list(argv)
    config = load_config_file(path)
    check_overrides(config, argv)
    remaining = without_flag(argv, "config")
    config_flags.DEFINE_config_dict("config", config, help_text, sys_argv=remaining)  # overrides found in `remaining`
    return remaining


def define_command_flags(argv: Sequence[str], config_help: str, workdir_help: str) -> list[str]:
    """The flags of a command that trains from weights (sft, rl, distill): --config (a file, with --config.a.b=value
    overrides), --init_from and --workdir; returns argv as `define_config_file_flag` leaves it."""
    from absl import flags

    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.checkpoints import base_weights

    argv = define_config_file_flag(argv, config_help)
    base_weights.define_init_from_flag()
    flags.DEFINE_string("workdir", None, workdir_help)
    return argv


def without_flag(argv: Sequence[str], name: str) -> list[str]:
    """argv without `--name=V` / `--name V` (its `--name.<path>=...` overrides stay)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg.startswith(f"--{name}="):
            continue
        elif arg == f"--{name}" and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            skip = True
        else:
            out.append(arg)
    return out


def define_workdir_config_flag(argv: Sequence[str]) -> tuple[ml_collections.ConfigDict, ml_collections.ConfigDict | None]:
    """`--config.<path>=value` overrides of the run's saved config (sample, evaluate). Returns (the config the flag
    holds, a copy of the saved config before overrides, or None when `--workdir` holds no config.json). Without a run
    (`--help`, a dry parse) the default config of the first task whose keys take every override stands in (text, then
    Sudoku), so the overrides can still be checked."""
    from ml_collections import config_flags

    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.checkpoints.hf_runs import resolve_workdir
    from hackable_diffusion.tasks import TASKS, get_task

    workdir = resolve_workdir(flag_value(argv, "workdir"))
    saved = None
    if workdir is not None and (pathlib.Path(workdir) / "config.json").is_file():
        config = run_config.load_saved_config(workdir)
        saved = copy.deepcopy(config)
        check_overrides(config, argv)
    else:
        candidates = [get_task(name).default_config() for name in TASKS]
        for config in candidates:
            try:
                check_overrides(config, argv)
                break
            except ConfigKeyError:
                continue
        else:
            check_overrides(candidates[0], argv)  # raises, naming the closest keys of the first task's config
    config_flags.DEFINE_config_dict(
        "config", config, "The run's saved config; override any key with --config.<path>=value."
    )
    return config, saved


def override(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A copy of `config` with each dotted key set (`{"sampler.num_steps": 3}`), as `--config.sampler.num_steps=3`
    would; an unknown key raises ConfigKeyError with the closest keys."""
    config = config.copy_and_resolve_references()
    check_overrides(config, [f"--config.{key}=" for key in overrides])
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for name in parents:
            node = node[name]
        node[leaf] = value
    return config


def parse_config_overrides(config: ml_collections.ConfigDict, args: Sequence[str]) -> ml_collections.ConfigDict:
    """A copy of `config` with `--config.<path>=value` arguments applied by ml_collections' own flag parsing (the
    same types as on the toolbox's commands), for scripts with their own argument parser; an unknown key raises
    ConfigKeyError with the closest keys, any other argument ValueError."""
    from absl import flags
    from ml_collections import config_flags

    others = [a for a in args if not a.startswith("--config.")]
    if others:
        raise ValueError(f"expected only --config.<path>=value overrides, got {others}.")
    config = copy.deepcopy(config)  # keeps the typed placeholders (copy_and_resolve_references would drop them)
    check_overrides(config, args)
    values = flags.FlagValues()
    argv = ["script", *args]
    config_flags.DEFINE_config_dict("config", config, flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


def argparse_command(script: str, args: Any, skip: Sequence[Any] = ("", None)) -> str:
    """The command line that reproduces an argparse Namespace: `python SCRIPT --key=value ...`, a True boolean as a
    bare `--key`, False booleans and values in `skip` left out; quoted for the shell."""
    import shlex

    parts = ["python", script]
    for key, value in vars(args).items():
        if value is True:
            parts.append(f"--{key}")
        elif value is not False and not any(value is s or (type(value) is type(s) and value == s) for s in skip):
            parts.append(f"--{key}={value}")
    return shlex.join(parts)


def json_line(value: Any) -> str:
    """One line of strict JSON: NaN and infinities (an undefined standard error, say) become null."""
    import math

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, Mapping):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if hasattr(x, "item") and getattr(x, "ndim", None) == 0:  # numpy scalars
            return clean(x.item())
        return x

    return json.dumps(clean(value), allow_nan=False, default=str)


def check_apart(source: str | os.PathLike, target: str | os.PathLike, source_flag: str, target_flag: str) -> None:
    """Raises ValueError when the directory a command writes (`target`) is the run or checkpoint it reads (`source`),
    or one of them lies inside the other (the layout `convert` refuses too): the written files would land in, or
    replace, what is read."""
    src, dst = pathlib.Path(source).resolve(), pathlib.Path(target).resolve()
    if src == dst or src in dst.parents or dst in src.parents:
        raise ValueError(
            f"{target_flag} {target} overlaps {source_flag} {source} (the same directory, or one inside the other): "
            f"write to a separate directory, e.g. {pathlib.Path(source).resolve().parent / (src.name + '_out')}."
        )


COMPILATION_CACHE_ENV = "HD_COMPILATION_CACHE"  # a directory for JAX's persistent compilation cache; 0 = off
_CACHE_OFF = ("0", "off", "false", "no")


def compilation_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the commands keep JAX's persistent compilation cache: $HD_COMPILATION_CACHE (0 = no cache), else JAX's
    own $JAX_COMPILATION_CACHE_DIR when set, else $XDG_CACHE_HOME/hackable_diffusion/jax (~/.cache when
    XDG_CACHE_HOME is unset or empty). None = off."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(COMPILATION_CACHE_ENV, "").strip()
    if chosen.lower() in _CACHE_OFF:
        return None
    if chosen:
        return str(pathlib.Path(chosen).expanduser())
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    home = environ.get("XDG_CACHE_HOME") or str(pathlib.Path(environ.get("HOME") or pathlib.Path.home()) / ".cache")
    return str(pathlib.Path(home) / "hackable_diffusion" / "jax")


def use_compilation_cache(environ: Mapping[str, str] | None = None) -> str | None:
    """Turns JAX's persistent compilation cache on for this process (`compilation_cache_dir`), every program cached
    however small or quick to compile (unless JAX_PERSISTENT_CACHE_MIN_* say otherwise), so that a second run of a
    command reads its programs back instead of compiling them; or off for HD_COMPILATION_CACHE=0. Call it before
    anything compiles (every command does, first thing). Returns the directory, or None when off. A default directory
    that cannot be created turns the cache off with a warning; an HD_COMPILATION_CACHE that is not a usable
    directory raises ValueError."""
    import jax

    environ = os.environ if environ is None else environ
    directory = compilation_cache_dir(environ)
    if directory is not None:
        try:
            pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            if environ.get(COMPILATION_CACHE_ENV, "").strip():
                raise ValueError(
                    f"{COMPILATION_CACHE_ENV}={environ[COMPILATION_CACHE_ENV]}: cannot use it as the compilation cache "
                    f"directory ({err.strerror or err}); give a writable directory, or 0 for no cache."
                ) from None
            print(f"warning: no compilation cache ({directory}: {err.strerror or err}).", file=sys.stderr)
            directory = None
    if directory is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", directory)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" not in environ:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return directory


def fail(message: str) -> NoReturn:
    """The one error style of every command: one line on stderr (a message's line breaks become spaces), exit 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def traceback_hint(message: str) -> str:
    """A user error's message with how to see its traceback."""
    return f"{message} (set {TRACEBACK_ENV}=1 for the traceback)"


def flags_help(own_modules: Sequence[str], full: bool = False) -> str:
    """One line per flag, defaults shortened: the command's own flags and `--config` (defined in `own_modules`), or
    with `full` every flag the imported libraries define too (grain, orbax, jax)."""
    from absl import flags

    by_module = flags.FLAGS.flags_by_module_dict()
    lines = []
    for module in sorted(by_module, key=lambda m: m == __name__):  # the command's own flags, then --config
        own = module in own_modules or module.startswith("hackable_diffusion.")  # never the libraries' flags
        if module.startswith("absl.") or not (full or own):
            continue
        for flag in sorted(by_module[module], key=lambda f: f.name):
            default = repr(flag.default) if not isinstance(flag.default, ml_collections.ConfigDict) else "the config"
            default = default if len(default) <= 40 else default[:37] + "..."
            lines.append(f"  --{flag.name}: {flag.help} (default: {default})")
    return "\n".join(lines)


def usage_summary(usage: str, paragraphs: int = 2) -> str:
    """The first paragraphs of an entry point's docstring (what it does and how it is called) for `--help`."""
    return "\n\n".join(usage.strip().split("\n\n")[:paragraphs])


def run_command(define_flags: Callable[[Sequence[str]], None], main: Callable[[Sequence[str]], None], usage: str):
    """Runs an entry point: defines its flags from argv, answers --help (exit 0), parses the flags, runs `main` under
    absl, and turns bad input (a `USER_ERRORS` exception, a flag error) into one `error:` line and exit 2."""
    from absl import app, flags

    argv = list(sys.argv)
    show_traceback = bool(os.environ.get(TRACEBACK_ENV))
    try:
        argv = define_flags(argv) or argv  # a command may take arguments it has consumed out of argv
    except (ConfigKeyError, *USER_ERRORS) as err:
        fail(str(err))
    if any(arg in HELP_FLAGS for arg in argv[1:]):
        full = "--helpfull" in argv[1:]
        own = ("__main__", sys.argv[0], define_flags.__module__, __name__)  # absl files __main__'s flags under argv[0]
        print(
            (usage.strip() if full else usage_summary(usage))
            + "\n\nflags:\n"
            + flags_help(own, full=full)
            + ("" if full else "\n\n--helpfull: the whole description and every flag, the libraries' too.")
        )
        sys.exit(0)
    try:
        remaining = flags.FLAGS(argv)
    except flags.Error as err:
        fail(f"{err} (see --help).")
    if len(remaining) > 1:
        fail(f"unexpected arguments {remaining[1:]} (flags are --name=value; see --help).")
    if os.environ.get(CHECK_FLAGS_ENV):
        print("flags ok")
        sys.exit(0)

    def guarded_main(args):
        try:
            use_compilation_cache()
            main(args)
        except app.UsageError as err:
            fail(str(err))
        except USER_ERRORS as err:
            if show_traceback:
                raise
            fail(traceback_hint(str(err)))
        except Exception as err:  # training stopped by SIGINT/SIGTERM after saving: its message and exit status
            if not hasattr(err, "exit_code") or show_traceback:
                raise
            print(str(err), file=sys.stderr)
            sys.exit(err.exit_code)

    app.run(guarded_main, argv=argv, flags_parser=lambda _: remaining)


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """Imports a config file and calls its `get_config()`, or `get_config(ARG)` for `FILE:ARG` (ml_collections'
    config-file contract)."""
    path, _, argument = path.partition(":")
    spec = importlib.util.spec_from_file_location("_hd_config", path)
    if spec is None or not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"Config file {path!r} not found.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(argument) if argument else module.get_config()


def flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        keys.append(name)
        if isinstance(value, ml_collections.ConfigDict):
            keys.extend(flat_keys(value, name + "."))
    return keys


def check_overrides(config: ml_collections.ConfigDict, argv: Sequence[str], flag: str = "config") -> None:
    """Raises ConfigKeyError for the first `--config.KEY=...` whose KEY is not in `config`."""
    valid = flat_keys(config)
    valid_set = set(valid)
    for arg in argv:
        if not arg.startswith(f"--{flag}."):
            continue
        key = arg[len(flag) + 3 :].split("=", 1)[0]
        if key not in valid_set:
            close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
            hint = f" Closest existing keys: {', '.join(close)}." if close else ""
            raise ConfigKeyError(f"Unknown config key {key!r} in {arg!r}.{hint}")


def quiet_library_logs():
    """orbax/grain/jax log every checkpoint step at INFO through absl; keep warnings and our own prints."""
    import logging

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    for name in ("orbax", "jax", "grain", "absl"):
        logging.getLogger(name).setLevel(logging.WARNING)
