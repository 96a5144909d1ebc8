"""The ``calculator`` tool: exact rational arithmetic on the text of a call, never ``eval``.

Grammar (spaces ignored)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "×" | "/" | "÷") factor)*
    factor := ("-" | "+") factor | power
    power  := atom (("^" | "**") factor)?        # right-associative: 2^3^2 = 2^9
    atom   := NUMBER | "(" expr ")"
    NUMBER := digits with an optional "." part and "," thousands separators (1,250.5), or a
              leading "." (.5); a trailing "%" divides by 100

Every value is a :class:`fractions.Fraction`, so ``0.1 + 0.2`` is ``0.3`` and ``10 / 4`` is ``2.5``.
A power needs an integer exponent of at most :data:`MAX_EXPONENT` in size and a result of at most
:data:`MAX_DIGITS` digits, parentheses nest at most :data:`MAX_DEPTH` deep. The answer
(:func:`calculate`) is the value as the shortest exact decimal (``84``, ``2.5``, ``-0.125``) or,
when none is exact, the fraction with a rounded decimal (``10/3 ≈ 3.333333``). A malformed
expression, a division by zero or a limit passed gives a text that starts with ``error:`` and says
what is wrong: the model reads it as the tool's output, the rollout never sees an exception.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = [
    "MAX_DEPTH",
    "MAX_DIGITS",
    "MAX_EXPONENT",
    "MAX_LENGTH",
    "CalculatorError",
    "calculate",
    "evaluate",
    "format_value",
]

#: the largest |exponent| of a power
MAX_EXPONENT = 64
#: the most digits of a numerator or denominator (a bound on the work and the output)
MAX_DIGITS = 60
#: the longest expression read, in characters
MAX_LENGTH = 500
#: the deepest nesting of parentheses
MAX_DEPTH = 50

_TOKEN = re.compile(r"\s*(?:(\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+\.?\d*|\.\d+)(%?)|(\*\*|[-+*/^()×÷]))")


class CalculatorError(ValueError):
    """An expression the calculator cannot evaluate; the message is what the model is told."""


def _tokens(text: str) -> list[tuple[str, Fraction | None, int]]:
    out: list[tuple[str, Fraction | None, int]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            bad = text[pos:].lstrip()
            raise CalculatorError(f"unexpected {bad[:1]!r} at character {len(text) - len(bad) + 1}")
        number, percent, op = m.groups()
        if number is not None:
            value = Fraction(number.replace(",", ""))
            out.append(("num", value / 100 if percent else value, m.start(1)))
        else:
            out.append(({"×": "*", "÷": "/", "**": "^"}.get(op, op), None, m.start(3)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, Fraction | None, int]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()[0]
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
            _check_size(value)
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()[0]
            rhs = self.factor()
            if op == "/" and rhs == 0:
                raise CalculatorError("division by zero")
            value = value * rhs if op == "*" else value / rhs
            _check_size(value)
        return value

    def factor(self) -> Fraction:
        if self.peek() in ("-", "+"):
            op = self.take()[0]
            value = self.factor()
            return -value if op == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        exponent = self.factor()
        if exponent.denominator != 1:
            raise CalculatorError(f"the exponent must be a whole number, got {format_value(exponent)}")
        if abs(exponent) > MAX_EXPONENT:
            raise CalculatorError(f"the exponent {exponent} is larger than {MAX_EXPONENT}")
        if base == 0 and exponent < 0:
            raise CalculatorError("division by zero (0 to a negative power)")
        size = max(len(str(abs(base.numerator))), len(str(base.denominator))) * abs(int(exponent))
        if size > MAX_DIGITS + 1:
            raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
        value = base ** int(exponent)
        _check_size(value)
        return value

    def atom(self) -> Fraction:
        if self.peek() is None:
            raise CalculatorError("the expression ends too early")
        kind, value, at = self.take()
        if kind == "num":
            assert value is not None  # a "num" token carries its value
            return value
        if kind == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise CalculatorError(f"more than {MAX_DEPTH} nested parentheses")
            inner = self.expr()
            self.depth -= 1
            if self.peek() != ")":
                raise CalculatorError("a '(' is not closed")
            self.take()
            return inner
        raise CalculatorError(f"unexpected {kind!r} at character {at + 1}")


def _check_size(value: Fraction) -> None:
    if max(len(str(abs(value.numerator))), len(str(value.denominator))) > MAX_DIGITS:
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")


def evaluate(text: str) -> Fraction:
    """The exact value of the arithmetic expression ``text`` (module docstring).

    Raises:
        CalculatorError: empty, longer than :data:`MAX_LENGTH`, malformed, a division by zero, or a
            limit passed; the message says which.

    >>> evaluate("12*7+3"), evaluate("(1 + 2) / 4"), evaluate("2^3^2"), evaluate("0.1 + 0.2")
    (Fraction(87, 1), Fraction(3, 4), Fraction(512, 1), Fraction(3, 10))
    """
    if len(text) > MAX_LENGTH:
        raise CalculatorError(f"the expression is longer than {MAX_LENGTH} characters")
    if not text.strip():
        raise CalculatorError("empty expression")
    p = _Parser(text)
    value = p.expr()
    if p.peek() is not None:
        kind, _, at = p.take()
        raise CalculatorError(f"unexpected {'number' if kind == 'num' else repr(kind)} at character {at + 1}")
    return value


def format_value(value: Fraction) -> str:
    """``value`` as the shortest exact decimal, else ``p/q ≈ d`` (six decimals).

    >>> format_value(Fraction(5, 2)), format_value(Fraction(-1, 8)), format_value(Fraction(10, 3))
    ('2.5', '-0.125', '10/3 ≈ 3.333333')
    """
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d == 1:  # a terminating decimal: scale by 10^k until whole
        k, scaled = 0, value
        while scaled.denominator != 1:
            scaled *= 10
            k += 1
        sign, digits = ("-" if scaled < 0 else ""), str(abs(scaled.numerator)).rjust(k + 1, "0")
        return f"{sign}{digits[:-k]}.{digits[-k:]}"
    return f"{value.numerator}/{value.denominator} ≈ {float(value):.6f}"


def calculate(expression: str) -> str:
    """The ``calculator`` tool: the value of ``expression`` (:func:`format_value`), or ``error: ...``.

    Never raises for any string.

    >>> calculate("12*7+3"), calculate("5 / (2 - 2)"), calculate("3 +")
    ('87', 'error: division by zero', 'error: the expression ends too early')
    """
    try:
        return format_value(evaluate(expression))
    except CalculatorError as e:
        return f"error: {e}"
