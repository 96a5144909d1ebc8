"""The loop's own state: step, data position, seeding. Imports only torch and numpy."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class TrainState:
    """What a checkpoint needs to continue the data order exactly, and what it carries on.

    ``step``: optimizer steps done (GRPO steps, not μ passes); ``epoch``/``position``: where the
    next prompt is taken in the epoch's seeded permutation; ``consecutive_skips``: non-finite
    updates in a row; ``train_s``: seconds of training so far, evaluations excluded (resumed runs
    count on: ``train_minutes`` in ``metrics.jsonl``); ``recipe_changes``: each key a resumed
    recipe changed, ``{"step", "key", "old", "new"}`` (``step``: the last step the old value ran;
    :func:`grpokit.trainer.resume.resume`); ``extra``: other free-form values checkpointed with the
    state (none of grpokit's own).

    In ``trainer_state.json`` (:meth:`to_checkpoint`) ``train_s`` and ``recipe_changes`` are written
    inside ``extra``, as before they were fields, so checkpoints of either version read the same.
    """

    step: int = 0
    epoch: int = 0
    position: int = 0
    consecutive_skips: int = 0
    train_s: float = 0.0
    recipe_changes: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_checkpoint(self) -> dict[str, Any]:
        """What ``trainer_state.json`` holds of the state, ``step`` aside (the checkpoint writes it
        first): ``epoch``, ``position``, ``consecutive_skips`` and ``extra`` = ``{"train_s": seconds,
        "recipe_changes": [...] (only when there are any), **extra}``."""
        changes = {"recipe_changes": list(self.recipe_changes)} if self.recipe_changes else {}
        return {
            "epoch": self.epoch,
            "position": self.position,
            "consecutive_skips": self.consecutive_skips,
            "extra": {"train_s": self.train_s, **changes, **self.extra},
        }

    @classmethod
    def from_checkpoint(cls, state: Mapping[str, Any]) -> TrainState:
        """The state ``trainer_state.json``'s object ``state`` holds (integer ``step``, ``epoch`` and
        ``position``, checked by :func:`grpokit.trainer.checkpoint.load_training_state`): its
        ``consecutive_skips`` (0 when absent), and from its ``extra`` object ``train_s`` (0.0 when
        absent) and ``recipe_changes`` ([] when absent), the rest of ``extra`` kept in :attr:`extra`.
        Other keys (``world_size``) are not the state's.

        Raises:
            KeyError: ``step``, ``epoch`` or ``position`` missing.

        >>> TrainState.from_checkpoint({"step": 2, "epoch": 0, "position": 4, "extra": {"train_s": 1.5}})
        TrainState(step=2, epoch=0, position=4, consecutive_skips=0, train_s=1.5, recipe_changes=[], extra={})
        """
        extra = dict(state.get("extra") or {})
        return cls(
            step=state["step"],
            epoch=state["epoch"],
            position=state["position"],
            consecutive_skips=state.get("consecutive_skips", 0),
            train_s=extra.pop("train_s", 0.0),
            recipe_changes=list(extra.pop("recipe_changes", [])),
            extra=extra,
        )


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def next_prompt_indices(state: TrainState, n_rows: int, b: int, seed: int) -> list[int]:
    """B row indices from the epoch's seeded permutation (``torch.randperm`` seeded
    ``seed·1000 + epoch``); advances ``state``; an epoch that runs out continues in the next one."""
    out: list[int] = []
    while len(out) < b:
        order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed * 1000 + state.epoch))
        take = order[state.position : state.position + b - len(out)].tolist()
        out += take
        state.position += len(take)
        if state.position >= n_rows:
            state.epoch, state.position = state.epoch + 1, 0
    return out
