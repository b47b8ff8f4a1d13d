"""The documentation stays true: every relative link and image in README.md, docs/ and results/ resolves to a file in
the repository, and every `python -m hackable_diffusion.X` / `python experiments/Y.py` command they quote names a
module or script that exists and whose flags parse (entry points: `HD_CHECK_FLAGS=1` parses and checks the command
line, config overrides included, then exits; experiment scripts: their argparse parser, stopped after parsing), and
every bold figure of the README's headline table is a figure that the results page of its row states and a number in a
committed JSON / JSON lines file of that row's results folder, and the README's Measured table is the rendering of
results/measured.jsonl (experiments/tooling/readme_tables.py)."""

import functools
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import readme_tables  # experiments/tooling/readme_tables.py: tests/conftest.py puts its folders on sys.path

REPO = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
COMMAND = re.compile(r"python3? (?:-m hackable_diffusion\.\w+|experiments/(?:\w+/)?\w+\.py)\b")


def markdown_files(with_results: bool = True) -> list[pathlib.Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    if with_results:
        files += sorted((REPO / "results").rglob("*.md"))
    return files


def broken_links(path: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
    """Relative link targets of a markdown file that do not resolve to a file or folder inside `root`."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the same page
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        if not resolved.exists() or not resolved.is_relative_to(root):
            broken.append(target)
    return broken


def quoted_commands(path: pathlib.Path) -> list[list[str]]:
    """The argv of every toolbox command quoted in a markdown file: in code blocks (backslash continuations joined,
    comments dropped, `a && b` split) and in inline code spans. Templates (`$VAR`, `[--optional]`, `...`, `<name>`,
    `FILE`-style placeholders) are skipped."""
    text = path.read_text()
    candidates = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        candidates += block.replace("\\\n", " ").splitlines()
    candidates += re.findall(r"`([^`\n]*python3? [^`\n]*)`", re.sub(r"```.*?```", "", text, flags=re.S))
    commands = []
    for line in candidates:
        for part in re.split(r"&&?|;|\|", line):
            match = COMMAND.search(part)
            if not match or re.search(r"\$|\[|\.\.\.|<\w+>", part):
                continue
            try:
                argv = shlex.split(part[match.start() :], comments=True)
            except ValueError:
                continue  # an unbalanced quote in prose
            commands.append(argv)
    return commands


def check_commands(commands: list[list[str]]) -> list[str | None]:
    """Per command: None when its module/script exists and its flags parse, else what is wrong. The command lines of
    all entry points and experiment scripts are parsed in one process (`_parse_script_flags.py --batch`), grouped by
    script; entry points run with HD_CHECK_FLAGS=1 (parse and check, then exit)."""
    env = dict(os.environ, HD_CHECK_FLAGS="1", JAX_PLATFORMS="cpu")
    problems: list[str | None] = [None] * len(commands)
    by_script: dict[tuple[str, ...], list[int]] = {}  # ("-m", module) or (script,) -> command rows
    for i, argv in enumerate(commands):
        if argv[1] == "-m":
            module = argv[2]
            path = REPO / module.replace(".", "/")
            if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
                problems[i] = f"no module {module}"
                continue
            by_script.setdefault(("-m", module), []).append(i)
        elif not (REPO / argv[1]).is_file():
            problems[i] = f"no script {argv[1]}"
        else:
            by_script.setdefault((str(REPO / argv[1]),), []).append(i)
    # One interpreter for every command line, grouped by script: the imports (jax above all) are paid once.
    rows = [i for script_rows in by_script.values() for i in script_rows]
    targets = {i: list(script) for script, script_rows in by_script.items() for i in script_rows}
    batch = json.dumps([[targets[i], commands[i][3 if targets[i][0] == "-m" else 2 :]] for i in rows])
    driver = REPO / "tests" / "_parse_script_flags.py"
    out = subprocess.run(
        [sys.executable, str(driver), "--batch", batch], cwd=REPO, env=env, capture_output=True, text=True
    )
    results = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else [out.stderr] * len(rows)
    for i, result in zip(rows, results):
        problems[i] = result
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [anchor](#x) [web](https://example.org) ![img](missing.png) [bad](nope.md#a)\n")
    assert broken_links(page, root=tmp_path) == ["missing.png", "nope.md#a"]


@pytest.mark.slow
def test_quoted_commands_exist_and_their_flags_parse():
    commands, where = [], []
    for path in markdown_files():
        for argv in quoted_commands(path):
            if argv not in commands:
                commands.append(argv)
                where.append(path.relative_to(REPO))
    assert len(commands) > 20  # the README and docs quote many commands; finding none means the extraction broke
    failures = [
        f"{path}: {shlex.join(argv)}\n    -> {problem}"
        for path, argv, problem in zip(where, commands, check_commands(commands))
        if problem
    ]
    assert failures == [], "\n".join(failures)


@pytest.mark.slow
def test_a_bad_command_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\n"
        "python -m hackable_diffusion.train --config configs/quickstart.py \\\n"
        "    --workdir runs/x --config.train.num_stepz=3   # a misspelt key\n"
        "python experiments/speed/throughput.py --quick --no_such_flag\n"
        "python -m hackable_diffusion.nothing --help\n"
        "```\n"
        "and inline: `python -m hackable_diffusion.sample --workdir runs/x --prompt hi`\n"
    )
    commands = quoted_commands(page)
    assert [argv[:3] for argv in commands] == [
        ["python", "-m", "hackable_diffusion.train"],
        ["python", "experiments/speed/throughput.py", "--quick"],
        ["python", "-m", "hackable_diffusion.nothing"],
        ["python", "-m", "hackable_diffusion.sample"],
    ]
    problems = check_commands(commands)
    assert "num_stepz" in problems[0]
    assert "no_such_flag" in problems[1]
    assert problems[2] == "no module hackable_diffusion.nothing"
    assert problems[3] is None


NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
BOLD = re.compile(r"\*\*(.+?)\*\*", flags=re.S)


def numbers_in(text: str) -> set[str]:
    """Every number written in `text`, thousands separators dropped ("1,000" -> "1000")."""
    return {n.replace(",", "") for n in NUMBER.findall(text)}


def stated_figures(page: pathlib.Path) -> set[str]:
    """The figures a results page states: the numbers in its bold spans and in those of the markdown files it links to,
    and every number in the data files it links to (JSON, JSON lines; a linked folder: each such file in it)."""
    text = page.read_text()
    figures = set().union(*[numbers_in(span) for span in BOLD.findall(text)])
    for target in LINK.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        linked = (page.parent / target.split("#", 1)[0]).resolve()
        for file in sorted(linked.iterdir()) if linked.is_dir() else [linked]:
            if file.is_file() and file.suffix == ".md":
                figures |= set().union(*[numbers_in(span) for span in BOLD.findall(file.read_text())])
            elif file.is_file() and file.suffix in (".json", ".jsonl"):
                figures |= numbers_in(file.read_text())
    return figures


def headline_figures_missing(readme: pathlib.Path) -> tuple[int, list[str]]:
    """The README's "Headline results" table against its results pages: every number in a bold span (**...**) of a row
    must be a figure that the page the row links to states (`stated_figures`: bold there, or in a linked data file).
    Returns (figures checked, problems)."""
    section = re.search(r"^## Headline results\n(.*?)(?=^## |\Z)", readme.read_text(), flags=re.S | re.M)
    assert section, f"{readme} has no '## Headline results' section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("|") and not line.startswith("|---")]
    checked, problems = 0, []
    for row in rows[1:]:  # after the header
        bold = BOLD.findall(row)
        links = [t for t in LINK.findall(row) if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]
        if not bold:
            continue
        if not links:
            problems.append(f"a row with bold figures and no results link: {row[:80]}")
            continue
        page = (readme.parent / links[-1].split("#", 1)[0]).resolve()
        if not page.is_file():
            problems.append(f"{links[-1]}: no such page")
            continue
        stated = stated_figures(page)
        for span in bold:
            for number in sorted(numbers_in(span)):
                checked += 1
                if number not in stated:
                    problems.append(f"{number} (README **{span}**) is not a figure of {links[-1]}")
    return checked, problems


def test_headline_figures_appear_in_their_results_pages():
    checked, problems = headline_figures_missing(REPO / "README.md")
    assert checked >= 8  # the table holds about a dozen bold figures; finding none means the parsing broke
    assert problems == [], "\n".join(problems)


def test_a_headline_figure_changed_in_the_readme_only_is_caught(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "page.md").write_text(
        "Exact: **99.7%** of 1,000 puzzles (99.5% with fewer passes); rows in [rows](rows.jsonl).\n"
    )
    (tmp_path / "results" / "rows.jsonl").write_text('{"speedup": 2.69}\n')
    table = (
        "# T\n\n## Headline results\n\n| task | result | details |\n|---|---|---|\n"
        "| a | **{a}%** of 1,000 | [page](results/page.md#x) |\n| b | **2.69x** faster | [page](results/page.md) |\n\n"
        "## Next\n\n| x | **12.5** | [page](results/page.md) |\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text(table.replace("{a}", "99.7"))
    assert headline_figures_missing(readme) == (2, [])
    for changed in ("99.8", "99.5"):  # 99.5 is on the page, but not as a stated (bold) figure
        readme.write_text(table.replace("{a}", changed))
        checked, problems = headline_figures_missing(readme)
        assert checked == 2 and len(problems) == 1 and problems[0].startswith(f"{changed} "), problems


# Headline figures whose evaluation is in no committed JSON / JSON lines file under results/ (only in a results page's
# prose). Each stays in the headline table, not in bold, until a rerun commits its record; keep this list short.
HEADLINE_FIGURES_WITHOUT_JSON = {
    # Penn Treebank, masking adapted from ptb_ar (results/ptb/README.md, "Adapted from the AR run"): measured before
    # its evaluation's JSON line was committed. Rerun with `python -m hackable_diffusion.train --config
    # configs/ptb_masking_from_ar.py --workdir runs/ptb_masking_from_ar` and `python -m hackable_diffusion.evaluate
    # --workdir runs/ptb_masking_from_ar` (needs $HD_DATA_DIR/ptb/) and commit that line under results/ptb/.
    "2,120": "Penn Treebank perplexity per word of the masking run adapted from the AR run",
}


def headline_rows(readme: pathlib.Path) -> list[str]:
    """The body rows of the README's "Headline results" table."""
    section = re.search(r"^## Headline results\n(.*?)(?=^## |\Z)", readme.read_text(), flags=re.S | re.M)
    assert section, f"{readme} has no '## Headline results' section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("|") and not line.startswith("|---")]
    return rows[1:]  # after the header


def json_numbers(folder: pathlib.Path) -> list[float]:
    """Every number in the JSON and JSON lines files under `folder` (parsed; booleans and strings are not numbers)."""
    numbers: list[float] = []

    def collect(tree) -> None:
        if isinstance(tree, dict):
            for value in tree.values():
                collect(value)
        elif isinstance(tree, list):
            for value in tree:
                collect(value)
        elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
            numbers.append(float(tree))

    for file in sorted(folder.rglob("*")):
        if not file.is_file() or file.suffix not in (".json", ".jsonl"):
            continue
        text = file.read_text()
        for document in [text] if file.suffix == ".json" else [line for line in text.splitlines() if line.strip()]:
            collect(json.loads(document))
    return numbers


def printed_figure(number: str, span: str) -> tuple[float, float, tuple[float, ...]]:
    """(value, tolerance, scales) of a number printed in a bold span: the tolerance is half a unit of its last printed
    digit; a percentage may be stored as a fraction (x100) or as printed, milliseconds as seconds (x1000) or as
    printed."""
    decimals = len(number.partition(".")[2])
    scales = (100.0, 1.0) if "%" in span else (1000.0, 1.0) if re.search(r"\bms\b", span) else (1.0,)
    return float(number.replace(",", "")), 0.5 * 10.0**-decimals + 1e-9, scales


def headline_figures_without_json(readme: pathlib.Path) -> tuple[int, list[str]]:
    """The README's headline table against the committed measurements: every number in a bold span of a row must be,
    within its printed precision, a number in a JSON / JSON lines file under the results folder the row links to
    (results/sudoku/README.md -> results/sudoku/, subfolders included). Returns (figures checked, problems)."""
    root = readme.parent.resolve()
    checked, problems, numbers_by_folder = 0, [], {}
    for row in headline_rows(readme):
        bold = BOLD.findall(row)
        links = [t for t in LINK.findall(row) if t.startswith("results/")]
        if not bold:
            continue
        if not links:
            problems.append(f"a row with bold figures and no results link: {row[:80]}")
            continue
        folder = (root / links[-1].split("#", 1)[0]).resolve().parent
        if not folder.is_relative_to(root / "results"):
            problems.append(f"{links[-1]}: not a page of a results folder")
            continue
        if folder not in numbers_by_folder:
            numbers_by_folder[folder] = json_numbers(folder)
        for span in bold:
            for number in NUMBER.findall(span):
                checked += 1
                value, tolerance, scales = printed_figure(number, span)
                if not any(abs(n * s - value) <= tolerance for n in numbers_by_folder[folder] for s in scales):
                    where = folder.relative_to(root)
                    problems.append(f"{number} (README **{span}**) is in no JSON / JSON lines file under {where}/")
    return checked, problems


def test_headline_figures_are_committed_measurements():
    checked, problems = headline_figures_without_json(REPO / "README.md")
    assert checked >= 8  # the table holds about a dozen bold figures; finding none means the parsing broke
    assert problems == [], "\n".join(problems)


def test_headline_figures_without_json_stay_in_the_table_unbolded():
    rows = headline_rows(REPO / "README.md")
    bold_numbers = {n for row in rows for span in BOLD.findall(row) for n in NUMBER.findall(span)}
    for figure, what in HEADLINE_FIGURES_WITHOUT_JSON.items():
        assert any(figure in row for row in rows), f"{figure} ({what}) left the headline table: drop it from the list"
        assert figure not in bold_numbers, f"{figure} ({what}) has no committed JSON record: it cannot be in bold"


def test_a_headline_figure_without_json_is_caught(tmp_path):
    (tmp_path / "results" / "page" / "runs").mkdir(parents=True)
    (tmp_path / "results" / "page" / "README.md").write_text("Exact: **99.7%**\n")
    (tmp_path / "results" / "page" / "runs" / "rows.jsonl").write_text(
        '{"accuracy": 0.997, "ttft_p50_s": 0.0261, "ratio": 0.8817, "ok": true}\n'
    )
    (tmp_path / "results" / "other.json").write_text('{"ppl_per_word": 2120.4}')  # not under the row's folder
    table = (
        "# T\n\n## Headline results\n\n| task | result | details |\n|---|---|---|\n"
        "| a | **{a}%** exact, TTFT **26 ms**, **0.88x** | [page](results/page/README.md#x) |\n\n## Next\n\n| **5** |\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text(table.replace("{a}", "99.7"))
    assert headline_figures_without_json(readme) == (3, [])
    for changed in ("99.8", "99", "2,120"):
        readme.write_text(table.replace("{a}", changed))
        checked, problems = headline_figures_without_json(readme)
        assert checked == 3 and len(problems) == 1 and problems[0].startswith(f"{changed} "), problems


def test_the_measured_table_is_rendered_from_results():
    assert readme_tables.rendered_readme() == (REPO / "README.md").read_text(), (
        "README.md's Measured table differs from results/measured.jsonl: run python experiments/tooling/readme_tables.py"
    )


def test_a_measured_row_that_drifts_from_its_record_is_caught(tmp_path):
    row = {
        "figure": "suite",
        "value": "924 passed in 31 min 54 s at commit 9484a59 (0.151-0.300 TFLOP/s, -2.0%)",
        "command": "pytest",
        "commits": ["9484a59"],
        "numbers": {"passed": 924, "wall": {"min": 31, "s": 54}, "peak": [0.151, 0.3], "change_percent": -2.0},
    }
    measured = tmp_path / "measured.jsonl"
    readme = tmp_path / "README.md"
    measured.write_text(json.dumps(row) + "\n")
    readme.write_text(f"# T\n\n## Measured\n\n{readme_tables.START}\n| stale |\n{readme_tables.END}\n\nend\n")
    rendered = readme_tables.rendered_readme(readme, measured)
    assert "| suite | 924 passed in 31 min 54 s" in rendered and "stale" not in rendered
    assert rendered.endswith(f"{readme_tables.END}\n\nend\n")
    measured.write_text(json.dumps(dict(row, value=row["value"].replace("924", "925"))) + "\n")
    with pytest.raises(ValueError, match="924 is not in the text"):
        readme_tables.rendered_readme(readme, measured)
    measured.write_text(json.dumps(dict(row, commits=["8ab7719"])) + "\n")
    with pytest.raises(ValueError, match="commit 8ab7719"):
        readme_tables.rendered_readme(readme, measured)


# Prose references: file paths and dotted module names quoted in inline code must name something that exists.
PROSE_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|sh|json|jsonl|ipynb|yaml|toml))(?![\w/])")
PROSE_MODULE = re.compile(
    r"(?<![\w.])(?:hackable_diffusion\.)?(?:models|diffusion|sampling|training|tasks|rl|distill|evals|serve|checkpoints"
    r"|data|aot)(?:\.\w+)+"
)
# Files of other projects that the docs name when they say where a figure or rule comes from.
EXTERNAL_FILES = {
    "_early_stopping.py": "DiffusionGemma's reference early-stopping rules",
    "modeling_diffusion_gemma.py": "transformers' DiffusionGemma model",
}


def written_file_names(root: pathlib.Path = REPO) -> set[str]:
    """File names that the toolbox or its experiments write (string literals in their sources), e.g. metrics.jsonl."""
    names = set()
    for source in [*(root / "hackable_diffusion").rglob("*.py"), *(root / "experiments").rglob("*.py")]:
        names |= set(re.findall(r"[\"']([\w.-]+\.(?:json|jsonl|md|png|txt))[\"']", source.read_text()))
    return names


def module_name_problem(name: str, root: pathlib.Path = REPO) -> str | None:
    """None when a dotted name resolves: its longest module prefix exists under hackable_diffusion/ and the rest (if
    any) starts with a name that module defines at top level. Names like `rl.kl_beta` (one package, then no module)
    read as config keys and are not judged."""
    parts = name.removeprefix("hackable_diffusion.").split(".")
    package = root / "hackable_diffusion"
    for k in range(len(parts), 0, -1):
        base = package.joinpath(*parts[:k])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            break
    else:
        return f"{name}: no such module" if name.startswith("hackable_diffusion.") else None
    if k == len(parts):
        return None
    if k == 1 and source.name == "__init__.py" and not name.startswith("hackable_diffusion."):
        return None  # a config key such as `rl.kl_beta`
    attribute = parts[k]
    defined = re.search(
        rf"^(?:def|class|async def) {attribute}\b|^{attribute}\s*[:=]|^from \S+ import .*\b{attribute}\b"
        rf"|^import \S+ as {attribute}\b",
        source.read_text(),
        flags=re.M,
    )
    return None if defined else f"{name}: {source.relative_to(root)} defines no {attribute}"


@functools.lru_cache(maxsize=4)
def repository_files(root: pathlib.Path) -> tuple[str, ...]:
    """Every file and folder under `root` (relative, POSIX), without descending into .git, .venv, runs or caches."""
    skipped = {".git", ".venv", "runs", "__pycache__", ".pytest_cache"}
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in skipped]
        here = pathlib.Path(folder).relative_to(root)
        found += [(here / name).as_posix() for name in [*subfolders, *names]]
    return tuple(found)


