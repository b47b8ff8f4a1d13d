"""An exhaustive Countdown solver: every value the given numbers reach, and one canonical expression for a target.

`reachable_values(numbers)` combines two disjoint groups of the numbers with + - * / recursively (a dynamic program
over sub-multisets, exact rationals, division by zero skipped), so its result is every value of every expression
that uses all the numbers once each, under the verifier's rules (`expressions.py`: fractions and negative values are
allowed in between). `solve(numbers, target)` looks for the target among the values of the smallest groups first and
rebuilds the expression top-down: groups in the fixed order of `itertools.combinations`, the left operand's values
integers first, then non-negative first, then ascending, operators in the order + - * /. The answer is therefore
canonical (a function of the sorted numbers and the target) and uses as few numbers as possible; it is written with
the fewest parentheses that keep its value. The TV show's integer-only intermediates are not required: neither the
verifier nor TinyZero's reward requires them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from fractions import Fraction

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3  # a number's precedence: it never needs parentheses


def _splits(group: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every ordered split of a sorted group into two non-empty sorted groups, each multiset split once per order."""
    seen = set()
    indices = range(len(group))
    for size in range(1, len(group)):
        for chosen in itertools.combinations(indices, size):
            left = tuple(group[i] for i in chosen)
            if left in seen:
                continue
            seen.add(left)
            rest = list(group)
            for value in left:
                rest.remove(value)
            yield left, tuple(rest)


Value = int | Fraction  # an integral value is kept as an int: integer arithmetic is several times faster


def _exact(value: Fraction) -> Value:
    return value.numerator if value.denominator == 1 else value


def _divide(a: Value, b: Value) -> Value:
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b
    return _exact(Fraction(a) / b)


def _pair_values(a: Value, b: Value, allow_division: bool) -> tuple[Value, ...]:
    """a + b, a - b, b - a, a * b, and a / b, b / a where defined."""
    both_ints = isinstance(a, int) and isinstance(b, int)
    out = (a + b, a - b, b - a, a * b) if both_ints else tuple(_exact(v) for v in (a + b, a - b, b - a, a * b))
    if allow_division:
        if b != 0:
            out += (_divide(a, b),)
        if a != 0:
            out += (_divide(b, a),)
    return out


@functools.lru_cache(maxsize=1 << 16)
def _values(group: tuple[int, ...], allow_division: bool) -> frozenset[Value]:
    """The values of every expression that uses each number of the sorted `group` exactly once."""
    if len(group) == 1:
        return frozenset((group[0],))
    out: set[Value] = set()
    for left, right in _splits(group):
        if left > right:  # every operator's other order is covered by `_pair_values` on the mirrored split
            continue
        right_values = _values(right, allow_division)
        for a in _values(left, allow_division):
            for b in right_values:
                out.update(_pair_values(a, b, allow_division))
    return frozenset(out)


def reachable_values(numbers: Sequence[int], *, allow_division: bool = True) -> frozenset[Value]:
    """Every value of an expression that uses each of `numbers` exactly once (ints, or Fractions when not integral)."""
    if not numbers:
        return frozenset()
    return _values(tuple(sorted(int(n) for n in numbers)), bool(allow_division))


def _natural_first(value: Value) -> tuple[bool, bool, Value]:
    """The order in which `_build` tries left operands: integers before fractions, non-negative before negative, then
    ascending, so that answers read as a person would write them where the value allows."""
    return not isinstance(value, int), value < 0, value


def _needed_right(a: Value, op: str, target: Value, right_values: frozenset[Value]) -> Value | None:
    """The smallest right operand b among `right_values` with `a op b == target`, or None."""
    if op == "+":
        b = target - a
    elif op == "-":
        b = a - target
    elif op == "*":
        if a == 0:  # 0 * b is 0 for every b
            return min(right_values) if target == 0 else None
        b = _divide(target, a)
    else:
        if target == 0:  # 0 / b is 0 for every non-zero b; a non-zero a over anything is never 0
            nonzero = [v for v in right_values if v != 0]
            return min(nonzero) if a == 0 and nonzero else None
        b = _divide(a, target)
        if b == 0:
            return None
    return b if b in right_values else None


def _build(group: tuple[int, ...], target: Value, allow_division: bool) -> tuple[str, int]:
    """(the canonical expression of `target` over all of the sorted `group`, its top operator's precedence); the
    target must be among `_values(group)`."""
    if len(group) == 1:
        return str(group[0]), _ATOM
    ops = "+-*/" if allow_division else "+-*"
    for left, right in _splits(group):
        right_values = _values(right, allow_division)
        for a in sorted(_values(left, allow_division), key=_natural_first):
            for op in ops:
                b = _needed_right(a, op, target, right_values)
                if b is not None:
                    return _render(_build(left, a, allow_division), op, _build(right, b, allow_division))
    raise AssertionError(f"{target} is not a value of {group}")  # unreachable when target is in _values(group)


def _render(left: tuple[str, int], op: str, right: tuple[str, int]) -> tuple[str, int]:
    """`left op right` with parentheses only where precedence or a non-associative operator needs them."""
    precedence = _PRECEDENCE[op]
    left_text = f"({left[0]})" if left[1] < precedence else left[0]
    right_needs = right[1] < precedence or (right[1] == precedence and op in "-/")
    right_text = f"({right[0]})" if right_needs else right[0]
    return left_text + op + right_text, precedence


def solve(
    numbers: Sequence[int], target: int, *, allow_division: bool = True, use_all_numbers: bool = False
) -> str | None:
    """A canonical expression over `numbers` (each at most once; all of them with `use_all_numbers`) equal to
    `target`, with as few numbers as possible; None when there is none."""
    ordered = tuple(sorted(int(n) for n in numbers))
    goal = _exact(Fraction(target))
    sizes = [len(ordered)] if use_all_numbers else range(1, len(ordered) + 1)
    for size in sizes:
        for group in sorted(set(itertools.combinations(ordered, size))):
            if goal in _values(group, bool(allow_division)):
                return _build(group, goal, bool(allow_division))[0]
    return None
