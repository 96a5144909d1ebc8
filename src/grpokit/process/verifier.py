"""Process reward functions: the protocol, and a built-in arithmetic step verifier.

**Protocol.** A process reward function is
``fn(prompts: list[str], completions: list[str], steps: list[list[str]], **columns)
-> list[list[float | None]]``: for each completion, one score per step (``steps[i]`` are the step
strings of completion i, e.g. ``step_texts(text, spans)`` from ``grpokit.process.steps``). The score
of step k judges the solution *up to and including* step k. ``None`` = this step cannot be scored
(``scatter_step_rewards`` turns it into NaN, which the process advantage leaves out).

**Arithmetic verifier** (:func:`arithmetic_step_rewards`), per completion:

1. In each step find arithmetic claims (:func:`find_claims`): equation chains ``E0 = E1 = ... = Ek``
   whose segments are plain arithmetic over numbers (``1,200``, ``$5``, ``0.5``, ``20%``; a word
   after a number is a unit: ``5 apples``), ``+ - − * × · / ÷ ^ **``, parentheses, ``x`` between
   two numbers (``0.2 x 50``), ``20% of 50``, LaTeX ``\\frac{a}{b}``, ``\\times``, ``\\cdot``,
   ``\\div``; and GSM8K calculator annotations ``<<48/2=24>>``. A segment that touches letters or
   other math (``2x + 3 = 7``, ``f(3) = 9``, ``= 7 + x``) is not a claim. A single number right after a
   word (``half of 50 = 25``) is dropped as the tail of a verbal expression. ``-``, ``*`` or ``+``
   and a space at a line start is a list bullet (``- 3 + 4 = 7`` claims ``3 + 4 = 7``), except in
   ``<<..>>``; a single number right after a bullet or a markdown ``*``/``**`` is dropped too
   (``* 4 = 20`` may end an expression begun on an earlier line). ``≈`` is not ``=``.
   Any text is accepted: what does not parse holds no claim (nothing raises).
2. Check each claim exactly with rational arithmetic (``fractions.Fraction``; no ``eval``).
   **Chain semantics:** ``running = value(E0)``; for each i ≥ 1 the claim ``E(i-1) = Ei`` is
   correct if ``value(Ei) == running``, or if Ei is compound and its first number equals
   ``running`` (a continued computation: ``3 + 4 = 7 * 2 = 14``); then ``running = value(Ei)``.
   A claimed value written as a decimal with d ≥ 1 digits after the point is accepted if it is
   the exact value rounded (within ``10**-d / 2``) or truncated to d digits (``10/3 = 3.33``,
   ``2/3 = 0.66``; not ``10/3 = 3.4``). Division by zero makes the claim wrong. Claims whose evaluation is
   too large (exponent > 1000, over ``MAX_BITS`` bits, non-integer exponent, a literal over 30
   digits) are skipped, never wrong. The sizes are checked *before* each power is computed and
   after every other operation, so no claim can make the verifier compute a big number
   (``2**9**9**9 = 1``, ``9^{9^{9}} = 1`` are skipped at once); there is no factorial. Segments are
   at most 64 tokens, which bounds the parser's recursion and work per ``=``.
3. Score step k: **0.0 if any claim in steps 1..k is wrong** (a wrong step poisons every later
   step), else 1.0; steps without claims inherit this running score.
4. Outcome on the last step: if the row's reference ``answer`` is not None, the final answer is
   checked with ``grpokit.rewards.math.math_correct`` (fallback if that module is missing: last
   number of the completion vs last number of the reference, exactly). Wrong -> the last step
   scores 0.0; unscorable reference (``math_correct`` gives None) -> the last step is None unless
   already 0.0 by step 3. A reference of None skips the outcome check.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

__all__ = ["find_claims", "Claim", "arithmetic_step_rewards", "MAX_BITS"]

MAX_BITS = 4096
"""Largest numerator/denominator (in bits) any intermediate value may reach before a claim is skipped."""
_MAX_EXP = 1000
_MAX_DIGITS = 30
_MAX_GAP = 64  # longest segment, in tokens (bounds parser recursion and work)


class Claim(NamedTuple):
    """One checked equality: ``left = right`` (source text of both sides) and whether it holds."""

    left: str
    right: str
    ok: bool


class _Unverifiable(Exception):
    pass


class _Tok(NamedTuple):
    kind: str  # NUM OP LP RP EQ WORD OTHER
    text: str
    start: int
    end: int
    value: Fraction | None = None
    decimals: int = 0


_LEX = re.compile(
    r"(?P<NUM>\$?(?:(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)%?)"
    r"|(?P<OTHER2>==|<=|>=|!=)"
    r"|(?P<EQ>=)"
    r"|(?P<OP>\*\*|[+\-−*/×÷^·⋅])"
    r"|(?P<LP>\()|(?P<RP>\))"
    r"|(?P<WORD>[^\W\d_]+)"
    r"|(?P<WS>\s+)"
    r"|(?P<OTHER>.)",
    re.S,
)
_LATEX = [
    (re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}"), r"((\1)/(\2))"),
    (re.compile(r"\^\s*\{([^{}]*)\}"), r"^(\1)"),
    (re.compile(r"\\times(?![a-zA-Z])"), " × "),
    (re.compile(r"\\cdot(?![a-zA-Z])"), " · "),
    (re.compile(r"\\div(?![a-zA-Z])"), " ÷ "),
    (re.compile(r"\\(?:left|right)(?![a-zA-Z])|\\[,;!]"), ""),
    (re.compile(r"\\\$"), "$"),
]
_GSM8K = re.compile(r"<<([^<>]*)>>")
_MUL = {"*", "×", "·", "⋅", "/", "÷"}
_OK_LEFT = {*":,;.?\"'$([*•", "**"}  # punctuation allowed just left of a chain's first segment
_OK_RIGHT = {*".,;:?\"')]$*", "**"}  # ... and just right of its last segment


def _lex(text: str, markdown: bool = True) -> list[_Tok]:
    """Tokens of ``text``; ``markdown``: read ``-``/``*``/``+`` + space at a line start as a bullet."""
    toks: list[_Tok] = []
    for m in _LEX.finditer(text):
        kind, s = m.lastgroup, m.group()
        assert kind is not None  # every alternative of _LEX is a named group
        if kind == "WS":
            continue
        if kind == "NUM":
            digits = s.strip("$%").replace(",", "")
            dec = len(digits.split(".")[1]) if "." in digits else 0
            val = None if sum(c.isdigit() for c in digits) > _MAX_DIGITS else Fraction(digits)
            if val is not None and s.endswith("%"):
                val /= 100
            toks.append(_Tok("NUM", s, m.start(), m.end(), val, dec if not s.endswith("%") else 0))
            continue
        toks.append(_Tok("OTHER" if kind == "OTHER2" else kind, s, m.start(), m.end()))
    out: list[_Tok] = []
    for i, t in enumerate(toks):  # context-dependent re-reading of a few tokens
        prev = toks[i - 1] if i else None
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        after_operand = prev is not None and prev.kind in ("NUM", "RP")
        before_operand = nxt is not None and (nxt.kind in ("NUM", "LP") or nxt.text in "-−")
        line_start = "\n" in text[prev.end : t.start] if prev is not None else True
        if (
            markdown
            and t.kind == "OP"
            and t.text in "-*+"
            and line_start
            and not after_operand
            and text[t.end : t.end + 1] in (" ", "\t")
        ):
            t = t._replace(kind="OTHER", text="•")  # a list bullet: "- 3 + 4 = 7" is 3 + 4 = 7
        elif t.kind == "WORD" and t.text in ("x", "X") and after_operand and before_operand:
            t = t._replace(kind="OP", text="×")
        elif (
            t.kind == "WORD"
            and t.text == "of"
            and prev is not None
            and prev.text.endswith("%")
            and prev.kind == "NUM"
            and before_operand
        ):
            t = t._replace(kind="OP", text="×")
        elif (
            t.kind == "OP"
            and t.text in ("*", "**")
            and not (
                before_operand
                and (
                    after_operand
                    or (prev is not None and prev.kind == "WORD" and len(out) > 1 and out[-2].kind == "NUM")
                )
            )
        ):
            t = t._replace(kind="OTHER")  # markdown emphasis (or a list bullet), not multiplication
        out.append(t)
    return out


# ---- parser: tokens -> AST; ("num", tok) | ("neg", a) | ("bin", op, a, b) --------------------
#: An AST node: ``("num", _Tok)``, ``("neg", node)`` or ``("bin", op, node, node)``.
_Node = tuple[Any, ...]


class _Parser:
    def __init__(self, toks: list[_Tok], units: bool = True):
        self.toks, self.i, self.units = toks, 0, units

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def expr(self) -> _Node:
        node = self.term()
        while (t := self.peek()) is not None and t.kind == "OP" and t.text in "+-−":
            self.i += 1
            node = ("bin", "-" if t.text in "-−" else "+", node, self.term())
        return node

    def term(self) -> _Node:
        node = self.unary()
        while (t := self.peek()) is not None and (t.kind == "OP" and t.text in _MUL or t.kind == "LP"):
            if t.kind == "OP":
                self.i += 1
            node = ("bin", "/" if t.text in "/÷" else "*", node, self.unary())
        return node

    def unary(self) -> _Node:
        t = self.peek()
        if t is not None and t.kind == "OP" and t.text in "-−":
            self.i += 1
            return ("neg", self.unary())
        base = self.primary()
        t = self.peek()
        if t is not None and t.kind == "OP" and t.text in ("^", "**"):
            self.i += 1
            return ("bin", "^", base, self.unary())
        return base

    def primary(self) -> _Node:
        t = self.peek()
        if t is None:
            raise SyntaxError("end")
        if t.kind == "NUM":
            self.i += 1
            u = self.peek()  # a unit word: "5 apples", "5kg" (single letters are variables)
            if self.units and u is not None and u.kind == "WORD" and len(u.text) >= 2:
                self.i += 1
            return ("num", t)
        if t.kind == "LP":
            self.i += 1
            node = self.expr()
            r = self.peek()
            if r is None or r.kind != "RP":
                raise SyntaxError(")")
            self.i += 1
            return node
        raise SyntaxError(t.text)


def _parse_all(toks: list[_Tok]) -> _Node:
    p = _Parser(toks)
    node = p.expr()
    if p.i != len(toks):
        raise SyntaxError("trailing")
    return node


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _check_size(v: Fraction) -> Fraction:
    if v.numerator.bit_length() > MAX_BITS or v.denominator.bit_length() > MAX_BITS:
        raise _Unverifiable
    return v


def _eval(node: _Node) -> Fraction:
    if node[0] == "num":
        if node[1].value is None:
            raise _Unverifiable
        return node[1].value
    if node[0] == "neg":
        return -_eval(node[1])
    _, op, a, b = node
    x, y = _eval(a), _eval(b)
    if op != "^":  # x / 0 raises ZeroDivisionError: the claim is wrong
        return _check_size(_ARITH[op](x, y))
    if y.denominator != 1 or abs(y) > _MAX_EXP:
        raise _Unverifiable
    bits = max(x.numerator.bit_length(), x.denominator.bit_length())
    if bits * abs(int(y)) > MAX_BITS:
        raise _Unverifiable
    return x ** int(y)


def _literal(node: _Node) -> _Tok | None:
    """The number token of a segment that is a single (possibly negated) number, else None."""
    if node[0] == "neg":
        node = node[1]
    return node[1] if node[0] == "num" else None


def _first_value(node: _Node) -> Fraction | None:
    """Value of the leftmost number of a compound segment (``-7`` in ``-7 + 2``), else None."""
    while node[0] == "bin":
        node = node[2]
    lit = _literal(node)
    if lit is None or lit.value is None:
        return None
    return -lit.value if node[0] == "neg" else lit.value


class _Seg(NamedTuple):
    node: _Node
    text: str


def _suffix(toks: list[_Tok], src: str) -> _Seg | None:
    """Longest suffix of a gap (ending at an "=") that is an arithmetic expression."""
    for j in range(max(0, len(toks) - _MAX_GAP), len(toks)):
        try:
            node = _parse_all(toks[j:])
        except SyntaxError:
            continue
        seg = _Seg(node, src[toks[j].start : toks[-1].end])
        if j == 0:
            return seg
        b, first = toks[j - 1], toks[j]
        if b.kind in ("NUM", "RP", "OP") or (b.kind == "OTHER" and b.text not in _OK_LEFT):
            return None
        if b.kind == "WORD":
            if b.end == first.start or first.kind == "OP":
                return None
            if node[0] == "num":  # "half of 50 = 25": the number ends a verbal expression
                return None
        if b.text in ("*", "**", "•") and node[0] == "num":  # "* 4 = 20": a bullet, or the tail
            return None  # of an expression begun on an earlier line ("12 / 3\n* 4 = 16")
        return seg
    return None


def _prefix(toks: list[_Tok], src: str, units: bool = True) -> _Seg | None:
    """Longest prefix of a gap (starting after an "=") that is an arithmetic expression, or None."""
    if not toks:
        return None
    p = _Parser(toks[:_MAX_GAP], units)
    try:
        node = p.expr()
    except SyntaxError:
        return None
    seg = _Seg(node, src[toks[0].start : toks[p.i - 1].end])
    if p.i == len(toks):
        return seg
    b = toks[p.i]
    if (
        b.kind in ("NUM", "LP", "OP")
        or (b.kind == "OTHER" and b.text not in _OK_RIGHT)
        or (b.kind == "WORD" and b.start == toks[p.i - 1].end)
    ):
        if units and toks[p.i - 1].kind == "WORD":  # "= 7 and 2 + 2": "and" was no unit
            return _prefix(toks, src, units=False)
        return None
    return seg


def _chains(text: str, markdown: bool = True) -> list[list]:
    toks = _lex(text, markdown)
    eqs = [i for i, t in enumerate(toks) if t.kind == "EQ"]
    if not eqs:
        return []
    chains, cur = [], [_suffix(toks[: eqs[0]], text)]
    for n, e in enumerate(eqs):
        last = n == len(eqs) - 1
        gap = toks[e + 1 : len(toks) if last else eqs[n + 1]]
        if not last and 0 < len(gap) <= _MAX_GAP:
            try:
                cur.append(_Seg(_parse_all(gap), text[gap[0].start : gap[-1].end]))
                continue
            except SyntaxError:
                pass
        cur.append(_prefix(gap, text))
        if not last:
            chains.append(cur)
            cur = [_suffix(gap, text)]
    chains.append(cur)
    return chains


def _matches(target: Fraction, seg: _Seg, value: Fraction, continuation: bool) -> bool:
    if value == target:
        return True
    lit = _literal(seg.node)
    if lit is not None and lit.decimals:  # rounded or truncated to d decimals
        scale = 10**lit.decimals
        if abs(value - target) * 2 * scale <= 1 or value == Fraction(int(target * scale), scale):
            return True
    if continuation and lit is None:
        return _first_value(seg.node) == target
    return False


def _claims_in(text: str, markdown: bool = True) -> list[Claim]:
    claims = []
    for chain in _chains(text, markdown):
        running, prev = None, None
        for seg in chain:
            if not isinstance(seg, _Seg):
                running, prev = None, None
                continue
            try:
                value, err = _eval(seg.node), False
            except _Unverifiable:
                running, prev = None, None
                continue
            except ZeroDivisionError:
                value, err = None, True
            if prev is not None and (err or running is not None):
                ok = False
                if value is not None and running is not None:  # not err (so running is set too)
                    ok = _matches(running, seg, value, continuation=True)
                    if not ok and _literal(prev.node) and not _literal(seg.node):
                        ok = _matches(value, prev, running, continuation=False)  # "3.33 = 10/3"
                claims.append(Claim(prev.text, seg.text, ok))
            elif err and prev is None:  # "5/0 = 0": the division itself is the wrong claim
                claims.append(Claim(seg.text, "?", False))
            running, prev = value, (None if err else seg)
    return claims


def find_claims(step: str) -> list[Claim]:
    """Every arithmetic claim in ``step`` with its verdict (module docstring, steps 1-2).

    >>> [(c.left, c.right, c.ok) for c in find_claims("So 48/2 = 24 clips, and 3 + 4 = 8.")]
    [('48/2', '24 clips', True), ('3 + 4', '8', False)]
    >>> [c.ok for c in find_claims("3 + 4 = 7 * 2 = 14, then <<14*2=29>>")]
    [False, True, True]
    """
    claims = []
    for m in _GSM8K.finditer(step):
        claims.extend(_claims_in(m.group(1), markdown=False))
    text = _GSM8K.sub(lambda m: " " * len(m.group()), step)
    for pattern, repl in _LATEX:
        text = pattern.sub(repl, text)
    return claims + _claims_in(text)


def _last_number(text: str) -> Fraction | None:
    nums = [t.value for t in _lex(text) if t.kind == "NUM" and t.value is not None]
    return nums[-1] if nums else None


def _math_correct() -> Callable[..., list[float | None]] | None:
    """:func:`grpokit.rewards.math.math_correct`, or None where it cannot be imported."""
    try:
        from grpokit.rewards.math import math_correct
    except ImportError:
        return None
    return math_correct


def _outcomes(prompts: list[str], completions: list[str], answer: list[Any]) -> list[float | None]:
    math_correct = _math_correct()
    rows = [i for i, a in enumerate(answer) if a is not None]
    out: list[float | None] = [None] * len(completions)
    if math_correct is not None and rows:
        got = math_correct([prompts[i] for i in rows], [completions[i] for i in rows], answer=[answer[i] for i in rows])
        for i, g in zip(rows, got):
            out[i] = g
        return out
    for i in rows:
        gold = _last_number(str(answer[i]))
        pred = _last_number(completions[i])
        out[i] = None if gold is None else float(pred is not None and pred == gold)
    return out


def arithmetic_step_rewards(
    prompts: Sequence[str],
    completions: Sequence[str],
    steps: Sequence[Sequence[str]],
    *,
    answer: Sequence[Any],
    **_: Any,
) -> list[list[float | None]]:
    """Process reward: check the arithmetic of each step, and the final answer on the last step.

    Rule (module docstring): ``score_k = 0.0`` if any claim in steps ``1..k`` is wrong, else 1.0;
    the last step is also 0.0 if the final answer is wrong (None if the reference cannot be
    scored and no claim was wrong).

    Args:
        prompts: the prompts (passed to the outcome check only).
        completions: the completions; ``steps[i]`` must be a split of ``completions[i]``.
        steps: per completion, its step strings.
        answer: per completion, the reference answer (None = do not check the outcome).

    Returns:
        Per completion, one score per step in ``{0.0, 1.0, None}``; ``[]`` for no steps.

    Raises:
        ValueError: ``completions``, ``steps`` and ``answer`` differ in length.

    >>> arithmetic_step_rewards(["q"], ["2 + 2 = 4\\n4 * 3 = 13\\nAnswer: 13"],
    ...     [["2 + 2 = 4\\n", "4 * 3 = 13\\n", "Answer: 13"]], answer=[None])
    [[1.0, 0.0, 0.0]]
    """
    if not len(completions) == len(steps) == len(answer):
        raise ValueError(
            f"arithmetic_step_rewards: {len(completions)} completions, {len(steps)} step lists, {len(answer)} answers"
        )
    outcomes = _outcomes(list(prompts), list(completions), list(answer))
    out: list[list[float | None]] = []
    for i, row in enumerate(steps):
        scores: list[float | None] = []
        score = 1.0
        for step in row:
            if any(not c.ok for c in find_claims(step)):
                score = 0.0
            scores.append(score)
        if scores and answer[i] is not None and scores[-1] != 0.0:
            if outcomes[i] is None:
                scores[-1] = None
            elif outcomes[i] == 0.0:
                scores[-1] = 0.0
        out.append(scores)
    return out
