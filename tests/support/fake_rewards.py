"""Reward functions for trainer tests (``rewards.functions: [support.fake_rewards:length_reward]``).

Tiny random models never emit EOS on purpose nor solve a math problem, so trainer tests score
completions with these instead (``tests/`` is on ``pythonpath``).

The faulty ones fail on row ``BAD_ROW`` of a batch. ``GuardedReward`` retries a failing batch
row by row, one completion per call; to fail on the same row then, the batch call remembers the
bad row's text (random completions of a 49k-token vocab never repeat) in a file under
``$GRPOKIT_FAKE_REWARDS_DIR`` (else the temp folder): the guard runs each call in a worker
process and kills it at a timeout, so memory of the process would not survive to the retry.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import time
from pathlib import Path

BAD_ROW = 1
"""The row (index within the batch of one reward call) the faulty rewards below fail on."""

HANG_S = 2.0
"""How long ``hanging_reward`` sleeps on the bad row (tests use ``rewards.timeout_s=0.5``)."""


def _memo(text: str) -> Path:
    root = Path(os.environ.get("GRPOKIT_FAKE_REWARDS_DIR") or Path(tempfile.gettempdir()) / "grpokit-fake-rewards")
    root.mkdir(parents=True, exist_ok=True)
    return root / hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


def length_reward(prompts, completions, **_):
    """Characters of the completion / 100: varies within a group, so advantages are non-zero.
    With ``FAKE_REWARD_SLEEP_S`` set, each call first sleeps that long (a run slow enough to be
    killed between two checkpoints)."""
    time.sleep(float(os.environ.get("FAKE_REWARD_SLEEP_S", "0")))
    return [len(c) / 100.0 for c in completions]


def _bad(completions) -> bool:
    if len(completions) > BAD_ROW:  # the batch call
        _memo(completions[BAD_ROW]).touch()
        return True
    return len(completions) == 1 and _memo(completions[0]).exists()  # the row-by-row retry


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


def process_constant_reward(prompts, completions, steps, **_):
    """Process reward: 1.0 for every step (no group ever carries process signal)."""
    return [[1.0 for _ in row] for row in steps]


def gil_holding_reward(prompts, completions, **_):
    """A big-integer power computed in C while holding the GIL (as sympy does on ``9^{9^{9}}``):
    no thread of the same process runs until it ends, minutes later."""
    base = len(completions[0]) + 9
    return [float(len(str(base ** (10**9))))]


def exiting_reward(prompts, completions, **_):
    """Ends its process at once with exit code 3 (a crash in native code, say)."""
    os._exit(3)


def pid_reward(prompts, completions, **_):
    """The id of the process the reward runs in, for every completion."""
    return [float(os.getpid())] * len(completions)


def some_prompts_constant_reward(prompts, completions, **_):
    """0.5 for every completion of a prompt whose length is a multiple of 3 (a group with no signal:
    dynamic sampling drops it), else the completion's characters / 100 (``FAKE_REWARD_SLEEP_S`` as
    :func:`length_reward`)."""
    time.sleep(float(os.environ.get("FAKE_REWARD_SLEEP_S", "0")))
    return [0.5 if len(p) % 3 == 0 else len(c) / 100.0 for p, c in zip(prompts, completions)]


def constant_reward(prompts, completions, **_):
    """1.0 for every completion: no group varies, so a step carries no learning signal."""
    return [1.0] * len(completions)


def residue_reward(prompts, completions, **_):
    """0.3 and 0.1 + 0.2 (= 0.30000000000000004) in turn: equal up to rounding, so no group varies."""
    return [0.3 if i % 2 else 0.1 + 0.2 for i in range(len(completions))]


FAIL_MARK = "<fail>"
"""A completion holding this makes ``raising_process_reward`` raise (in its batch call and in its
row-by-row retry alike: no memory between calls is needed)."""


def raising_process_reward(prompts, completions, steps, **_):
    """Process reward: raises ``ValueError`` if a completion holds ``FAIL_MARK``; else
    ``process_length_reward``."""
    if any(FAIL_MARK in c for c in completions):
        raise ValueError("fake process-reward failure")
    return process_length_reward(prompts, completions, steps)


def bad_row_process_reward(prompts, completions, steps, **_):
    """Process reward: raises ``ZeroDivisionError`` on row ``BAD_ROW`` (as ``raising_reward``);
    ``process_length_reward`` elsewhere."""
    if _bad(completions):
        raise ZeroDivisionError("fake failure on the bad row")
    return process_length_reward(prompts, completions, steps)


# -- async and TRL-form rewards (grpokit.rewards.calling) ---------------------------------------

ROW_SLEEP_S = 0.4
"""How long each one-row call of ``async_slow_rows_reward`` sleeps (its rows are searched at once)."""


async def async_length_reward(prompts, completions, **_):
    """``length_reward`` as an ``async def`` (yields to the event loop once)."""
    import asyncio

    await asyncio.sleep(0)
    return [len(c) / 100.0 for c in completions]


class AsyncLengthReward:
    """``length_reward`` as an object whose ``__call__`` is ``async def``."""

    async def __call__(self, prompts, completions, **_):
        return await async_length_reward(prompts, completions)


async def async_raising_reward(prompts, completions, **_):
    """``raising_reward`` as an ``async def``: ``ZeroDivisionError`` on row ``BAD_ROW``."""
    if _bad(completions):
        raise ZeroDivisionError("fake failure on the bad row")
    return await async_length_reward(prompts, completions)


async def async_hanging_reward(prompts, completions, **_):
    """``hanging_reward`` as an ``async def``: awaits ``HANG_S`` on row ``BAD_ROW``."""
    import asyncio

    if _bad(completions):
        await asyncio.sleep(HANG_S)
    return await async_length_reward(prompts, completions)


async def async_slow_rows_reward(prompts, completions, **_):
    """Fails on row ``BAD_ROW`` of the batch; each one-row call awaits ``ROW_SLEEP_S`` first (a
    remote judge's latency), so a row search one row after another takes ``N * ROW_SLEEP_S``."""
    import asyncio

    if len(completions) == 1:
        await asyncio.sleep(ROW_SLEEP_S)
    return await async_raising_reward(prompts, completions)


async def async_process_length_reward(prompts, completions, steps, **_):
    """``process_length_reward`` as an ``async def``."""
    return process_length_reward(prompts, completions, steps)


def trl_length_reward(completions, **kwargs):
    """TRL's keyword form: ``length_reward``; checks that ``prompts`` came as a keyword too."""
    assert len(kwargs["prompts"]) == len(completions)
    return [len(c) / 100.0 for c in completions]


def trl_answer_reward(completions, answer, **kwargs):
    """TRL's keyword form with a named column: 1.0 if the completion ends with the answer."""
    return [float(c.strip().endswith(str(a))) for c, a in zip(completions, answer)]


def no_columns_reward(prompts, completions):
    """grpokit's form without ``**columns``: cannot take a row column such as ``answer``."""
    return [0.0] * len(completions)


def one_argument_reward(texts):
    """Neither form: one positional parameter."""
    return [0.0] * len(texts)
