"""Run reward functions with a time limit that always holds, and a fault policy.

A reward function is user code (or a symbolic engine) reading model-written text: it can raise, and
it can run for ever. A thread cannot bound it: CPython cannot interrupt a thread, and a call that
holds the GIL in C (a big-integer power such as ``9**9**9``, sympy simplifying a tower of
exponents) keeps the trainer's own thread from even noticing its deadline. So by default
(``isolation="process"``) every call runs in a worker process that the guard kills when the time
is up; the next call gets a fresh worker.

The worker is a ``fork`` of the trainer made at the first call and kept for later calls (the
function is not pickled, so lambdas and closures work; the trainer's ``__main__`` is not run
again, unlike ``spawn``/``forkserver``). Inside it the function runs on the main thread (so
math-verify's own signal-based time limit works there too), with SIGINT ignored (Ctrl-C stops the
trainer, which then ends the worker) and torch limited to one thread (OpenMP thread pools do not
survive a fork). The worker sees the trainer's memory as it was at the fork: a reward function
that reads state the trainer changes later, or that must run a model on the trainer's GPU, wants
``isolation="thread"`` (the former behaviour: a hung call is abandoned in its thread, and a call
holding the GIL cannot be cut off).

The function is called through :class:`~grpokit.rewards.calling.RewardCall`: in its call form
(grpokit's positional one or TRL's keywords), its signature bound first, and an ``async`` function
awaited in the worker (or thread) where the call runs, under the same limit and fault policy as a
sync one (:mod:`grpokit.rewards.calling`). A call that does not bind to the function's signature
is a :class:`~grpokit.rewards.calling.RewardSignatureError`, raised whatever ``on_error`` says.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from grpokit.rewards.calling import RewardCall, RewardSignatureError, check_signature

ISOLATIONS = ("process", "thread")


class RewardError(RuntimeError):
    """A reward function raised or timed out; the message names the function, row and cause."""


class RewardTimeout(TimeoutError):
    """A reward call ran past its limit (its worker was killed, or its thread abandoned)."""


def _serve(conn: Connection, trainer_end: Connection, trainer_pid: int, fn: Any) -> None:
    """The worker's loop: for each ``(op, args, kwargs)`` received, call ``fn(*args, **kwargs)``
    (op ``"call"``) or ``fn.rows(*args, **kwargs)`` (op ``"rows"``); send back ``("ok", result)`` or
    ``("error", exception)``; stop at EOF, ``None``, or when the trainer is gone (it may have been
    killed with SIGKILL, which runs no clean-up)."""
    trainer_end.close()  # else this process holds its own pipe open and never sees EOF
    _die_with_parent()
    if os.getppid() != trainer_pid:  # the trainer died before the line above took effect
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the trainer's stop-after-this-step handler
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    while True:
        try:
            while not conn.poll(1.0):
                if os.getppid() != trainer_pid:  # re-parented: the trainer died
                    return
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        op, args, kwargs = msg
        try:
            if op == "rows":
                reply: tuple = ("ok", [(s, _portable(v) if s == "error" else v) for s, v in fn.rows(*args, **kwargs)])
            else:
                reply = ("ok", fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - reported to the trainer, which decides
            reply = ("error", _portable(e))
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - e.g. the result cannot be pickled
            conn.send(
                (
                    "error",
                    RuntimeError(f"the reward function's result could not be sent back from its worker process: {e!r}"),
                )
            )


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies, even in the middle of a
    call that never returns (``prctl(PR_SET_PDEATHSIG)``). Elsewhere the idle loop's parent check
    is all there is."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _portable(e: BaseException) -> BaseException:
    """``e`` with the worker's traceback as a note, or a RuntimeError naming it if it cannot be
    pickled."""
    import pickle

    note = "traceback in the reward worker process:\n" + "".join(traceback.format_exception(e))
    try:
        pickle.loads(pickle.dumps(e))
        out = e
    except Exception:  # noqa: BLE001
        out = RuntimeError(f"{type(e).__name__}: {e}")
    if hasattr(out, "add_note"):  # Python >= 3.11
        out.add_note(note)
    else:
        out.__notes__ = [*getattr(out, "__notes__", []), note]  # type: ignore[attr-defined]  # 3.10 stubs lack it
    return out


class Worker:
    """One forked worker process running one function; restarted after a kill or a crash.

    ``call(timeout_s, args, kwargs)`` runs ``fn(*args, **kwargs)`` in the worker (module docstring:
    forked at the first call, kept for the next; the function is not pickled) and returns its
    result or raises its exception.

    Args:
        fn: the function (a :class:`~grpokit.rewards.calling.RewardCall` for op ``"rows"``).
        what: how messages name the worker's function (``reward``; ``tool`` for
            :mod:`grpokit.envs.tools`).

    Raises (from ``call``):
        RewardTimeout: no result within ``timeout_s`` (the worker is killed; the next call forks
            a fresh one).
        RuntimeError: the worker process died during the call.
    """

    def __init__(self, fn: Callable[..., Any], what: str = "reward"):
        self.fn, self.what = fn, what
        self.proc: BaseProcess | None = None
        self.conn: Connection | None = None

    def start(self) -> None:
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe()
        with warnings.catch_warnings():  # Python >= 3.12 warns on any fork of a threaded process;
            warnings.simplefilter("ignore", DeprecationWarning)  # the child runs one function only
            self.proc = ctx.Process(
                target=_serve,
                args=(child, parent, os.getpid(), self.fn),
                daemon=True,
                name=f"grpokit-{self.what}-worker",
            )
            self.proc.start()
        child.close()
        self.conn = parent

    def call(self, timeout_s: float, args: tuple, kwargs: dict, op: str = "call") -> Any:
        if self.proc is None or not self.proc.is_alive():
            self.close()
            self.start()
        conn = self.conn
        assert conn is not None  # set with the process, by start()
        try:
            conn.send((op, args, kwargs))
            ready = conn.poll(timeout_s)
        except (BrokenPipeError, OSError) as e:
            code = self._exitcode()
            self.close()
            raise RuntimeError(f"the {self.what} worker process exited (code {code})") from e
        if not ready:
            self.close()
            raise RewardTimeout(f"timed out after {timeout_s:g} s")
        try:
            status, payload = conn.recv()
        except (EOFError, OSError):
            code = self._exitcode()
            self.close()
            raise RuntimeError(f"the {self.what} worker process exited (code {code}) during the call") from None
        if status == "ok":
            return payload
        raise payload

    def _exitcode(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.join(1.0)
        return self.proc.exitcode

    def close(self) -> None:
        """Kill the worker (if any) and release its pipe."""
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join()
            self.proc.close()
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None


def call_in_thread(fn: Callable, timeout_s: float, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` in a helper thread, waited on for ``timeout_s`` seconds: its result,
    or what it raised; :class:`RewardTimeout` when it runs longer (the call is abandoned in its
    thread: CPython cannot stop it)."""
    pool = cf.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(fn, *args, **kwargs).result(timeout=timeout_s)
    except cf.TimeoutError:
        raise RewardTimeout(f"timed out after {timeout_s:g} s") from None
    finally:
        pool.shutdown(wait=False)  # a hung call is abandoned in its thread


