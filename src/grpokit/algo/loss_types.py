"""What :func:`grpokit.algo.policy_loss` takes and returns besides tensors: its :class:`LossConfig`
(every scalar and variant name, checked once when built), and :class:`LossOutput` with the typed
:class:`LossStats` (torch only)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .catalog import AGGREGATIONS, IMPORTANCE_LEVELS, SAMPLER_CORRECTIONS, SURROGATES, Registry
from .kl import KL_ESTIMATORS


@dataclass(frozen=True)
class LossConfig:
    """The scalars and variant names of :func:`grpokit.algo.policy_loss` (docs/loss_variants.md),
    validated once, here; built once per estimator from the recipe's ``algo`` section
    (:func:`grpokit.estimators.grpo.loss_config`). Defaults: plain GRPO without KL.

    Fields:
        beta: KL coefficient β >= 0 (> 0 needs ``ref_logp``). kl_estimator: ``"k1" | "k2" | "k3"``.
        clip_eps_low / clip_eps_high: ε_low, ε_high >= 0 (clip-higher, DAPO).
        aggregation: a name of :data:`~grpokit.algo.catalog.AGGREGATIONS`; max_completion_length:
            required (>= 1) by ``seq_mean_token_sum_norm``.
        tis_cap: C >= 0 of the sampler correction (0 = off; > 0 needs ``sampler_logp``);
            is_correction: a name of :data:`~grpokit.algo.catalog.SAMPLER_CORRECTIONS`.
        importance_level: a name of :data:`~grpokit.algo.catalog.IMPORTANCE_LEVELS`.
        surrogate: a name of :data:`~grpokit.algo.catalog.SURROGATES`; dual_clip_c: c (0 = off, else
            > 1); delta: δ (0 = off, else > 1 + ε_high; TRL's advice: below it δ also clips A > 0).
        entropy_coef: the entropy bonus's coefficient >= 0 (0 = off; > 0 needs ``entropy``).

    Raises:
        ValueError: ``LossConfig: <field> ...`` for a negative β, ε, C or entropy_coef, an unknown
        name (listing the registry's names), a ``dual_clip_c``/``delta`` out of range, or a
        combination an entry's check refuses (CISPO with a sequence-level ratio or with dual clip /
        δ; MIS with ``0 < tis_cap <= 1``; ``seq_mean_token_sum_norm`` without max_completion_length).

    Example:
        >>> LossConfig(surrogate="cispo", clip_eps_low=1.0).surrogate
        'cispo'
        >>> LossConfig(dual_clip_c=0.5)
        Traceback (most recent call last):
        ...
        ValueError: LossConfig: dual_clip_c must be 0 (off) or > 1, got 0.5
    """

    beta: float = 0.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_estimator: str = "k3"
    aggregation: str = "seq_mean_token_mean"
    max_completion_length: int | None = None
    tis_cap: float = 0.0
    is_correction: str = "tis"
    importance_level: str = "token"
    surrogate: str = "clip"
    dual_clip_c: float = 0.0
    delta: float = 0.0
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        fn = "LossConfig"
        if self.beta < 0 or self.clip_eps_low < 0 or self.clip_eps_high < 0:
            raise ValueError(
                f"{fn}: beta, clip_eps_low, clip_eps_high must be >= 0, "
                f"got {self.beta}, {self.clip_eps_low}, {self.clip_eps_high}"
            )
        if self.tis_cap < 0:
            raise ValueError(f"{fn}: tis_cap must be >= 0 (0 = off), got {self.tis_cap}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"{fn}: kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        chosen = self._chosen()
        for registry, name in chosen:
            registry.lookup(name, fn)
        if self.dual_clip_c != 0 and not self.dual_clip_c > 1:
            raise ValueError(f"{fn}: dual_clip_c must be 0 (off) or > 1, got {self.dual_clip_c}")
        if self.delta != 0 and not self.delta > 1 + self.clip_eps_high:
            raise ValueError(
                f"{fn}: delta must be 0 (off) or > 1 + clip_eps_high = {1 + self.clip_eps_high}, got {self.delta}"
            )
        for registry, name in chosen:
            registry.check(name, fn, self)
        if not self.entropy_coef >= 0:
            raise ValueError(f"{fn}: entropy_coef must be >= 0, got {self.entropy_coef}")

    def _chosen(self) -> tuple[tuple[Registry, str], ...]:
        """The registries this config picks from, with its names."""
        return (
            (IMPORTANCE_LEVELS, self.importance_level),
            (SURROGATES, self.surrogate),
            (SAMPLER_CORRECTIONS, self.is_correction),
            (AGGREGATIONS, self.aggregation),
        )


@dataclass(frozen=True, eq=False)
class LossStats:
    """:func:`grpokit.algo.policy_loss`'s statistics, detached 0-dim tensors (masked means over this
    batch's tokens; docstring of ``policy_loss`` for each). The first five are always set; the
    others (None = not logged) by the variant that defines them. :meth:`as_dict` is what the
    trainer logs, by these names."""

    clip_frac_low: torch.Tensor
    clip_frac_high: torch.Tensor
    kl: torch.Tensor
    ratio_mean: torch.Tensor
    #: this batch's counted tokens: the weight of its stats in a token-weighted sum over micro-batches
    num_tokens: torch.Tensor
    clip_frac_dual: torch.Tensor | None = None
    clip_frac_delta: torch.Tensor | None = None
    seq_ratio_mean: torch.Tensor | None = None
    tis_weight_mean: torch.Tensor | None = None
    tis_capped_frac: torch.Tensor | None = None
    mis_weight_mean: torch.Tensor | None = None
    mis_dropped_frac: torch.Tensor | None = None
    #: stats an estimator adds to the loss's (GRPO: ``entropy_coef``), logged after the others
    extra: Mapping[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, torch.Tensor]:
        """``name -> tensor`` of the set stats, in field order (``num_tokens`` included), then
        :attr:`extra`."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "extra" and value is not None:
                out[f.name] = value
        return out | dict(self.extra)

    def means(self) -> dict[str, torch.Tensor]:
        """:meth:`as_dict` without ``num_tokens``: the token means the trainer weights by
        :attr:`num_tokens` and sums over micro-batches."""
        return {k: v for k, v in self.as_dict().items() if k != "num_tokens"}


class LossOutput(NamedTuple):
    """``(loss, stats)``: the 0-dim loss (with gradient) and its :class:`LossStats`."""

    loss: torch.Tensor
    stats: LossStats
