"""The calculator tool: exact rational results, and an ``error:`` text (never an exception) for any
other string."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpokit.envs.calculator import MAX_DEPTH, MAX_EXPONENT, CalculatorError, calculate, evaluate, format_value


@pytest.mark.parametrize(
    "text, value",
    [
        ("12*7+3", Fraction(87)),
        ("12 * (7 + 3)", Fraction(120)),
        ("7 - 10 - 2", Fraction(-5)),  # left-associative
        ("48 / 4 / 2", Fraction(6)),
        ("2^3^2", Fraction(512)),  # right-associative
        ("2**-2", Fraction(1, 4)),
        ("-3^2", Fraction(-9)),  # the power binds tighter than the sign
        ("(-3)^2", Fraction(9)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("1,250.5 + .5", Fraction(1251)),
        ("15% * 80", Fraction(12)),
        ("7 ÷ 2 × 4", Fraction(14)),
        ("10 / 3", Fraction(10, 3)),
        ("--4", Fraction(4)),
        ("  6  ", Fraction(6)),
    ],
)
def test_exact_values(text, value):
    assert evaluate(text) == value


@pytest.mark.parametrize(
    "value, text",
    [
        (Fraction(87), "87"),
        (Fraction(-5), "-5"),
        (Fraction(5, 2), "2.5"),
        (Fraction(-1, 8), "-0.125"),
        (Fraction(1, 400), "0.0025"),
        (Fraction(10, 3), "10/3 ≈ 3.333333"),
        (Fraction(-2, 3), "-2/3 ≈ -0.666667"),
    ],
)
def test_the_answer_is_the_shortest_exact_decimal_else_the_fraction(value, text):
    assert format_value(value) == text


@pytest.mark.parametrize(
    "text, message",
    [
        ("5 / (2 - 2)", "division by zero"),
        ("0^-1", "division by zero"),
        ("3 +", "ends too early"),
        ("", "empty expression"),
        ("(1 + 2", "'(' is not closed"),
        ("1 + 2)", "unexpected ')' at character 6"),
        ("3 4", "unexpected number at character 3"),
        ("2 x 3", "unexpected 'x' at character 3"),
        ("__import__('os')", "unexpected '_' at character 1"),
        ("2^0.5", "exponent must be a whole number"),
        (f"2^{MAX_EXPONENT + 1}", f"larger than {MAX_EXPONENT}"),
        ("99^60", "more than 60 digits"),
        ("10^30 * 10^31", "more than 60 digits"),
        ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "nested parentheses"),
        ("1+" * 300 + "1", "longer than 500 characters"),
    ],
)
def test_errors_are_texts_for_the_model(text, message):
    with pytest.raises(CalculatorError, match=message.replace("(", r"\(").replace(")", r"\)")):
        evaluate(text)
    out = calculate(text)
    assert out.startswith("error: ") and message in out


@pytest.mark.slow
@given(st.text(max_size=60))
def test_any_text_gives_a_text(text):
    out = calculate(text)
    assert isinstance(out, str) and out


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.integers(1, 10**4))
def test_agrees_with_fraction_arithmetic(a, b, c):
    assert evaluate(f"({a}) + ({b}) * {c}") == Fraction(a) + Fraction(b) * c
    assert evaluate(f"({a} - {b}) / {c}") == Fraction(a - b, c)
