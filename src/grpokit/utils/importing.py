"""Resolving ``"module:attribute"`` specs, the form in which a recipe names user code.

Recipes name reward functions (``rewards.functions``), evaluation scorers (``eval.scorer``,
``grpokit eval --scorer``) and process reward functions (``algo.process_reward``) either by a
built-in name or by where the code is; :func:`import_object` turns such a spec into the object,
with one-line errors that name the spec and the accepted forms (:data:`SPEC_FORMS`):

- ``"package.module:function"``: a module on ``sys.path`` or in the **working directory** (as
  ``python -m`` makes it importable; ``rewards.functions=[myreward:exact]`` finds
  ``./myreward.py``). The working directory goes at the end of ``sys.path``, and only when the module
  is not found otherwise: so a file there never shadows an installed package (a ``datasets.py``
  beside the recipe does not replace Hugging Face's); name such a file by its path instead.
- ``"path/to/file.py:function"`` (``./myreward.py:exact``, an absolute path, ``~/...``): that file,
  loaded as a module named after it (its folder put at the end of ``sys.path`` too, so that it can
  import the files beside it, as ``python path/to/file.py`` can). A spec whose module part ends with
  ``.py`` or holds a ``/`` is a path; relative paths are from the working directory.

Reward worker processes are forks of the trainer, made after the specs are resolved: they see the
same ``sys.path`` and modules.
Used by :mod:`grpokit.rewards.base` and :mod:`grpokit.process.wiring`.

Optional packages (the extras of ``pyproject.toml``: ``reasoning-gym``, ``torchao``, ``plots``,
``tensorboard``, ``datasets``, ``lora``) are imported only where they are used, through :func:`require`,
which turns a missing one into an ``ImportError`` naming the extra that installs it; where a run
can go on without one (the plot, the TensorBoard mirror), :func:`warn_missing` says so once.
Imports the standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["import_object", "require", "install_hint", "warn_missing", "MissingExtraWarning", "SPEC_FORMS"]

SPEC_FORMS = (
    "accepted forms: 'module:function' (a module on sys.path or in the working directory) or 'path/to/file.py:function'"
)
"""The end of :func:`import_object`'s messages for a spec that names nothing."""


def _is_path(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def _on_path(folder: str) -> bool:
    real = os.path.realpath(folder)
    return any(os.path.realpath(p or os.curdir) == real for p in sys.path)


def _append_path(folder: str) -> None:
    if not _on_path(folder):
        sys.path.append(folder)


def _import_module(module_name: str, spec: str, what: str) -> ModuleType:
    """``importlib.import_module``, the working directory tried last (module docstring)."""
    top = module_name.split(".")[0]
    for attempt in range(2):
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name not in (top, module_name) and not module_name.startswith(f"{e.name}."):
                raise ValueError(f"{what} {spec!r}: importing module {module_name!r} failed: {e}") from e
            if attempt == 0 and not _on_path(os.getcwd()):
                _append_path(os.getcwd())
                importlib.invalidate_caches()
                continue
            raise ValueError(
                f"{what} {spec!r}: cannot import module {module_name!r}: {e} (searched sys.path "
                f"and the working directory {os.getcwd()}); {SPEC_FORMS}"
            ) from e
        except Exception as e:  # noqa: BLE001 - the user's module raised while it was imported
            raise ValueError(
                f"{what} {spec!r}: importing module {module_name!r} failed: {type(e).__name__}: {e}"
            ) from e
    raise AssertionError("unreachable")


def _load_file(file_part: str, spec: str, what: str) -> ModuleType:
    """The module of the file ``file_part`` names (module docstring); ValueError names the file."""
    path = Path(file_part).expanduser()
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not path.is_file():
        raise ValueError(f"{what} {spec!r}: no file {path}; {SPEC_FORMS}")
    name = path.stem
    known = sys.modules.get(name)
    known_file = getattr(known, "__file__", None)
    if known is not None and known_file and Path(known_file).resolve() == path:
        return known
    if not name.isidentifier() or known is not None:  # e.g. math.py: never replace a loaded module
        name = f"_grpokit_file_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}_{name}"
        if name in sys.modules:
            return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"{what} {spec!r}: {path} cannot be loaded as a Python module; {SPEC_FORMS}")
    module = importlib.util.module_from_spec(module_spec)
    _append_path(str(path.parent))
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
    try:
        module_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[name]
        if not isinstance(e, Exception):
            raise
        raise ValueError(f"{what} {spec!r}: importing {path} failed: {type(e).__name__}: {e}") from e
    return module


def import_object(spec: str, *, what: str = "object") -> Callable[..., Any]:
    """Import the callable named by ``spec``: ``"package.module:attribute"`` (a module on
    ``sys.path`` or in the working directory) or ``"path/to/file.py:attribute"`` (module docstring).

    The attribute may be dotted (``"mod:Class.method"``); it must be callable.

    Args:
        spec: ``"module:attribute"`` or ``"path/to/file.py:attribute"`` (the last ``:`` splits).
        what: what the spec names, for the error messages (``"reward"`` gives
            ``reward 'mod:f': cannot import module 'mod': ...``).

    Returns:
        The callable.

    Raises:
        ValueError: ``spec`` has neither form, the module or file cannot be found (the message
            gives the accepted forms, :data:`SPEC_FORMS`) or raised while it was imported, the
            attribute is missing (the message lists the module's public names) or not callable;
            every message starts with ``what`` and ``spec``.

    >>> import_object("os.path:join")("a", "b") == __import__("os").path.join("a", "b")
    True
    >>> import_object("os.path", what="reward")
    Traceback (most recent call last):
    ...
    ValueError: reward 'os.path': expected 'module:function' or 'path/to/file.py:function'
    """
    from grpokit.utils.given import given_object, is_given

    if is_given(spec):  # a Python object given to grpokit's API (grpokit.utils.given)
        return given_object(spec, what=what)
    module_name, _, attr_path = spec.rpartition(":")
    if not module_name or not attr_path:
        raise ValueError(f"{what} {spec!r}: expected 'module:function' or 'path/to/file.py:function'")
    module = _load_file(module_name, spec, what) if _is_path(module_name) else _import_module(module_name, spec, what)
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))
            where = getattr(module, "__file__", None)
            raise ValueError(
                f"{what} {spec!r}: {module_name!r}{f' ({where})' if where else ''} has no attribute "
                f"{attr_path!r} (public names: {', '.join(public[:30])})"
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