ROWS_SLACK_S = 1.0
"""Seconds past ``timeout_s`` that the concurrent row search of an async function may take in all
(its rows are each cut at ``timeout_s`` inside the event loop)."""


def _the_row(value: Any) -> Any:
    """A one-row call's value: the one element of a list of one, else the value itself (the length
    check downstream then names it); a 1-D array or tensor of one counts as a list."""
    from grpokit.rewards.base import reward_values

    values = reward_values(value)
    return values[0] if values is not None and len(values) == 1 else value


def as_messages(
    prompts: list[str], completions: list[str], prompt_messages: list[Any] | None = None
) -> tuple[list[list[dict[str, str]]], list[list[dict[str, str]]]]:
    """Prompts and completions in TRL's conversational form: each completion
    ``[{"role": "assistant", "content": text}]``, each prompt its row's message list
    (``prompt_messages``, where the row gave one) or ``[{"role": "user", "content": prompt}]``.

    >>> as_messages(["2+2?"], ["4"])
    ([[{'role': 'user', 'content': '2+2?'}]], [[{'role': 'assistant', 'content': '4'}]])
    """
    msgs = [
        list(m) if m is not None else [{"role": "user", "content": p}]
        for p, m in zip(prompts, prompt_messages or [None] * len(prompts))
    ]
    return msgs, [[{"role": "assistant", "content": c}] for c in completions]


