"""What a process tree uses, read from ``/proc`` (Linux; standard library only): the monitor of the
``python`` tool's whole-call limits (:mod:`grpokit.envs.python_tool`)."""

from __future__ import annotations

import os

__all__ = ["folder_bytes", "tree_pids", "tree_usage"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_pids(root: int) -> list[int]:
    """``root`` and its living descendants (``/proc/<pid>/task/<tid>/children``), parents first; an
    orphan of a PID namespace is its init's child, so a sandbox's tree holds all its processes."""
    pids, i = [root], 0
    while i < len(pids):
        pid, i = pids[i], i + 1
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    pids += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return pids


def tree_usage(root: int) -> tuple[float, float, int]:
    """``(CPU seconds, resident anonymous MiB, threads)`` of ``root``'s tree: the CPU time of each
    living process plus what the processes it reaped used (``utime + stime + cutime + cstime``),
    ``RssAnon`` summed, threads counted (the kernel's process limit counts threads)."""
    cpu = rss_kb = 0.0
    threads = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue
        cpu += sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime (stat 14-17)
        threads += int(fields[17])  # num_threads (stat 20)
        at = status.find("RssAnon:")
        if at >= 0:
            rss_kb += int(status[at + 8 :].split(None, 1)[0])
    return cpu, rss_kb / 1024, threads


def folder_bytes(folder: str) -> int:
    """The bytes of the files under ``folder`` (allocated blocks; links not followed)."""
    total, stack = 0, [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:
                            total += e.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        pass
        except OSError:
            pass
    return total
