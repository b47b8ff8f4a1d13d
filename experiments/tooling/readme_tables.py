"""Renders the README's "Measured" table from results/measured.jsonl, between the marker comments
`<!-- measured:start -->` and `<!-- measured:end -->` of README.md.

  python experiments/tooling/readme_tables.py            # rewrite the table in README.md
  python experiments/tooling/readme_tables.py --check    # exit 1 when README.md's table differs from the rendering

Each line of results/measured.jsonl is one row: `figure`, `value` and `command` (the three cells, as printed), and the
figures the row states in structured form: `commits` (the commits the value names) and `numbers` (a nested object of
numbers, each written in the row's text). A row whose structured figures its text does not state is refused, so the
record and the printed text cannot drift apart. Standard library only: the docs tests import it.
"""

import argparse
import dataclasses
import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MEASURED = REPO / "results" / "measured.jsonl"
START = "<!-- measured:start -->"
END = "<!-- measured:end -->"
HEADER = ("figure", "value", "command")
# A number as written in prose: a sign only where no digit precedes it ("0.79-1.36" is two positive numbers).
NUMBER = re.compile(r"(?<![\d.])[-+]?\d[\d,]*(?:\.\d+)?")


@dataclasses.dataclass(frozen=True)
class MeasuredRow:
    """One row of the Measured table and the figures its text states."""

    figure: str
    value: str
    command: str
    commits: tuple[str, ...]
    numbers: dict

    @classmethod
    def from_json(cls, record: dict) -> "MeasuredRow":
        return cls(
            figure=record["figure"],
            value=record["value"],
            command=record["command"],
            commits=tuple(record.get("commits", ())),
            numbers=record.get("numbers", {}),
        )


def read_rows(path: pathlib.Path = MEASURED) -> list[MeasuredRow]:
    return [MeasuredRow.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def leaf_numbers(tree) -> list[float]:
    """The numbers of a nested object (dicts and lists), depth first."""
    if isinstance(tree, dict):
        return [n for value in tree.values() for n in leaf_numbers(value)]
    if isinstance(tree, list):
        return [n for value in tree for n in leaf_numbers(value)]
    if isinstance(tree, bool) or not isinstance(tree, (int, float)):
        raise ValueError(f"not a number: {tree!r}")
    return [float(tree)]


def written_numbers(text: str) -> set[float]:
    """Every number written in `text` ("1,000" -> 1000.0, "-2.0%" -> -2.0, "0.79-1.36" -> 0.79 and 1.36)."""
    return {float(n.replace(",", "")) for n in NUMBER.findall(text)}


def row_problems(row: MeasuredRow) -> list[str]:
    """The structured figures of a row that its printed text does not state."""
    text = " ".join((row.figure, row.value, row.command))
    stated = written_numbers(text) | {abs(n) for n in written_numbers(text)}
    problems = [f"{row.figure[:40]}: commit {c} is not in the text" for c in row.commits if c not in text]
    problems += [f"{row.figure[:40]}: {n:g} is not in the text" for n in leaf_numbers(row.numbers) if n not in stated]
    return problems


def render_table(rows: list[MeasuredRow]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        cells = (row.figure, row.value, row.command)
        if any("|" in cell or "\n" in cell for cell in cells):
            raise ValueError(f"a cell holds a '|' or a line break: {row.figure[:40]}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def replace_between_markers(text: str, table: str) -> str:
    """`text` with what lies between the marker lines replaced by `table`."""
    start, end = text.find(START + "\n"), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md lacks the marker lines {START} ... {END}")
    return text[: start + len(START) + 1] + table + text[end:]


def rendered_readme(readme: pathlib.Path = README, measured: pathlib.Path = MEASURED) -> str:
    """README.md's text with its Measured table rendered from `measured` (refused if a row's record and text differ)."""
    rows = read_rows(measured)
    problems = [p for row in rows for p in row_problems(row)]
    if problems:
        raise ValueError("rows whose text does not state their figures:\n" + "\n".join(problems))
    return replace_between_markers(readme.read_text(), render_table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md differs from the rendering")
    args = parser.parse_args()
    text = rendered_readme()
    if args.check:
        if text != README.read_text():
            sys.exit(f"README.md's Measured table differs from {MEASURED.relative_to(REPO)}: run {sys.argv[0]}")
        return
    README.write_text(text)


if __name__ == "__main__":
    main()
