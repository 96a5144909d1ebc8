"""Resolving ``"module:attribute"`` specs, the form in which a recipe names user code.

Recipes name reward functions (``rewards.functions``) and process reward functions
(``algo.process_reward``) either by a built-in name or as ``"package.module:function"``;
:func:`import_object` turns such a spec into the object, with one-line errors that name the spec.
Used by :mod:`grpokit.rewards.base` and :mod:`grpokit.process.wiring`.

Optional packages (the extras of ``pyproject.toml``: ``reasoning-gym``, ``torchao``, ``plots``,
``tensorboard``, ``datasets``, ``lora``) are imported only where they are used, through :func:`require`,
which turns a missing one into an ``ImportError`` naming the extra that installs it; where a run
can go on without one (the plot, the TensorBoard mirror), :func:`warn_missing` says so once.
Imports the standard library only.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Any, Callable

__all__ = ["import_object", "require", "install_hint", "warn_missing", "MissingExtraWarning"]


def import_object(spec: str, *, what: str = "object") -> Callable[..., Any]:
    """Import the callable named by ``spec``, ``"package.module:attribute"``.

    The attribute may be dotted (``"mod:Class.method"``); it must be callable.

    Args:
        spec: ``"module:attribute"``.
        what: what the spec names, for the error messages (``"reward"`` gives
            ``reward 'mod:f': cannot import module 'mod': ...``).

    Returns:
        The callable.

    Raises:
        ValueError: ``spec`` is not ``module:attribute``, the module cannot be imported, the
            attribute is missing (the message lists the module's public names) or not callable;
            every message starts with ``what`` and ``spec``.

    >>> import_object("os.path:join")("a", "b") == __import__("os").path.join("a", "b")
    True
    >>> import_object("os.path", what="reward")
    Traceback (most recent call last):
    ...
    ValueError: reward 'os.path': expected 'module:function'
    """
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise ValueError(f"{what} {spec!r}: expected 'module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{what} {spec!r}: cannot import module {module_name!r}: {e}") from e
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))
            raise ValueError(
                f"{what} {spec!r}: {module_name!r} has no attribute {attr_path!r}"
                f" (public names: {', '.join(public[:30])})"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{what} {spec!r}: {attr_path!r} is a {type(obj).__name__}, not callable")
    return obj


class MissingExtraWarning(UserWarning):
    """An optional package is missing, so a run skips what needs it (the plot, TensorBoard)."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'grpokit[extra]'``.

    >>> install_hint("plots")
    "pip install 'grpokit[plots]'"
    """
    return f"pip install 'grpokit[{extra}]'"


def _missing_message(module: str, extra: str, why: str, package: str | None, err: ImportError) -> str:
    top = module.split(".")[0]
    pkg = package or top.replace("_", "-")
    msg = f"{why} needs {pkg}, which is not installed: {install_hint(extra)}"
    if err.name not in (None, top, module):  # the package is there but one of its imports failed
        msg += f" (importing {module} failed: {err})"
    return msg


def require(module: str, *, extra: str, why: str, package: str | None = None) -> ModuleType:
    """Import ``module``, an optional dependency; if it is missing, say which extra installs it.

    Args:
        module: the module to import (``"torchao.optim"``).
        extra: the ``grpokit`` extra that installs it (``"torchao"``).
        why: what needs it, the start of the message (``"train.optimizer=adamw_8bit"``).
        package: the distribution's name when it is not the module's (``matplotlib`` ->
            ``matplotlib``, ``reasoning_gym`` -> ``reasoning-gym`` are derived).

    Returns:
        The module.

    Raises:
        ImportError: ``"<why> needs <package>, which is not installed: pip install
            'grpokit[<extra>]'"`` (chained to the original error).

    >>> require("json", extra="none", why="x").__name__
    'json'
    >>> require("no_such_module_xyz", extra="demo", why="the demo")
    Traceback (most recent call last):
    ...
    ImportError: the demo needs no-such-module-xyz, which is not installed: pip install 'grpokit[demo]'
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(_missing_message(module, extra, why, package, e), name=module) from e


_warned: set[str] = set()


def warn_missing(err: ImportError, skipped: str) -> None:
    """Warn (:class:`MissingExtraWarning`, once per process and message) that ``skipped`` is
    left out because of ``err``, an ``ImportError`` from :func:`require`."""
    msg = f"{err}; {skipped}"
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, MissingExtraWarning, stacklevel=3)
