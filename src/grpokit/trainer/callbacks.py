"""User hooks into the training loop (:func:`grpokit.trainer.loop.train`, ``callbacks=``).

A callback is an object with any of these methods (:class:`Callback` has them all, doing nothing),
or a plain function, which is taken as ``on_step_end``:

- ``on_train_begin(step, recipe)``: once the run's parts are built (``step``: 0, or the step a
  resumed run continues from; ``recipe``: the :class:`~grpokit.config.Recipe`).
- ``on_step_end(step, metrics)``: after each step, with the step's ``metrics.jsonl`` line (the
  ``eval/*`` numbers of a held-out evaluation at that step included). Returning ``True`` asks the
  run to stop: the step's checkpoint is written, the evaluation after training runs, and the summary
  says ``early_stopped_at`` and ``stopped_by``.
- ``on_evaluate(step, result)``: after each held-out evaluation (before training: step 0), with
  its :class:`~grpokit.eval.evaluate.EvalResult` (a mapping of what ``eval_<when>.json`` holds).
  Returning ``True`` stops the run as above (not for the evaluation before training, nor the one
  after it).
- ``on_save(step, path)``: after a checkpoint folder is written.
- ``on_train_end(summary)``: with the run's :class:`~grpokit.trainer.summary.RunSummary` (read as a
  mapping too; its ``stop_reason`` says how it ended), at the end (a stopped run's too).

With several ranks (torchrun) every rank calls ``on_step_end`` and ``on_save`` is called on rank 0
only, as is ``on_evaluate`` (rank 0 evaluates); a stop asked on any rank stops every rank after the
same step.

A callback that raises is reported by its name: the run stops after the step under way, writes its
checkpoint, and :func:`grpokit.trainer.loop.train` raises :class:`CallbackError` (a ``RuntimeError``)
naming the callback, the hook and the step; nothing of the run is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["Callback", "CallbackError", "Callbacks", "callback_name"]


class Callback:
    """A callback with every hook, each doing nothing: subclass it and write the ones you need
    (the module docstring says when each is called and what returning ``True`` does)."""

    def on_train_begin(self, step: int, recipe: Any) -> None:
        """Once the run's parts are built; ``step`` is 0 or the resumed step."""

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> bool | None:
        """After each step; return ``True`` to stop the run. ``metrics``: the step's ``metrics.jsonl``
        line, a :class:`grpokit.metrics.step.StepMetrics` (a dict with typed views: ``metrics.loss``,
        ``metrics.rewards``)."""
        return None

    def on_evaluate(self, step: int, result: Mapping[str, Any]) -> bool | None:
        """After each held-out evaluation; return ``True`` to stop the run."""
        return None

    def on_save(self, step: int, path: str) -> None:
        """After each checkpoint folder is written."""

    def on_train_end(self, summary: Mapping[str, Any]) -> None:
        """At the end of the run, with its summary."""


class CallbackError(RuntimeError):
    """A callback raised; the run stopped after the step under way and wrote its checkpoint."""


def callback_name(cb: Any) -> str:
    """How messages name a callback: a function's qualified name, else its class's name.

    >>> def stop_at_two(step, metrics): ...
    >>> callback_name(stop_at_two), callback_name(Callback())
    ('stop_at_two', 'Callback')
    """
    if hasattr(cb, "__qualname__") and not isinstance(cb, type):
        return str(cb.__qualname__).replace(".<locals>", "")
    return type(cb).__name__


HOOKS = ("on_train_begin", "on_step_end", "on_evaluate", "on_save", "on_train_end")


def _is_transformers_callback(cb: Any) -> bool:
    """Whether ``cb`` (an instance or a class) derives from ``transformers.TrainerCallback``."""
    cls = cb if isinstance(cb, type) else type(cb)
    return any(k.__name__ == "TrainerCallback" and k.__module__.startswith("transformers") for k in cls.__mro__)


class Callbacks:
    """The run's callbacks, called in the order given.

    ``stop_requested`` is set by a hook that returned ``True`` (``stopped_by`` names it) or raised
    (``error`` holds the :class:`CallbackError`); the loop reads both after each step.

    Raises:
        TypeError: an object with none of the hooks that is not callable (names it and the hooks); a
            ``transformers.TrainerCallback`` (its hooks take ``(args, state, control)``).
    """

    def __init__(self, callbacks: Iterable[Any] = ()):
        self.items: list[Any] = []
        for cb in callbacks:
            if _is_transformers_callback(cb):
                raise TypeError(
                    f"callback {callback_name(cb)}: a transformers.TrainerCallback; grpokit calls its own hooks "
                    "with other arguments (on_step_end(step, metrics), ...): subclass grpokit.Callback "
                    "(docs/python.md, Callbacks)"
                )
            if not any(hasattr(cb, h) for h in HOOKS) and not callable(cb):
                raise TypeError(
                    f"callback {cb!r}: neither callable nor an object with any of {', '.join(HOOKS)} "
                    "(subclass grpokit.Callback)"
                )
            self.items.append(cb)
        self.stop_requested = False
        self.stopped_by: str | None = None
        self.error: CallbackError | None = None

    def __bool__(self) -> bool:
        return bool(self.items)

    def _hook(self, cb: Any, hook: str) -> Callable[..., Any] | None:
        fn = getattr(cb, hook, None)
        if fn is None and hook == "on_step_end" and not any(hasattr(cb, h) for h in HOOKS):
            return cb  # a plain function is an on_step_end
        return fn

    def call(self, hook: str, *args: Any, step: int, can_stop: bool = False) -> None:
        """Call ``hook`` on every callback that has it; a ``True`` from one (where ``can_stop``) or an
        exception asks the run to stop. After an exception the other callbacks still run."""
        for cb in self.items:
            fn = self._hook(cb, hook)
            if fn is None:
                continue
            try:
                asked = fn(*args)
            except Exception as e:  # reported by name; the run stops cleanly
                if self.error is None:
                    self.error = CallbackError(
                        f"callback {callback_name(cb)}.{hook} raised at step {step}: {type(e).__name__}: {e}"
                    )
                    self.error.__cause__ = e
                self.stop_requested = True
                continue
            if can_stop and asked is True and not self.stop_requested:
                self.stop_requested, self.stopped_by = True, f"{callback_name(cb)}.{hook}"
