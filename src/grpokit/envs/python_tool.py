"""The ``python`` tool: model-written code run in a separate, limited process.

Every call gets a fresh empty working folder (removed afterwards), a cleared environment
(``PATH``, ``HOME`` = the folder, ``LANG``), no stdin, and ``python -I`` (isolated mode: no user site,
no ``PYTHON*`` variables, the script's folder not on the path). Limits (:class:`PythonLimits`), set
with ``setrlimit`` before the code starts: CPU seconds, address space, the largest
file written, the number of processes; a wall-clock limit; the output read is cut at
``max_output_bytes``. At a limit, or when the call ends, the whole process group is killed.

Where the machine allows it (``unshare`` with mount, network and PID namespaces: root, or
unprivileged user namespaces), the code also runs in its own namespaces (``sandbox="auto"``):

- **network**: a new network namespace with no interface up: no connection leaves it;
- **files**: every mount is read-only but the working folder: the code cannot write anywhere else;
- **processes**: a PID namespace whose first process is the interpreter: when it ends, every
  process it started is killed by the kernel, whatever process group it moved to.

Without namespaces (``sandbox="none"``, or ``"auto"`` where ``unshare`` is refused) only the limits and
the process-group kill apply: **the code can then open network connections, read and write every
file the user running grpokit can, and a process that calls ``setsid`` escapes the group kill**. That
is no sandbox for untrusted code; ``sandbox="required"`` refuses to run without the namespaces.
:func:`sandbox_available` says which this machine gives.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["CPU_LIMIT_STATUS", "PythonLimits", "run_python", "sandbox_available"]

#: makes every mount read-only but the working folder ($1), then runs the rest of the arguments there
_READ_ONLY = (
    'mount --make-rprivate /; mount --bind "$1" "$1"; '
    "for m in $(awk '{print $2}' /proc/mounts | sort -u); do "
    '[ "$m" = "$1" ] || mount -o remount,bind,ro "$m" 2>/dev/null || true; done; '
    'mount -o remount,bind,rw "$1"; '
)


@dataclass(frozen=True)
class PythonLimits:
    """The limits of one ``python`` call (``rollout.env_options.python``)."""

    cpu_s: int = 5
    """CPU seconds (the kernel's SIGXCPU/SIGKILL at the limit)."""
    wall_s: float = 10.0
    """Wall-clock seconds until the process group is killed."""
    memory_mb: int = 1024
    """Address space, MiB (an allocation past it raises MemoryError in the code)."""
    file_mb: int = 16
    """The largest file the code may write, MiB."""
    processes: int = 64
    """Processes of the user, counted by the kernel (``ulimit -u``; root is exempt, the PID
    namespace and the group kill still end them)."""
    max_output_bytes: int = 20_000
    """Output (stdout and stderr together) read; the rest is cut and the process killed."""
    sandbox: str = "auto"
    """``auto``: namespaces where the machine allows them; ``none``: never; ``required``: refuse to
    run without them (module docstring)."""

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "file_mb", "processes", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"rollout.env_options.python.{name}: must be > 0, got {getattr(self, name)!r}")
        if self.sandbox not in ("auto", "none", "required"):
            raise ValueError(f"rollout.env_options.python.sandbox: auto, none or required, got {self.sandbox!r}")


@functools.lru_cache(maxsize=1)
def sandbox_available() -> bool:
    """Whether ``unshare`` gives this process mount, network and PID namespaces (probed once)."""
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--net", "--pid", "--fork", "sh", "-c", "mount --make-rprivate /"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


#: exit status of a run stopped at its CPU limit (the launcher's SIGXCPU handler)
CPU_LIMIT_STATUS = 124

#: run by the interpreter before the code: sets the limits (argv: cpu s, address space bytes, file
#: bytes, processes; the CPU limit's hard value one second later, so the soft one's SIGXCPU is
#: caught and said), then runs main.py as ``__main__``
_LAUNCH = (
    "import os, resource, runpy, signal, sys\n"
    "cpu, mem, size, procs = map(int, sys.argv[1:5])\n"
    "resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))\n"
    "for what, n in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, size),"
    " (resource.RLIMIT_NPROC, procs), (resource.RLIMIT_CORE, 0)):\n"
    "    resource.setrlimit(what, (n, n))\n"
    "def _cpu(*_):\n"
    f"    os._exit({CPU_LIMIT_STATUS})\n"
    "signal.signal(signal.SIGXCPU, _cpu)\n"
    "def _hook(kind, err, tb):  # the traceback from main.py on, without the launcher's frames\n"
    "    while tb is not None and tb.tb_frame.f_code.co_filename != 'main.py':\n"
    "        tb = tb.tb_next\n"
    "    import traceback; traceback.print_exception(kind, err, tb)\n"
    "sys.excepthook = _hook\n"
    "sys.argv = ['main.py']\n"
    "runpy.run_path('main.py', run_name='__main__')\n"
)


