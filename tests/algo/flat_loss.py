"""``policy_loss`` called with one flat set of keywords, as the parametrized variant tables write them:
the :class:`grpokit.algo.LossConfig` fields go into the config, the rest (tensors and batch counts)
to the call; the stats come back as their name -> tensor mapping."""

from __future__ import annotations

import dataclasses

import torch

from grpokit import algo

CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(algo.LossConfig))


def flat_policy_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, **kw
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    config = algo.LossConfig(**{k: v for k, v in kw.items() if k in CONFIG_FIELDS})
    rest = {k: v for k, v in kw.items() if k not in CONFIG_FIELDS}
    loss, stats = algo.policy_loss(logp, old_logp, advantages, mask, config, **rest)
    return loss, stats.as_dict()