def prose_reference_problems(
    path: pathlib.Path, root: pathlib.Path = REPO, written: set[str] | None = None
) -> list[str]:
    """File paths and dotted module names in the inline code of a markdown file that name nothing in the repository
    (placeholders such as `WORKDIR/x.json`, `{a,b}` patterns and `*` globs are skipped; a bare file name may live
    anywhere in the repository or be one the toolbox writes at run time)."""
    written = written_file_names(root) if written is None else written
    files = repository_files(root)
    problems = []
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", path.read_text(), flags=re.S)):
        if re.search(r"[{}*$<>]", span):
            continue
        for reference in PROSE_PATH.findall(span):
            if any(part.isupper() for part in reference.split("/")[:-1]):
                continue  # a placeholder folder: WORKDIR/config.json
            name = reference.rsplit("/", 1)[-1]
            if reference in files or any(f.endswith("/" + reference) for f in files):
                continue
            if name in written or name in EXTERNAL_FILES:
                continue
            problems.append(f"{path.name}: {reference} names no file")
        for name in PROSE_MODULE.findall(span):
            if re.search(r"\.(?:py|md|sh|json|jsonl|ipynb|yaml|toml|png)$", name):
                continue  # a file named after a module, e.g. results/mutation/diffusion.elbos.json
            problem = module_name_problem(name, root)
            if problem:
                problems.append(f"{path.name}: {problem}")
    return problems