def _command(work: str, limits: PythonLimits, sandboxed: bool) -> list[str]:
    """The argv: a shell that (with the sandbox) makes the mounts read-only, then, in ``work`` (``$1``),
    the interpreter setting the limits (:data:`_LAUNCH`) and running the code; ``set -e``: a step that
    fails stops the call before the code runs."""
    script = f'set -e; {_READ_ONLY if sandboxed else ""}cd "$1"; shift; exec "$@"'
    numbers = [limits.cpu_s, limits.memory_mb * 2**20, limits.file_mb * 2**20, limits.processes]
    launch = [sys.executable, "-I", "-B", "-c", _LAUNCH, *(str(int(n)) for n in numbers)]
    shell = ["sh", "-c", script, "sh", work, *launch]
    return ["unshare", "--mount", "--net", "--pid", "--fork", *shell] if sandboxed else shell


def _read(proc: subprocess.Popen, limits: PythonLimits) -> tuple[bytes, str | None]:
    """``(output, why it was stopped or None)``: reads until EOF, the wall clock or the output limit."""
    assert proc.stdout is not None  # stdout=PIPE
    fd, out, deadline = proc.stdout.fileno(), bytearray(), time.monotonic() + limits.wall_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), "wall"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(out), None
        out += chunk
        if len(out) > limits.max_output_bytes:
            return bytes(out[: limits.max_output_bytes]), "output"


def run_python(code: str, limits: PythonLimits | None = None) -> tuple[str, dict[str, int]]:
    """Run ``code`` under ``limits`` (module docstring): ``(text for the model, counts)``.

    The text is the output (stdout and stderr, decoded as UTF-8 with replacement), followed by what
    ended the run when it was not a clean exit: ``error: exit status 1`` (an exception: its traceback
    is in the output), ``error: CPU time limit (5 s)``, ``error: timed out after 10 s``, ``error:
    output cut at 20000 bytes``. ``counts``: ``tool_calls`` 1, ``tool_errors`` 1 unless it exited
    with 0, ``tool_timeouts`` 1 for the CPU or wall-clock limit. Never raises for any code.

    Raises:
        RuntimeError: ``sandbox="required"`` where :func:`sandbox_available` is False.
    """
    limits = limits or PythonLimits()
    sandboxed = limits.sandbox != "none" and sandbox_available()
    if limits.sandbox == "required" and not sandboxed:
        raise RuntimeError("rollout.env_options.python.sandbox=required: this machine gives no namespaces (unshare)")
    work = tempfile.mkdtemp(prefix="grpokit-python-")
    counts = {"tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        proc = subprocess.Popen(
            _command(work, limits, sandboxed),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, killed as a whole
        )
        try:
            out, stopped = _read(proc, limits)
        finally:
            _kill_group(proc)
        text = out.decode("utf-8", errors="replace")
        status = proc.returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)
    end = _ending(stopped, status, limits)
    if end is not None:
        counts["tool_errors"] = 1
        counts["tool_timeouts"] = int(stopped == "wall" or "CPU time" in end)
        text = f"{text.rstrip()}\n{end}" if text.strip() else end
    return text.rstrip("\n"), counts


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _ending(stopped: str | None, status: int, limits: PythonLimits) -> str | None:
    if stopped == "wall":
        return f"error: timed out after {limits.wall_s:g} s"
    if stopped == "output":
        return f"error: output cut at {limits.max_output_bytes} bytes"
    if status in (CPU_LIMIT_STATUS, -signal.SIGXCPU, 128 + signal.SIGXCPU):
        return f"error: CPU time limit ({limits.cpu_s} s)"
    if status != 0:
        return f"error: exit status {status}"
    return None
