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
in any other thread we pass ``None`` (no signal, no crash). In every thread, what reaches
math-verify is screened first, so that the slow families found by fuzzing cannot run long (a
signal cannot interrupt one big-integer operation in C either):

- not parsed: answers longer than :data:`MAX_VERIFY_CHARS` characters, with ``{ ( [`` nested
  deeper than :data:`MAX_NESTING` (its ANTLR LaTeX parser takes time exponential in the nesting of
  ``{``: ~2 s at depth 12, doubling per level), or chaining more than :data:`MAX_SCRIPT_CHAIN`
  brace-less scripts (``x^x^x^...``);
- not compared: parsed answers deeper than :data:`MAX_EXPR_DEPTH`, or that may denote a number of
  over :data:`MAX_ANSWER_BITS` bits (``9^{9^{9}}``, ``10^{10}!``: an upper bound computed from the
  expression tree, powers, factorials and products; :data:`MAX_TOWER_BITS` for a power with a
  power or factorial in its exponent).

A refused prediction scores 0.0; a refused reference makes the row unscorable (None). The reward
guard's worker process bounds whatever else is slow. Numbers of more than
:data:`MAX_NUMBER_DIGITS` digits are not plain numbers (step 3; Python refuses ``int()`` of over
4300 digits). Any text is accepted: nothing here raises on what a model writes.
Nothing is ever ``eval``-ed.
"""

from __future__ import annotations

import logging
import math
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

__all__ = ["extract_answer", "boxed_contents", "reference_answer", "parse_number", "is_equivalent", "math_correct"]

MATH_VERIFY_TIMEOUT_S = 3
"""Seconds given to each math-verify parse / comparison (main thread only)."""
MAX_VERIFY_CHARS = 1000
"""Longer answers are not sent to math-verify (they score as wrong)."""
MAX_NESTING = 8
"""Answers with ``{ ( [`` nested deeper than this are not sent to math-verify (they score as wrong)."""
MAX_SCRIPT_CHAIN = 6
"""Nor answers chaining more brace-less scripts than this (``x^x^x^x^x^x^x``: a LaTeX error,
parsed in time growing ~quadratically: 40 carets took 16 s)."""
MAX_EXPR_DEPTH = 12
"""Parsed answers deeper than this are not compared (sympy's ``evalf`` on the left-nested tree of
``1/2/3/.../n`` takes time exponential in n: 1 s at n = 16)."""
REL_TOL = 1e-6
"""Relative tolerance of the cheap numeric comparison when either side is not an integer."""
MAX_ANSWER_BITS = 8192
"""Answers whose numbers may exceed this many bits (``2^{10^7}``, ``9^{9^{9}}``) are not compared."""
MAX_TOWER_BITS = 512
"""The same bound for a power whose exponent holds a power or a factorial (``2^{2^{10}}``): sympy's
simplification of those grows steeply (measured: ``2^{2^{11}}`` vs ``2^{2048}`` took 7 s)."""
MAX_NUMBER_DIGITS = 1000
""":func:`parse_number` gives None for a text holding more digits than this."""

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)")
_BRACKET_RE = re.compile(r"[{}()\[\]]")
# %-format: the pattern's own braces would need doubling in an f-string
_SCRIPT_CHAIN_RE = re.compile(r"(?:[\^_]\s*[^\s{}^_]\s*){%d}[\^_]" % MAX_SCRIPT_CHAIN)  # noqa: UP031
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_HASH_ANSWER_START = re.compile(r"[-+$\\(\[\d.]")
_PHRASE_RE = re.compile(r"\banswer\**(?:\s+is\b\s*:?|\s*:)[ \t]*([^\n]*)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def _matching_braces(text: str) -> dict[int, int]:
    """``{open: close}`` offsets of every balanced ``{...}`` pair, in one pass (linear time)."""
    pairs, stack = {}, []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            pairs[stack.pop()] = m.start()
    return pairs


def boxed_contents(text: str) -> list[str]:
    """Contents of every well-formed ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x``, in order.

    Nested braces are matched (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); a box whose brace
    is never closed is skipped; ``\\boxed 5`` (no brace) gives the one space-separated token after
    it. Contents are returned as written (not stripped; possibly empty). Used by
    :func:`extract_answer`, the ``format`` reward and the data loaders that reduce a
    ``\\boxed{..}`` reference to its answer.

    >>> boxed_contents(r"first \\boxed{\\frac{1}{2}}, then \\fbox{3} and \\boxed 7$")
    ['\\\\frac{1}{2}', '3', '7']
    >>> boxed_contents(r"\\boxed{never closed")
    []
    """
    out = []
    pairs: dict[int, int] | None = None
    for m in _BOXED_RE.finditer(text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            if pairs is None:
                pairs = _matching_braces(text)
            if i in pairs:
                out.append(text[i + 1 : pairs[i]])
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
    for candidate in reversed(boxed_contents(text)):
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
_FRAC_RE = re.compile(r"(-?)\\[dt]?frac\s*(?:\{\s*(-?\d+(?:\.\d+)?)\s*\}|(\d))\s*(?:\{\s*(-?\d+(?:\.\d+)?)\s*\}|(\d))")
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

    A text holding more than :data:`MAX_NUMBER_DIGITS` digits gives None (never an exception).
    """
    if sum(ch.isdigit() for ch in text) > MAX_NUMBER_DIGITS:
        return None
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
    return abs(pred - gold) <= Fraction(REL_TOL) * max(Fraction(1), abs(gold))  # exact: a float overflows


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@lru_cache(maxsize=8192)
def _mv_parse(answer: str, main_thread: bool) -> tuple:
    from math_verify import parse

    timeout = MATH_VERIFY_TIMEOUT_S if main_thread else None
    return tuple(parse("\\boxed{" + answer + "}", parsing_timeout=timeout))


_GROWTH = {
    "factorial",
    "factorial2",
    "subfactorial",
    "gamma",
    "binomial",
    "RisingFactorial",
    "FallingFactorial",
    "fibonacci",
    "lucas",
}  # functions growing like a factorial or less


def _bits(x: Any) -> float:
    """Upper bound of log2 of the numerator and denominator of any number evaluating the sympy
    expression ``x`` can produce; a symbol counts 1, ``inf`` = over :data:`MAX_ANSWER_BITS`."""
    import sympy

    if isinstance(x, sympy.Rational):  # Integer included
        return math.log2(max(abs(int(x.p)), int(x.q), 2))
    if isinstance(x, sympy.Float):
        try:
            return math.log2(max(abs(float(x)), 2.0)) + 64.0
        except (OverflowError, ValueError):
            return math.inf
    args = list(x) if isinstance(x, sympy.MatrixBase) else getattr(x, "args", ())
    sizes = [_bits(a) for a in args if isinstance(a, (sympy.Basic, sympy.MatrixBase))]
    if not sizes:
        return 1.0
    if isinstance(x, sympy.Pow):  # |b ** e| <= 2 ** (|e| bits(b)), |e| < 2 ** bits(e)
        base, exp = sizes
        e = float(abs(x.exp)) if isinstance(x.exp, sympy.Rational) and exp < 64 else 2.0 ** min(exp, 64)
        value = e * max(base, 1.0)
        tower = not isinstance(x.exp, sympy.Number) and any(
            isinstance(n, sympy.Pow) or type(n).__name__ in _GROWTH for n in sympy.preorder_traversal(x.exp)
        )
        if tower and value > MAX_TOWER_BITS:
            return math.inf
    elif type(x).__name__ in _GROWTH:  # |f(a, b)| <= m ** (m + 1), m = |a| + |b| <= sum 2 ** bits
        m = sum(2.0 ** min(size, 64) for size in sizes)
        value = (m + 1) * math.log2(m + 2)
    elif isinstance(x, sympy.Mul):
        value = sum(sizes)
    else:  # sums, functions, sets, relations...
        value = max(sizes) + math.log2(len(sizes)) + 1.0
    return value if value <= MAX_ANSWER_BITS else math.inf


def _deeper_than(x: Any, limit: int) -> bool:
    """Whether the expression tree of ``x`` has more than ``limit`` levels."""
    if limit < 1:
        return True
    args = getattr(x, "args", None)
    return isinstance(args, tuple) and any(_deeper_than(a, limit - 1) for a in args)


def _too_costly(parsed: tuple) -> bool:
    """Whether a math-verify parse is too costly to compare: deeper than :data:`MAX_EXPR_DEPTH`,
    or denoting a number over :data:`MAX_ANSWER_BITS` bits."""
    exprs = [x for x in parsed if not isinstance(x, str)]
    if any(_deeper_than(x, MAX_EXPR_DEPTH) for x in exprs):
        return True
    try:
        return any(_bits(x) > MAX_ANSWER_BITS for x in exprs)
    except RecursionError:  # cannot happen below MAX_EXPR_DEPTH; kept as a fence
        return True


def _nesting(text: str) -> int:
    """Deepest nesting of ``{ ( [`` brackets (unbalanced closers ignored)."""
    depth = deepest = 0
    for m in _BRACKET_RE.finditer(text):
        depth = depth + 1 if m.group() in "{([" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def _sendable(answer: str) -> bool:
    """Whether math-verify may see ``answer`` (bounded work; module docstring)."""
    return (
        len(answer) <= MAX_VERIFY_CHARS and _nesting(answer) <= MAX_NESTING and _SCRIPT_CHAIN_RE.search(answer) is None
    )


def _mv_equal(pred: str, gold: str) -> bool:
    if not _sendable(pred) or not _sendable(gold):
        return False
    from math_verify import verify

    main = _in_main_thread()
    gold_parsed, pred_parsed = _mv_parse(gold, main), _mv_parse(pred, main)
    if not gold_parsed or not pred_parsed or _too_costly(gold_parsed) or _too_costly(pred_parsed):
        return False
    timeout = MATH_VERIFY_TIMEOUT_S if main else None
    return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=timeout))


def is_equivalent(pred: str, gold: str) -> bool:
    """Whether answer ``pred`` equals reference ``gold`` (both already extracted).

    Plain numbers on both sides are compared exactly (see module docstring); anything else goes
    to math-verify (symbolic, sets, intervals, tuples, ``\\text{(C)}`` vs ``C``...), unless the
    time-bound screens of the module docstring refuse it (then only identical strings are equal).
    Never raises on any strings.

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
    if not _sendable(gold):
        return False
    parsed = _mv_parse(gold, _in_main_thread())
    return bool(parsed) and not _too_costly(parsed)


def math_correct(prompts: list[str], completions: list[str], *, answer: list[Any], **_: Any) -> list[float | None]:
    """Outcome reward: 1.0 if the completion's final answer equals the reference, else 0.0.

    Args:
        prompts: the prompts (unused; part of the reward protocol).
        completions: the completions, one per reward.
        answer: the reference answers, aligned with ``completions`` (str, int or float; a
            reference holding ``\\boxed{}``/``#### x`` is reduced to that part).
        **_: other dataset columns, ignored.

    Returns:
        One value per completion: 1.0 correct, 0.0 wrong or no answer found, None when the
        reference is empty, cannot be parsed, or is refused by the time-bound screens (module
        docstring): that sample cannot be scored.

    Raises:
        ValueError: if ``answer`` and ``completions`` have different lengths.

    >>> math_correct(["q"] * 3, [r"\\boxed{18}", "It is 17.", "I don't know"], answer=["18"] * 3)
    [1.0, 0.0, 0.0]
    """
    if len(answer) != len(completions):
        raise ValueError(f"math_correct: got {len(completions)} completions but {len(answer)} answers")
    rewards: list[float | None] = []
    for completion, ref in zip(completions, answer):
        gold = reference_answer(ref)
        if gold is None or not _reference_is_parseable(gold):
            rewards.append(None)
            continue
        pred = extract_answer(completion or "")
        rewards.append(1.0 if pred is not None and is_equivalent(pred, gold) else 0.0)
    return rewards
