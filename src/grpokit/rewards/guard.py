"""Run reward functions with a time limit and a fault policy (raise, or score as unscorable)."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Callable


class RewardError(RuntimeError):
    """A reward function raised or timed out; the message names the function, row and cause."""


def _call_with_timeout(fn: Callable, timeout_s: float, *args, **kwargs):
    pool = cf.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(fn, *args, **kwargs).result(timeout=timeout_s)
    finally:
        pool.shutdown(wait=False)  # a hung call is abandoned in its thread


class GuardedReward:
    """Wrap a reward function ``fn(prompts, completions, **columns) -> list[float | None]``.

    The whole batch is scored in one call limited to ``timeout_s`` seconds. If that call raises or
    times out, each row is scored alone (same limit per row) to find the culprit: with
    ``on_error="raise"`` a :class:`RewardError` names the function, the row, the start of the
    completion and the exception; with ``on_error="none"`` the failing rows score ``None``
    (unscorable) and ``self.failures`` counts them. A hung thread cannot be killed in Python; it is
    abandoned and its result ignored.
    """

    def __init__(self, name: str, fn: Callable, *, timeout_s: float = 10.0, on_error: str = "raise"):
        if on_error not in ("raise", "none"):
            raise ValueError(f"rewards.on_error: expected raise or none, got {on_error!r}")
        self.name, self.fn, self.timeout_s, self.on_error = name, fn, timeout_s, on_error
        self.failures = 0

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list:
        try:
            return _call_with_timeout(self.fn, self.timeout_s, prompts, completions, **columns)
        except Exception:  # noqa: BLE001 - find the row below
            pass
        out = []
        for i in range(len(completions)):
            row_cols = {k: v[i : i + 1] for k, v in columns.items()}
            try:
                value = _call_with_timeout(
                    self.fn, self.timeout_s, prompts[i : i + 1], completions[i : i + 1], **row_cols
                )
                out.append(value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value)
            except Exception as e:  # noqa: BLE001
                cause = f"timed out after {self.timeout_s:g} s" if isinstance(e, cf.TimeoutError) else repr(e)
                if self.on_error == "raise":
                    raise RewardError(
                        f"reward function {self.name!r} failed on row {i} "
                        f"(completion starts {completions[i][:60]!r}): {cause}. Set "
                        "rewards.on_error=none to score such rows as unscorable instead."
                    ) from (e if not isinstance(e, cf.TimeoutError) else None)
                self.failures += 1
                out.append(None)
        return out
