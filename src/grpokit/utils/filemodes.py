"""File modes of what grpokit writes: every file gets the mode a plain ``open(path, "w")`` gives it,
``0o666 & ~umask`` (``0o644`` under the usual umask 022), and every folder ``0o777 & ~umask``.

Writers that go through a temporary file or folder do not: ``tempfile.mkstemp``/``mkdtemp`` make
them private (``0o600``/``0o700``), and the mode stays when the temporary is renamed into place.
safetensors (0.8) saves every weight file that way, so ``model.safetensors`` and
``adapter_model.safetensors`` came out ``0o600`` while the other files of the same folder were
``0o644``. Each place that writes a model folder (a checkpoint, ``grpokit export``, ``grpokit
sft``, the packaged model's cache folder) calls :func:`honour_umask` on what it wrote before it
moves it into place.

Imports the standard library only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["current_umask", "default_mode", "honour_umask"]


def current_umask() -> int:
    """The process's umask, read from ``/proc/self/status`` where Linux shows it (no change to the
    process), else by setting it and setting it back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(is_dir: bool = False, executable: bool = False) -> int:
    """The mode ``open``/``mkdir`` give a new file (``0o666 & ~umask``; ``0o777`` before the mask
    for a folder or an executable file).

    >>> old = os.umask(0o022)
    >>> oct(default_mode()), oct(default_mode(is_dir=True)), oct(default_mode(executable=True))
    ('0o644', '0o755', '0o755')
    >>> _ = os.umask(old)
    """
    return (0o777 if is_dir or executable else 0o666) & ~current_umask()


def honour_umask(*paths: str | Path) -> None:
    """Give each path, and for a folder everything below it (links left alone), the mode of
    :func:`default_mode` (executable files keep their executable bits, under the umask).

    Raises:
        OSError: a path cannot be changed (not its owner).
    """
    file_mode, exec_mode, dir_mode = default_mode(), default_mode(executable=True), default_mode(is_dir=True)

    def fix(p: Path) -> None:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            return
        if stat.S_ISDIR(st.st_mode):
            os.chmod(p, dir_mode)
            for child in p.iterdir():
                fix(child)
        elif stat.S_ISREG(st.st_mode):
            os.chmod(p, exec_mode if st.st_mode & 0o100 else file_mode)

    for path in paths:
        fix(Path(path))
