"""Ranks of ``python -m grpokit …`` forked from a process that imported torch, transformers and
grpokit once: torchrun's ranks without torchrun's launcher (1.8 s) or each rank's imports (4 s).

``torchrun --nproc-per-node N -m grpokit train …`` starts an agent that execs N fresh interpreters
with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set; each imports torch and transformers again, then meets the others in
``init_process_group("env://")``. :class:`RankForker` keeps one warm server per test worker
(``python -m support.ranks``, imports done once, no torch op run) and, per launch, forks the N
ranks from it with the same variables, so each rank runs grpokit's ``__main__`` exactly as under
torchrun, from a fresh address space copied from the server. What only torchrun does (its own
exit report, restarting, multi-node rendezvous, signal forwarding) is tested through torchrun
itself in ``tests/trainer/test_distributed.py``; everything else the ranks do is the same code.

With ``nprocs=0`` the launch is one process without any of those variables: ``python -m grpokit``.

Protocol (JSON lines): the client writes ``{"argv", "nprocs", "env", "path", "log"}``; the server
answers ``{"pids": [...]}`` once the ranks are forked, then ``{"returncodes": [...]}`` (negative:
killed by that signal, as :attr:`subprocess.Popen.returncode`) when all have ended. The ranks'
stdout and stderr go, interleaved as torchrun prints them, to the file ``log``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the client ------------------------------------------------------------------------------------


class Launch:
    """One launch: the ranks' pids, and (after :meth:`wait`) their return codes and the log."""

    def __init__(self, forker: RankForker, pids: list[int], log: Path):
        self.forker, self.pids, self.log_path = forker, pids, log
        self.returncodes: list[int] | None = None

    def wait(self, timeout: float = 300.0) -> list[int]:
        if self.returncodes is None:
            reply = self.forker._read(timeout)
            self.returncodes = list(reply["returncodes"])
        return self.returncodes

    def poll(self) -> list[int] | None:
        """The return codes if every rank has ended, else None (does not wait)."""
        if self.returncodes is None:
            try:
                line = self.forker.replies.get_nowait()
            except queue.Empty:
                return None
            self.returncodes = list(self.forker._parse(line)["returncodes"])
        return self.returncodes

    def wait_for_file(self, path: Path, timeout: float = 180.0) -> bool:
        """Poll every 5 ms until ``path`` exists (True), or until every rank has ended or ``timeout``
        seconds have passed (then whether it exists)."""
        t0 = time.monotonic()
        while not path.exists():
            if self.poll() is not None or time.monotonic() - t0 > timeout:
                return path.exists()
            time.sleep(0.005)
        return True

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """``sig`` to every rank and what it started (each rank leads its own process group)."""
        for pid in self.pids:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:  # not yet its own group leader, or gone
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class RankForker:
    """A warm server that forks ranks of ``python -m grpokit``; one launch at a time.

    ``env``: the server's environment (what the ranks inherit before a launch's own ``env``)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.replies: queue.Queue[str] = queue.Queue()
        self.last: Launch | None = None  # a launch a failed test left running is ended first

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "support.ranks"],
                env=self.env,
                cwd=str(TESTS),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            self.replies = queue.Queue()
            threading.Thread(target=self._pump, args=(self.proc, self.replies), daemon=True).start()
        return self.proc

    @staticmethod
    def _pump(proc: subprocess.Popen, replies: queue.Queue[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            replies.put(line)
        replies.put("")  # the server ended

    def _read(self, timeout: float) -> dict:
        try:
            line = self.replies.get(timeout=timeout)
        except queue.Empty:
            self.close()
            raise TimeoutError(f"the ranks did not end within {timeout} s") from None
        return self._parse(line)

    def _parse(self, line: str) -> dict:
        if not line:
            raise RuntimeError(f"the rank server died (rc {self.proc.poll() if self.proc else None})")
        return json.loads(line)

    def start(
        self,
        argv: list[str],
        log: Path,
        *,
        nprocs: int = 2,
        env: dict[str, str] | None = None,
        path: list[str] | None = None,
    ) -> Launch:
        """Fork ``nprocs`` ranks (0: one process, no torchrun variables) of ``python -m grpokit
        *argv``, ``env`` added to their environment and ``path`` put first on their ``sys.path``."""
        if self.last is not None and self.last.returncodes is None and self.proc is not None:
            self.last.kill()
            self.last.wait(60)
        proc = self._start()
        assert proc.stdin is not None
        request = {"argv": argv, "nprocs": nprocs, "env": env or {}, "path": path or [], "log": str(log)}
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        self.last = Launch(self, list(self._read(120.0)["pids"]), log)
        return self.last

    def run(self, argv: list[str], log: Path, *, timeout: float = 300.0, **kw) -> tuple[list[int], str]:
        """:meth:`start`, then wait: the return codes and the log."""
        launch = self.start(argv, log, **kw)
        return launch.wait(timeout), launch.log

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None


# -- the server --------------------------------------------------------------------------------------


def _rank(request: dict, rank: int, port: int) -> None:
    """In the forked child: become rank ``rank`` and run ``python -m grpokit``; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # as torchrun's ranks: their own process group
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        n = request["nprocs"]
        if n:
            os.environ.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                GROUP_RANK="0",
                ROLE_RANK=str(rank),
                WORLD_SIZE=str(n),
                LOCAL_WORLD_SIZE=str(n),
                ROLE_WORLD_SIZE=str(n),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        os.environ.update(request["env"])
        sys.path[:0] = request["path"]
        sys.argv = ["grpokit", *request["argv"]]
        import runpy

        try:
            runpy.run_module("grpokit", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait_all(pids: list[int], grace_s: float = 10.0) -> list[int]:
    """The ranks' return codes; once one fails, the others get ``grace_s`` to end, then SIGKILL
    (torchrun ends the job when one rank fails; a rank left waiting in a collective would hang)."""
    codes: dict[int, int] = {}
    deadline = None
    while len(codes) < len(pids):
        pid, status = os.waitpid(-1, os.WNOHANG if deadline is not None else 0)
        if pid in pids:
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0 and deadline is None:
                deadline = time.monotonic() + grace_s
        elif pid == 0:
            if time.monotonic() > deadline:
                for p in set(pids) - set(codes):
                    os.kill(p, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.01)
    return [codes[p] for p in pids]


def _serve() -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # replies only: what the imports print goes to stderr
    os.dup2(2, 1)
    import torch  # noqa: F401  (what every rank imports: once, here)
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: F401

    import grpokit.cli.main  # noqa: F401
    import grpokit.trainer.loop  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        port = free_port()
        sys.stdout.flush()
        sys.stderr.flush()
        pids = []
        for rank in range(max(1, request["nprocs"])):
            pid = os.fork()
            if pid == 0:
                proto.close()
                _rank(request, rank, port)
            pids.append(pid)
        print(json.dumps({"pids": pids}), file=proto, flush=True)
        print(json.dumps({"returncodes": _wait_all(pids)}), file=proto, flush=True)


if __name__ == "__main__":
    _serve()
