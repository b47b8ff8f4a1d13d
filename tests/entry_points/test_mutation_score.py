"""experiments/tooling/mutation_score.py's bookkeeping on a toy module (no jax, no pytest runs): which mutants it makes and how
it names them, which tests a mutant runs, the deterministic sample, the counts and score, the declared equivalents
(the committed file included), and which toolbox modules must be imported fresh per mutant."""

import json
import pathlib

import pytest

pytest.importorskip("cosmic_ray")

import mutation_score as M  # noqa: E402  (experiments/ is on sys.path through tests/conftest.py)

TOY = '''"""A toy module."""

from __future__ import annotations

BIG = 1e30
LIMIT = 3


def clip(x: int | None, low: int = 0) -> int:
    if x < low:
        return low
    return min(x, LIMIT)


# A comment above a decorator.
@staticmethod
def twice(values):
    total = 0
    for v in values:
        total += 2 * v
    return total
'''


@pytest.fixture(scope="module")
def mutants():
    return M.enumerate_mutants(TOY)


def test_mutants_are_named_by_definition_and_change_and_ordered_by_line(mutants):
    descriptions = [m.description for m in mutants]
    assert "clip: if x < low: -> if x <= low:" in descriptions
    assert "twice: total += 2 * v -> total += 2 / v" in descriptions
    assert "<module>: LIMIT = 3 -> LIMIT = 4" in descriptions
    assert "twice: for v in values: -> for v in []:" in descriptions
    assert [m.line for m in mutants] == sorted(m.line for m in mutants)
    assert [m.index for m in mutants] == list(range(len(mutants)))
    assert len(set(descriptions)) == len(descriptions)
    # A mutant's source is the whole module with that one change.
    mutant = mutants[descriptions.index("clip: if x < low: -> if x <= low:")]
    assert mutant.line == 10 and mutant.statement == (10, 11) and "if x <= low:" in mutant.source
    assert mutant.source.replace("if x <= low:", "if x < low:") == TOY


def test_no_mutant_leaves_the_program_unchanged_or_touches_only_an_annotation(mutants):
    assert not [m for m in mutants if m.line == 5]  # 1e30 +- 1 == 1e30
    assert not [m for m in mutants if m.line == 9 and "int & None" in m.description]  # `int | None`: an annotation
    assert [m for m in mutants if m.description == "clip: def clip(x: int | None, low: int = 0) -> int: -> "
            "def clip(x: int | None, low: int = 1) -> int:"]  # fmt: skip  (a default is behaviour)


def test_a_removed_decorator_is_named_by_its_line_not_the_comment_above_it(mutants):
    [removed] = [m for m in mutants if m.operator == "RemoveDecorator"]
    assert removed.description == "twice: @staticmethod -> "
    assert removed.line == 16 and removed.statement == (16, 21)


def test_a_mutant_runs_the_tests_that_execute_its_statement_fastest_first(mutants):
    durations = {"t::slow": 3.0, "t::fast": 1.0, "t::other": 2.0}
    coverage = {M.COLLECTION: {1, 3, 5, 6, 9, 16}, "t::slow": {10, 11}, "t::fast": {10, 12}, "t::other": {18}}
    by = {m.description: m for m in mutants}
    assert M.tests_for(by["clip: if x < low: -> if x <= low:"], coverage, durations) == ["t::fast", "t::slow"]
    everything = ["t::fast", "t::other", "t::slow"]  # a module-level statement: every test
    assert M.tests_for(by["<module>: LIMIT = 3 -> LIMIT = 4"], coverage, durations) == everything
    assert M.tests_for(by["twice: total += 2 * v -> total += 2 / v"], coverage, durations) is None


def test_the_sample_is_deterministic_and_bounded(mutants):
    first = M.sample(mutants, 5, seed=1)
    assert first == M.sample(mutants, 5, seed=1) and len(first) == 5
    assert [m.index for m in first] == sorted(m.index for m in first)
    assert M.sample(mutants, 5, seed=2) != first
    assert M.sample(mutants, None, seed=0) == mutants == M.sample(mutants, len(mutants) + 3, seed=0)
    with pytest.raises(ValueError, match="--max_mutants must be >= 1"):
        M.sample(mutants, 0, seed=0)


def test_counts_and_score_leave_equivalents_out():
    outcomes = [
        {"line": 1, "operator": "a", "mutation": "m1", "outcome": "killed"},
        {"line": 2, "operator": "a", "mutation": "m2", "outcome": "timeout"},
        {"line": 3, "operator": "a", "mutation": "m3", "outcome": "survived"},
        {"line": 4, "operator": "a", "mutation": "m4", "outcome": "not_covered"},
        {"line": 5, "operator": "a", "mutation": "m5", "outcome": "equivalent"},
        {"line": 6, "operator": "a", "mutation": "m6", "outcome": "killed"},
        {"line": 7, "operator": "a", "mutation": "m7", "outcome": "error"},
    ]
    summary = M.summarise(outcomes, {"m5": "same value"})
    assert (summary["killed"], summary["survived"], summary["equivalent"], summary["errors"]) == (3, 2, 1, 1)
    assert summary["score"] == 0.6
    assert [s["mutation"] for s in summary["survivors"]] == ["m3", "m4"]
    assert summary["equivalents"] == [{"line": 5, "operator": "a", "mutation": "m5", "reason": "same value"}]


def test_equivalents_need_a_reason(tmp_path):
    path = tmp_path / "eq.json"
    path.write_text(json.dumps({"diffusion/elbos.py": {"f: a -> b": "a == b here"}, "x.py": {"g: c -> d": " "}}))
    assert M.load_equivalents(path, "diffusion/elbos.py") == {"f: a -> b": "a == b here"}
    assert M.load_equivalents(path, "other.py") == {}
    with pytest.raises(ValueError, match="needs a one-line reason"):
        M.load_equivalents(path, "x.py")


def test_the_committed_equivalents_name_mapped_modules_with_one_line_reasons():
    table = json.loads(M.EQUIVALENTS_FILE.read_text())
    for module, declared in table.items():
        assert module in M.MODULE_TESTS, module
        assert (M.REPO / M.PACKAGE / module).exists()
        for description, reason in M.load_equivalents(M.EQUIVALENTS_FILE, module).items():
            assert ": " in description and " -> " in description, description
            assert "\n" not in reason, description


def test_module_names_and_fresh_imports():
    assert M.module_path("hackable_diffusion/diffusion/elbos.py") == "diffusion/elbos.py"
    assert M.module_path("diffusion.elbos") == M.module_path("diffusion/elbos.py") == "diffusion/elbos.py"
    fresh = M._dependents("distill/reverse_kl.py")
    assert {"hackable_diffusion.distill.reverse_kl", "hackable_diffusion.distill.command"} <= fresh
    assert "hackable_diffusion.diffusion.elbos" not in fresh and "hackable_diffusion.distill" not in fresh
    for tests in M.MODULE_TESTS.values():
        assert all(pathlib.Path(t).suffix == ".py" for t in tests)
