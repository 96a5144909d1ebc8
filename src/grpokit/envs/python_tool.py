"""The ``python`` tool: model-written code run in a separate, limited process.

Every call gets a fresh folder holding only ``main.py``, a cleared environment (``PATH``, ``HOME``
= the folder, ``LANG``), no stdin, and ``python -I`` (isolated mode: no user site, no ``PYTHON*``
variables). Limits (:class:`PythonLimits`) hold for the **whole call**, all its processes together:
CPU seconds, resident memory, processes, disk written, a wall clock and the output read. A monitor
samples the call's processes every :data:`TICK_S` (CPU time of the living ones and of those they
reaped; anonymous resident memory) and kills the call past a limit; each process also gets
``setrlimit`` bounds (CPU, address space, file size, processes) that stop it by itself. At a limit,
or when the call ends, every process of the call is killed.

With ``sandbox="auto"`` (the default) or ``"required"`` the code runs in bubblewrap
(:mod:`grpokit.envs.sandbox`): no path of the host's file system but read-only system and Python
files and its own ``tmpfs`` folder of ``disk_mb``; its own ``/proc``, PID, network (no interface but
loopback), IPC and UTS namespaces; no capabilities and no nested user namespaces; as root, a fresh
unprivileged user id per call. Where bwrap is missing or refused, ``"auto"`` says so once (a
warning) and applies the limits only: **the code can then read and write every file the user
running grpokit can, open connections, and a process that calls ``setsid`` outlives the call**;
``"required"`` refuses (:func:`check_sandbox`, called when the environment is built, before any
model loads). :func:`sandbox_available` says which this machine gives.
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
import warnings
from dataclasses import dataclass

from grpokit.envs.sandbox import WORK, bwrap_command, isolation_problem

__all__ = ["CPU_LIMIT_STATUS", "PythonLimits", "check_sandbox", "run_python", "sandbox_available"]

#: how often the monitor samples a call's processes, seconds
TICK_S = 0.01


@dataclass(frozen=True)
class PythonLimits:
    """The limits of one ``python`` call (``rollout.env_options.python``), each for the whole call."""

    cpu_s: int = 5
    """CPU seconds of all the call's processes together."""
    wall_s: float = 10.0
    """Wall-clock seconds until every process of the call is killed."""
    memory_mb: int = 1024
    """Resident (anonymous) memory of all its processes together, MiB; also each process's address
    space (an allocation past it raises MemoryError in the code)."""
    file_mb: int = 16
    """The largest file the code may write, MiB."""
    disk_mb: int = 64
    """All the files the call writes together, MiB (the sandbox's ``tmpfs``; without it, the
    folder's size as the monitor samples it)."""
    processes: int = 64
    """Processes (and threads) living at once."""
    max_output_bytes: int = 20_000
    """Output (stdout and stderr together) read; the rest is cut and the call killed."""
    sandbox: str = "auto"
    """``auto``: bubblewrap where it runs, else the limits only (warned once); ``none``: the limits
    only; ``required``: refuse to run without it (module docstring)."""

    def __post_init__(self) -> None:
        names = ("cpu_s", "wall_s", "memory_mb", "file_mb", "disk_mb", "processes", "max_output_bytes")
        for name in names:
            if not getattr(self, name) > 0:
                raise ValueError(f"rollout.env_options.python.{name}: must be > 0, got {getattr(self, name)!r}")
        if self.sandbox not in ("auto", "none", "required"):
            raise ValueError(f"rollout.env_options.python.sandbox: auto, none or required, got {self.sandbox!r}")


def sandbox_available() -> bool:
    """Whether bubblewrap runs this interpreter here (:func:`grpokit.envs.sandbox.isolation_problem`)."""
    return isolation_problem() is None


def check_sandbox(limits: PythonLimits) -> bool:
    """Whether calls under ``limits`` run in the sandbox; with ``auto`` where it does not, warns once.

    Raises:
        RuntimeError: ``sandbox="required"`` where it does not run (the message says why).
    """
    if limits.sandbox == "none":
        return False
    problem = isolation_problem()
    if problem is not None and limits.sandbox == "required":
        raise RuntimeError(f"rollout.env_options.python.sandbox=required: {problem}")
    if problem is not None:
        _warn_once(problem)
    return problem is None


@functools.lru_cache(maxsize=1)
def _warn_once(problem: str) -> None:
    msg = (
        f"grpokit: the python tool runs WITHOUT A SANDBOX ({problem}); only its limits apply: the "
        "model's code can read and write your files and reach the network (sandbox: required refuses)"
    )
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    print(msg, file=sys.stderr, flush=True)


#: exit status of a run stopped at its CPU limit (the launcher's SIGXCPU handler)
CPU_LIMIT_STATUS = 124

#: run by the interpreter before the code: sets the per-process limits (argv: cpu s, address space
#: bytes, file bytes, processes; the CPU limit's hard value one second later, so the soft one's
#: SIGXCPU is caught and said), then runs main.py as ``__main__``
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


def _launch(limits: PythonLimits) -> list[str]:
    numbers = [limits.cpu_s, limits.memory_mb * 2**20, limits.file_mb * 2**20, limits.processes]
    return [sys.executable, "-I", "-B", "-c", _LAUNCH, *(str(int(n)) for n in numbers)]


