"""math_correct / extract_answer / parse_number: a table of cases, thread safety, doctests."""

import doctest
import threading

import pytest

import grpokit.rewards.math as rm
from grpokit.rewards.math import extract_answer, is_equivalent, math_correct, parse_number

# (completion, reference, expected reward)
CASES = [
    (r"So the total is $\boxed{18}$.", "18", 1.0),
    (r"\boxed{19}", "18", 0.0),
    (r"nested: \boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", 1.0),  # math-verify path
    (r"\boxed{\dfrac{3}{4}}", "0.75", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\frac12}", "1/2", 1.0),
    ("The answer is 3/4.", r"\frac{3}{4}", 1.0),
    ("We get 1,000 apples in total: 1,000", "1000", 1.0),
    ("#### 1,080", "1080", 1.0),  # GSM8K style
    (r"It costs \boxed{\$18}", "18", 1.0),
    ("She makes $18 every day.", "18", 1.0),
    ("The answer is 18 dollars.", "18", 1.0),
    (r"\boxed{18 \text{ dollars}}", "18", 1.0),
    ("Answer: 50%", "50", 1.0),
    ("Answer: 18.0", "18", 1.0),
    ("Answer: 1000001", "1000000", 0.0),  # integers compare exactly
    ("The result is 0.333333", r"\frac{1}{3}", 1.0),  # rel. tolerance 1e-6 for non-integers
    ("The result is 0.33", r"\frac{1}{3}", 0.0),
    ("First 3, then 7, then finally 42", "42", 1.0),  # several numbers -> the last one
    ("First 42, then 7", "42", 0.0),
    ("I have no idea.", "42", 0.0),  # no answer -> 0
    ("", "42", 0.0),
    ("The answer is -5.", "-5", 1.0),
    (r"\boxed{(3, \pi/2)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),  # tuple via math-verify
    (r"\boxed{x^2 + 2x}", "2x+x^2", 1.0),
    (r"\boxed{\text{(C)}}", "C", 1.0),
    ("So they arrive at 3:30 p.m.", "3:30 p.m.", 0.0),  # last number "30"
    (r"\boxed{3:30 p.m.}", "3:30 p.m.", 1.0),  # string equality
    ("Natalia sold 48/2 = 24 clips... 48+24 = 72.\n#### 72", "Natalia...\n#### 72", 1.0),
    (r"the first box \boxed{5} is wrong, final \boxed{7}", "7", 1.0),  # last box wins
]


@pytest.mark.parametrize("completion,reference,expected", CASES)
def test_math_correct_table(completion, reference, expected):
    assert math_correct(["q"], [completion], answer=[reference]) == [expected]


def test_math_correct_batch_and_numeric_references():
    out = math_correct(["q"] * 3, ["#### 145", "#### 2.5", "#### 3"], answer=[145.0, 2.5, 4])
    assert out == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("reference", ["", "   ", None, r"\boxed{}"])
def test_unparseable_reference_gives_none(reference):
    assert math_correct(["q"], [r"\boxed{1}"], answer=[reference]) == [None]


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        math_correct(["q", "q"], ["1", "2"], answer=["1"])


@pytest.mark.parametrize(
    "text,expected",
    [
        (r"\boxed{\frac{a}{\sqrt{b}}} and more", r"\frac{a}{\sqrt{b}}"),
        (r"\boxed 5 is it", "5"),
        (r"\fbox{7}", "7"),
        (r"\boxed{3} then \boxed{4", "3"),  # unbalanced last box ignored
        ("blah\n#### 72\n", "72"),
        ("#### Step 1\n3 + 4 = 7\n#### Step 2\nso 7 * 2 = 14", "14"),  # headings skipped
        ("**Final Answer:**\n42", "42"),  # empty phrase -> last number
        ("**Final Answer:** 12", "12"),
        ("The answer is $\\frac{2}{3}$. Next", "\\frac{2}{3}"),
        ("the answer is: 4 apples. Then", "4 apples"),
        ("x = 3.5 and y = -2", "-2"),
        ("ratio 3 / 4", "3/4"),
        ("total 12,345,678 units", "12,345,678"),
        ("nothing", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("1,000", 1000),
        ("1{,}000", 1000),
        ("$18.50", rm.Fraction(37, 2)),
        (r"\$5", 5),
        ("50\\%", 50),
        ("-3/4", rm.Fraction(-3, 4)),
        (r"\tfrac{1}{3}", rm.Fraction(1, 3)),
        ("-\\frac{3}{4}", rm.Fraction(-3, 4)),
        ("x = 5", 5),
        ("5 dollars", 5),
        ("90^\\circ", 90),
        ("7.", 7),
        (".5", rm.Fraction(1, 2)),
        ("1/0", None),
        ("\\sqrt{2}", None),
        ("2, 3", None),
        ("1,00", None),  # not a thousands grouping
        ("5x", None),
        ("", None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


def test_is_equivalent_symbolic():
    assert is_equivalent(r"10\sqrt{2}", r"\sqrt{200}")
    assert not is_equivalent(r"\sqrt{3}", r"\sqrt{2}")


def _run_in_thread(fn):
    box = {}

    def target():
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 - report any failure to the main thread
            box["err"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(60)
    if "err" in box:
        raise box["err"]
    return box["out"]


def test_math_correct_works_outside_main_thread():
    # math-verify's signal-based timeout would raise in a thread; we pass None there.
    out = _run_in_thread(
        lambda: math_correct(
            ["q"] * 3,
            [r"\boxed{x^3 + 1}", r"\boxed{\frac{\sqrt{8}}{2}}", r"\boxed{2}"],
            answer=["1 + x^3", r"\sqrt{2}", "3"],
        )
    )
    assert out == [1.0, 1.0, 0.0]


def test_timeouts_passed_only_in_main_thread(monkeypatch):
    import math_verify

    seen = []

    def fake_parse(text, parsing_timeout=5, **_):
        seen.append(parsing_timeout)
        return [text]

    monkeypatch.setattr(math_verify, "parse", fake_parse)
    rm._mv_parse.cache_clear()
    try:
        rm._mv_parse("y+1", True)
        _run_in_thread(lambda: rm._mv_parse("y+2", False))
    finally:
        rm._mv_parse.cache_clear()
    assert seen == [rm.MATH_VERIFY_TIMEOUT_S, None]


def test_overlong_answers_skip_math_verify(monkeypatch):
    import math_verify

    def boom(*a, **k):
        raise AssertionError("math-verify must not be called")

    monkeypatch.setattr(math_verify, "parse", boom)
    monkeypatch.setattr(math_verify, "verify", boom)
    long = "x+" * rm.MAX_VERIFY_CHARS + "1"
    assert not is_equivalent(long, "(" + long + ")")


def test_doctests():
    assert doctest.testmod(rm).failed == 0
