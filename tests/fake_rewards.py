"""Reward functions for trainer tests (``rewards.functions: [fake_rewards:length_reward]``).

Tiny random models never emit EOS on purpose nor solve a math problem, so trainer tests score
completions with these instead (``tests/`` is on ``pythonpath``).

The faulty ones fail on row ``BAD_ROW`` of a batch. ``GuardedReward`` retries a failing batch
row by row, one completion per call; to fail on the same row then, the batch call remembers the
bad row's text in ``_BAD_TEXTS`` (random completions of a 49k-token vocab never repeat).
"""

from __future__ import annotations

import math
import time

BAD_ROW = 1
"""The row (index within the batch of one reward call) the faulty rewards below fail on."""

HANG_S = 2.0
"""How long ``hanging_reward`` sleeps on the bad row (tests use ``rewards.timeout_s=0.5``)."""

_BAD_TEXTS: set[str] = set()


def length_reward(prompts, completions, **_):
    """Characters of the completion / 100: varies within a group, so advantages are non-zero."""
    return [len(c) / 100.0 for c in completions]


def _bad(completions) -> bool:
    if len(completions) > BAD_ROW:  # the batch call
        _BAD_TEXTS.add(completions[BAD_ROW])
        return True
    return len(completions) == 1 and completions[0] in _BAD_TEXTS  # the row-by-row retry


def raising_reward(prompts, completions, **_):
    """Raises ``ZeroDivisionError`` on row ``BAD_ROW``; the length reward elsewhere."""
    if _bad(completions):
        raise ZeroDivisionError("fake failure on the bad row")
    return length_reward(prompts, completions)


def hanging_reward(prompts, completions, **_):
    """Sleeps ``HANG_S`` on row ``BAD_ROW`` (past ``rewards.timeout_s``); the length reward else."""
    if _bad(completions):
        time.sleep(HANG_S)
    return length_reward(prompts, completions)


def nan_reward(prompts, completions, **_):
    """NaN (unscorable) for every odd row, the length reward elsewhere."""
    return [math.nan if i % 2 else len(c) / 100.0 for i, c in enumerate(completions)]


def inf_reward(prompts, completions, **_):
    """+inf on row 0 of the batch (a reward bug that must not reach the weights)."""
    return [math.inf if i == 0 else len(c) / 100.0 for i, c in enumerate(completions)]


def process_length_reward(prompts, completions, steps, **_):
    """Process reward: one score per step, the step's length in characters / 10."""
    return [[len(s) / 10.0 for s in row] for row in steps]
