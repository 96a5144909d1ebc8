"""Every function that reads model-written text raises nothing on arbitrary text (hypothesis).

Covered: the step verifier (``find_claims``, ``arithmetic_step_rewards``), the step splitter and
span helpers (``split_steps`` with every rule, ``step_texts``, ``step_token_ends`` on arbitrary
token ids), answer extraction (``extract_answer``, ``reference_answer``, ``parse_number``,
``is_equivalent``, ``math_correct``), the format rewards, reasoning-gym scoring, and PRM tag
placement (``TokenProbPRM.build`` / ``__call__``). Besides "no exception", each test checks the
output is well formed (right length, values in the documented set, spans inside the text).

Inputs: ``st.text()``, and texts assembled from math-ish pieces (digits, operators, ``\\boxed{``,
``####``, ``Step``, LaTeX, unicode digits, newlines), and very long lines. Time bounds are on CPU
time (``time.process_time``), as in ``tests/algo/test_properties.py``: a loaded machine must not fail
them. Crashing inputs found by fuzzing are pinned with ``@example``.
"""

from __future__ import annotations

import re
import threading
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpokit.data.reasoning_gym import _tagged_answer, reasoning_gym_score
from grpokit.data.reasoning_gym import extract_rg_answer as rg_extract_answer
from grpokit.process.steps import split_steps, step_texts, step_token_ends
from grpokit.process.verifier import Claim, arithmetic_step_rewards, find_claims
from grpokit.rewards.format import answer_line_format, format_reward, make_format_reward, number_at_end
from grpokit.rewards.math import extract_answer, is_equivalent, math_correct, parse_number, reference_answer

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW_FUZZ = settings(FUZZ, max_examples=60)  # the tests that tokenize or run a model
CPU_S = 1.0  # CPU seconds per call
MV_CPU_S = 2.0  # ... for calls that may reach math-verify (it parses a 1000-char answer in ~0.4 s)

_PIECES = [
    *"0123456789",
    "12",
    "3.5",
    "1,000",
    "$5",
    "20%",
    ".5",
    " ",
    " ",
    "\n",
    "\n\n",
    "\t",
    "\r",
    "+",
    "-",
    "*",
    "**",
    "/",
    "=",
    "==",
    "(",
    ")",
    "^",
    "x",
    " x ",
    "×",
    "÷",
    "−",
    "·",
    "≈",
    "\\boxed{",
    "\\boxed ",
    "\\fbox{",
    "{",
    "}",
    "$",
    "\\frac{",
    "\\dfrac",
    "\\times",
    "\\cdot",
    "\\div",
    "\\left(",
    "\\right)",
    "\\",
    "^{",
    "<<",
    ">>",
    "####",
    "#### ",
    "Step ",
    "Step 1:",
    "**Step 2:**",
    "Answer:",
    "answer is ",
    "Final answer: ",
    "<answer>",
    "</answer>",
    "ки",
    "of",
    "apples",
    "half",
    "٣",
    "७",
    "²",
    "½",
    "𝟗",
    "①",
    "é",
    "\u2028",
    "\x00",
    "\ufffd",
    "9^{9^{9}}",
    "2**9**9**9",
    "9^9^9",
    "99999999999999999999999999999999",
    "0",
    "/0",
    "%",
    "!",
    "\\binom{",
    "\\sqrt{",
    "\\sqrt[",
    "\\infty",
    "\\pi",
    "e^{",
    "1e9",
    "[",
    "]",
    ",",
]
math_text = st.lists(st.sampled_from(_PIECES), max_size=80).map("".join)
long_line = st.tuples(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=6).map("".join), st.integers(50, 600)
).map(lambda p: p[0] * p[1])
any_text = st.one_of(st.text(max_size=300), math_text, math_text, long_line)

