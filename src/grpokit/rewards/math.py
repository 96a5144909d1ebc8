"""Math answer checking: extract a final answer from a completion and compare it to a reference.

Steps of :func:`math_correct`, per completion:

1. Reference: the ``answer`` column, taken as-is unless it holds ``\\boxed{..}`` or ``#### x``, in
   which case that part is taken (so a raw GSM8K/MATH solution also works as a reference).
2. Prediction: :func:`extract_answer` (last ``\\boxed{}``, then ``#### x``, then
   "answer is x"/"Answer: x", then the last number). No answer found -> reward 0.0.
3. Cheap exact path: if both sides read as plain numbers (commas ``1,000``, ``$``, ``%``,
   trailing words such as ``5 dollars``, ``\\frac{1}{2}``/``\\dfrac``, ``a/b``, trailing ``.``),
   compare them as exact fractions; integers must be equal exactly, otherwise a relative
   tolerance of 1e-6 applies (``1/3`` == ``0.333333``; math-verify rounds at 6 digits too).
4. Otherwise ``math_verify.parse`` both (each wrapped in ``\\boxed{}``) and ``math_verify.verify``.

Time bound: math-verify's timeouts use ``signal.alarm``, which only works in the main thread. In
the main thread we pass ``parsing_timeout=``/``timeout_seconds=`` :data:`MATH_VERIFY_TIMEOUT_S`;
in any other thread we pass ``None`` (no signal, no crash) and instead refuse answers longer than
:data:`MAX_VERIFY_CHARS` characters (they score 0.0), which keeps sympy work small.
Nothing is ever ``eval``-ed.
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction
from functools import lru_cache
from typing import Any


class _NoTimeoutNotice(logging.Filter):
    """math-verify warns once that its signal timeout is off in worker threads; grpokit bounds the
    call itself (``rewards.timeout_s``, ``grpokit.rewards.guard``), so the notice is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_name).addFilter(_NoTimeoutNotice())

__all__ = ["extract_answer", "reference_answer", "parse_number", "is_equivalent", "math_correct"]

