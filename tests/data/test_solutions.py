"""Step-by-step arithmetic solutions (grpokit.data.solutions) and the ``solution`` column of
reasoning_gym's basic_arithmetic rows."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from grpokit.data import load_rows
from grpokit.data.solutions import arithmetic_solution, arithmetic_steps
from grpokit.envs.calculator import evaluate, format_value
from grpokit.process.verifier import arithmetic_step_rewards


@pytest.mark.parametrize(
    "expression, lines",
    [
        ("12 + 5 - 3 * 2", ["12 + 5 = 17", "3 * 2 = 6", "17 - 6 = 11"]),
        ("2 * 3 + 4 * 5", ["2 * 3 = 6", "4 * 5 = 20", "6 + 20 = 26"]),
        ("(2 + 3) * (4 - 6)", ["2 + 3 = 5", "4 - 6 = -2", "5 * (-2) = -10"]),
        ("10 - 4 - 3", ["10 - 4 = 6", "6 - 3 = 3"]),  # left to right
        ("10 - (4 - 3)", ["4 - 3 = 1", "10 - 1 = 9"]),
        ("-3 * -8", ["(-3) * (-8) = 24"]),
        ("7 / 2 + 1", ["7 / 2 = 3.5", "3.5 + 1 = 4.5"]),
        ("7", []),
        ("-(41 - 68) + 1", ["41 - 68 = -27", "27 + 1 = 28"]),
        ("-(41 - 68)", ["41 - 68 = -27", "-(-27) = 27"]),
    ],
)
def test_steps_by_hand(expression, lines):
    assert arithmetic_steps(expression)[0] == lines


def test_value_is_the_calculators_and_every_line_checks_out():
    rng = random.Random(0)
    for _ in range(200):
        terms = [str(rng.randint(-30, 30)) for _ in range(rng.randint(1, 5))]
        text = terms[0]
        for t in terms[1:]:
            text += f" {rng.choice('+-*')} {t}"
        if rng.random() < 0.5 and len(terms) > 2:
            text = f"({text}) * {rng.randint(1, 9)}"
        lines, value = arithmetic_steps(text)
        assert value == evaluate(text), text
        assert len(lines) == text.count(" + ") + text.count(" - ") + text.count(" * "), text  # no negation
        if lines:  # the rule verifier finds every claim right (each line a step)
            steps = [line + "\n" for line in lines]
            got = arithmetic_step_rewards([text], ["".join(steps)], [steps], answer=[format_value(value)])
            assert got == [[1.0] * len(lines)], (text, lines)
    assert arithmetic_solution("7") == "7" and arithmetic_solution("1 + 1") == "1 + 1 = 2"
    assert arithmetic_steps("1 / 3")[1] == Fraction(1, 3)


@pytest.mark.parametrize(
    "expression, match",
    [
        ("2 ** 3", "'2 \\*\\* 3' is not allowed"),
        ("abs(-3)", "is not allowed"),
        ("x + 1", "'x' is not allowed"),
        ("1 / (2 - 2)", "divides by zero"),
        ("3 +", "is not an expression"),
    ],
)
def test_refusals_name_the_part(expression, match):
    with pytest.raises(ValueError, match=match):
        arithmetic_steps(expression)


def test_basic_arithmetic_rows_carry_their_solution():
    opts = {"size": 20, "min_terms": 3, "max_terms": 4, "max_digits": 2, "operators": ["+", "-", "*"]}
    rows = load_rows("reasoning_gym:basic_arithmetic", "train", limit=20, seed=3, options=opts)
    for row in rows:
        lines = row["solution"].split("\n")
        n = row["rg_entry"]["metadata"]["num_terms"]
        assert len(lines) in (n - 1, n)  # one per operation; a negated whole expression one more
        assert lines[-1].endswith(f"= {row['answer']}")
    with_division = load_rows(
        "reasoning_gym:basic_arithmetic", "train", limit=20, seed=3, options={**opts, "operators": ["+", "/"]}
    )
    assert {r["solution"] is None for r in with_division} == {True, False}
    assert all((r["solution"] is None) == ("/" in r["rg_entry"]["metadata"]["expression"]) for r in with_division)