RULES = [
    "lines",
    "paragraphs",
    r"regex:Step \d+:",
    r"regex:(?m)^",
    "regex:",
    r"regex:\n\n",
    r"regex:(?=#)",
    "tag:ки",
    "tag:\n",
    "tag: ",
    "tag:####",
    "tag:=",
]
rules = st.one_of(st.sampled_from(RULES), st.text(min_size=1, max_size=4).map(lambda t: "tag:" + t))


def _timed(fn, *args, limit=CPU_S, **kwargs):
    t0 = time.process_time()
    out = fn(*args, **kwargs)
    assert time.process_time() - t0 < limit, (fn, args)
    return out


@pytest.fixture(scope="module", autouse=True)
def _warm_math_verify():
    """math-verify/sympy import submodules on first use: pay that here, not inside a time bound."""
    math_correct(["q"] * 3, ["\\boxed{x+1}", "answer is (1, 2]", "\\sqrt{2}"], answer=["42", "x^2", "7"])


# ---- the step verifier --------------------------------------------------------------------------
@pytest.mark.slow
@FUZZ
@given(any_text)
@example("* 4 = 20")  # AttributeError: a leading "*" looked at the token before it (there is none)
@example("* (113 - 52)")
@example("** 3 = 3")
def test_find_claims_total(text):
    claims = _timed(find_claims, text)
    assert isinstance(claims, list)
    assert all(
        isinstance(c, Claim) and isinstance(c.left, str) and isinstance(c.right, str) and isinstance(c.ok, bool)
        for c in claims
    )


def test_find_claims_leading_star_regressions():
    """A "*" with nothing before it is markdown, not multiplication (it crashed the lexer)."""
    assert find_claims("* 4 = 20") == []  # "* 4": no left operand, so "4 = 20" alone: not a claim
    assert find_claims("* (113 - 52)") == []
    assert find_claims("*4 = 20") == [] and find_claims("** 4 = 20") == []  # no bullet: emphasis
    assert [c.ok for c in find_claims("**3 + 4 = 7**")] == [True]
    assert [c.ok for c in find_claims("*(113 - 52) = 60")] == [False]
    assert [(c.left, c.right, c.ok) for c in find_claims("* 3 + 4 = 7")] == [("3 + 4", "7", True)]
    assert [c.ok for c in find_claims("* 3 + 4 = 8")] == [False]


@pytest.mark.parametrize(
    "text",
    [
        "2**9**9**9 = 1",
        "9^{9^{9}} = 1",
        "9^9^9^9^9 = 5",
        "(10^1000)^(10^1000) = 1",
        "10^999 * 10^999 * 10^999 = 1",
        "<<2**9**9**9=1>>",
        "\\frac{9^{9^{9}}}{2} = 1",
    ],
)
def test_huge_powers_are_skipped_and_fast(text):
    assert [c.ok for c in _timed(find_claims, text)] == []


def _in_worker_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a thread (where math-verify has no signal timeout, as under the
    trainer's reward guard); returns (result, thread CPU seconds). A hang fails after 30 s."""
    out = {}

    def run():
        t0 = time.thread_time()
        out["value"] = fn(*args, **kwargs)
        out["cpu_s"] = time.thread_time() - t0

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), f"{fn.__name__} still running after 30 s"
    return out["value"], out["cpu_s"]


# a power tower, a huge factorial, deep braces (exponential in math-verify's LaTeX parser)
HUGE = [
    "9^{9^{9}}",
    "2**9**9**9",
    "2^{2^{30}}",
    "2^{10^{5}}",
    "2^{2^{12}}",
    "(10^{10})!",
    "10^{10}!",
    "x^{10^{10}}",
    "{" * 30 + "1" + "}" * 30,
    "(" * 40 + "1" + ")" * 40,
]