MATH_VERIFY_TIMEOUT_S = 3
"""Seconds given to each math-verify parse / comparison (main thread only)."""
MAX_VERIFY_CHARS = 1000
"""Longer answers are not sent to math-verify (they score as wrong)."""
REL_TOL = 1e-6
"""Relative tolerance of the cheap numeric comparison when either side is not an integer."""

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)")
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_HASH_ANSWER_START = re.compile(r"[-+$\\(\[\d.]")
_PHRASE_RE = re.compile(r"\banswer\**(?:\s+is\b\s*:?|\s*:)[ \t]*([^\n]*)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def _boxed_contents(text: str) -> list[str]:
    """Contents of every well-formed ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x``, in order."""
    out = []
    for m in _BOXED_RE.finditer(text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth, start = 0, i
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        out.append(text[start + 1 : j])
                        break
        elif i > m.end():  # "\boxed 5": one space-separated token
            tok = re.match(r"[^\s$]+", text[i:])
            if tok:
                out.append(tok.group(0))
    return out


def _clean(ans: str) -> str:
    """Strip spaces, markdown bold, surrounding ``$`` and a trailing period."""
    ans = ans.strip().strip("*").strip()
    if len(ans) >= 2 and ans.startswith("$") and ans.endswith("$") and ans.count("$") == 2:
        ans = ans[1:-1].strip()
    return ans.rstrip(".").strip()


def extract_answer(text: str) -> str | None:
    """Extract the final answer from a completion.

    Priority: the last well-formed ``\\boxed{...}`` (nested braces allowed; also ``\\fbox``),
    then the last ``#### x`` (rest of line; only when ``x`` starts like a number or math --
    digit, sign, ``$``, ``\\``, ``(``, ``[`` -- so markdown headings ``#### Step 2`` are
    skipped), then the last "answer is x" / "Answer: x" (rest of line, cut at a sentence end
    ". "), then the last number in the text (``1,000``, ``-3.5``, ``3/4``).

    Args:
        text: the model's completion.

    Returns:
        The answer string (stripped of ``$``, ``**`` and a trailing period), or None if nothing
        looks like an answer.

    >>> extract_answer(r"so $x = \\boxed{\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    >>> extract_answer("She pays 3 + 4 = 7 dollars.\\n#### 7")
    '7'
    >>> extract_answer("The answer is 12 apples. Done")
    '12 apples'
    >>> extract_answer("2 + 2 = 4, then 4 * 10 = 40.")
    '40'
    >>> extract_answer("no digits here") is None
    True
    """
    for candidate in reversed(_boxed_contents(text)):
        if candidate.strip():
            return _clean(candidate)
    for regex in (_HASH_RE, _PHRASE_RE):
        for m in reversed(list(regex.finditer(text))):
            ans = m.group(1)
            if regex is _PHRASE_RE:
                ans = re.split(r"\.\s", ans, maxsplit=1)[0]
            elif not _HASH_ANSWER_START.match(ans.strip()):
                continue  # a markdown heading ("#### Step 2"), not a GSM8K answer
            ans = _clean(ans)
            if ans:
                return ans
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1].replace(" ", "") if numbers else None


def reference_answer(reference: Any) -> str | None:
    """Normalize a reference answer: ``str()`` it, and if it holds ``\\boxed{}`` or ``#### x`` take
    that part; strip it like an extracted answer (``$..$``, ``**``, trailing period). GSM8K
    commas are kept (the comparison ignores them). Empty -> None."""
    if reference is None:
        return None
    ref = str(reference).strip()
    if "\\boxed" in ref or "\\fbox" in ref or "####" in ref:
        ref = extract_answer(ref) or ""
    return _clean(ref) or None


_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_FRAC_RE = re.compile(
    r"(-?)\\[dt]?frac\s*(?:\{\s*(-?\d+(?:\.\d+)?)\s*\}|(\d))\s*(?:\{\s*(-?\d+(?:\.\d+)?)\s*\}|(\d))"
)
_PLAIN_RE = re.compile(
    r"([+-]?)\s*(\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))(\.\d+)?(?:\s*/\s*(\d+(?:\.\d+)?))?((?:\s+[A-Za-z]+\.?)*)"
)
_NOISE = ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\;", "^{\\circ}", "^\\circ", "°", "\\left", "\\right")


def parse_number(text: str) -> Fraction | None:
    """Read ``text`` as a plain number, exactly, or return None.

    Accepts a sign, thousands commas (``1,000``; LaTeX ``1{,}000``), decimals, ``a/b``,
    ``\\frac{a}{b}``/``\\dfrac``/``\\tfrac``/``\\frac12``, and ignores ``$``, ``%``, degrees,
    ``\\text{..}`` wrappers, a leading ``x =``, a trailing period and trailing unit words
    (``5 dollars``, ``12 cm``). Anything else (``\\sqrt2``, ``2, 3``, ``x+1``) gives None.

    >>> parse_number("$1,000.50")
    Fraction(2001, 2)
    >>> parse_number(r"-\\dfrac{3}{4}")
    Fraction(-3, 4)
    >>> parse_number("5 dollars"), parse_number("x + 1")
    (Fraction(5, 1), None)
    """
    s = _TEXT_CMD_RE.sub(r" \1", text).replace("\u2212", "-").replace("{,}", ",")
    for noise in _NOISE:
        s = s.replace(noise, "")
    s = re.sub(r"^[A-Za-z]\s*=\s*", "", s.strip()).rstrip(".").strip()
    m = _FRAC_RE.fullmatch(s)
    if m:
        num = Fraction(m.group(2) or m.group(3))
        den = Fraction(m.group(4) or m.group(5))
        if den == 0:
            return None
        value = num / den
        return -value if m.group(1) else value
    m = _PLAIN_RE.fullmatch(s)
    if not m or (not m.group(2) and not m.group(3)):
        return None
    value = Fraction((m.group(2) or "0").replace(",", "") + (m.group(3) or ""))
    if m.group(4) is not None:
        den = Fraction(m.group(4))
        if den == 0:
            return None
        value /= den
    return -value if m.group(1) == "-" else value


def _numbers_equal(pred: Fraction, gold: Fraction) -> bool:
    if pred == gold:
        return True
    if pred.denominator == 1 and gold.denominator == 1:
        return False
    return abs(pred - gold) <= REL_TOL * max(1, abs(gold))


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@lru_cache(maxsize=8192)
def _mv_parse(answer: str, main_thread: bool) -> tuple:
    from math_verify import parse

    timeout = MATH_VERIFY_TIMEOUT_S if main_thread else None
    return tuple(parse("\\boxed{" + answer + "}", parsing_timeout=timeout))


def _mv_equal(pred: str, gold: str) -> bool:
    if len(pred) > MAX_VERIFY_CHARS or len(gold) > MAX_VERIFY_CHARS:
        return False
    from math_verify import verify

    main = _in_main_thread()
    gold_parsed, pred_parsed = _mv_parse(gold, main), _mv_parse(pred, main)
    if not gold_parsed or not pred_parsed:
        return False
    timeout = MATH_VERIFY_TIMEOUT_S if main else None
    return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=timeout))


