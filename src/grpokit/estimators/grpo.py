"""GRPO (DeepSeekMath, arXiv 2402.03300) through the algorithm seam of :mod:`grpokit.estimators.base`:
group-normalized outcome advantages (§4.1.2) or process advantages (§4.1.3), and the clipped
surrogate with β·KL (eq. 3). All math is in :mod:`grpokit.algo`; this class binds it to the recipe's
``algo`` section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from grpokit import algo

if TYPE_CHECKING:
    from grpokit.config import AlgoConfig, TrainConfig
    from grpokit.experience import Experience
    from grpokit.models.logprobs import LogprobScorer


class GRPO:
    """GRPO from the recipe's ``algo`` section ``a`` and the longest completion (tokens, for
    ``seq_mean_token_sum_norm``)."""

    def __init__(self, a: AlgoConfig, max_completion_length: int):
        self.cfg, self.max_completion_length = a, max_completion_length
        self.needs_reference = a.beta > 0

    def advantages(self, exp: Any) -> torch.Tensor:
        """Outcome: ``algo.group_advantages(exp.rewards, G, scale=algo.advantage_scale)``, ``(N,)``;
        process: ``algo.process_advantages(exp.step_rewards, exp.step_ends, mask, G,
        mode=algo.process_advantage)``, ``(N, T)``. float32."""
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
            adv = algo.group_advantages(exp.rewards, exp.group_size, scale=a.advantage_scale, eps=a.advantage_eps)
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
        self, logp: torch.Tensor, mb: Any, loss_mask: torch.Tensor, *, num_sequences: int, num_tokens: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``algo.policy_loss`` on micro-batch ``mb`` (ratio against ``mb.old_logprobs``, or 1 by
        value when there are none: μ = 1; with ``algo.tis_cap > 0`` truncated importance sampling
        against ``mb.sampler_logprobs``)."""
        a = self.cfg
        old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
        return algo.policy_loss(
            logp,
            old,
            mb.advantages,
            loss_mask,
            ref_logp=mb.ref_logprobs,
            beta=a.beta,
            clip_eps_low=a.clip_eps_low,
            clip_eps_high=a.clip_eps_high,
            kl_estimator=a.kl_estimator,
            aggregation=a.loss_aggregation,
            max_completion_length=self.max_completion_length,
            num_sequences=num_sequences,
            num_tokens=num_tokens,
            sampler_logp=mb.sampler_logprobs if a.tis_cap > 0 else None,
            tis_cap=a.tis_cap,
        )

    def bind(self, logprobs: LogprobScorer, train_cfg: TrainConfig) -> None:
        """Nothing to build."""

    def updates_policy(self, step: int) -> bool:
        """Always."""
        return True

    def update_auxiliary(self, exp: Experience, loss_mask: torch.Tensor, train_cfg: TrainConfig) -> dict[str, float]:
        """Nothing beyond the policy."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """No state of its own."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""