@pytest.mark.parametrize("huge", HUGE)
def test_huge_answers_are_bounded_in_worker_threads(huge):
    """The verifier's outcome check (``math_correct``) in a thread: no signal timeout there, so
    huge answers must be refused before sympy starts on them (``MAX_ANSWER_BITS``, ``MAX_NESTING``)."""
    steps = [f"We get {huge} = 1\n", f"So the answer is \\boxed{{{huge}}}"]
    (scores,), cpu = _in_worker_thread(arithmetic_step_rewards, ["q"], ["".join(steps)], [steps], answer=["42"])
    assert scores == [1.0, 0.0] and cpu < MV_CPU_S  # no claim checked; the answer is wrong
    (score,), cpu = _in_worker_thread(math_correct, ["q"], ["\\boxed{42}"], answer=[huge])
    # such a reference is unscorable; math-verify reads no LaTeX in "2**9**9**9" (a string: 0.0)
    assert score == (0.0 if huge == "2**9**9**9" else None) and cpu < MV_CPU_S
    assert _in_worker_thread(is_equivalent, huge, huge)[0]  # identical strings still match


# answers math-verify parses or compares in time exponential (or steeply polynomial) in their size
SLOW = [
    "/".join(str(i) for i in range(1, 40)),
    "x^" * 40 + "2",
    "x_" * 60 + "1",
    "\\frac{" * 12 + "1" + "}{2}" * 12,
    "\\{" * 12 + "\\}" * 12,
]


@pytest.mark.parametrize("slow", SLOW, ids=range(len(SLOW)))
def test_slow_to_parse_answers_are_refused_in_worker_threads(slow):
    """Screens before math-verify (``MAX_NESTING``, ``MAX_SCRIPT_CHAIN``, ``MAX_EXPR_DEPTH``)."""
    (score,), cpu = _in_worker_thread(math_correct, ["q"], [f"\\boxed{{{slow}}}"], answer=["42"])
    assert score == 0.0 and cpu < MV_CPU_S
    (score,), cpu = _in_worker_thread(math_correct, ["q"], ["\\boxed{42}"], answer=[slow])
    assert score is None and cpu < MV_CPU_S


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("2^{2^8}", "2^{256}"),
        ("(2^{100})^{40}", "2^{4000}"),
        ("3^{2^8}", "3^{256}"),
        ("1000!", "1000!"),
        ("2^{8000}", "2^{7999} \\cdot 2"),
    ],
)
def test_big_but_bounded_answers_still_compare(pred, gold):
    """Under ``MAX_ANSWER_BITS`` (8192) and, for towers, ``MAX_TOWER_BITS`` (512): compared."""
    assert _in_worker_thread(is_equivalent, pred, gold)[0]


@pytest.mark.slow
@FUZZ
@given(any_text, rules, st.sampled_from([None, "42", "\\frac{1}{2}", "12 apples", ""]))
def test_arithmetic_step_rewards_total(text, rule, answer):
    steps = step_texts(text, split_steps(text, rule))
    (scores,) = _timed(arithmetic_step_rewards, ["q"], [text], [steps], answer=[answer], limit=MV_CPU_S)
    assert len(scores) == len(steps)
    assert all(s in (0.0, 1.0) or s is None for s in scores)
    if answer is None:  # only the outcome check can give None
        assert None not in scores


# ---- the step splitter --------------------------------------------------------------------------
def _check_spans(text, spans):
    if not text:
        assert spans == []
        return
    if not text.strip():
        assert spans == [(0, len(text))]  # whitespace only: one step
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(s < e for s, e in spans)  # non-empty steps ...
    assert all(spans[k][1] == spans[k + 1][0] for k in range(len(spans) - 1))  # ... contiguous
    assert "".join(step_texts(text, spans)) == text


