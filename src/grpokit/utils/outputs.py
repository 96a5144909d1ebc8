"""Where grpokit writes: every output location a user names is checked before any model loads.

:func:`check_output_dir` (a run's ``train.output_dir``, the folder of ``grpokit sft``/``export``)
and :func:`check_output_file` (``grpokit eval --output``) look at the path and its nearest existing
parent, create nothing, and raise the ``OSError`` that writing there later would raise, with a
one-line message naming the key (or argument) and the path:

- ``FileExistsError``: a folder is needed and the path is a file (``grpokit sft``/``export``:
  a folder that is not empty);
- ``IsADirectoryError``: a file is needed and the path is a folder;
- ``NotADirectoryError``: a part of the path above it is a file, so nothing can be made below it;
- ``PermissionError``: the path, or the parent it would be made in, is not writable.

Imports the standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_output_dir", "check_output_file"]


def _named(key: str, path: Path) -> str:
    """``train.output_dir='runs/x'`` for a recipe key, ``--output runs/x`` / ``OUT runs/x`` for an argument."""
    return f"{key} {path}" if key.startswith("-") or key.isupper() else f"{key}={str(path)!r}"


def _check_can_create(path: Path, key: str) -> None:
    """``path`` does not exist: its nearest existing parent must be a folder this process can write in."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"{_named(key, path)}: {parent} is a file, so nothing can be made below it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{_named(key, path)}: no permission to create it in {parent}")


def check_output_dir(path: str | Path, key: str, *, empty: bool = False) -> Path:
    """``path`` as a Path, after checking that it is a folder grpokit can write into, or can be made.

    Args:
        key: the recipe key or argument that named the path (``train.output_dir``, ``OUT``), for messages.
        empty: the folder must not exist, or be empty (a model is written there as a whole).

    Raises:
        FileExistsError: the path is a file; with ``empty``, a folder that holds files.
        NotADirectoryError: a part of the path above it is a file.
        PermissionError: the folder, or the parent it would be made in, is not writable.
    """
    path = Path(path).expanduser()
    if not path.exists():
        _check_can_create(path, key)
    elif not path.is_dir():
        raise FileExistsError(f"{_named(key, path)}: is a file; a folder is needed (choose another path)")
    elif empty and any(path.iterdir()):
        raise FileExistsError(f"{_named(key, path)}: exists and is not empty; choose another folder or remove it")
    elif not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"{_named(key, path)}: no permission to write in this folder")
    return path


def check_output_file(path: str | Path, key: str) -> Path:
    """``path`` as a Path, after checking that it is a file grpokit can (over)write, or can be made
    (missing parent folders are made when it is written).

    Raises:
        IsADirectoryError: the path is a folder.
        NotADirectoryError: a part of the path above it is a file.
        PermissionError: the file, or the folder it would be made in, is not writable.
    """
    path = Path(path).expanduser()
    if not path.exists():
        _check_can_create(path, key)
    elif path.is_dir():
        raise IsADirectoryError(f"{_named(key, path)}: is a folder; name a file")
    elif not os.access(path, os.W_OK):
        raise PermissionError(f"{_named(key, path)}: no permission to write this file")
    return path
