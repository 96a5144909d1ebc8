"""What :func:`grpokit.trainer.loop.train` returns: :class:`RunSummary`, the run's summary with a
declared field for each thing it can say, and :class:`StopReason`, how the run ended.

A summary is also read as a mapping of the keys set so far, in the order they were set
(``summary["resumed_from"]``, ``"stopped_at" in summary``, ``summary.get("eval_after")``,
``dict(summary)``), so code written for the summary dict keeps working; :meth:`RunSummary.to_dict`
is what ``summary.json`` holds (:class:`grpokit.utils.records.KeyedRecord`). Imports only the standard
library and that base (and, for its types, :class:`grpokit.eval.evaluate.EvalResult`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpokit.utils.records import KeyedRecord

if TYPE_CHECKING:
    from grpokit.eval.evaluate import EvalResult

__all__ = ["RunSummary", "StopReason"]


class StopReason(enum.Enum):
    """How a run ended (:attr:`RunSummary.stop_reason`)."""

    COMPLETED = "completed"
    """It trained to ``train.max_steps`` (then the evaluation after training ran, when asked for)."""
    SIGNAL = "signal"
    """SIGTERM/SIGINT: it stopped after the step under way, checkpointed (``stopped_at``, ``stop_signal``)."""
    EARLY_STOP = "early_stop"
    """A callback asked it to stop (``early_stopped_at``, ``stopped_by``); the evaluation after training ran."""
    NOTHING_TO_DO = "nothing_to_do"
    """Its resume checkpoint was already at ``train.max_steps``: nothing was loaded or trained."""
    ERROR = "error"
    """A callback raised (``callback_error``); :func:`grpokit.trainer.loop.train` raises ``CallbackError``."""


class _Unset:
    """Matches the values that leave a constructor's field unset: None and ``nothing_to_do=False``."""

    def __contains__(self, value: object) -> bool:
        return value is None or value is False


_UNSET = _Unset()


@dataclass(eq=False)
class RunSummary(KeyedRecord):
    """A run's summary: what :func:`grpokit.trainer.loop.train` returns and ``summary.json`` holds.

    A key is present once its field is assigned (the constructor's ``output_dir`` and ``rank`` always,
    a field given to the constructor when it is not None), and it keeps the place it was first set
    at; the fields not set read as None (``nothing_to_do``: False). Reading it as a mapping sees only
    the keys present, in that order; :meth:`to_dict` is that mapping as a plain dict.

    Attributes:
        output_dir: the run folder (``train.output_dir``).
        rank: this process's rank (0 without torchrun); only rank 0 writes ``summary.json``.
        world_size: how many ranks trained (1 without torchrun).
        parallel: how the ranks shared the work (``train.parallel``: ``ddp``, ``fsdp2``).
        resumed_from: the checkpoint folder the run continued from.
        eval_before: the held-out evaluation before training (``eval_before.json``; None on ranks > 0;
            a dict when read from a file: :meth:`from_dict`).
        stopped_at: the step after which a signal stopped the run.
        stop_signal: that signal's number (15: SIGTERM, 2: SIGINT).
        early_stopped_at: the step after which a callback stopped the run.
        stopped_by: the callback hook that asked, ``<callback>.<hook>`` (``another rank``: a stop asked
            on another rank).
        last_metrics: the last step's ``metrics.jsonl`` line ({} when no step ran).
        callback_error: the message of the callback that raised.
        eval_after: the held-out evaluation after training (``eval_after.json``; None on ranks > 0).
        checkpoint: the newest complete checkpoint folder: the trained model.
        nothing_to_do: True when the resume checkpoint was already at ``train.max_steps``.
        step: the resume checkpoint's step (with ``nothing_to_do``).
        recipe_changes: ``[key, the run's value, this recipe's]`` for each key the recipe changes,
            none of them used (with ``nothing_to_do``).
        other: keys of an earlier ``summary.json`` that are none of these (read by :meth:`from_dict`).
    """

    output_dir: str
    rank: int
    world_size: int | None = None
    parallel: str | None = None
    resumed_from: str | None = None
    eval_before: EvalResult | dict[str, Any] | None = None
    stopped_at: int | None = None
    stop_signal: int | None = None
    early_stopped_at: int | None = None
    stopped_by: str | None = None
    last_metrics: dict[str, Any] | None = None
    callback_error: str | None = None
    eval_after: EvalResult | dict[str, Any] | None = None
    checkpoint: str | None = None
    nothing_to_do: bool = False
    step: int | None = None
    recipe_changes: list[list[Any]] | None = None
    other: dict[str, Any] = field(default_factory=dict, repr=False)
    _keys: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        # a field given to the constructor is present unless it is None (or nothing_to_do=False)
        given = [n for n in _FIELDS if n in ("output_dir", "rank") or getattr(self, n) not in _UNSET]
        self._keys.extend(given + [k for k in self.other if k not in given])

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        keys = self.__dict__.get("_keys")
        if keys is not None and name in _FIELDS and name not in keys:
            keys.append(name)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """The summary ``data`` holds (e.g. an earlier run's ``summary.json``), its keys in their order:
        each declared key into its field, any other into :attr:`other`. Values are taken as they are
        (not checked); when ``data`` lacks ``output_dir`` or ``rank`` they read as ``""`` and 0 but are
        not keys.

        >>> s = RunSummary.from_dict({"rank": 0, "output_dir": "out", "seen": 1})
        >>> list(s), s.other
        (['rank', 'output_dir', 'seen'], {'seen': 1})
        """
        out = cls(output_dir="", rank=0)
        out._keys.clear()
        for key, value in data.items():
            out._set(key, value)
        return out

    def _set(self, key: str, value: Any) -> None:
        """Set ``key`` (a field's name, or another key into :attr:`other`), keeping its place if present."""
        if key in _FIELDS:
            setattr(self, key, value)
            return
        self.other[key] = value
        if key not in self._keys:
            self._keys.append(key)

    @property
    def stop_reason(self) -> StopReason:
        """How the run ended: :attr:`StopReason.NOTHING_TO_DO` when ``nothing_to_do`` (whatever the
        earlier run's summary it repeats says), else ``ERROR`` with a ``callback_error``, ``SIGNAL`` with
        ``stopped_at``, ``EARLY_STOP`` with ``early_stopped_at``, else ``COMPLETED``.

        >>> RunSummary("out", 0, stopped_at=3, stop_signal=15).stop_reason
        <StopReason.SIGNAL: 'signal'>
        """
        if self.nothing_to_do:
            return StopReason.NOTHING_TO_DO
        if self.callback_error is not None:
            return StopReason.ERROR
        if self.stopped_at is not None:
            return StopReason.SIGNAL
        if self.early_stopped_at is not None:
            return StopReason.EARLY_STOP
        return StopReason.COMPLETED

    def to_dict(self) -> dict[str, Any]:
        """The keys present, in the order they were set, with their values (an evaluation result as
        its own ``to_dict()``): what ``summary.json`` holds (``json.dumps(..., indent=1, default=str)``)."""
        return super().to_dict()

    def _present(self) -> list[str]:
        return self._keys

    def _value(self, key: str) -> Any:
        return getattr(self, key) if key in _FIELDS else self.other[key]


#: the declared keys of a summary, in the fields' order (every field but ``other`` and the key order)
_FIELDS = tuple(f.name for f in dataclasses.fields(RunSummary) if f.name not in ("other", "_keys"))
