"""Arithmetic step verifier (grpokit.process.verifier): claim finding, exact checks, step scores."""

from __future__ import annotations

import sys
import time

import pytest

from grpokit.process.verifier import arithmetic_step_rewards, find_claims

# (step text, verdict of each claim found, in order); [] = no claim found
CLAIMS = [
    ("48/2 = 24", [True]),
    ("48/2 = 25", [False]),
    ("0.2 x 50 = 10", [True]),
    ("0.2 x 50 = 11", [False]),
    ("3 × 4 = 12", [True]),
    ("3 * 4 = 12", [True]),
    ("12 ÷ 4 − 1 = 2", [True]),  # unicode ÷ and − (U+2212)
    ("(3 + 4) × 2 = 14", [True]),
    ("3 + 4 × 2 = 14", [False]),  # precedence: 3 + 8 = 11
    ("2(3+4) = 14", [True]),  # implicit multiplication before "("
    ("2^10 = 1024", [True]),
    ("-3^2 = -9", [True]),  # unary minus binds looser than ^
    ("10^-2 = 0.01", [True]),
    ("5 - 8 = -3", [True]),
    ("10 - 3 - 2 = 5", [True]),  # left associative
    # chains: running value; a compound segment may continue from it
    ("3 + 4 = 7 * 2 = 14", [True, True]),
    ("3 + 4 = 7 * 2 = 15", [True, False]),
    ("3 + 4 = 8 * 2 = 16", [False, True]),
    ("7 - 3 = 4 - 1 = 3", [True, True]),
    ("2 + 3 = 5 = 5", [True, True]),
    ("3 - 10 = -7 + 2 = -5", [True, True]),
    ("3 + 4 = 7, and 7 × 2 = 14", [True, True]),
    ("3 + 4 = 7 and 2 + 2 = 5", [True, False]),  # "and" is no unit of 7
    # GSM8K calculator annotations (checked, then also the surrounding text)
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.", [True, True]),
    ("She has 16 - 3 - 4 = <<16-3-4=9>>9 eggs left.", [True, True]),
    ("<<16-3-4=8>>", [False]),
    # numbers: commas, $, %, decimals, units
    ("1,200 + 300 = 1,500", [True]),
    ("1,200 + 300 = 1,400", [False]),
    ("$5 + $3 = $8", [True]),
    ("20% of 50 = 10", [True]),
    ("15% of $40 = $6", [True]),
    ("50% = 0.5", [True]),
    ("5 apples + 3 apples = 8 apples", [True]),
    ("5kg + 3kg = 9kg", [False]),
    ("The total is 5 * 4 = 20 dollars.", [True]),
    ("3.5 * 2 = 7.0", [True]),
    ("1.5 + 1.5 = 3.", [True]),  # sentence-final period
    ("10/3 = 3.33", [True]),  # a d-decimal claim may be rounded ...
    ("2/3 = 0.67", [True]),
    ("2/3 = 0.66", [True]),  # ... or truncated
    ("10/3 = 3.4", [False]),
    ("-2/3 = -0.66", [True]),
    ("3.33 = 10/3", [True]),
    ("7/2 = 3", [False]),  # integers are exact
    # markdown / LaTeX
    ("**Step 1:** 3 + 4 = 7", [True]),
    ("\\frac{48}{2} = 24", [True]),
    ("$3 \\times 4 = 13$", [False]),
    ("Step 2: 3 × 4 = 12\n", [True]),
    ("1. 3 + 4 = 7", [True]),
    ("- 3 + 4 = 7", [True]),  # a list bullet, not minus three
    ("Sum:\n  * 3 + 4 = 8", [False]),
    ("-3 + 4 = 1", [True]),  # no space: a negative number
    ("24\n- 4 = 20", [True]),  # after an operand a line-start "-" is still a minus
    ("* 4 = 20", []),  # a bare number after a bullet may end an expression from the line before
    ("- 2 = -2", []),
    ("<<- 3 + 4=1>>", [True]),  # no bullets inside a calculator annotation
    # not claims: algebra, functions, verbal expressions, approximations
    ("2x + 3 = 7", []),
    ("x - 3 + 4 = 5", []),
    ("y = 2x = 10", []),
    ("f(3) = 9", []),
    ("= 7 + x", []),
    ("half of 50 = 25", []),
    ("It takes 2 hours = 120 minutes", []),
    ("3 times 4 = 12", []),
    ("10 ≈ 9.9", []),
    ("a = 3, b = 4, so a + b = 7", []),
    ("x = 5 + 3 = 8", [True]),
    ("3 + 4 == 7", []),
    ("no numbers here", []),
    ("", []),
    # division by zero is wrong; huge numbers are skipped, never wrong (and fast)
    ("5/0 = 0", [False]),
    ("3 + 4 = 7 = 7/0", [True, False]),
    ("2^100000 = 5", []),
    ("9^9^9 = 1", []),
    ("2^0.5 = 1.41", []),
    ("12345678901234567890123456789012345 + 1 = 2", []),
    ("99999999^999 = 1", []),
]


