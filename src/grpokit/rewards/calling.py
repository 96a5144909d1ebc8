"""How a reward function is called: its call form, read from its signature, and async functions awaited.

**Call forms.** Told apart once per function by ``inspect.signature``:

- grpokit's (positional): ``fn(prompts, completions, **columns)``; the first two parameters are given
  by position, whatever their names (``lambda p, c, **_: ...`` works).
- TRL's (keyword): a function with a parameter named ``completions`` that can be given by keyword is
  called as TRL's ``GRPOTrainer`` calls it, ``fn(prompts=prompts, completions=completions,
  **columns)``; so ``def f(completions, **kwargs)``, ``def f(prompts, completions, **kwargs)`` and
  ``def f(completions, answer, **kwargs)`` all work (a function written in grpokit's form with these
  names binds the same either way). TRL's ``completion_ids`` and ``trainer_state`` are not passed, and
  completions are strings (TRL's standard format, not its conversational one).
- a callable whose signature cannot be read (some C functions): positional, unchecked.

A process reward gets ``steps=`` as one more keyword, in either form.

**Signature faults.** :func:`check_signature` binds the call a function will get (``inspect.Signature.bind``)
without calling it: when the reward is resolved, before any model loads (with the run's columns once
they are known), and again before each call. A function that cannot take the call is a
:class:`RewardSignatureError` whose one-line message shows the function's signature, why it does not
bind, and the expected forms. It is a fault of the recipe, not of a row: the reward guard raises it
whatever ``rewards.on_error`` says (with ``none`` every row would be unscorable and the run would
train on nothing).

**Async.** An ``async def`` function, an object whose ``__call__`` is ``async def``, or any call that
returns an awaitable: the awaitable is run to completion in an event loop of its own
(``asyncio.run``) where the call runs -- the guard's worker process or thread -- so the time limit
(``rewards.timeout_s``, which kills the worker or abandons the thread) and the fault policy
(``rewards.on_error``) are those of a sync function. After a failed batch, the row-by-row search for
the culprit calls an async function on every row at once (:meth:`RewardCall.rows`: ``asyncio.gather``,
each row cut at the same limit), rather than one row after another.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RewardCall", "RewardSignatureError", "check_signature", "call_form", "is_async", "EXPECTED_FORMS"]

EXPECTED_FORMS = (
    "expected def f(prompts, completions, **columns) -> list[float | None], or TRL's "
    "def f(completions, **kwargs) (called with keywords prompts=, completions= and one per column)"
)
"""The end of every :class:`RewardSignatureError` message."""

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class RewardSignatureError(TypeError, ValueError):
    """A reward function's signature cannot take the call it gets (message: its signature, why, and
    :data:`EXPECTED_FORMS`). A ``TypeError`` (user code of the wrong form) and a ``ValueError`` (a bad
    recipe value), so either kind of handler turns it into one line."""


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some C callables have none
        return None


def call_form(fn: Callable) -> str:
    """``"keyword"`` (TRL's form: a parameter ``completions`` that can be given by keyword) or
    ``"positional"`` (grpokit's form, and any callable whose signature cannot be read).

    >>> call_form(lambda completions, **kw: [])
    'keyword'
    >>> call_form(lambda p, c, **kw: [])
    'positional'
    """
    sig = _signature(fn)
    p = sig.parameters.get("completions") if sig is not None else None
    return "keyword" if p is not None and p.kind in _KEYWORD_KINDS else "positional"


def is_async(fn: Callable) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def`` function (or a ``functools.partial``
    of one), or an object whose ``__call__`` is ``async def``.

    >>> async def f(prompts, completions, **_): return []
    >>> is_async(f), is_async(lambda p, c: [])
    (True, False)
    """
    # the class's __call__ method itself (an async __call__ on a callable object), not a callability test
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(type(fn), "__call__", None))  # noqa: B004


def _call_args(form: str, prompts: Any, completions: Any) -> tuple[tuple, dict]:
    return ((), {"prompts": prompts, "completions": completions}) if form == "keyword" else ((prompts, completions), {})


def _signature_error(
    what: str, sig: inspect.Signature, form: str, keywords: Sequence[str], why: TypeError
) -> RewardSignatureError:
    """The error for a call ``f(prompts, completions, k=...)`` (in ``form``) that ``sig`` cannot take."""
    head = "prompts=, completions=" if form == "keyword" else "prompts, completions"
    call = f"f({head}{''.join(f', {k}=' for k in keywords)})"
    return RewardSignatureError(f"{what}: its signature f{sig} cannot take the call {call}: {why}; {EXPECTED_FORMS}")


def check_signature(
    fn: Callable, what: str, *, columns: Sequence[str] | None = None, extra: Sequence[str] = ()
) -> None:
    """Check, without calling it, that ``fn`` can take the call it will get (module docstring).

    Args:
        fn: the reward function.
        what: how messages name it (``"reward 'mod:f'"``).
        columns: the row columns it will get as keywords; None = not known yet (then a required
            parameter beyond the first two passes: it may be a column).
        extra: keywords the caller adds besides the columns (``("steps",)`` for a process reward).

    Raises:
        RewardSignatureError: ``"<what>: its signature f(...) cannot take the call f(prompts,
            completions, answer=): <why>; expected def f(prompts, completions, **columns) ..."``.

    >>> check_signature(lambda completions, **kw: [], "reward 'trl'", columns=["answer"])
    >>> check_signature(lambda text: [], "reward 'x'")
    Traceback (most recent call last):
    ...
    grpokit.rewards.calling.RewardSignatureError: reward 'x': its signature f(text) cannot take the call \
f(prompts, completions): too many positional arguments; expected def f(prompts, completions, **columns) \
-> list[float | None], or TRL's def f(completions, **kwargs) (called with keywords prompts=, completions= \
and one per column)
    """
    sig = _signature(fn)
    if sig is None:
        return
    form = call_form(fn)
    keywords = [*extra, *(columns or ())]
    args, kwargs = _call_args(form, None, None)
    kwargs.update({k: None for k in keywords})
    try:
        if columns is not None:
            sig.bind(*args, **kwargs)
        else:
            bound = sig.bind_partial(*args, **kwargs)
            for p in sig.parameters.values():  # what is left unbound must be able to come as a column
                if p.name not in bound.arguments and p.default is p.empty and p.kind is p.POSITIONAL_ONLY:
                    raise TypeError(f"missing a required positional argument: {p.name!r}")
    except TypeError as e:
        raise _signature_error(what, sig, form, keywords if columns is not None else extra, e) from None


def _run(awaitable: Any) -> Any:
    """Run ``awaitable`` to completion in an event loop of its own (in a helper thread when this
    thread already runs a loop: ``asyncio.run`` refuses to nest)."""

    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with cf.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


class RewardCall:
    """A reward function made callable as ``call(prompts, completions, **keywords)`` whatever its
    form: called in its form (:func:`call_form`), its signature bound first (a fault is a
    :class:`RewardSignatureError`), an awaitable result awaited (module docstring).

    Args:
        fn: the reward function.
        name: its name in messages.
    """

    def __init__(self, fn: Callable, name: str):
        self.fn, self.name = fn, name
        self.signature = _signature(fn)
        self.form = call_form(fn)
        self.is_async = is_async(fn)

    def _start(self, prompts: Any, completions: Any, keywords: dict[str, Any]) -> Any:
        args, kwargs = _call_args(self.form, prompts, completions)
        kwargs.update(keywords)
        if self.signature is not None:
            try:
                self.signature.bind(*args, **kwargs)
            except TypeError as e:
                raise _signature_error(
                    f"reward function {self.name!r}", self.signature, self.form, list(keywords), e
                ) from None
        return self.fn(*args, **kwargs)

    def __call__(self, prompts: Any, completions: Any, **keywords: Any) -> Any:
        """The function's result for the batch (awaited if it is awaitable).

        Raises:
            RewardSignatureError: the call does not bind to the signature. Anything the function raises.
        """
        out = self._start(prompts, completions, keywords)
        return _run(out) if inspect.isawaitable(out) else out

    def rows(
        self, prompts: Sequence[Any], completions: Sequence[Any], keywords: dict[str, Sequence[Any]], timeout_s: float
    ) -> list[tuple[str, Any]]:
        """Score each row alone (a batch of one), all rows concurrently in one event loop; each row's
        call is cut at ``timeout_s`` (cooperatively: a row that blocks the loop holds up all of them,
        which the caller's own limit covers).

        Returns:
            per row ``("ok", the function's result for the row)``, ``("error", exception)`` or
            ``("timeout", None)``.

        Raises:
            RewardSignatureError: a row's call does not bind to the signature.
        """

        async def one(i: int) -> Any:
            out = self._start(
                prompts[i : i + 1], completions[i : i + 1], {k: v[i : i + 1] for k, v in keywords.items()}
            )
            return await asyncio.wait_for(out, timeout_s) if inspect.isawaitable(out) else out

        async def every_row() -> list:
            return await asyncio.gather(*(one(i) for i in range(len(completions))), return_exceptions=True)

        results: list[tuple[str, Any]] = []
        for r in _run(every_row()):
            if isinstance(r, RewardSignatureError):
                raise r
            if isinstance(r, asyncio.TimeoutError):
                results.append(("timeout", None))
            elif isinstance(r, BaseException):
                results.append(("error", r))
            else:
                results.append(("ok", r))
        return results