@FUZZ
@given(any_text, rules)
def test_split_steps_total_and_contiguous(text, rule):
    _check_spans(text, _timed(split_steps, text, rule))


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@SLOW_FUZZ
@given(
    st.one_of(st.text(max_size=120), math_text.map(lambda t: t[:200])),
    st.sampled_from(RULES),
    st.lists(st.integers(0, 49151), max_size=40),
    st.integers(0, 3),
)
def test_step_token_ends_total(tok, text, rule, random_ids, extra):
    """Real tokens, or arbitrary ids a model may sample (specials, pieces of UTF-8 characters)."""
    for ids in (tok.encode(text, add_special_tokens=False) + [2] * extra, random_ids):
        n = len(ids)
        ends, spans, decoded = _timed(step_token_ends, ids + [2], n, None, tok, rule=rule)
        if n == 0:
            assert (ends, spans) == ([], [])
            continue
        assert ends == sorted(set(ends)) and ends[-1] == n - 1 and 0 <= ends[0]
        assert len(spans) == len(ends) and spans[0][0] == 0 and spans[-1][1] == len(decoded)
        assert all(spans[k][1] == spans[k + 1][0] for k in range(len(spans) - 1))


# ---- answer extraction and math_correct ---------------------------------------------------------
@FUZZ
@given(any_text)
@example("1" * 5000)  # ValueError: Python's 4300-digit limit on int(str)
@example("\\frac{" + "1" * 5000 + "}{3}")
@example("0." + "1" * 5000)
def test_answer_parsers_total(text):
    ans = _timed(extract_answer, text)
    assert ans is None or isinstance(ans, str)
    ref = _timed(reference_answer, text)
    assert ref is None or (isinstance(ref, str) and ref)
    value = _timed(parse_number, text)
    assert value is None or isinstance(value, Fraction)


@pytest.mark.slow
@FUZZ
@given(any_text, st.one_of(st.sampled_from(["42", "\\frac{1}{2}", "x^2", "1,000", "\\text{(C)}"]), any_text))
@example("\\boxed{0.5}", "1" * 400)  # OverflowError: the tolerance was a float times a Fraction
@example("{" * 30 + "}" * 30, "42")  # took minutes: math-verify's parser on deep braces
def test_math_correct_and_is_equivalent_total(text, gold):
    assert _timed(math_correct, ["q"], [text], answer=[gold], limit=MV_CPU_S)[0] in (0.0, 1.0, None)
    assert isinstance(_timed(is_equivalent, text, gold, limit=MV_CPU_S), bool)


def test_huge_reference_with_a_decimal_prediction():
    """The relative tolerance is applied exactly: ``1e-6 * gold`` as a float overflowed past 1e308."""
    assert math_correct(["q"] * 2, ["\\boxed{0.5}", "1" * 400], answer=["1" * 400] * 2) == [0.0, 1.0]
    assert not is_equivalent("0.5", "1" * 310) and is_equivalent("1" * 310 + ".0000000001", "1" * 310)


def test_extract_answer_is_linear_in_boxes():
    """One pass matches every brace (it was a scan to the end of the text per ``\\boxed{``)."""
    assert _timed(extract_answer, "\\boxed{" * 5000 + "1") == "1"
    assert _timed(extract_answer, "\\boxed{1}" + "\\boxed{" * 5000) == "1"
    assert _timed(extract_answer, "\\boxed 1 " * 50000) == "1"


def test_long_numbers_are_not_plain_numbers():
    """Past MAX_NUMBER_DIGITS digits a text is no plain number (it crashed on Python's digit
    limit); such answers still compare equal to themselves as strings, and score, never raise."""
    big = "1" * 5000
    assert parse_number(big) is None and parse_number("\\frac{" + big + "}{3}") is None
    assert parse_number("1" * 300) == int("1" * 300)  # long but sane numbers still read exactly
    assert math_correct(["q"] * 2, [big, "7"], answer=["7", big]) == [0.0, None]
    assert is_equivalent(big, big) and not is_equivalent(big, "1")


# ---- format rewards -----------------------------------------------------------------------------
_FORMATS = [
    format_reward,
    answer_line_format,
    number_at_end,
    make_format_reward(r"<answer>.+</answer>", scope="whole"),
    make_format_reward(r"\d", scope="last_line"),
]


