"""How many CPU threads a run uses: the cores it may use that other work is not already using.

torch starts one OpenMP thread per physical core and, by default, its threads spin while they wait
for each other. On a machine shared with other work (a test suite, a second run, a laptop's
browser) that is the worst choice: with two such processes on two cores each one's threads wait at
every barrier for a thread the other process has taken off its core, and a 19 s step took 250–400 s
(docs/speed.md, "A shared machine"). So, once per process, before the first step:

- **usable cores**: the CPUs this process may run on (``os.sched_getaffinity``), capped by a
  cgroup CPU quota (``/sys/fs/cgroup/cpu.max``, how containers limit CPU);
- **busy cores**: how many of those other processes keep busy, measured from ``/proc/stat`` over
  :data:`WINDOW_S` seconds with this process's own CPU time taken out;
- **threads** = usable − busy (rounded, at least 1), never more than torch's own default (its
  physical-core count);
- **wait policy**: where other work was busy at the start, OpenMP threads that sleep as soon as
  they wait (``OMP_WAIT_POLICY=PASSIVE``) rather than spin on a core another process wants; on an
  idle machine the runtime's default (spin a little, then sleep), which is faster there (the demo's
  steps: 24.0 s against 25.9 s with PASSIVE, docs/speed.md). It takes effect only when set before
  torch loads its OpenMP runtime: :func:`prepare_environment`, called by ``grpokit train``, ``eval``,
  ``sft`` and ``prm`` before anything imports torch, measures the machine then.

``OMP_NUM_THREADS`` set by the user is kept as it is (nothing measured); so is
``OMP_WAIT_POLICY``. ``GRPOKIT_THREADS`` chooses too: ``auto`` (the default, as above), a number
(that many threads), or ``off`` (leave torch as it is; the test suite runs so, its numbers must not
depend on the machine's load). The choice is one line (:meth:`ThreadChoice.line`) among a run's
first lines. A different thread count can change a float sum's order, hence the last bits of the
numbers a run computes: a run's ``metrics.jsonl`` records ``threads`` on every line, and results
that must reproduce bit for bit (``experiments/results/demo_metrics.jsonl``) are taken at a stated count.

Standard library only until :func:`apply_threads` sets torch's count.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ThreadChoice",
    "WINDOW_S",
    "apply_threads",
    "busy_cores",
    "choose_threads",
    "prepare_environment",
    "usable_cores",
]

WINDOW_S = 0.5
"""Seconds over which the other processes' CPU use is measured (once per process)."""


@dataclass(frozen=True)
class ThreadChoice:
    """What :func:`choose_threads` decided.

    Attributes:
        threads: torch's intra-op thread count to use; None: leave torch's as it is.
        usable: CPUs this process may run on (affinity and cgroup quota).
        busy: cores the other processes kept busy while measured (None: not measured).
        source: ``"auto"``, ``"OMP_NUM_THREADS"``, ``"GRPOKIT_THREADS"`` or ``"off"``.
        wait_policy: ``OMP_WAIT_POLICY`` as the OpenMP runtime reads it (None: its default, spinning).
    """

    threads: int | None
    usable: int
    busy: float | None
    source: str
    wait_policy: str | None

    def line(self) -> str:
        """The run's line on it, e.g. ``threads: 1 of 2 usable cores (1.0 busy with other work);
        OpenMP threads sleep while waiting (OMP_WAIT_POLICY=PASSIVE)``."""
        if self.threads is None:
            what = f"threads: torch's own count ({self.source}; {self.usable} usable cores)"
        elif self.source == "auto":
            what = f"threads: {self.threads} of {self.usable} usable cores ({self.busy:.1f} busy with other work)"
        else:
            what = f"threads: {self.threads} ({self.source} set; {self.usable} usable cores)"
        if (self.wait_policy or "").upper() == "PASSIVE":
            return what + "; OpenMP threads sleep while waiting (OMP_WAIT_POLICY=PASSIVE)"
        return what + f"; OpenMP wait policy {self.wait_policy or 'default (spin, then sleep)'}"


