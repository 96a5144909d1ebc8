"""Reward functions: protocol, registry, combination, math answer check and format checks.

A reward function is ``fn(prompts, completions, **columns) -> list[float | None]`` (see
:mod:`grpokit.rewards.base`), or TRL's ``fn(completions, **kwargs)`` called with keywords, sync or
``async`` (:mod:`grpokit.rewards.calling`). Built-in names for :func:`get_reward_function`:
``math_correct``, ``format``, ``answer_line``, ``number_at_end``, ``reasoning_gym``; or
``"module:function"`` (a module on ``sys.path`` or in the working directory) or
``"path/to/file.py:function"`` (:func:`grpokit.utils.importing.import_object`).
"""

from grpokit.rewards.base import (
    BUILTIN_REWARDS,
    RewardFunction,
    compute_rewards,
    get_reward_function,
    register_reward,
)
from grpokit.rewards.calling import RewardSignatureError
from grpokit.rewards.format import answer_line_format, format_reward, make_format_reward, number_at_end
from grpokit.rewards.math import extract_answer, is_equivalent, math_correct, parse_number

__all__ = [
    "BUILTIN_REWARDS",
    "RewardFunction",
    "RewardSignatureError",
    "answer_line_format",
    "compute_rewards",
    "extract_answer",
    "format_reward",
    "get_reward_function",
    "is_equivalent",
    "make_format_reward",
    "math_correct",
    "number_at_end",
    "parse_number",
    "register_reward",
]
