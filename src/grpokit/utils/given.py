"""Python objects given to the library API (:mod:`grpokit.api`) where a recipe holds a name.

A recipe names user code and data by strings (``rewards.functions``, ``algo.process_reward``,
``rollout.env``, the ``tools`` environment's tools, ``data.dataset``, ``eval.dataset``) so that it can
be written to a file, checked on resume and run again from the command line. The API takes the
objects themselves (a function, a ``functools.partial``, a bound method, an object with
``__call__``, an environment class or instance, a list of rows) and puts them here under a name of
the form ``obj:NAME`` (:data:`PREFIX`); the recipe holds that name. Every place that resolves a
name asks this table first: :func:`grpokit.utils.importing.import_object` for callables and classes,
:func:`grpokit.data.load_rows` for rows. The table is this process's: reward and tool worker
processes are forks of it (:mod:`grpokit.rewards.guard`) and see the same objects without pickling
them, lambdas and closures included.

A name of the table that is not filled (a run folder of an API run resumed from the command line)
raises a ``ValueError`` that says where the name came from and what to do.

Imports the standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["PREFIX", "is_given", "give", "given_label", "given_object", "given_rows", "forget"]

PREFIX = "obj:"
"""The prefix of a name this table resolves (``obj:my_reward``)."""

_OBJECTS: dict[str, Any] = {}
_ROWS: dict[str, list[dict[str, Any]]] = {}
_LOCK = threading.Lock()


def is_given(name: str) -> bool:
    """Whether ``name`` has this table's form (``obj:NAME``), filled or not.

    >>> is_given("obj:exact"), is_given("mymod:exact")
    (True, False)
    """
    return isinstance(name, str) and name.startswith(PREFIX)


def given_label(name: str) -> str:
    """How messages name a dataset: rows given to the API as the argument that gave them (``rows=``,
    ``eval_rows=``), anything else as itself.

    >>> given_label("obj:data-rows-0123456789"), given_label("obj:eval-rows-0123456789"), given_label("gsm8k")
    ('rows=', 'eval_rows=', 'gsm8k')
    """
    if is_given(name):
        if name.startswith(PREFIX + "data-rows-"):
            return "rows="
        if name.startswith(PREFIX + "eval-rows-"):
            return "eval_rows="
    return name


def _check_label(label: str) -> str:
    if not label or ":" in label or any(c.isspace() for c in label):
        raise ValueError(f"object name {label!r}: give a non-empty name without ':' or spaces")
    return PREFIX + label


def give(label: str, obj: Any = None, *, rows: list[dict[str, Any]] | None = None) -> str:
    """Put ``obj`` (a callable or class), or ``rows`` (a list of dicts), under ``obj:<label>``;
    returns that name. A second object under the same label replaces the first (a notebook cell
    run again).

    Raises:
        ValueError: ``label`` is empty or holds ``:`` or spaces; both or neither of ``obj`` and ``rows``.
    """
    name = _check_label(label)
    if (obj is None) == (rows is None):
        raise ValueError(f"{name}: give either an object or rows")
    with _LOCK:
        if rows is not None:
            _ROWS[name] = rows
        else:
            _OBJECTS[name] = obj
    return name


def _missing(name: str, what: str, known: dict[str, Any]) -> ValueError:
    have = ", ".join(sorted(known)) or "none"
    return ValueError(
        f"{what} {name!r}: a Python object given to grpokit's API (grpokit.Trainer), not given in this process "
        f"(given here: {have}); pass the object again to grpokit.Trainer, or name an importable module:function "
        "or a dataset file in the recipe"
    )


def given_object(name: str, *, what: str = "object") -> Callable[..., Any]:
    """The object given under ``name`` (``obj:NAME``).

    Raises:
        ValueError: nothing given under ``name`` in this process (the message names ``what``, the name
            and the fix).
    """
    with _LOCK:
        if name in _OBJECTS:
            return _OBJECTS[name]
        raise _missing(name, what, _OBJECTS)


def given_rows(name: str) -> list[dict[str, Any]]:
    """A copy of each row given under ``name`` (the loaders may add columns to the rows they return).

    Raises:
        ValueError: no rows given under ``name`` in this process.
    """
    with _LOCK:
        if name in _ROWS:
            return [dict(r) for r in _ROWS[name]]
        raise _missing(name, "dataset", _ROWS)


def forget(name: str) -> None:
    """Drop ``name`` from the table (nothing if absent)."""
    with _LOCK:
        _OBJECTS.pop(name, None)
        _ROWS.pop(name, None)
