"""Parses command lines of a script in experiments/ without running it.

  python _parse_script_flags.py SCRIPT '[["--flag", "v"], ["--other"]]'

Each command line runs the script as `__main__` until its argparse parser has parsed it (then the next one starts;
heavy imports are paid once), or until absl has parsed its flags (`app.run`: the main function is replaced by one that
returns). Prints a JSON list with, per command line, null when it parsed or the parser's last error line.
"""

import argparse
import contextlib
import io
import json
import runpy
import sys


class _Parsed(Exception):
    pass


def parse_one(script: str, args: list[str]) -> str | None:
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        original(self, argv, namespace)
        raise _Parsed

    from absl import app, flags

    defined_before = set(flags.FLAGS)
    original_run = app.run
    argparse.ArgumentParser.parse_args = parse_then_stop
    app.run = lambda main, argv=None, **kw: original_run(lambda _: sys.exit(0), argv=argv, **kw)
    sys.argv = [script, *args]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            runpy.run_path(script, run_name="__main__")
    except _Parsed:
        return None
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return None
        return (stderr.getvalue().strip().splitlines() or [f"exit {exit_.code}"])[-1]
    finally:
        argparse.ArgumentParser.parse_args = original
        app.run = original_run
        for name in set(flags.FLAGS) - defined_before:  # flags the script defined at import: the next run redefines
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
    return None


def main() -> None:
    script, commands = sys.argv[1], json.loads(sys.argv[2])
    results = []
    for args in commands:
        try:
            results.append(parse_one(script, args))
        except Exception as err:  # e.g. absl flags defined twice when a script defines flags at import
            results.append(f"{type(err).__name__}: {err}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
