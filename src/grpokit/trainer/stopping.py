"""When a run stops early, and when it has nothing to do (the loop of :mod:`grpokit.trainer.loop`).

- SIGTERM/SIGINT (:class:`StopFlag`): the step under way finishes and is checkpointed, then the run
  stops; ``grpokit train`` exits 128 + the signal (130, 143). With several ranks a signal to any one
  stops all after the same step (:func:`grpokit.utils.distributed.any_rank`), and each takes its number
  (:func:`stop_signal`). A second signal stops at once (:class:`StopNow`, a ``KeyboardInterrupt``).
- A run whose resume checkpoint is already at ``train.max_steps`` (:func:`nothing_to_do`) loads and
  writes nothing, and says so.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

from grpokit.config import Recipe
from grpokit.trainer.summary import RunSummary
from grpokit.utils.distributed import Ranks, gather_objects
from grpokit.utils.textio import read_utf8

__all__ = ["StopFlag", "StopNow", "nothing_to_do", "stop_signal"]


class StopNow(KeyboardInterrupt):
    """A second SIGTERM/SIGINT during a run: it stops at once (the step under way is not saved);
    ``signum``: that signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"second signal {signum}: aborting")
        self.signum = int(signum)


class StopFlag:
    """SIGTERM/SIGINT: finish the step, checkpoint, stop. A second signal aborts at once.

    ``signum``: the first signal received (None: none), which sets the exit status of
    ``grpokit train`` (128 + signum: 130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self._old: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise StopNow(signum)
        self.requested, self.signum = True, int(signum)
        print(
            f"\n[grpokit] signal {signum}: stopping after this step (checkpoint first); send again to abort", flush=True
        )

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def nothing_to_do(recipe: Recipe, start: Path | None) -> RunSummary | None:
    """The summary of a run already done: its resume checkpoint ``start`` is at or past
    ``train.max_steps`` (said on rank 0's stdout); None when there are steps left (or no checkpoint,
    or a ``trainer_state.json`` that cannot be read: resuming reports that). The summary is the one
    the finished run wrote (``summary.json``: ``last_metrics``, ``eval_after``, ...; its keys in
    their order, :meth:`RunSummary.from_dict`) with ``output_dir``, ``rank``, ``nothing_to_do``,
    ``step``, ``resumed_from``, ``checkpoint`` (``start``) and ``recipe_changes`` (``[key, the run's
    value, this recipe's]`` for each key this recipe changes, none of them used) set; its
    ``stop_reason`` is ``StopReason.NOTHING_TO_DO``. The line said names those changes."""
    if start is None:
        return None
    try:
        step = json.loads(read_utf8(start / "trainer_state.json"))["step"]
    except (ValueError, KeyError, TypeError, OSError):
        return None
    max_steps = recipe.train.max_steps
    if type(step) is not int or step < max_steps:
        return None
    rank = int(os.environ.get("RANK", "0"))
    changes = _unused_changes(recipe, start)
    if rank == 0:
        where = (
            f"train.max_steps={max_steps}" if step == max_steps else f"step {step}, past train.max_steps={max_steps}"
        )
        unused = "; not used, as they differ from the run's: " + said_changes(changes) if changes else ""
        print(
            f"[grpokit] {start} is already at {where}, nothing to do (raise train.max_steps to continue; "
            f"train.resume=none or a new train.output_dir to start over){unused}",
            flush=True,
        )
    done: dict[str, Any] = {}
    try:  # what the run that got there wrote at its end: last_metrics, eval_after, checkpoint
        done = json.loads(read_utf8(start.parent / "summary.json"))
    except (ValueError, OSError):
        pass
    if not isinstance(done, dict):
        done = {}
    summary = RunSummary.from_dict(done)  # an earlier key keeps its place, as in {**done, ...}
    summary.output_dir, summary.rank, summary.nothing_to_do = str(recipe.train.output_dir), rank, True
    summary.step, summary.resumed_from, summary.checkpoint = step, str(start), str(start)
    summary.recipe_changes = [list(c) for c in changes]
    return summary


def said_changes(changes: list, most: int = 4) -> str:
    """``key=new (the run's: old)`` for the first ``most`` of ``changes`` (``(key, old, new)``), and
    how many more.

    >>> said_changes([("rollout.group_size", 8, 2)])
    "rollout.group_size=2 (the run's: 8)"
    """
    shown = ", ".join(f"{k}={new!r} (the run's: {old!r})" for k, old, new in changes[:most])
    return shown + (f" and {len(changes) - most} more" if len(changes) > most else "")


def _unused_changes(recipe: Recipe, start: Path) -> list[tuple[str, Any, Any]]:
    """The keys whose values ``recipe`` changes from checkpoint ``start``'s ``recipe.json`` (none
    of which a finished run uses), ``train.max_steps`` aside; [] when it cannot be read."""
    from grpokit.config.resume import resume_changes

    try:
        old = json.loads(read_utf8(start / "recipe.json"))
    except (ValueError, OSError):
        return []
    return [c for c in resume_changes(old, recipe) if c[0] != "train.max_steps"] if isinstance(old, dict) else []


def stop_signal(stop: StopFlag, ranks: Ranks) -> int:
    """The signal that stopped the run: this rank's, else the lowest rank's that got one (a stop seen
    on every rank through :func:`grpokit.utils.distributed.any_rank`; collective: every rank calls it)."""
    got = [s for s in gather_objects(stop.signum, ranks) if s]
    return stop.signum or (got[0] if got else int(signal.SIGTERM))
