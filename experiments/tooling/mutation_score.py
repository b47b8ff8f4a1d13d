"""Mutation score of one module: small changes to its code (mutants) that its tests should notice.

  nice -n 15 .venv/bin/python experiments/tooling/mutation_score.py --module diffusion/elbos.py
  nice -n 15 .venv/bin/python experiments/tooling/mutation_score.py --module distill/reverse_kl.py --max_mutants 120 --seed 0
  nice -n 15 .venv/bin/python experiments/tooling/mutation_score.py --module diffusion/elbos.py --rerun_survivors

Mutants are made by cosmic-ray's operators (a curated subset, `OPERATORS`: arithmetic, comparison, boolean and unary
operator swaps, numbers +-1, True/False, `not` added to conditions, loops run zero times, decorators removed), one
change per mutant. Each mutant runs the module's tests (`MODULE_TESTS`): a mutant is killed when a test fails (or
the tests time out), survives when they all pass. A surviving mutant is a change no test can see: either a missing
test or an equivalent mutant (the same behaviour, e.g. `x >= 0` vs `x > 0` where x is never 0), which is declared with
a one-line reason in experiments/tooling/mutation_equivalents.json, keyed by module path and the mutant's description
(`definition: original line -> mutated line`, stable when other lines move). Declared equivalents are not run.

Cost. The runner is a fork server: the parent imports jax, flax, pytest and every toolbox module that does not import
the mutated module once, then forks one child per mutant that imports the mutated source (served from memory by an
import hook; the file on disk is never written, so other processes using the tree are unaffected) and runs pytest
in-process. A baseline run records, per test, which lines of the module it executes; a mutant runs only the tests
that execute its statement (all of them for module-level statements: definitions, defaults, constants), fastest
first, stopping at the first failure; with `--confirm` a mutant that survives them runs the remaining tests as well
(a jitted function traced by one test and reused by another hides the second test's dependence from the line trace,
so without it a survivor may be killable by a test that was not run: the score is a lower bound). A
mutant whose statement no test executes survives without a run ("not_covered"). XLA programs go to a persistent
compilation cache (`--cache_dir`), so the programs a mutation does not touch compile once per module.

Writes results/mutation/<module>.json (killed / survived / equivalent counts, the score killed / (killed +
survived), each survivor with its line, operator and description, each equivalent with its reason, every mutant's
outcome and the first test that killed it) and prints one JSON line per mutant with progress (done/total, seconds per
mutant, ETA). `--max_mutants N --seed S` runs a deterministic sample (recorded in the JSON) for modules whose full run
would take too long. Not part of the test suite (tests/test_mutation_score.py checks the bookkeeping on a toy module).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import hashlib
import json
import os
import pathlib
import random
import signal
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "hackable_diffusion"
EQUIVALENTS_FILE = REPO / "experiments" / "tooling" / "mutation_equivalents.json"

RL_OBJECTIVE_TESTS = [
    "tests/rl/test_rl_reference.py",
    "tests/rl/test_rl_objective_registry.py",
    "tests/rl/test_rl_objectives.py",
]
# Module (path under hackable_diffusion/) -> the test files that test it. Small on purpose: one mutant's run is seconds.
MODULE_TESTS = {
    "data/text.py": ["tests/data/test_text_data.py"],
    "diffusion/elbos.py": ["tests/diffusion/test_elbos.py"],
    "diffusion/schedules.py": ["tests/diffusion/test_schedules.py", "tests/diffusion/test_schedule_config.py"],
    "distill/reverse_kl.py": ["tests/distill/test_reverse_kl.py"],
    "sampling/selection.py": ["tests/sampling/test_selection.py"],
    "sampling/selection_base.py": ["tests/sampling/test_selection.py"],
    "sampling/scores.py": ["tests/sampling/test_selection.py"],
    "sampling/counts.py": ["tests/sampling/test_selection.py"],
    "sampling/remasking.py": ["tests/sampling/test_selection.py"],
    "rl/objectives/base.py": RL_OBJECTIVE_TESTS,
    "rl/objectives/clipped.py": RL_OBJECTIVE_TESTS,
    "rl/objectives/diffu_grpo.py": RL_OBJECTIVE_TESTS,
    "rl/objectives/ar_grpo.py": RL_OBJECTIVE_TESTS,
    "rl/objectives/wd1.py": RL_OBJECTIVE_TESTS,
    "rl/objectives/elbo.py": RL_OBJECTIVE_TESTS,
    "rl/objectives/expert_iteration.py": RL_OBJECTIVE_TESTS,
    "rl/advantages.py": [
        "tests/rl/test_rl_advantages.py",
        "tests/rl/test_rl_dynamic_sampling.py",
        "tests/rl/test_rl_reference.py",
    ],
    "rl/scorers.py": [
        "tests/rl/test_rl_trajectory_scorer.py",
        "tests/rl/test_rl_scorer_contracts.py",
        "tests/rl/test_rl_stop_at_eos.py",
        "tests/rl/test_rl_reference.py",
    ],
    "checkpoints/hf_mapping.py": ["tests/models/test_hf_checkpoints.py", "tests/models/test_hf_export.py"],
    "tasks/sudoku/difficulty.py": ["tests/tasks/test_sudoku_difficulty.py"],
}

_BINARY = ["Add_Sub", "Sub_Add", "Mul_Div", "Div_Mul", "FloorDiv_Div", "Mod_FloorDiv", "Pow_Mul", "BitAnd_BitOr",
           "BitOr_BitAnd", "BitXor_BitOr", "LShift_RShift", "RShift_LShift"]  # fmt: skip
_COMPARISON = ["Lt_LtE", "LtE_Lt", "Gt_GtE", "GtE_Gt", "Eq_NotEq", "NotEq_Eq", "Is_IsNot", "IsNot_Is"]
OPERATORS = (
    [f"core/ReplaceBinaryOperator_{pair}" for pair in _BINARY]
    + [f"core/ReplaceComparisonOperator_{pair}" for pair in _COMPARISON]
    + ["core/ReplaceUnaryOperator_Delete_USub", "core/ReplaceUnaryOperator_Delete_Not"]
    + ["core/ReplaceUnaryOperator_Delete_Invert", "core/NumberReplacer", "core/ReplaceTrueWithFalse"]
    + ["core/ReplaceFalseWithTrue", "core/ReplaceAndWithOr", "core/ReplaceOrWithAnd", "core/AddNot"]
    + ["core/ZeroIterationForLoop", "core/ReplaceBreakWithContinue", "core/ReplaceContinueWithBreak"]
    + ["core/RemoveDecorator"]
)
COLLECTION = "<collection>"  # the pseudo-test of lines run while the test modules are imported


# ---------------------------------------------------------------------------------------------------------------------
# Mutants (pure bookkeeping: no jax, no pytest)
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mutant:
    index: int  # position in the module's full, ordered mutant list
    operator: str
    occurrence: int
    line: int  # 1-based line of the change
    statement: tuple[int, int]  # the innermost statement holding the change: (first line, last line)
    description: str  # "definition: original line -> mutated line" (stable when other lines move)
    source: str  # the whole mutated module


def module_path(name: str) -> str:
    """'diffusion/elbos.py', 'diffusion.elbos', 'hackable_diffusion/diffusion/elbos.py' -> 'diffusion/elbos.py'."""
    name = name.strip()
    if name.endswith(".py"):
        name = name[:-3]
    name = name.replace(".", "/")
    if name.startswith(PACKAGE + "/"):
        name = name[len(PACKAGE) + 1 :]
    return name + ".py"


def _statements(tree: ast.AST) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified definition name) of every statement; decorators count as the def's lines."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.stmt):
                first = min([child.lineno] + [d.lineno for d in getattr(child, "decorator_list", [])])
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}.{child.name}" if prefix else child.name
                found.append((first, child.end_lineno, name if name != prefix else prefix))
            visit(child, name)

    visit(tree, "")
    return found


def innermost_statement(statements: list[tuple[int, int, str]], line: int) -> tuple[int, int, str]:
    """The shortest statement containing `line` (the module itself, (1, 1, '<module>'), when none does)."""
    holding = [s for s in statements if s[0] <= line <= s[1]]
    if not holding:
        return (line, line, "<module>")
    return min(holding, key=lambda s: (s[1] - s[0], -s[0]))


def _definition(statements, line: int) -> str:
    """The qualified name of the innermost def/class holding `line` ('<module>' at the top level)."""
    holding = [s for s in statements if s[0] <= line <= s[1] and s[2]]
    return min(holding, key=lambda s: s[1] - s[0])[2] if holding else "<module>"


def describe(original: str, mutated: str, statements) -> tuple[int, str]:
    """(line of the first changed line, 'definition: original lines -> mutated lines')."""
    old, new = original.splitlines(), mutated.splitlines()
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    code = lambda text: text.strip() and not text.strip().startswith("#")  # noqa: E731  (blank and comment lines
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():  # go with a removed decorator; they are no part of the change)
        if tag != "equal":
            kept = [(i, old[i].strip()) for i in range(i1, i2) if code(old[i])]
            before = " / ".join(text for _, text in kept)
            after = " / ".join(line.strip() for line in new[j1:j2] if code(line))
            line = kept[0][0] + 1 if kept else i1 + 1
            return line, f"{_definition(statements, line)}: {before} -> {after}"
    raise ValueError("error: the mutated source equals the original; a mutation operator changed nothing.")


def _program(source: str) -> str:
    """The module's AST without its type annotations (strings at run time under `from __future__ import
    annotations`, and never behaviour here), as text."""

    class Strip(ast.NodeTransformer):
        def visit_arg(self, node):
            node.annotation = None
            return node

        def visit_FunctionDef(self, node):
            node.returns = None
            return self.generic_visit(node)

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_AnnAssign(self, node):
            node.annotation = ast.Constant(None)
            return self.generic_visit(node)

    return ast.dump(Strip().visit(ast.parse(source)))


def enumerate_mutants(source: str, operators: list[str] = OPERATORS) -> list[Mutant]:
    """Every mutant of `source` under `operators`, ordered by (line, operator, occurrence); equal descriptions (the
    same change twice on one line) get ' #2', ' #3', ..."""
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.mutating import mutate_code

    known = set(cosmic_ray.plugins.operator_names())
    unknown = [name for name in operators if name not in known]
    if unknown:
        raise ValueError(
            f"error: unknown cosmic-ray operators {unknown}; pick from cosmic_ray.plugins.operator_names()."
        )
    statements = _statements(ast.parse(source))
    original_tree = _program(source)
    found = []
    for name in operators:
        operator = cosmic_ray.plugins.get_operator(name)()
        count = sum(1 for node in ast_nodes(get_ast(source)) for _ in operator.mutation_positions(node))
        for occurrence in range(count):
            mutated = mutate_code(source, operator, occurrence)
            if mutated is None or mutated == source:
                continue
            try:
                if _program(mutated) == original_tree:
                    continue  # the same program (1e30 + 1 == 1e30) or a change to a type annotation only
            except SyntaxError:
                continue  # not a program: nothing to test
            line, description = describe(source, mutated, statements)
            first, last, _ = innermost_statement(statements, line)
            found.append((line, name, occurrence, (first, last), description, mutated))
    found.sort(key=lambda m: (m[0], m[1], m[2]))
    mutants, seen = [], {}
    for index, (line, name, occurrence, statement, description, mutated) in enumerate(found):
        seen[description] = seen.get(description, 0) + 1
        if seen[description] > 1:
            description = f"{description} #{seen[description]}"
        mutants.append(Mutant(index, name.split("/", 1)[1], occurrence, line, statement, description, mutated))
    return mutants


def sample(mutants: list[Mutant], max_mutants: int | None, seed: int) -> list[Mutant]:
    """A deterministic sample of at most `max_mutants` (all of them when None or when there are fewer)."""
    if max_mutants is None or max_mutants >= len(mutants):
        return list(mutants)
    if max_mutants < 1:
        raise ValueError(f"error: --max_mutants must be >= 1, got {max_mutants}.")
    chosen = sorted(random.Random(seed).sample(range(len(mutants)), max_mutants))
    return [mutants[i] for i in chosen]


def load_equivalents(path: pathlib.Path, module: str) -> dict[str, str]:
    """{description: reason} declared for `module` (its path under hackable_diffusion/)."""
    if not path.exists():
        return {}
    table = json.loads(path.read_text())
    declared = table.get(module, {})
    for description, reason in declared.items():
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"error: {path}: the equivalent {description!r} of {module} needs a one-line reason.")
    return declared


def tests_for(mutant: Mutant, coverage: dict[str, set[int]], durations: dict[str, float]) -> list[str] | None:
    """The tests that execute the mutant's statement, fastest first; every test when the statement runs at import
    (a module-level statement); None when no test executes it."""
    lines = set(range(mutant.statement[0], mutant.statement[1] + 1))
    tests = [name for name in durations]
    if coverage.get(COLLECTION, set()) & lines:
        return sorted(tests, key=lambda t: durations[t])
    covering = [t for t in tests if coverage.get(t, set()) & lines]
    return sorted(covering, key=lambda t: durations[t]) or None


def summarise(outcomes: list[dict], equivalents: dict[str, str]) -> dict:
    """Counts and score from per-mutant outcomes ({'outcome': killed|timeout|survived|not_covered|equivalent|error})."""
    count = lambda *kinds: sum(1 for o in outcomes if o["outcome"] in kinds)  # noqa: E731
    killed, survived = count("killed", "timeout"), count("survived", "not_covered")
    return {
        "killed": killed,
        "survived": survived,
        "equivalent": count("equivalent"),
        "timeout": count("timeout"),
        "not_covered": count("not_covered"),
        "errors": count("error"),  # runs that ended in neither a pass nor a test failure: in no count above
        "score": round(killed / (killed + survived), 4) if killed + survived else None,
        "survivors": [
            {k: o[k] for k in ("line", "operator", "mutation", "outcome")}
            for o in outcomes
            if o["outcome"] in ("survived", "not_covered")
        ],
        "equivalents": [
            {k: o[k] for k in ("line", "operator", "mutation")} | {"reason": equivalents[o["mutation"]]}
            for o in outcomes
            if o["outcome"] == "equivalent"
        ],
    }


# ---------------------------------------------------------------------------------------------------------------------
# The fork server
# ---------------------------------------------------------------------------------------------------------------------


def _dependents(module: str) -> set[str]:
    """Dotted names of the toolbox modules that import `module` (or a module that does), itself included. Static: any
    import statement anywhere in a file counts, and a module depends on its packages."""
    imports: dict[str, set[str]] = {}
    for path in (REPO / PACKAGE).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        deps = {".".join(parts[:i]) for i in range(1, len(parts))}  # its packages
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                package = parts[: len(parts) - node.level] if node.level else ()
                base = ".".join([*package, node.module] if node.module else package) if node.level else node.module
                deps |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        imports[name] = deps
    target = f"{PACKAGE}.{module[:-3].replace('/', '.')}"
    found, grew = {target}, True
    while grew:
        grew = False
        for name, deps in imports.items():
            if name not in found and deps & found:
                found.add(name)
                grew = True
    return found


def _configure_environment(cache_dir: str) -> None:
    """What tests/conftest.py sets, with a compilation cache that outlives one pytest run (set before jax loads)."""
    os.environ.setdefault(
        "XLA_FLAGS",
        "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
        "--xla_cpu_use_fusion_emitters=false",
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["HD_TEST_COMPILATION_CACHE"] = cache_dir
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache_dir
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
    sys.dont_write_bytecode = True


def _serve_source(dotted: str, path: pathlib.Path, source: str) -> None:
    """Makes `import dotted` execute `source` (as if it were the file at `path`)."""
    import importlib.abc
    import importlib.util

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, search_path, target=None):
            return importlib.util.spec_from_file_location(name, path, loader=self) if name == dotted else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            exec(compile(source, str(path), "exec"), module.__dict__)

    sys.meta_path.insert(0, Finder())


class _Recorder:
    """A pytest plugin (in the baseline child): per test, the lines of the mutated file it executes, and its time."""

    def __init__(self, filename: str):
        self.filename, self.current = filename, COLLECTION
        self.lines: dict[str, set[int]] = {COLLECTION: set()}
        self.durations: dict[str, float] = {}
        self.failed: list[str] = []

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines[self.current].add(frame.f_lineno)
        return self._local

    def _global(self, frame, event, arg):
        return self._local if frame.f_code.co_filename == self.filename else None

    def start(self):
        import threading

        sys.settrace(self._global)
        threading.settrace(self._global)

    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        self.lines.setdefault(item.nodeid, set())
        self.durations[item.nodeid] = 0.0

    def pytest_runtest_logreport(self, report):
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        if report.failed:
            self.failed.append(report.nodeid)


class _FirstFailure:
    """A pytest plugin (in a mutant's child): writes the first failing test's id to a file."""

    def __init__(self, path: str):
        self.path = path

    def pytest_runtest_logreport(self, report):
        if report.failed and not os.path.exists(self.path):
            pathlib.Path(self.path).write_text(report.nodeid)

    def pytest_collectreport(self, report):
        if report.failed and not os.path.exists(self.path):
            pathlib.Path(self.path).write_text(f"{report.nodeid} (collection)")


def _fork_pytest(dotted, path, source, args, plugin, log_path, timeout) -> tuple[int | None, float]:
    """Runs pytest on `args` in a forked child that imports `source` as `dotted`. (exit code or None on timeout,
    seconds)."""
    start = time.time()
    pid = os.fork()
    if pid == 0:  # the child
        code = 70
        try:
            os.setpgid(0, 0)
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            _serve_source(dotted, path, source)
            if isinstance(plugin, _Recorder):
                plugin.start()
            import pytest

            argv = ["-q", "-p", "no:cacheprovider", "-x", "--rootdir", str(REPO), *args]
            code = int(pytest.main(argv, plugins=[plugin]))
            if isinstance(plugin, _Recorder):
                sys.settrace(None)
                result = {
                    "lines": {k: sorted(v) for k, v in plugin.lines.items()},
                    "durations": plugin.durations,
                    "failed": plugin.failed,
                    "modules": sorted(m for m in sys.modules if m.startswith(PACKAGE)),
                }
                pathlib.Path(log_path + ".json").write_text(json.dumps(result))
        except BaseException:  # noqa: BLE001  (report anything as a failed run, never return into the parent's loop)
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = start + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), time.time() - start
            if time.time() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None, time.time() - start
            time.sleep(0.02)
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): the child goes too
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise


def _preimport(dependents: set[str], modules: list[str]) -> list[str]:
    """Imports the heavy libraries and the toolbox modules that do not depend on the mutated module, before any
    fork (jax's backend must not be started yet: a forked child starts its own)."""
    import importlib

    for name in ("numpy", "jax", "jax.numpy", "flax", "flax.linen", "optax", "jaxtyping", "einops", "pytest",
                 "hypothesis", "ml_collections"):  # fmt: skip
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    done = []
    for name in modules:
        if name not in dependents:
            importlib.import_module(name)
            done.append(name)
    leaked = dependents & set(sys.modules)
    if leaked:
        raise RuntimeError(f"error: pre-importing loaded {sorted(leaked)}, which must be imported fresh per mutant.")
    from jax._src import xla_bridge

    if getattr(xla_bridge, "_backends", None):  # its thread pools would not survive the fork
        raise RuntimeError("error: a pre-imported module started jax's backend at import; import it per mutant.")
    return done


def _read(path: str) -> str:
    return pathlib.Path(path).read_text() if os.path.exists(path) else ""


def run(args: argparse.Namespace) -> dict:
    module = module_path(args.module)
    path = REPO / PACKAGE / module
    if not path.exists():
        raise SystemExit(f"error: no module {path}; name one under {PACKAGE}/, e.g. diffusion/elbos.py.")
    tests = args.tests or MODULE_TESTS.get(module)
    if not tests:
        raise SystemExit(f"error: no tests mapped for {module}; add it to MODULE_TESTS or pass --tests FILE ...")
    source = path.read_text()
    sha = hashlib.sha256(source.encode()).hexdigest()
    out = pathlib.Path(args.out or REPO / "results" / "mutation" / (module[:-3].replace("/", ".") + ".json"))
    equivalents = load_equivalents(pathlib.Path(args.equivalents), module)
    mutants = enumerate_mutants(source)
    chosen = sample(mutants, args.max_mutants, args.seed)
    previous = {}
    if args.rerun_survivors:
        if not out.exists():
            raise SystemExit(f"error: --rerun_survivors needs an earlier result at {out}; run without it first.")
        earlier = json.loads(out.read_text())
        if earlier["module_sha256"] != sha:
            raise SystemExit(
                f"error: {module} changed since {out} was written; run it again without --rerun_survivors."
            )
        previous = {o["mutation"]: o for o in earlier["mutants"]}
        chosen = [m for m in mutants if m.description in previous]

    dotted = f"{PACKAGE}.{module[:-3].replace('/', '.')}"
    _configure_environment(args.cache_dir)
    os.chdir(REPO)
    work = tempfile.mkdtemp(prefix="hd-mutation-")
    dependents = _dependents(module)
    t0 = time.time()
    _preimport(dependents, [])
    log = os.path.join(work, "baseline.log")
    code, seconds = _fork_pytest(dotted, path, source, tests, _Recorder(str(path)), log, args.baseline_timeout)
    if code != 0 or not os.path.exists(log + ".json"):
        raise SystemExit(
            f"error: the tests fail on the unmutated module (exit {code}); fix them first:\n{_read(log)[-3000:]}"
        )
    baseline = json.loads(_read(log + ".json"))
    coverage = {k: set(v) for k, v in baseline["lines"].items()}
    durations = {k: v for k, v in baseline["durations"].items()}
    preimported = _preimport(dependents, baseline["modules"])
    start = {"module": module, "mutants": len(mutants), "running": len(chosen), "tests": len(durations)}
    print(json.dumps(start | {"baseline_s": round(seconds, 1), "preimported_modules": len(preimported)}), flush=True)

    outcomes, ran_seconds, ran = [], 0.0, 0
    for done, mutant in enumerate(chosen, 1):
        record = {"line": mutant.line, "operator": mutant.operator, "mutation": mutant.description}
        if mutant.description in equivalents:
            record["outcome"] = "equivalent"
        elif previous and previous[mutant.description]["outcome"] not in ("survived", "not_covered", "error"):
            record = previous[mutant.description]
        else:
            selected = tests_for(mutant, coverage, durations)
            if selected is None:
                record["outcome"] = "not_covered"
            else:
                rest = sorted((t for t in durations if t not in selected), key=lambda t: durations[t])
                record["outcome"], record["seconds"] = "survived", 0.0
                for group in (selected, rest if args.confirm else []):
                    if not group:
                        continue
                    first = os.path.join(work, "first_failure")
                    if os.path.exists(first):
                        os.remove(first)
                    budget = args.timeout_factor * sum(durations[t] for t in group) + args.timeout_extra
                    mlog = os.path.join(work, "mutant.log")
                    code, seconds = _fork_pytest(dotted, path, mutant.source, group, _FirstFailure(first), mlog, budget)
                    record["seconds"] = round(record["seconds"] + seconds, 2)
                    if code is None:
                        record["outcome"] = "timeout"
                        break
                    if code in (1, 2, 3, 4) or code < 0:  # a test failed, a test module or conftest failed to
                        # import (2, 4), a hook failed (3), or a crash
                        record["outcome"] = "killed"
                        record["killed_by"] = _read(first) or f"pytest exit {code}: {_read(mlog)[-300:]}"
                        break
                    if code != 0:  # no tests ran (5), or the runner itself failed
                        record["outcome"], record["error"] = "error", f"exit {code}: {_read(mlog)[-500:]}"
                        break
                ran_seconds += record["seconds"]
                ran += 1
        outcomes.append(record)
        rate = (time.time() - t0) / done
        print(json.dumps({"done": done, "total": len(chosen), **record, "s_per_mutant": round(rate, 2),
                          "eta_min": round(rate * (len(chosen) - done) / 60, 1)}), flush=True)  # fmt: skip

    stale = sorted(set(equivalents) - {m.description for m in mutants})
    result = {
        "module": f"{PACKAGE}/{module}",
        "module_sha256": sha,
        "tests": tests,
        "tool": "experiments/tooling/mutation_score.py (cosmic-ray operators, fork-server pytest runner)",
        "operators": [name.split("/", 1)[1] for name in OPERATORS],
        "mutants_total": len(mutants),
        "mutants_run": len(chosen),
        "sampled": len(chosen) < len(mutants),
        "max_mutants": args.max_mutants,
        "confirm": args.confirm,
        "seed": args.seed,
        "seconds_per_executed_mutant": round(ran_seconds / ran, 2) if ran else None,
        "wall_seconds": round(time.time() - t0, 1),
        **summarise(outcomes, equivalents),
        "stale_equivalents": stale,
        "mutants": outcomes,
    }
    if args.rerun_survivors:  # the earlier run's sample; the cost figures are this rerun's
        for key in ("sampled", "max_mutants", "seed"):
            result[key] = earlier.get(key)
        result["rerun_of"] = {k: earlier.get(k) for k in ("killed", "survived", "equivalent", "score",
                                                          "seconds_per_executed_mutant", "wall_seconds")}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: result[k] for k in ("module", "mutants_run", "killed", "survived", "equivalent", "score")}
    print(json.dumps(summary | {"seconds_per_executed_mutant": result["seconds_per_executed_mutant"], "out": str(out)}))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", required=True, help="the module to mutate, e.g. diffusion/elbos.py")
    parser.add_argument("--tests", nargs="*", help="test files (default: MODULE_TESTS of the module)")
    parser.add_argument("--max_mutants", type=int, default=None, help="run a deterministic sample of this many")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--rerun_survivors", action="store_true", help="rerun only the survivors of the last result")
    parser.add_argument("--confirm", action="store_true",
                        help="also run the non-covering tests on a mutant that survives the covering ones")  # fmt: skip
    parser.add_argument("--timeout_factor", type=float, default=4.0, help="x the baseline time of the tests run")
    parser.add_argument("--timeout_extra", type=float, default=60.0, help="+ seconds (imports, compiling)")
    parser.add_argument("--baseline_timeout", type=float, default=1800.0)
    parser.add_argument("--equivalents", default=str(EQUIVALENTS_FILE))
    parser.add_argument("--cache_dir", default=os.path.join(tempfile.gettempdir(), "hd-mutation-jax-cache"))
    parser.add_argument("--out", default=None, help="default: results/mutation/<module>.json")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("error: terminated; no result written."))
    run(parser.parse_args())


if __name__ == "__main__":
    main()
