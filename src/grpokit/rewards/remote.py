"""A reward server as a reward function (``rewards.functions: ["http://HOST:PORT/PATH"]``).

The JSON contract (one POST per batch of completions, ``Content-Type: application/json``)::

    request:  {"prompts":     ["question 1", ...],            # N strings, the row's question
               "completions": ["completion 1", ...],          # N strings
               "columns":     {"answer": ["42", ...], ...}}   # every other column of the rows, N each
    reply:    {"rewards": [1.0, 0.0, null, ...]}               # N numbers or nulls (or the bare list)

``null`` means "cannot score this completion" (as ``None`` from a local reward function). Values that
JSON cannot hold in a column are sent as their ``str()``.

Failures: an HTTP 5xx reply, a refused or dropped connection, or a timed-out request is retried
after ``backoff_s``, then ``2 * backoff_s``, ..., at most ``retries`` times and never past the call's
deadline (``timeout_s`` from the first attempt: the run's ``rewards.timeout_s``); every request's
socket timeout is the time left, so nothing waits past the deadline. A 4xx reply is not retried.
When the attempts are used up, or the reply is malformed (not JSON, not a list of N numbers/nulls),
the call raises :class:`RemoteRewardError` naming the URL and what was wrong; the reward guard then
applies ``rewards.on_error`` as for any reward function (stop the run, or score the batch None).
"""

from __future__ import annotations

import json
import math
import numbers
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

__all__ = ["RemoteReward", "RemoteRewardError", "is_remote"]


class RemoteRewardError(RuntimeError):
    """A reward server failed or replied with something that is not one score per completion."""


def is_remote(name: str) -> bool:
    """Whether a ``rewards.functions`` entry names a reward server (``http://`` or ``https://``)."""
    return name.startswith(("http://", "https://"))


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v, allow_nan=False)
        return v
    except (TypeError, ValueError):
        return str(v)


def parse_reply(url: str, body: bytes, n: int) -> list[float | None]:
    """The scores in a server's reply body; :class:`RemoteRewardError` says what is wrong.

    >>> parse_reply("http://x", b'{"rewards": [1, null, 0.5]}', 3)
    [1.0, None, 0.5]
    """
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RemoteRewardError(f"reward server {url}: reply is not JSON ({e}): {body[:200]!r}") from None
    values = data.get("rewards") if isinstance(data, dict) else data
    if not isinstance(values, list):
        raise RemoteRewardError(f'reward server {url}: expected {{"rewards": [...]}} or a list, got {body[:200]!r}')
    if len(values) != n:
        raise RemoteRewardError(f"reward server {url}: {len(values)} rewards for {n} completions")
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
        elif isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)):
            out.append(float(v))
        else:
            raise RemoteRewardError(f"reward server {url}: reward {i} is {v!r}, expected a number or null")
    return out


class RemoteReward:
    """POST a batch to a reward server and read one score or null per completion.

    Args:
        url: ``http(s)://HOST:PORT/PATH``.
        timeout_s: deadline of one call, all attempts included (> 0).
        retries: extra attempts after a 5xx, a connection error or a timed-out request (>= 0).
        backoff_s: wait before the first retry, doubled before each next one (>= 0).

    Raises:
        ValueError: a URL that is not http(s), ``timeout_s <= 0``, ``retries < 0``, ``backoff_s < 0``.
    """

    def __init__(self, url: str, *, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.5):
        if not is_remote(url):
            raise ValueError(f"reward server {url!r}: expected an http:// or https:// URL")
        if not timeout_s > 0 or retries < 0 or backoff_s < 0:
            raise ValueError(
                f"reward server {url}: need timeout_s > 0, retries >= 0, backoff_s >= 0 "
                f"(got {timeout_s}, {retries}, {backoff_s})"
            )
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, retries, backoff_s
        self.__name__ = url
        self.isolation = "thread"  # network I/O: socket timeouts bound it, no forked worker needed

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float | None]:
        """Scores of ``completions`` (one per completion, None = unscorable).

        Raises:
            RemoteRewardError: attempts used up (names the last failure) or a malformed reply.
        """
        n = len(completions)
        body = json.dumps(
            {
                "prompts": list(prompts),
                "completions": list(completions),
                "columns": {k: [_jsonable(v) for v in vals] for k, vals in columns.items()},
            },
            allow_nan=False,
        ).encode()
        deadline = time.monotonic() + self.timeout_s
        last = "no attempt"
        for attempt in range(self.retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            request = urllib.request.Request(
                self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=left) as reply:
                    return parse_reply(self.url, reply.read(), n)
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} {e.reason}"
                if e.code < 500:
                    raise RemoteRewardError(f"reward server {self.url}: {last} (not retried)") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            wait = self.backoff_s * 2**attempt
            if attempt == self.retries or time.monotonic() + wait >= deadline:
                break
            time.sleep(wait)
        raise RemoteRewardError(
            f"reward server {self.url}: no reply with scores within {self.timeout_s:g} s "
            f"({attempt + 1} attempt(s); last: {last})"
        )
