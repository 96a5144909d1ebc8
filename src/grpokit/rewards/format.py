"""Format rewards: does the completion state its final answer in the requested form?

They check form only, never correctness, and always return 1.0 or 0.0 (never None).

- :func:`format_reward` (registry name ``format``): a non-empty, well-formed ``\\boxed{...}``
  (nested braces allowed) appears somewhere. Matches the usual "put your final answer within
  \\boxed{}" instruction.
- :func:`answer_line_format` (``answer_line``): the last non-empty line is ``Answer: <something>``
  (case-insensitive, ``**`` markdown allowed, ``Final answer:`` too).
- :func:`number_at_end` (``number_at_end``): the text ends with a number (trailing ``.``, ``$``,
  ``}``, ``)``, ``*`` and spaces allowed) -- the GSM8K "end with the number" style.
- :func:`make_format_reward`: build your own from a regular expression.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from grpokit.rewards.math import boxed_contents

__all__ = ["make_format_reward", "format_reward", "answer_line_format", "number_at_end"]

Scope = Literal["anywhere", "last_line", "whole"]


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def make_format_reward(
    pattern: str | re.Pattern[str],
    *,
    scope: Scope = "anywhere",
    flags: int = 0,
    name: str | None = None,
) -> Callable[..., list[float | None]]:
    """Build a reward function scoring 1.0 when ``pattern`` matches the completion, else 0.0.

    Args:
        pattern: a regular expression (string or compiled).
        scope: where it must match: ``"anywhere"`` (``re.search`` on the whole text),
            ``"last_line"`` (``re.search`` on the last non-empty line, stripped) or ``"whole"``
            (``re.fullmatch`` on the stripped text).
        flags: ``re`` flags used when ``pattern`` is a string.
        name: the function's ``__name__`` (for logs); default ``format[<pattern>]``.

    Returns:
        A reward function ``fn(prompts, completions, **columns) -> list[float]``.

    Raises:
        ValueError: unknown ``scope`` or a pattern that does not compile.

    >>> fn = make_format_reward(r"<answer>.+</answer>", flags=re.S)
    >>> fn(["q", "q"], ["<answer>4</answer>", "4"])
    [1.0, 0.0]
    """
    if scope not in ("anywhere", "last_line", "whole"):
        raise ValueError(f"make_format_reward: unknown scope {scope!r}; use anywhere, last_line or whole")
    try:
        regex = re.compile(pattern, flags) if isinstance(pattern, str) else pattern
    except re.error as e:
        raise ValueError(f"make_format_reward: bad pattern {pattern!r}: {e}") from e

    def check(text: str) -> bool:
        if scope == "anywhere":
            return regex.search(text) is not None
        if scope == "last_line":
            return regex.search(_last_line(text)) is not None
        return regex.fullmatch(text.strip()) is not None

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
        return [1.0 if check(c or "") else 0.0 for c in completions]

    reward.__name__ = reward.__qualname__ = name or f"format[{regex.pattern}]"
    return reward


def format_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    """1.0 if the completion contains a non-empty, well-formed ``\\boxed{...}``, else 0.0.

    Args:
        prompts: unused (reward protocol).
        completions: the completions.

    Returns:
        One float per completion.

    >>> format_reward(["q"] * 3, [r"so \\boxed{\\frac{1}{2}}", r"\\boxed{}", r"\\boxed{3"])
    [1.0, 0.0, 0.0]
    """
    return [1.0 if any(c.strip() for c in boxed_contents(text or "")) else 0.0 for text in completions]


answer_line_format = make_format_reward(
    r"^\**(?:final\s+)?answer\**\s*:\**\s*\S",
    scope="last_line",
    flags=re.IGNORECASE,
    name="answer_line_format",
)
answer_line_format.__doc__ = """1.0 if the last non-empty line reads ``Answer: <something>``, else 0.0.

>>> answer_line_format(["q", "q"], ["3 + 4 = 7\\nAnswer: 7", "Answer: 7\\nbye"])
[1.0, 0.0]
"""

# ``(?<![\w.])-?\d[\d,]*(?:\.\d+)?[\s.$})*]*\Z`` searched in the text, written reversed and
# matched at the start of the reversed text: one start position, so linear time (the forward
# search tries every digit after a comma and took 17 s on "1,1,1,...,1x" of 40k characters)
_NUMBER_AT_END_REVERSED = re.compile(r"[\s.$})*]*(?:\d+\.)?[\d,]*\d-?(?![\w.])")


def number_at_end(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    """1.0 if the completion ends with a number (trailing ``.$})*`` allowed), else 0.0.

    The number: ``-?\\d[\\d,]*(?:\\.\\d+)?`` not preceded by a letter, digit, ``_`` or ``.``.

    Args:
        prompts: unused (reward protocol).
        completions: the completions.

    Returns:
        One float per completion.

    >>> number_at_end(["q"] * 3, ["so it is 42.", "total: $1,200", "42 apples"])
    [1.0, 1.0, 0.0]
    """
    return [1.0 if _NUMBER_AT_END_REVERSED.match((text or "")[::-1]) else 0.0 for text in completions]