@FUZZ
@given(st.lists(any_text, min_size=1, max_size=3))
def test_format_rewards_total(texts):
    for fn in _FORMATS:
        out = _timed(fn, ["q"] * len(texts), texts)
        assert len(out) == len(texts) and all(v in (0.0, 1.0) for v in out)


_NUMBER_AT_END_FORWARD = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?[\s.$})*]*\Z")  # the old rule
short_text = st.one_of(st.text(max_size=300), math_text, st.text(alphabet="0123456789,.-$})* \n\tx_é١", max_size=60))


@FUZZ
@given(short_text)
def test_number_at_end_equals_the_forward_search(text):
    """The linear reversed match decides as the (quadratic) forward search of the same pattern."""
    want = 1.0 if _NUMBER_AT_END_FORWARD.search(text) else 0.0
    assert number_at_end(["q"], [text]) == [want]


def test_format_rewards_linear_on_long_runs():
    for text in ["1," * 50000 + "x", " " * 100000 + "x", "1" + " " * 100000, "-1" * 50000]:
        for fn in _FORMATS:
            _timed(fn, ["q"], [text])


# ---- reasoning-gym scoring ----------------------------------------------------------------------
@FUZZ
@given(
    st.one_of(
        short_text, st.lists(st.sampled_from(["<answer>", "</answer>", " ", "\n", "1", "x"]), max_size=30).map("".join)
    )
)
def test_tagged_answer_equals_reasoning_gym_extract(text):
    from reasoning_gym.utils import extract_answer as rg_extract

    assert _tagged_answer(text) == rg_extract(text)


def test_tagged_answer_linear_on_unclosed_tags():
    """reasoning_gym's regex scans to the end from every unclosed tag (25 s on 160k characters)."""
    assert _timed(rg_extract_answer, "<answer>" * 20000) is None
    assert _timed(rg_extract_answer, "</answer>" + "<answer>" * 20000 + "7") == "7"


@pytest.fixture(scope="module")
def rg_rows():
    from grpokit.data import load_rows

    return load_rows("reasoning_gym:basic_arithmetic", limit=2, seed=0, options={"size": 10})


@FUZZ
@given(st.one_of(any_text, any_text.map(lambda t: f"<answer>{t}</answer>")))
def test_reasoning_gym_score_total(rg_rows, text):
    ans = _timed(rg_extract_answer, text)
    assert ans is None or isinstance(ans, str)
    entries = [r["rg_entry"] for r in rg_rows] + [None]
    tasks = [r["rg_task"] for r in rg_rows] + [None]
    out = _timed(reasoning_gym_score, ["q"] * 3, [text] * 3, rg_entry=entries, rg_task=tasks, limit=MV_CPU_S)
    assert len(out) == 3 and out[2] is None
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in out[:2])


# ---- PRM tag placement --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prm(tok):
    from conftest import _make_tiny_model
    from grpokit.process.prm import TokenProbPRM

    return TokenProbPRM(_make_tiny_model(), tok, "ки", "+", "-", max_length=96)


@SLOW_FUZZ
@given(st.one_of(st.text(max_size=150), math_text.map(lambda t: t[:200])), st.sampled_from(RULES), st.text(max_size=20))
def test_prm_tag_placement_total(prm, tok, text, rule, prompt):
    steps = step_texts(text, split_steps(text, rule))
    ids, pos = _timed(prm.build, prompt, steps)
    assert len(pos) == len(steps) and pos == sorted(set(pos))
    assert all(0 <= p < len(ids) and ids[p] == prm._scorer.layout.tag_ids[-1] for p in pos)
    (scores,) = _timed(prm, [prompt], [text], [steps])
    assert len(scores) == len(steps)
    for p, s in zip(pos, scores):  # beyond max_length: None; else a probability
        assert (s is None) if p >= 96 else (isinstance(s, float) and 0.0 <= s <= 1.0)