def test_prose_file_paths_and_module_names_exist():
    written = written_file_names()
    problems = [p for path in markdown_files() for p in prose_reference_problems(path, written=written)]
    assert problems == [], "\n".join(problems)


def test_a_stale_prose_reference_is_caught(tmp_path):
    (tmp_path / "hackable_diffusion" / "tasks" / "sudoku").mkdir(parents=True)
    (tmp_path / "hackable_diffusion" / "tasks" / "__init__.py").write_text("")
    (tmp_path / "hackable_diffusion" / "tasks" / "sudoku" / "__init__.py").write_text("")
    (tmp_path / "hackable_diffusion" / "tasks" / "sudoku" / "search.py").write_text("def search_puzzles():\n    pass\n")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "bench.py").write_text('OUT = "rows.jsonl"\n')
    page = tmp_path / "page.md"
    page.write_text(
        "`tasks.sudoku.search.search_puzzles` and `search.py`, `tasks/sudoku/search.py`, `rows.jsonl`,"
        " `WORKDIR/config.json`, `rl.kl_beta`, `configs/{a,b}.py`\n"
        "stale: `tasks.sudoku.solve.solve_puzzles`, `tasks.sudoku.search.gone`, `models/hf_ckpt.py`, `pretrained.py`\n"
    )
    assert prose_reference_problems(page, root=tmp_path) == [
        "page.md: tasks.sudoku.solve.solve_puzzles: hackable_diffusion/tasks/sudoku/__init__.py defines no solve",
        "page.md: tasks.sudoku.search.gone: hackable_diffusion/tasks/sudoku/search.py defines no gone",
        "page.md: models/hf_ckpt.py names no file",
        "page.md: pretrained.py names no file",
    ]


