"""The exact verifier of Countdown answers: a recursive-descent parser over exact rationals, no `eval`.

A Countdown problem (d1, Zhao et al. 2025; TinyZero) gives a few numbers and a target; an answer is an arithmetic
expression that uses each given number at most once and evaluates to the target. The grammar:

    expression := term (("+" | "-") term)*
    term       := factor (("*" | "/") factor)*
    factor     := NUMBER | "(" expression ")"

with the usual precedence and left associativity; spaces between tokens are ignored. The rules, decided here:

* Only the given numbers may appear as literals, each at most as often as it is given (a multiset); a number may be
  left unused. A literal is written in decimal without a leading zero ("07" is refused), and there is no unary minus.
* Arithmetic is exact (`fractions.Fraction`): an intermediate value may be a fraction or negative, e.g.
  (1+1/3)*3 = 4 is a valid answer for the numbers 1, 1, 3, 3 and target 4; the final value must equal the target
  exactly. TinyZero's reward evaluates the answer with Python's `eval` in floating point and accepts an error below
  1e-5; exact rationals accept the same answers without the tolerance (and without `eval`). Division by zero
  anywhere makes the answer invalid.
* Anything else is invalid: an empty string, a character outside the grammar, unbalanced parentheses, trailing text
  (including "=target"), an expression longer than `MAX_EXPRESSION_CHARS` characters or nested deeper than
  `MAX_DEPTH` parentheses. `verify` and `reward` never raise on any input.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

MAX_EXPRESSION_CHARS = 64  # longer answers are refused unread: a 4-number answer is at most about 20 characters
MAX_DEPTH = 16  # nested parentheses beyond this are refused (the parser recurses once per level)
OPERATORS = "+-*/"


class InvalidExpression(ValueError):
    """The text is not an answer under the rules of the module docstring."""


class _Parser:
    """One pass over the text: each `_expression` / `_term` / `_factor` consumes the longest match at `pos`."""

    def __init__(self, text: str, numbers: Sequence[int]):
        self.text = text.replace(" ", "")
        self.pos = 0
        self.available = Counter(int(n) for n in numbers)

    def parse(self) -> Fraction:
        if not self.text:
            raise InvalidExpression("empty expression")
        value = self._expression(0)
        if self.pos != len(self.text):
            raise InvalidExpression(f"unexpected {self.text[self.pos]!r} at {self.pos}")
        return value

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _expression(self, depth: int) -> Fraction:
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op = self.text[self.pos]
            self.pos += 1
            right = self._term(depth)
            value = value + right if op == "+" else value - right
        return value

    def _term(self, depth: int) -> Fraction:
        value = self._factor(depth)
        while self._peek() in ("*", "/"):
            op = self.text[self.pos]
            self.pos += 1
            right = self._factor(depth)
            if op == "*":
                value = value * right
            elif right == 0:
                raise InvalidExpression("division by zero")
            else:
                value = value / right
        return value

    def _factor(self, depth: int) -> Fraction:
        ch = self._peek()
        if ch == "(":
            if depth >= MAX_DEPTH:
                raise InvalidExpression(f"parentheses nested deeper than {MAX_DEPTH}")
            self.pos += 1
            value = self._expression(depth + 1)
            if self._peek() != ")":
                raise InvalidExpression(f"missing ')' at {self.pos}")
            self.pos += 1
            return value
        if ch.isdigit() and ch.isascii():
            start = self.pos
            while self._peek().isdigit() and self._peek().isascii():
                self.pos += 1
            literal = self.text[start : self.pos]
            if len(literal) > 1 and literal[0] == "0":
                raise InvalidExpression(f"leading zero in {literal!r}")
            number = int(literal)
            if self.available[number] <= 0:
                raise InvalidExpression(f"{number} is not given (or is used more often than given)")
            self.available[number] -= 1
            return Fraction(number)
        raise InvalidExpression(f"expected a number or '(' at {self.pos}, got {ch or 'the end'!r}")


def evaluate(numbers: Sequence[int], text: str) -> Fraction:
    """The exact value of `text` under the rules; InvalidExpression when it breaks one."""
    if not isinstance(text, str):
        raise InvalidExpression(f"an answer is a string, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise InvalidExpression(f"longer than {MAX_EXPRESSION_CHARS} characters")
    return _Parser(text, numbers).parse()


def verify(numbers: Sequence[int], target: int, text: str) -> bool:
    """True iff `text` is an expression over the given `numbers` (each at most once) equal to `target` exactly."""
    try:
        return evaluate(numbers, text) == target
    except Exception:  # noqa: BLE001  (any malformed input is a wrong answer, never an error)
        return False


def reward(numbers: Sequence[int], target: int, text: str) -> float:
    """The verifiable reward: 1.0 for an exact answer, 0.0 otherwise (malformed included)."""
    return 1.0 if verify(numbers, target, text) else 0.0