@pytest.mark.parametrize("text, verdicts", CLAIMS)
def test_find_claims_table(text, verdicts):
    assert [c.ok for c in find_claims(text)] == verdicts


def test_find_claims_sides():
    (c,) = find_claims("So 0.2 x 50 = 10 apples.")
    assert (c.left, c.right, c.ok) == ("0.2 x 50", "10 apples", True)


def test_adversarial_inputs_are_fast():
    texts = [
        "9^" * 200 + "9 = 1",
        "(" * 500 + "1" + ")" * 500 + " = 1",
        "1 + " * 2000 + "1 = 2001",
        "= " * 3000,
        "2**2**2**2**2**2 = 3",
        "1/" * 300 + "1 = 1",
        "2 = " + "1 + " * 3000 + "1",
        "1 = " + "(" * 3000 + "1" + ")" * 3000,
        "1 = " + "-" * 5000 + "1 = 1",
        "<<" + "1+" * 3000 + "1=1>>",
    ]
    start = time.process_time()  # CPU time: a loaded machine must not make this fail
    for t in texts:
        find_claims(t)
    assert time.process_time() - start < 5.0


# ---- step scores -------------------------------------------------------------------------------
def _score(steps, answer=None, completion=None):
    completion = "".join(steps) if completion is None else completion
    return arithmetic_step_rewards(["q"], [completion], [steps], answer=[answer])[0]


def test_all_correct_and_no_claims():
    steps = ["We add: 2 + 2 = 4\n", "Now think.\n", "4 * 3 = 12\n", "Answer: 12"]
    assert _score(steps) == [1.0, 1.0, 1.0, 1.0]


def test_wrong_step_poisons_later_steps():
    steps = ["2 + 2 = 4\n", "4 * 3 = 13\n", "Some words.\n", "13 + 1 = 14\n", "Answer: 14"]
    assert _score(steps) == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_outcome_on_last_step():
    steps = ["2 + 2 = 4\n", "4 * 3 = 12\n", "The answer is 12."]
    assert _score(steps, answer="12") == [1.0, 1.0, 1.0]
    assert _score(steps, answer="13") == [1.0, 1.0, 0.0]  # right arithmetic, wrong final answer
    assert _score(steps, answer="#### 12") == [1.0, 1.0, 1.0]  # GSM8K-style reference
    assert _score(steps, answer=None) == [1.0, 1.0, 1.0]  # outcome not checked
    assert _score(["2 + 2 = 5\n", "So 5."], answer="5") == [0.0, 0.0]  # poisoned stays 0


def test_outcome_single_step_and_empty():
    assert _score(["The answer is 7"], answer="7") == [1.0]
    assert _score(["The answer is 7"], answer="8") == [0.0]
    assert arithmetic_step_rewards(["q"], [""], [[]], answer=["7"]) == [[]]


def test_unscorable_reference_gives_none_last_step():
    steps = ["2 + 2 = 4\n", "The answer is 4."]
    assert _score(steps, answer="") == [1.0, None]  # math_correct: empty reference -> None
    assert _score(["2 + 2 = 5\n", "So 5."], answer="") == [0.0, 0.0]


def test_fallback_without_math_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpokit.rewards.math", None)  # import -> ImportError
    steps = ["2 + 2 = 4\n", "4 * 3 = 12\n", "The answer is 12."]
    assert _score(steps, answer="12") == [1.0, 1.0, 1.0]
    assert _score(steps, answer="The total is 1,2 or #### 13") == [1.0, 1.0, 0.0]
    assert _score(steps, answer="no number") == [1.0, 1.0, None]


def test_batch_rows_independent_and_length_check():
    steps = [["1 + 1 = 2\n", "Answer: 2"], ["1 + 1 = 3\n", "Answer: 3"], []]
    comps = ["".join(s) for s in steps]
    out = arithmetic_step_rewards(["q"] * 3, comps, steps, answer=["2", "3", "1"])
    assert out == [[1.0, 1.0], [0.0, 0.0], []]
    with pytest.raises(ValueError, match="2 completions, 3 step lists"):
        arithmetic_step_rewards(["q"] * 2, comps[:2], steps, answer=["2", "3", "1"])