def _quota() -> float | None:
    """CPUs a cgroup v2 quota allows (``cpu.max``: ``"200000 100000"`` = 2.0), or None."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _cpus() -> set[int]:
    """The CPUs this process may run on: its affinity set (all CPUs where the platform has none)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """CPUs this process may run on (:func:`_cpus`), capped by a cgroup CPU quota; at least 1."""
    n = len(_cpus())
    quota = _quota()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def _cpu_jiffies(cpus: set[int]) -> tuple[int, int] | None:
    """(busy, total) jiffies of ``cpus`` from ``/proc/stat`` (busy: all but idle and iowait)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        values = [int(v) for v in fields[:8]]
        total += sum(values)
        busy += sum(values) - values[3] - values[4]
    return busy, total


def busy_cores(window_s: float = WINDOW_S) -> float | None:
    """Cores of this process's CPUs that other processes kept busy over ``window_s`` seconds
    (this process's own CPU time left out); None where ``/proc/stat`` cannot be read."""
    cpus = _cpus()
    first, own0, t0 = _cpu_jiffies(cpus), time.process_time(), time.monotonic()
    if first is None:
        return None
    time.sleep(window_s)
    second, own1, t1 = _cpu_jiffies(cpus), time.process_time(), time.monotonic()
    if second is None or second[1] <= first[1]:
        return None
    share = (second[0] - first[0]) / (second[1] - first[1])  # busy fraction of the CPUs' time
    return max(0.0, share * len(cpus) - (own1 - own0) / max(t1 - t0, 1e-9))


def _torch_default() -> int:
    """torch's own default thread count: one per physical core, where that can be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.cpu_count() or 1
    cores = {
        (block.get("physical id"), block.get("core id"))
        for block in (
            dict(kv.split(":", 1) for kv in para.splitlines() if ":" in kv) for para in text.split("\n\n") if para
        )
    }
    return max(1, len(cores)) if cores and (None, None) not in cores else (os.cpu_count() or 1)


def choose_threads(environ: dict[str, str] | None = None, *, window_s: float = WINDOW_S) -> ThreadChoice:
    """Decide the thread count (module docstring); reads the environment, measures nothing when
    ``OMP_NUM_THREADS`` or ``GRPOKIT_THREADS`` decides.

    Raises:
        ValueError: ``GRPOKIT_THREADS`` is neither ``auto``, ``off`` nor a positive integer (names it).
    """
    env = os.environ if environ is None else environ
    usable, wait = usable_cores(), env.get("OMP_WAIT_POLICY")
    asked = env.get("GRPOKIT_THREADS", "auto").strip().lower()
    if asked not in ("auto", "off") and not (asked.isdigit() and int(asked) > 0):
        raise ValueError(f"GRPOKIT_THREADS={env['GRPOKIT_THREADS']!r}: expected auto, off or a positive integer")
    if env.get("OMP_NUM_THREADS", "").strip():
        return ThreadChoice(None, usable, None, "OMP_NUM_THREADS", wait)
    if asked == "off":
        return ThreadChoice(None, usable, None, "GRPOKIT_THREADS=off", wait)
    if asked != "auto":
        return ThreadChoice(int(asked), usable, None, "GRPOKIT_THREADS", wait)
    busy = busy_cores(window_s)
    free = usable - math.floor((busy or 0.0) + 0.5)
    return ThreadChoice(max(1, min(free, _torch_default())), usable, busy, "auto", wait)


_EARLY: list[ThreadChoice] = []  # the choice prepare_environment made (before torch loaded)


def prepare_environment() -> ThreadChoice:
    """Choose before torch is imported (``grpokit`` commands call it first), so that the wait policy
    can still take effect: where other work keeps half a core or more busy and the user set no
    ``OMP_WAIT_POLICY``, set it to ``PASSIVE`` (waiting threads sleep). Too late once torch is
    loaded (its OpenMP runtime read the environment then). Returns the choice, which
    :func:`apply_threads` then uses instead of measuring again.

    Raises:
        ValueError: as :func:`choose_threads`.
    """
    choice = choose_threads()
    if choice.busy is not None and choice.busy >= 0.5 and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        choice = ThreadChoice(choice.threads, choice.usable, choice.busy, choice.source, "PASSIVE")
    _EARLY[:] = [choice]
    return choice


@functools.lru_cache(maxsize=1)
def apply_threads() -> ThreadChoice:
    """:func:`choose_threads` once per process (or the one :func:`prepare_environment` made) and
    set torch's intra-op count to it; returns it (later calls: the same, nothing measured again).

    Raises:
        ValueError: as :func:`choose_threads`.
    """
    choice = _EARLY[0] if _EARLY else choose_threads()
    if choice.threads is not None:
        import torch

        torch.set_num_threads(choice.threads)
    return choice
