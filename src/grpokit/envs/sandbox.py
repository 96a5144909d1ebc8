"""The isolation of the ``python`` tool: bubblewrap (``bwrap``, the sandbox Flatpak uses) and a
per-call user id. Standard library only.

:func:`bwrap_command` builds the argv that runs a program in new user, mount, PID, network, IPC and
UTS namespaces (``--unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts``), with

- **files**: an empty root, read-only binds of ``/usr``, the ``/bin`` ``/lib`` links, a few files of
  ``/etc`` the loader reads, and the interpreter's prefixes (a virtualenv: read only); a fresh
  ``/proc`` of the call's own PID namespace; a minimal ``/dev``; the call's folder
  :data:`WORK` a ``tmpfs`` of ``disk_mb`` (the call's whole disk budget; it vanishes with the
  namespace); the root remounted read-only. No path of the host's file system but these;
- **no capabilities**: run by an ordinary user, bwrap makes its own user namespace and refuses
  nested ones (``--disable-userns``); run by root, it drops every capability but the three that
  ``setpriv`` uses to become a fresh unprivileged user id (:func:`call_uid`) with empty capability
  and bounding sets before the code starts (mounts made by root stay locked read-only for it);
  ``no_new_privs`` either way;
- **processes**: bwrap's init is the namespace's first process; when the code's process ends, it
  ends and the kernel kills every process left in the namespace (``setsid`` or not);
  ``--die-with-parent`` ends it with the trainer.

:func:`isolation_problem` probes once whether this machine runs it (None) or why not.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["WORK", "bwrap_command", "call_uid", "isolation_problem"]

#: the call's folder inside the sandbox (its working directory, HOME and TMPDIR)
WORK = "/sandbox"

#: /etc files the dynamic loader and Python read (bound read-only where they exist)
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")

#: per-call user ids for a trainer running as root: no account uses them
_UID_BASE, _UID_SPAN = 1_500_000_000, 500_000_000
_calls = itertools.count()


def call_uid() -> int | None:
    """The host user id a call runs as: a fresh one per call when grpokit runs as root (so the
    kernel's process count is the call's own and the code holds no root identity), else None (the
    user's own id, mapped into the sandbox's user namespace)."""
    if os.geteuid() != 0:
        return None
    return _UID_BASE + (os.getpid() * 7919 + next(_calls)) % _UID_SPAN


def _binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += [a for p in _ETC if os.path.exists(p) for a in ("--ro-bind", p, p)]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    prefixes.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    made: set[str] = set()
    for p in sorted(prefixes):
        if p and p != "/" and not p.startswith("/usr/") and p != "/usr" and os.path.isdir(p):
            parents = [q for q in _ancestors(p) if q not in made]
            made.update(parents)  # searchable by the per-call user (the host's /root is not)
            args += [a for q in parents for a in ("--perms", "0755", "--dir", q)]
            args += ["--ro-bind", p, p]
    return args


def _ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a", "/a/b"]``."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def bwrap_command(argv_in: list[str], *, disk_mb: int, env: dict[str, str], code_fd: int) -> list[str]:
    """The argv running ``argv_in`` in the sandbox (module docstring), in :data:`WORK`, with the
    environment ``env`` only, and the file ``main.py`` there read from descriptor ``code_fd``
    (which the caller passes to the child). As root, ``argv_in`` runs behind ``setpriv`` as :func:`call_uid`.

    Raises:
        RuntimeError: ``bwrap`` (or, as root, ``setpriv``) is not on the PATH.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RuntimeError("bwrap (bubblewrap) is not installed")
    uid = call_uid()
    cmd = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if uid is None:  # unprivileged: bwrap's own user namespace, no nested one
        cmd += ["--unshare-user", "--disable-userns"]
    else:  # root: bwrap sets up the mounts with root's access and keeps no capability but the
        # three setpriv needs (SETPCAP: to empty the bounding set), which leaves them with root's
        # user id before the code starts
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        argv = [_setpriv(), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
        argv += ["--bounding-set=-all", "--", *argv_in]
    cmd += ["--hostname", "sandbox", "--die-with-parent", "--new-session", *_binds(), "--proc", "/proc"]
    cmd += ["--dev", "/dev", "--perms", "1777", "--size", str(1 << 20), "--tmpfs", "/dev/shm"]
    cmd += ["--perms", "1777", "--size", str(int(disk_mb) << 20), "--tmpfs", WORK]
    cmd += ["--perms", "0644", "--file", str(code_fd), f"{WORK}/main.py"]
    cmd += ["--remount-ro", "/", "--chdir", WORK, "--clearenv"]
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    return [*cmd, "--", *(argv_in if uid is None else argv)]


def _setpriv() -> str:
    setpriv = shutil.which("setpriv")
    if setpriv is None or not setpriv.startswith("/usr/"):
        raise RuntimeError("setpriv (util-linux) is not installed in /usr: needed to leave root in the sandbox")
    return setpriv


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """None where :func:`bwrap_command` runs this interpreter here (probed once, ~50 ms), else
    what stops it (bwrap missing, user namespaces refused, the interpreter unreadable to the
    per-call user), in one line."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bwrap (bubblewrap) is not installed: apt-get install bubblewrap (Debian/Ubuntu), dnf install bubblewrap"
    with tempfile.TemporaryFile() as code:
        code.write(b"print('ok')")
        code.seek(0)
        try:
            argv = [sys.executable, "-I", "-S", "main.py"]
            done = subprocess.run(
                bwrap_command(argv, disk_mb=1, env={"PATH": "/usr/bin:/bin"}, code_fd=code.fileno()),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=20,
                pass_fds=(code.fileno(),),
            )
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            return f"bwrap did not start: {e}"
    if done.returncode != 0 or done.stdout.strip() != b"ok":
        why = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
        return f"bwrap failed here: {why[-1] if why else f'exit status {done.returncode}'}"
    return None
