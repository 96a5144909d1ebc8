"""Reward-function protocol, registry and weighted combination.

Protocol (TRL style): a reward function is a plain callable
``fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]``; every
column (``answer=[...]``, ...) is a list aligned with ``completions``; ``None`` means "cannot
score this sample" (left out of the group statistics downstream). TRL's keyword form
(``def f(completions, **kwargs)``, called ``f(prompts=..., completions=..., **columns)``) and
``async def`` functions are accepted too; the signature is checked when the function is resolved,
before any model loads (:mod:`grpokit.rewards.calling`).

Decisions (pinned by tests/rewards/test_registry.py):

- NaN returned by a reward function is turned into ``None`` (both mean "unscorable").
- The total is ``sum(weight * reward)``; it is ``None`` if any component with a non-zero weight is
  ``None``. Components with weight 0 are still computed (for logging) but never affect the total.
- A function without an entry in ``weights`` gets weight 1.0; a weight for a name that is not
  a function is an error.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from grpokit.rewards.calling import RewardCall, RewardSignatureError, check_signature
from grpokit.utils.importing import import_object, require

__all__ = [
    "RewardFunction",
    "BUILTIN_REWARDS",
    "register_reward",
    "get_reward_function",
    "compute_rewards",
]


@runtime_checkable
class RewardFunction(Protocol):
    """``fn(prompts, completions, **columns) -> list[float | None]`` (one value per completion)."""

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]: ...


BUILTIN_REWARDS: dict[str, str | Callable[..., list[float | None]]] = {
    "math_correct": "grpokit.rewards.math:math_correct",
    "format": "grpokit.rewards.format:format_reward",
    "answer_line": "grpokit.rewards.format:answer_line_format",
    "number_at_end": "grpokit.rewards.format:number_at_end",
    "reasoning_gym": "grpokit.data.reasoning_gym:reasoning_gym_score",
}
"""Built-in names -> ``"module:function"`` (imported on first use) or a callable."""

_BUILTIN_EXTRAS: dict[str, tuple[str, str]] = {"reasoning_gym": ("reasoning_gym", "reasoning-gym")}
"""Built-in names whose function needs an optional package: name -> ``(module, extra)``; checked when
the name is resolved, so a missing package stops the run before any model loads."""


def register_reward(name: str, fn: str | Callable[..., list[float | None]]) -> None:
    """Register ``name`` for :func:`get_reward_function` (a callable or a ``"module:function"``).

    Raises:
        ValueError: if ``name`` contains ``:`` (reserved for import specs) or is already taken.
    """
    if ":" in name:
        raise ValueError(f"reward name {name!r} must not contain ':'")
    if name in BUILTIN_REWARDS:
        raise ValueError(f"reward name {name!r} is already registered")
    BUILTIN_REWARDS[name] = fn


def get_reward_function(name: str) -> Callable[..., list[float | None]]:
    """Resolve a reward function by built-in name or import spec, and check its signature.

    Args:
        name: a key of :data:`BUILTIN_REWARDS` (``math_correct``, ``format``, ``answer_line``,
            ``number_at_end``, ``reasoning_gym``), ``"package.module:function"`` (a module on
            ``sys.path`` or in the working directory; dotted attributes such as
            ``"mod:Class.method"`` work too) or ``"path/to/file.py:function"``
            (:func:`grpokit.utils.importing.import_object`).

    Returns:
        The callable.

    Raises:
        ValueError: unknown name (lists the built-ins), module not importable, attribute
            missing, or not callable -- each message names ``name``.
        RewardSignatureError: a ``TypeError``: its signature cannot take
            ``(prompts, completions, **columns)`` in either call form
            (:func:`grpokit.rewards.calling.check_signature`; the message shows the expected forms).
        ImportError: a built-in reward's optional package is missing (``reasoning_gym`` needs
            ``grpokit[reasoning-gym]``); the message names the extra.
    """
    if name in BUILTIN_REWARDS:
        target = BUILTIN_REWARDS[name]
        if name in _BUILTIN_EXTRAS:
            module, extra = _BUILTIN_EXTRAS[name]
            require(module, extra=extra, why=f"reward {name!r}")
        fn = import_object(target, what="reward") if isinstance(target, str) else target
    elif ":" in name:
        fn = import_object(name, what="reward")
    else:
        raise ValueError(
            f"unknown reward {name!r}; built-in rewards: {', '.join(sorted(BUILTIN_REWARDS))};"
            " or give 'module:function' or 'path/to/file.py:function'"
        )
    check_signature(fn, f"reward {name!r}")
    return fn


def reward_values(out: Any) -> list[Any] | None:
    """A reward's output as a list: a list or tuple, or a one-dimensional numpy array or torch tensor
    (``.tolist()``); None for anything else."""
    if isinstance(out, (list, tuple)):
        return list(out)
    tolist = getattr(out, "tolist", None)
    if callable(tolist) and getattr(out, "ndim", None) == 1:
        values = tolist()
        return values if isinstance(values, list) else None
    return None


def _check_output(name: str, out: Any, n: int) -> list[float | None]:
    """``out`` as ``n`` floats or None: numbers, bools (1.0/0.0), numpy and torch scalars, None and NaN
    (unscorable) accepted, as TRL takes them.

    Raises:
        ValueError: not a list (or 1-D array/tensor), a wrong length, or a value that is not a number
            (names the reward function and the index)."""
    values = reward_values(out)
    if values is None:
        shape = getattr(out, "shape", None)
        got = f"{type(out).__name__} of shape {tuple(shape)}" if shape is not None else type(out).__name__
        raise ValueError(f"reward {name!r} returned {got}; expected a list (or 1-D array) of {n} numbers")
    if len(values) != n:
        raise ValueError(f"reward {name!r} returned {len(values)} values for {n} completions")
    clean: list[float | None] = []
    for i, v in enumerate(values):
        if getattr(v, "ndim", None) == 0 and callable(getattr(v, "item", None)):
            v = v.item()  # a numpy or torch scalar
        if v is None:
            clean.append(None)
        elif isinstance(v, numbers.Real):  # bool included: True is 1.0
            f = float(v)
            clean.append(None if math.isnan(f) else f)
        else:
            raise ValueError(
                f"reward {name!r} returned {v!r} ({type(v).__name__}) at index {i}; expected a number or None"
            )
    return clean


def compute_rewards(
    funcs: Mapping[str, Callable[..., Sequence[float | None]]],
    weights: Mapping[str, float],
    prompts: list[str],
    completions: list[str],
    columns: Mapping[str, list[Any]],
) -> tuple[list[float | None], dict[str, list[float | None]]]:
    """Call every reward function and combine them into one weighted reward per completion.

    Args:
        funcs: name -> reward function.
        weights: name -> weight; missing names get 1.0.
        prompts: prompts aligned with ``completions`` (a prompt repeated G times for its group).
        completions: the completions, ``N`` of them.
        columns: extra per-sample columns passed as keyword arguments (``answer=[...]``), each a
            list of length ``N``.

    Returns:
        ``(total, per_function)``: ``total[i] = sum_k weights[k] * r_k[i]`` (None if any
        component with non-zero weight is None); ``per_function[name]`` the validated outputs
        (NaN turned into None).

    Each function is called in its call form, an ``async`` one awaited
    (:class:`grpokit.rewards.calling.RewardCall`).

    Raises:
        ValueError: no functions; a weight for an unknown name; misaligned prompts/columns;
            a function returning a non-list, a wrong length or a non-number (names the function).
        RewardSignatureError: a function's signature cannot take the call (as it is).
        RuntimeError: a reward function raised (chained; names the function).

    >>> total, parts = compute_rewards(
    ...     {"a": lambda p, c, **_: [1.0, None], "b": lambda p, c, **_: [0.5, 0.5]},
    ...     {"b": 2.0}, ["q", "q"], ["x", "y"], {})
    >>> total, parts["b"]  # 1.0*1.0 + 2.0*0.5 = 2.0; None poisons the second
    ([2.0, None], [0.5, 0.5])
    """
    if not funcs:
        raise ValueError("compute_rewards: no reward functions given")
    unknown = sorted(set(weights) - set(funcs))
    if unknown:
        raise ValueError(f"compute_rewards: weights for unknown reward(s) {unknown}; functions: {sorted(funcs)}")
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"compute_rewards: {len(prompts)} prompts for {n} completions")
    for col, values in columns.items():
        if len(values) != n:
            raise ValueError(f"compute_rewards: column {col!r} has {len(values)} values, expected {n}")

    per_function: dict[str, list[float | None]] = {}
    for name, fn in funcs.items():
        try:
            out = RewardCall(fn, name)(prompts, completions, **columns)
        except RewardSignatureError:
            raise
        except Exception as e:
            if type(e).__name__ == "RewardError":  # a guarded function's own message names it and the row
                raise
            raise RuntimeError(f"reward {name!r} raised {type(e).__name__}: {e}") from e
        per_function[name] = _check_output(name, out, n)

    total: list[float | None] = []
    for i in range(n):
        acc = 0.0
        for name, values in per_function.items():
            w = float(weights.get(name, 1.0))
            if w == 0.0:
                continue
            v = values[i]
            if v is None:  # one unscorable term: the row is unscorable
                total.append(None)
                break
            acc += w * v
        else:
            total.append(acc)
    return total, per_function
