"""GRPO (DeepSeekMath, arXiv 2402.03300) through the algorithm seam of :mod:`grpokit.estimators.base`:
group-normalized outcome advantages (§4.1.2) or process advantages (§4.1.3), and the clipped
surrogate with β·KL (eq. 3). All math is in :mod:`grpokit.algo`; this class binds it to the recipe's
``algo`` section.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from grpokit import algo
from grpokit.utils.distributed import group_ranks, sum_over_ranks

if TYPE_CHECKING:
    from grpokit.config import AlgoConfig, TrainConfig
    from grpokit.experience import Experience
    from grpokit.models.logprobs import LogprobScorer


def loss_config(a: AlgoConfig, max_completion_length: int) -> algo.LossConfig:
    """The :class:`grpokit.algo.LossConfig` of the recipe's ``algo`` section ``a``: ``beta``,
    ``clip_eps_low/high``, ``kl_estimator``, ``loss_aggregation``, ``tis_cap``, ``is_correction``,
    ``importance_level``, ``policy_loss`` (the surrogate), ``dual_clip_c``, ``delta``,
    ``entropy_coef`` (the starting one with ``entropy_target``), and ``max_completion_length``
    (tokens, for ``seq_mean_token_sum_norm``).

    Raises:
        ValueError: what :class:`grpokit.algo.LossConfig` refuses (the recipe checks refuse it first,
        naming the recipe key).
    """
    return algo.LossConfig(
        beta=a.beta,
        clip_eps_low=a.clip_eps_low,
        clip_eps_high=a.clip_eps_high,
        kl_estimator=a.kl_estimator,
        aggregation=a.loss_aggregation,
        max_completion_length=max_completion_length,
        tis_cap=a.tis_cap,
        is_correction=a.is_correction,
        importance_level=a.importance_level,
        surrogate=a.policy_loss,
        dual_clip_c=a.dual_clip_c,
        delta=a.delta,
        entropy_coef=a.entropy_coef,
    )


class GRPO:
    """GRPO from the recipe's ``algo`` section ``a`` and the longest completion (tokens, for
    ``seq_mean_token_sum_norm``); its :func:`loss_config` is built (and checked) once, here."""

    def __init__(self, a: AlgoConfig, max_completion_length: int):
        self.cfg, self.max_completion_length = a, max_completion_length
        self.loss_config = loss_config(a, max_completion_length)
        self.needs_reference = a.beta > 0
        self._adapted_entropy_coef: float | None = None  # algo.entropy_target: the coefficient as adapted
        self._entropy_seen = [0.0, 0.0]  # this step's Σ H over the loss's tokens, and their number

    @property
    def needs_entropy(self) -> bool:
        """The entropy bonus is on (``algo.entropy_coef > 0`` or ``algo.entropy_target`` set): the loop
        passes the policy's per-token entropy, with gradient, to :meth:`loss`."""
        return self.cfg.entropy_coef > 0 or self.cfg.entropy_target is not None

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient for this step: ``algo.entropy_coef``, or with
        ``algo.entropy_target`` its value as :meth:`update_auxiliary` adapted it (checkpointed)."""
        return self.cfg.entropy_coef if self._adapted_entropy_coef is None else self._adapted_entropy_coef

    def advantages(self, exp: Any) -> torch.Tensor:
        """Outcome: ``algo.outcome_advantages(exp.rewards, G, baseline=algo.advantage_baseline,
        scale=algo.advantage_scale, lengths=completion_mask.sum(1))`` (the group baseline is
        ``algo.group_advantages``), ``(N,)``; process: ``algo.process_advantages(exp.step_rewards,
        exp.step_ends, mask, G, mode=algo.process_advantage)``, ``(N, T)``. float32."""
        a = self.cfg
        if exp.step_rewards is not None:
            adv = algo.process_advantages(
                exp.step_rewards,
                exp.step_ends,
                exp.completion_mask,
                exp.group_size,
                eps=a.advantage_eps,
                mode=a.process_advantage,
            )
        else:
            adv = algo.outcome_advantages(
                exp.rewards,
                exp.group_size,
                baseline=a.advantage_baseline,
                scale=a.advantage_scale,
                eps=a.advantage_eps,
                lengths=exp.completion_mask.sum(dim=1),  # the tokens that count (REINFORCE++'s token statistics)
            )
        return adv.float()

    def groups_with_signal(self, exp: Any) -> list[int]:
        """Outcome: groups whose rewards are not all equal (``algo.constant_groups``); process:
        groups whose pooled step rewards are not all equal (``algo.process_constant_groups``)."""
        if exp.step_rewards is not None:
            const = algo.process_constant_groups(exp.step_rewards, exp.step_ends, exp.completion_mask, exp.group_size)
        else:
            const = algo.constant_groups(exp.rewards, exp.group_size)
        return (~const).nonzero().flatten().tolist()

    def loss(
        self,
        logp: torch.Tensor,
        mb: Any,
        loss_mask: torch.Tensor,
        *,
        num_sequences: int,
        num_tokens: int,
        entropy: torch.Tensor | None = None,
    ) -> algo.LossOutput:
        """``algo.policy_loss`` with :attr:`loss_config` on micro-batch ``mb`` (ratio against
        ``mb.old_logprobs``, or 1 by value when there are none: μ = 1; with ``algo.tis_cap > 0`` the
        sampler correction against ``mb.sampler_logprobs``) and, when :attr:`needs_entropy`, the
        entropy bonus on ``entropy`` with :attr:`entropy_coef` (logged as the stat ``entropy_coef``).
        With the entropy bonus the stats carry ``entropy_coef`` in :attr:`grpokit.algo.LossStats.extra`."""
        old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
        coef = self.entropy_coef if self.needs_entropy else 0.0
        cfg = self.loss_config
        if coef != cfg.entropy_coef:  # algo.entropy_target adapted it: checked once per new value
            cfg = self.loss_config = dataclasses.replace(cfg, entropy_coef=coef)
        out = algo.policy_loss(
            logp,
            old,
            mb.advantages,
            loss_mask,
            cfg,
            ref_logp=mb.ref_logprobs,
            sampler_logp=mb.sampler_logprobs if cfg.tis_cap > 0 else None,
            entropy=entropy if coef > 0 else None,
            num_sequences=num_sequences,
            num_tokens=num_tokens,
        )
        if not self.needs_entropy:
            return out
        if entropy is not None and self.cfg.entropy_target is not None:  # what update_auxiliary adapts to
            self._entropy_seen[0] += float(torch.where(loss_mask, entropy.detach(), 0.0).sum())
            self._entropy_seen[1] += float(loss_mask.sum())
        extra = {"entropy_coef": torch.tensor(coef, dtype=torch.float64)}
        return algo.LossOutput(out.loss, dataclasses.replace(out.stats, extra=extra))

    def bind(self, logprobs: LogprobScorer, train_cfg: TrainConfig) -> None:
        """Nothing to build."""

    def updates_policy(self, step: int) -> bool:
        """Always."""
        return True

    def update_auxiliary(self, exp: Experience, loss_mask: torch.Tensor, train_cfg: TrainConfig) -> dict[str, float]:
        """With ``algo.entropy_target`` (adaptive entropy bonus): after the step's update, the
        coefficient moves toward keeping the batch's entropy at the target,
        ``coef ← max(0, coef + algo.entropy_coef_lr · (target − H))``, ``H`` the mean entropy over
        the loss's tokens of this step's μ passes (summed over ranks, so every rank agrees); the next
        step's loss uses it. Nothing else beyond the policy; no metrics."""
        seen, self._entropy_seen = self._entropy_seen, [0.0, 0.0]
        target = self.cfg.entropy_target
        if target is None:
            return {}
        total, tokens = sum_over_ranks(seen, group_ranks())
        if tokens > 0:
            h = total / tokens
            self._adapted_entropy_coef = max(0.0, self.entropy_coef + self.cfg.entropy_coef_lr * (target - h))
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The adapted entropy coefficient (``algo.entropy_target``), once adapted; else nothing."""
        c = self._adapted_entropy_coef
        return {} if c is None else {"entropy_coef": c}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (an empty dict: nothing to restore)."""
        if "entropy_coef" in state:
            self._adapted_entropy_coef = float(state["entropy_coef"])