def run_python(code: str, limits: PythonLimits | None = None) -> tuple[str, dict[str, int]]:
    """Run ``code`` under ``limits`` (module docstring): ``(text for the model, counts)``.

    The text is the output (stdout and stderr, decoded as UTF-8 with replacement), followed by what
    ended the run when it was not a clean exit: ``error: exit status 1`` (an exception: its traceback
    is in the output), ``error: CPU time limit (5 s)``, ``error: timed out after 10 s``, ``error:
    output cut at 20000 bytes``, ``error: memory limit (1024 MiB)``, ``error: process limit (64)``,
    ``error: disk limit (64 MiB)``. ``counts``: ``tool_calls`` 1, ``tool_errors`` 1 unless it exited
    with 0, ``tool_timeouts`` 1 for the CPU or wall-clock limit. Never raises for any code.

    Raises:
        RuntimeError: ``sandbox="required"`` where the sandbox does not run (:func:`check_sandbox`).
    """
    limits = limits or PythonLimits()
    sandboxed = check_sandbox(limits)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    counts = {"tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}
    host_dir = None if sandboxed else tempfile.mkdtemp(prefix="grpokit-python-")
    fds: tuple[int, ...]
    try:
        if sandboxed:
            fd = os.memfd_create("main.py")
            os.write(fd, code.encode("utf-8", "surrogatepass"))
            os.lseek(fd, 0, os.SEEK_SET)
            env |= {"HOME": WORK, "TMPDIR": WORK}
            argv, cwd, fds = bwrap_command(_launch(limits), disk_mb=limits.disk_mb, env=env, code_fd=fd), None, (fd,)
        else:
            assert host_dir is not None
            with open(os.path.join(host_dir, "main.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(code)
            env |= {"HOME": host_dir, "TMPDIR": host_dir}
            argv, cwd, fds = _launch(limits), host_dir, ()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                pass_fds=fds,
                start_new_session=True,  # its own process group, killed as a whole
            )
        finally:
            for fd in fds:
                os.close(fd)
        try:
            out, stopped = _watch(proc, limits, host_dir)
        finally:
            _kill_all(proc)
        text = out.decode("utf-8", errors="replace")
        status = proc.returncode
    finally:
        if host_dir is not None:
            _remove(host_dir)
    end = _ending(stopped, status, limits)
    if end is not None:
        counts["tool_errors"] = 1
        counts["tool_timeouts"] = int(stopped in ("wall", "cpu") or "CPU time" in end)
        text = f"{text.rstrip()}\n{end}" if text.strip() else end
    return text.rstrip("\n"), counts


def _watch(proc: subprocess.Popen, limits: PythonLimits, host_dir: str | None) -> tuple[bytes, str | None]:
    """``(output, why it was stopped or None)``: reads until EOF, sampling the call's processes every
    :data:`TICK_S` against the whole-call limits (module docstring)."""
    from grpokit.envs.proc_usage import folder_bytes, tree_usage

    assert proc.stdout is not None  # stdout=PIPE
    fd, out, deadline = proc.stdout.fileno(), bytearray(), time.monotonic() + limits.wall_s
    ticks = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), "wall"
        ready, _, _ = select.select([fd], [], [], min(left, TICK_S))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return bytes(out), None
            out += chunk
            if len(out) > limits.max_output_bytes:
                return bytes(out[: limits.max_output_bytes]), "output"
        ticks += 1
        cpu_s, rss_mb, n = tree_usage(proc.pid)
        if cpu_s > limits.cpu_s:
            return bytes(out), "cpu"
        if rss_mb > limits.memory_mb:
            return bytes(out), "memory"
        if n > limits.processes + 2:  # bwrap's two processes (setpriv execs)
            return bytes(out), "processes"
        if host_dir is not None and ticks % 10 == 0 and folder_bytes(host_dir) > limits.disk_mb << 20:
            return bytes(out), "disk"


def _kill_all(proc: subprocess.Popen) -> None:
    """Kill every process of the call: its tree (the sandbox's init first: the kernel then ends its
    namespace), then its process group."""
    from grpokit.envs.proc_usage import tree_pids

    for pid in tree_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _remove(folder: str) -> None:
    """Remove the call's folder whatever the code did to its modes (each folder made searchable
    before the walk enters it)."""
    try:
        os.chmod(folder, 0o700)
    except OSError:
        pass
    for root, dirs, _ in os.walk(folder):
        for d in dirs:
            try:
                os.chmod(os.path.join(root, d), 0o700, follow_symlinks=False)
            except OSError:
                pass
    shutil.rmtree(folder, ignore_errors=True)


def _ending(stopped: str | None, status: int, limits: PythonLimits) -> str | None:
    if stopped == "wall":
        return f"error: timed out after {limits.wall_s:g} s"
    if stopped == "output":
        return f"error: output cut at {limits.max_output_bytes} bytes"
    if stopped == "cpu" or status in (CPU_LIMIT_STATUS, -signal.SIGXCPU, 128 + signal.SIGXCPU):
        return f"error: CPU time limit ({limits.cpu_s} s)"
    if stopped == "memory":
        return f"error: memory limit ({limits.memory_mb} MiB)"
    if stopped == "processes":
        return f"error: process limit ({limits.processes})"
    if stopped == "disk":
        return f"error: disk limit ({limits.disk_mb} MiB)"
    if status != 0:
        return f"error: exit status {status}"
    return None