def unindexed_experiments(root: pathlib.Path = REPO) -> list[str]:
    """Files under experiments/ that its README's index does not name (as `folder/file` at the start of a table cell;
    the scripts live in topic folders, the index's sections); a row naming `folder/package/` covers the modules of an
    experiment-only package."""
    index = (root / "experiments" / "README.md").read_text()
    named = set(re.findall(r"^\| `([\w./]+)", index, flags=re.M))
    packages = tuple(n for n in named if n.endswith("/"))
    folder = root / "experiments"
    files = {
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    return sorted(f for f in files - named - {"README.md"} if not f.startswith(packages))


def test_every_experiment_is_in_the_index():
    assert unindexed_experiments() == [], "add these to experiments/README.md (one line, its command, what it writes)"


def test_an_unindexed_experiment_is_caught(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "speed").mkdir()
    (tmp_path / "experiments" / "README.md").write_text("| `speed/listed.py` | x | - |\n")
    (tmp_path / "experiments" / "speed" / "listed.py").write_text("")
    (tmp_path / "experiments" / "speed" / "new_bench.py").write_text("")
    assert unindexed_experiments(tmp_path) == ["speed/new_bench.py"]


def experiments_with_another_cli(root: pathlib.Path = REPO) -> list[str]:
    """Experiment scripts whose flags are not argparse's: the one CLI style of experiments/ (the package's commands
    take absl/ml_collections flags; a script reads a config file with `cli.load_config_file`)."""
    found = []
    for path in sorted((root / "experiments").rglob("*.py")):
        text = path.read_text()
        if "from absl" in text or "import absl" in text or "config_flags" in text:
            found.append(path.relative_to(root / "experiments").as_posix())
    return found


def test_experiments_share_one_cli_style():
    assert experiments_with_another_cli() == [], "parse these scripts' flags with argparse"


def test_an_absl_experiment_is_caught(tmp_path):
    (tmp_path / "experiments" / "speed").mkdir(parents=True)
    (tmp_path / "experiments" / "speed" / "ok.py").write_text("import argparse\n")
    (tmp_path / "experiments" / "speed" / "flags.py").write_text("from absl import app\n")
    assert experiments_with_another_cli(tmp_path) == ["speed/flags.py"]


def undocumented_packages(root: pathlib.Path = REPO) -> list[str]:
    """Packages of hackable_diffusion/ that docs/architecture.md's module table never names (as `PACKAGE/...`)."""
    text = (root / "docs" / "architecture.md").read_text()
    package_root = root / "hackable_diffusion"
    packages = [p.parent.relative_to(package_root).as_posix() for p in package_root.rglob("__init__.py")]
    return sorted(p for p in packages if p != "." and f"`{p}/" not in text)


def test_the_architecture_page_covers_every_package():
    assert undocumented_packages() == [], "add a row for these packages to docs/architecture.md"


def test_an_undocumented_package_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text("| `rl/objectives.py` | x |\n")
    for package in ("rl", "newpkg"):
        (tmp_path / "hackable_diffusion" / package).mkdir(parents=True)
        (tmp_path / "hackable_diffusion" / package / "__init__.py").write_text("")
    (tmp_path / "hackable_diffusion" / "__init__.py").write_text("")
    assert undocumented_packages(tmp_path) == ["newpkg"]
