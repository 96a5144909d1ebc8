"""The loop's own state: step, data position, seeding. Imports only torch and numpy."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class TrainState:
    """What a checkpoint needs to continue the data order exactly.

    ``step``: optimizer steps done (GRPO steps, not μ passes); ``epoch``/``position``: where the
    next prompt is taken in the epoch's seeded permutation; ``consecutive_skips``: non-finite
    updates in a row; ``extra``: free-form values checkpointed with the state (``train_s``).
    """

    step: int = 0
    epoch: int = 0
    position: int = 0
    consecutive_skips: int = 0
    extra: dict = field(default_factory=dict)


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
