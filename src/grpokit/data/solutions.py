"""Step-by-step solutions of arithmetic expressions: one operation per line, each operation after
the ones its operands need (precedence and parentheses kept; the left operand's operations first),
for the
supervised warm-up of a multi-step task (issue #33: a task whose solutions have several steps, so
that process supervision has steps to credit).

>>> print(arithmetic_solution("12 + 5 - 3 * 2"))
12 + 5 = 17
3 * 2 = 6
17 - 6 = 11

Exact rational arithmetic (``fractions.Fraction``) on Python's parse of the expression
(:func:`ast.parse`, never evaluated): numbers, ``+ - * /``, unary minus and parentheses only. A
value is written as :func:`grpokit.envs.calculator.format_value` writes it; a negative operand in
parentheses (``5 - (-3) = 8``); a negated part is used negated by the next line, and the negation of
the whole expression is its last line (``-(-27) = 27``), so that the answer ends the solution.
"""

from __future__ import annotations

import ast
from fractions import Fraction

from grpokit.envs.calculator import format_value

__all__ = ["arithmetic_solution", "arithmetic_steps"]

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _text(v: Fraction) -> str:
    s = format_value(v)
    return f"({s})" if v < 0 else s


def arithmetic_steps(expression: str) -> tuple[list[str], Fraction]:
    """``(lines, value)``: one ``"a op b = c"`` line per binary operation of ``expression``, in
    evaluation order (the post-order of its parse: the left operand's operations first), and the
    expression's exact value. An expression without an operation (``"7"``, ``"-3"``) has no line.

    >>> arithmetic_steps("(2 + 3) * (4 - 6)")
    (['2 + 3 = 5', '4 - 6 = -2', '5 * (-2) = -10'], Fraction(-10, 1))

    Raises:
        ValueError: not arithmetic of numbers with ``+ - * /``, unary minus and parentheses
            (names the part), or a division by zero.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"arithmetic_steps: {expression!r} is not an expression ({e.msg})") from None
    lines: list[str] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = walk(node.operand)
            if isinstance(node.op, ast.UAdd):
                return v
            if node is tree and lines:  # -(41 - 68) as the whole expression: the answer is the last line
                lines.append(f"-({format_value(v)}) = {format_value(-v)}")
            return -v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = walk(node.left), walk(node.right)
            op = _OPS[type(node.op)]
            if op == "/" and b == 0:
                raise ValueError(f"arithmetic_steps: {expression!r} divides by zero")
            v = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]
            lines.append(f"{_text(a)} {op} {_text(b)} = {format_value(v)}")
            return v
        raise ValueError(f"arithmetic_steps: {expression!r}: {ast.unparse(node)!r} is not allowed")

    value = walk(tree)
    return lines, value


def arithmetic_solution(expression: str) -> str:
    """The lines of :func:`arithmetic_steps` joined by newlines (the expression's value when it has
    no operation).

    Raises:
        ValueError: as :func:`arithmetic_steps`.
    """
    lines, value = arithmetic_steps(expression)
    return "\n".join(lines) if lines else format_value(value)
