"""Parses command lines of a script in experiments/ without running it.

  python _parse_script_flags.py SCRIPT '[["--flag", "v"], ["--other"]]'
  HD_CHECK_FLAGS=1 python _parse_script_flags.py -m hackable_diffusion.train '[["--config", "configs/x.py"]]'
  HD_CHECK_FLAGS=1 python _parse_script_flags.py --batch '[[["-m", "hackable_diffusion.train"], ["--config", "x"]]]'

Each command line runs the script as `__main__` until its argparse parser has parsed it (`parse_args` or `parse_known_args`) (then the next one starts;
heavy imports are paid once), or until absl has parsed its flags (`app.run`: the main function is replaced by one that
returns); a toolbox entry point (`-m MODULE`, run with HD_CHECK_FLAGS=1) parses and checks its flags, then exits.
Prints a JSON list with, per command line, null when it parsed or the parser's last error line.
"""

import argparse
import contextlib
import io
import json
import pathlib
import runpy
import sys


class _Parsed(Exception):
    pass


def parse_one(script: str, args: list[str], module: bool = False) -> str | None:
    original = argparse.ArgumentParser.parse_args
    original_known = argparse.ArgumentParser.parse_known_args
    inside_parse_args = []

    def parse_then_stop(self, argv=None, namespace=None):
        inside_parse_args.append(True)
        try:
            original(self, argv, namespace)
        finally:
            inside_parse_args.pop()
        raise _Parsed

    def parse_known_then_stop(self, argv=None, namespace=None):
        result = original_known(self, argv, namespace)
        if inside_parse_args:  # parse_args calls parse_known_args, then refuses what is left
            return result
        raise _Parsed

    from absl import app, flags

    defined_before = set(flags.FLAGS)
    original_run = app.run
    argparse.ArgumentParser.parse_args = parse_then_stop
    argparse.ArgumentParser.parse_known_args = parse_known_then_stop
    app.run = lambda main, argv=None, **kw: original_run(lambda _: sys.exit(0), argv=argv, **kw)
    sys.argv = [script, *args]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            if module:
                runpy.run_module(script, run_name="__main__", alter_sys=True)
            else:  # as `python SCRIPT` would: the script's folder first on sys.path (experiments' own modules)
                folder = str(pathlib.Path(script).resolve().parent)
                sys.path.insert(0, folder)
                try:
                    runpy.run_path(script, run_name="__main__")
                finally:
                    sys.path.remove(folder)
    except _Parsed:
        return None
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return None
        return (stderr.getvalue().strip().splitlines() or [f"exit {exit_.code}"])[-1]
    finally:
        argparse.ArgumentParser.parse_args = original
        argparse.ArgumentParser.parse_known_args = original_known
        app.run = original_run
        for name in set(flags.FLAGS) - defined_before:  # flags the script defined at import: the next run redefines
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
    return None


def main() -> None:
    if sys.argv[1] == "--batch":  # [[["-m", MODULE] | [SCRIPT], [args...]], ...]: many scripts, one interpreter
        jobs = [(target[-1], args, target[0] == "-m") for target, args in json.loads(sys.argv[2])]
    else:
        module = sys.argv[1] == "-m"
        script = sys.argv[1 + module]
        jobs = [(script, args, module) for args in json.loads(sys.argv[2 + module])]
    results = []
    for script, args, module in jobs:
        try:
            results.append(parse_one(script, args, module))
        except Exception as err:  # e.g. absl flags defined twice when a script defines flags at import
            results.append(f"{type(err).__name__}: {err}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