def is_equivalent(pred: str, gold: str) -> bool:
    """Whether answer ``pred`` equals reference ``gold`` (both already extracted).

    Plain numbers on both sides are compared exactly (see module docstring); anything else goes
    to math-verify (symbolic, sets, intervals, tuples, ``\\text{(C)}`` vs ``C``...).

    >>> is_equivalent("0.5", r"\\frac{1}{2}"), is_equivalent("1,000", "1000"), is_equivalent("7", "8")
    (True, True, False)
    """
    p, g = parse_number(pred), parse_number(gold)
    if p is not None and g is not None:
        return _numbers_equal(p, g)
    if pred.strip() == gold.strip():
        return True
    return _mv_equal(pred, gold)


def _reference_is_parseable(gold: str) -> bool:
    if parse_number(gold) is not None:
        return True
    if len(gold) > MAX_VERIFY_CHARS:
        return False
    return bool(_mv_parse(gold, _in_main_thread()))


def math_correct(
    prompts: list[str], completions: list[str], *, answer: list[Any], **_: Any
) -> list[float | None]:
    """Outcome reward: 1.0 if the completion's final answer equals the reference, else 0.0.

    Args:
        prompts: the prompts (unused; part of the reward protocol).
        completions: the completions, one per reward.
        answer: the reference answers, aligned with ``completions`` (str, int or float; a
            reference holding ``\\boxed{}``/``#### x`` is reduced to that part).
        **_: other dataset columns, ignored.

    Returns:
        One value per completion: 1.0 correct, 0.0 wrong or no answer found, None when the
        reference is empty or cannot be parsed (that sample cannot be scored).

    Raises:
        ValueError: if ``answer`` and ``completions`` have different lengths.

    >>> math_correct(["q"] * 3, [r"\\boxed{18}", "It is 17.", "I don't know"], answer=["18"] * 3)
    [1.0, 0.0, 0.0]
    """
    if len(answer) != len(completions):
        raise ValueError(
            f"math_correct: got {len(completions)} completions but {len(answer)} answers"
        )
    rewards: list[float | None] = []
    for completion, ref in zip(completions, answer):
        gold = reference_answer(ref)
        if gold is None or not _reference_is_parseable(gold):
            rewards.append(None)
            continue
        pred = extract_answer(completion or "")
        rewards.append(1.0 if pred is not None and is_equivalent(pred, gold) else 0.0)
    return rewards