class GuardedReward:
    """Wrap a reward function ``fn(prompts, completions, **columns) -> list`` with a time limit
    and a fault policy.

    The whole batch is scored in one call limited to ``timeout_s`` seconds. If that call raises or
    times out, each row is scored alone (same limit per row) to find the culprit: with
    ``on_error="raise"`` a :class:`RewardError` names the function, the row, the start of the
    completion and the exception; with ``on_error="none"`` the failing rows score ``None``
    (unscorable) and ``self.failures`` counts them. With ``find_row=False`` (a reward server: its
    failures are the server's, not a row's) the failed batch is not searched row by row: the error
    names the batch, or all its rows score ``None``. An ``async`` function's rows are searched all at
    once (:meth:`~grpokit.rewards.calling.RewardCall.rows`, each row cut at ``timeout_s``, the whole
    search at ``timeout_s`` plus :data:`ROWS_SLACK_S`; should that limit be hit, one row after another).
    A call that does not bind to the function's signature raises
    :class:`~grpokit.rewards.calling.RewardSignatureError` whatever ``on_error`` says.

    Args:
        name: the function's name in messages (the recipe's name for it).
        fn: the reward function (any callable, sync or async, in grpokit's or TRL's call form:
            :mod:`grpokit.rewards.calling`; it is not pickled).
        timeout_s: limit per call, seconds (> 0).
        on_error: ``"raise"`` or ``"none"``.
        isolation: ``"process"`` (default): each call runs in a forked worker process, killed at
            the limit, so the limit holds whatever the function does (module docstring);
            ``"thread"``: in a thread of the trainer, abandoned at the limit (a call that holds
            the GIL cannot be cut off).
        find_row: after a failed batch, score each row alone to find the culprit (default).
        as_messages: call ``fn`` in TRL's conversational form (:func:`as_messages`), not with strings;
            None: in that form when a row of the call had its prompt as messages (a
            ``prompt_messages`` column), as TRL decides for a conversational dataset.
        extra_keywords: keywords its caller adds besides the row columns (``("steps",)`` for a
            process reward), for :meth:`check_signature`.

    Raises:
        ValueError: ``on_error``/``isolation`` not one of the choices, ``timeout_s <= 0``.

    The worker is killed by :meth:`close`, when the guard is garbage-collected, or at exit.
    """

    def __init__(
        self,
        name: str,
        fn: Callable,
        *,
        timeout_s: float = 10.0,
        on_error: str = "raise",
        isolation: str = "process",
        find_row: bool = True,
        extra_keywords: tuple[str, ...] = (),
        as_messages: bool | None = False,
    ):
        if on_error not in ("raise", "none"):
            raise ValueError(f"rewards.on_error: expected raise or none, got {on_error!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"rewards.isolation: expected one of {ISOLATIONS}, got {isolation!r}")
        if not timeout_s > 0:
            raise ValueError(f"rewards.timeout_s: must be > 0, got {timeout_s!r}")
        if isolation == "process" and "fork" not in mp.get_all_start_methods():
            raise ValueError(
                "rewards.isolation=process needs os.fork (Linux/macOS); use rewards.isolation=thread on this platform"
            )
        self.name, self.fn, self.timeout_s, self.on_error = name, fn, timeout_s, on_error
        self.isolation, self.find_row, self.extra_keywords = isolation, find_row, tuple(extra_keywords)
        self.as_messages = as_messages
        self._messages_now = bool(as_messages)  # the form of the current call (auto: per call)
        self.failures = 0
        self.caller = RewardCall(fn, name)
        self._worker = Worker(self.caller) if isolation == "process" else None
        if self._worker is not None:
            # forked now, while the trainer is small: a fork shares the parent's pages copy-on-write,
            # and a worker forked after the models load would keep a copy of every page the
            # trainer then rewrites (the weights, at each update). A replacement after a kill or
            # a crash is forked from the trainer as it is then.
            self._worker.start()

    def check_signature(self, columns: list[str] | None = None) -> None:
        """Check, without calling it, that the function can take its calls with these row ``columns``
        (and :attr:`extra_keywords`); :func:`grpokit.rewards.calling.check_signature`.

        Raises:
            RewardSignatureError: it cannot (the message shows its signature and the expected forms).
        """
        check_signature(self.fn, f"reward function {self.name!r}", columns=columns, extra=self.extra_keywords)

    def _call(self, args: tuple, kwargs: dict, op: str = "call", timeout_s: float | None = None) -> Any:
        limit = self.timeout_s if timeout_s is None else timeout_s
        if self._worker is not None:
            return self._worker.call(limit, args, kwargs, op)
        return call_in_thread(self.caller if op == "call" else self.caller.rows, limit, args, kwargs)

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list:
        texts = completions  # what messages quote
        given = columns.get("prompt_messages")
        auto = given is not None and any(m is not None for m in given)
        self._messages_now = auto if self.as_messages is None else self.as_messages
        if self._messages_now:
            prompts, completions = as_messages(prompts, completions, given)  # type: ignore[assignment]
        try:
            return self._call((prompts, completions), columns)
        except RewardSignatureError:
            raise  # the recipe's fault, not a row's: no row search, whatever on_error says
        except Exception as e:  # noqa: BLE001 - find the row below
            if not self.find_row:
                return self._batch_failed(e, len(completions))
        at_once = self._rows_at_once(prompts, completions, columns) if self.caller.is_async else None
        out = []
        for i in range(len(completions)):
            if at_once is not None:
                status, value = at_once[i]
                if status == "ok":
                    out.append(_the_row(value))
                    continue
                err = RewardTimeout(f"timed out after {self.timeout_s:g} s") if status == "timeout" else value
            else:
                row_cols = {k: v[i : i + 1] for k, v in columns.items()}
                try:
                    out.append(_the_row(self._call((prompts[i : i + 1], completions[i : i + 1]), row_cols)))
                    continue
                except RewardSignatureError:
                    raise
                except Exception as e:  # noqa: BLE001
                    err = e
            self._row_failed(i, err, texts)
            out.append(None)
        return out

    def _rows_at_once(self, prompts: list[str], completions: list[str], columns: dict) -> list | None:
        """An async function's rows scored concurrently; None when that call failed as a whole (a
        row blocked the event loop past the limit, the worker died): then rows go one by one."""
        if len(completions) < 2:
            return None
        try:
            return self._call(
                (prompts, completions, columns, self.timeout_s), {}, op="rows", timeout_s=self.timeout_s + ROWS_SLACK_S
            )
        except RewardSignatureError:
            raise
        except Exception:  # noqa: BLE001
            return None

    def _row_failed(self, i: int, e: BaseException, completions: list[str]) -> None:
        cause = str(e) if isinstance(e, RewardTimeout) else repr(e)
        if self.on_error == "raise":
            raise RewardError(
                f"reward function {self.name!r} failed on row {i} "
                f"(completion starts {completions[i][:60]!r}): {cause}. {self._advice(e)}"
            ) from (None if isinstance(e, RewardTimeout) else e)
        self.failures += 1
        return None

    def _batch_failed(self, e: Exception, n: int) -> list:
        cause = str(e) if isinstance(e, RewardTimeout) else f"{type(e).__name__}: {e}"
        if self.on_error == "raise":
            raise RewardError(
                f"reward function {self.name!r} failed on a batch of {n} completions: {cause}. {self._advice(e)}"
            ) from (None if isinstance(e, RewardTimeout) else e)
        self.failures += n
        return [None] * n

    def _advice(self, e: BaseException) -> str:
        """What to do about a failure ``e``: a function that indexes a completion as TRL's
        conversational form (``c[0]["content"]``) while it is given text is told of
        ``rewards.completions_as``; otherwise on_error's choice, for rows that may fail."""
        said, messages = str(e), self._messages_now
        wrong_form = isinstance(e, (TypeError, AttributeError, KeyError)) and (
            ("string indices must be integers" in said or "'str' object has no attribute" in said)
            if not messages
            else ("'list' object has no attribute" in said or "list indices must be integers" in said)
        )
        if wrong_form:
            now, other = ("text", "messages") if not messages else ("messages", "text")
            return (
                f"The completions it got are {now}; if it reads {other}, set rewards.completions_as={other} "
                f"(Python: overrides={{'rewards.completions_as': '{other}'}})."
            )
        return (
            "If only some rows make it fail, rewards.on_error=none scores those as unscorable "
            "instead (a function that fails on every row gives no reward to learn from)."
        )

    def close(self) -> None:
        """End the worker process, if any (a later call starts a new one)."""
        if self._worker is not None:
            self._worker.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
