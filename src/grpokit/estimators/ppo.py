"""PPO with a value model and GAE: the baseline GRPO replaces (``algo.estimator=ppo``).

DeepSeekMath §4.1 (arXiv 2402.03300) introduces GRPO as PPO (Ouyang et al. 2022, arXiv
2203.02155) without the value model. This is that PPO, in the same loop through the algorithm seam
(:mod:`grpokit.estimators.base`):

1. ``advantages(exp)`` (after the rewards): the policy's log-probs at sampling (π_old), the
   reference's when the KL is in the reward, and the value model's ``V_old`` — all without gradient;
   per-token rewards (the outcome reward on the last completion token, or the process rewards at
   step ends; minus ``β · (log π_old − log π_ref)`` per token with ``algo.kl_in_reward``);
   GAE(``algo.gamma``, ``algo.lam``) skipping masked tokens; advantages whitened over the batch's
   unmasked tokens (``algo.whiten_advantages``; across ranks when a process group is up).
   Every group has signal (the value model is the baseline, not the group mean).
2. ``loss``: the clipped surrogate on those per-token advantages, with ``β · KL`` in the loss unless
   the KL is in the reward (as GRPO: :func:`grpokit.algo.policy_loss`).
3. ``update_auxiliary``: ``train.num_iterations`` passes of the clipped value loss
   (:func:`grpokit.algo.value_loss`, ``algo.value_clip_eps``) over the same micro-batches, one
   step of the value model's own AdamW (``train.critic_learning_rate``, no schedule) per pass.
4. ``updates_policy(step)``: False for the first ``train.critic_warmup_steps`` steps (the value
   model learns, the policy is not touched).

The value model (:class:`grpokit.estimators.value.ValueModel`) is a copy of the policy's decoder with a zero
scalar head; it and its optimizer are in every checkpoint (``state_dict``). Under FSDP2
(``train.parallel=fsdp2``) the value model is sharded as the policy is (each decoder layer, then the
whole); its gradients are reduce-scattered in the backward, and its checkpoint state is gathered to
full tensors (every rank calls ``state_dict``; rank 0 writes it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from grpokit import algo
from grpokit.estimators.value import ValueModel
from grpokit.models.logprobs import LogprobScorer
from grpokit.utils.distributed import (
    full_state,
    group_ranks,
    is_sharded,
    load_full_state,
    norm_value,
    reduce_gradients,
    shard_model,
    sum_over_ranks,
)

if TYPE_CHECKING:
    from grpokit.config import AlgoConfig, TrainConfig
    from grpokit.experience import Experience


class PPO:
    """PPO from the recipe's ``algo`` section ``a`` (module docstring)."""

    def __init__(self, a: AlgoConfig, max_completion_length: int):
        self.cfg, self.max_completion_length = a, max_completion_length
        self.needs_reference = a.beta > 0
        self.needs_entropy = False  # the loss variants and entropy bonus are GRPO's (the recipe checks refuse them)
        # the clipped surrogate; β·KL in the loss unless algo.kl_in_reward (then it is in the reward)
        self.loss_config = algo.LossConfig(
            beta=0.0 if a.kl_in_reward else a.beta,
            clip_eps_low=a.clip_eps_low,
            clip_eps_high=a.clip_eps_high,
            kl_estimator=a.kl_estimator,
            aggregation=a.loss_aggregation,
            max_completion_length=max_completion_length,
        )
        self.critic: ValueModel | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.sharded = False

    # -- set-up ------------------------------------------------------------------------------

    def bind(self, logprobs: LogprobScorer, train_cfg: TrainConfig) -> None:
        """Build the value model from the policy's decoder (``logprobs.model``) and its AdamW
        (``train.critic_learning_rate``, ``train.adam_betas``, ``train.weight_decay``); sharded
        with FSDP2 when the policy is (every rank must call this then)."""
        self.logprobs = logprobs
        self.micro_batch_size, self.autocast_bf16 = logprobs.micro_batch_size, logprobs.autocast_bf16
        self.critic = ValueModel.from_policy(logprobs.model)
        self.sharded = is_sharded(logprobs.model)
        if self.sharded:
            shard_model(self.critic)
        self.critic_optimizer = torch.optim.AdamW(
            self.critic.parameters(),
            lr=train_cfg.critic_learning_rate,
            betas=tuple(train_cfg.adam_betas),
            weight_decay=train_cfg.weight_decay,
        )
        self.warmup_steps = train_cfg.critic_warmup_steps

    def _bound(self) -> ValueModel:
        if self.critic is None:
            raise RuntimeError("PPO: bind() the models before use (grpokit.trainer.build.build_run does)")
        return self.critic

    def _optimizer(self) -> torch.optim.Optimizer:
        """The value model's optimizer; called after :meth:`_bound` (bind() makes the two together)."""
        assert self.critic_optimizer is not None  # made by bind() with self.critic
        return self.critic_optimizer

    # -- the seam ----------------------------------------------------------------------------

    def updates_policy(self, step: int) -> bool:
        """False during the value model's warm-up (the first ``train.critic_warmup_steps`` steps)."""
        return step > self.warmup_steps

    def groups_with_signal(self, exp: Any) -> list[int]:
        """Every group: the value model, not the group, is the baseline."""
        return sorted(set(exp.group_index.tolist()))

    @torch.no_grad()
    def values(self, exp: Any) -> torch.Tensor:
        """``(N, T)`` float32 values of ``exp``'s completion tokens, micro-batched, no gradient."""
        critic = self._bound()
        out = torch.zeros(exp.completion_mask.shape, dtype=torch.float32, device=exp.device)
        for sl, mb in exp.micro_batches(self.micro_batch_size):
            v = critic.values(mb, autocast_bf16=self.autocast_bf16)
            out[sl, : v.shape[1]] = v
        return torch.where(exp.completion_mask, out, torch.zeros_like(out))  # not out·mask: inf·0 = NaN

    @torch.no_grad()
    def advantages(self, exp: Any) -> torch.Tensor:
        """``(N, T)`` float32 GAE advantages (module docstring, step 1). Also sets
        ``exp.old_logprobs``, ``exp.old_values``, ``exp.returns`` and, with the KL in the reward,
        ``exp.ref_logprobs``."""
        a, mask = self.cfg, exp.completion_mask
        self._bound()
        exp.old_logprobs = self.logprobs.policy(exp)
        kl = None
        if a.kl_in_reward and a.beta > 0:  # π_ref: the reference model, or the policy with LoRA adapters off
            exp.ref_logprobs = self.logprobs.reference(exp)
            # k1, per token (Ouyang et al. 2022 eq. 2); masked tokens selected out (token_rewards too)
            kl = torch.where(mask, exp.old_logprobs - exp.ref_logprobs, torch.zeros_like(exp.old_logprobs))
        rewards = exp.rewards if exp.rewards is not None else torch.zeros(len(exp), dtype=torch.float64)
        per_token = algo.token_rewards(
            rewards.to(exp.device), mask, step_rewards=exp.step_rewards, step_ends=exp.step_ends, kl=kl, kl_coef=a.beta
        )
        exp.old_values = self.values(exp)
        adv, returns = algo.gae_advantages(per_token, exp.old_values.double(), mask, gamma=a.gamma, lam=a.lam)
        exp.returns = returns.float()
        if a.whiten_advantages:  # over the whole batch: with several ranks the loop gathered it first
            adv = algo.masked_whiten(adv, mask)
        return adv.float()

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
        """The clipped surrogate (:attr:`loss_config`) on ``mb``'s per-token advantages (β·KL in the
        loss unless ``algo.kl_in_reward``); ``entropy`` is not used."""
        old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
        cfg = self.loss_config
        out = algo.policy_loss(
            logp,
            old,
            mb.advantages,
            loss_mask,
            cfg,
            ref_logp=mb.ref_logprobs if cfg.beta > 0 else None,
            num_sequences=num_sequences,
            num_tokens=num_tokens,
        )
        return out

    def update_auxiliary(self, exp: Experience, loss_mask: torch.Tensor, train_cfg: TrainConfig) -> dict[str, float]:
        """``train.num_iterations`` passes of the clipped value loss (module docstring, step 3).

        Returns ``value_loss`` (mean over passes of the batch loss), ``value_clip_frac``,
        ``critic_grad_norm`` (mean over passes) and ``value_mean`` (V_old over unmasked tokens)."""
        critic, opt = self._bound(), self._optimizer()
        if exp.old_values is None or exp.returns is None:
            raise RuntimeError("PPO.update_auxiliary: the batch has no old values or returns; call prepare() first")
        ranks = group_ranks()  # data parallel: exp is this rank's share; counts, losses, gradients summed
        n_tok = max(int(sum_over_ranks([int(loss_mask.sum())], ranks)[0]), 1)
        losses, fracs, norms = [], [], []
        critic.train(False)
        for _ in range(train_cfg.num_iterations):
            opt.zero_grad(set_to_none=True)
            total, frac = 0.0, 0.0
            for sl, mb in exp.micro_batches(train_cfg.micro_batch_size):
                v = critic.values(mb, autocast_bf16=self.autocast_bf16)
                m = loss_mask[sl, : v.shape[1]]
                assert mb.old_values is not None and mb.returns is not None  # a slice of exp's (checked above)
                loss, f = algo.value_loss(
                    v, mb.old_values, mb.returns, m, clip_eps=self.cfg.value_clip_eps, num_tokens=n_tok
                )
                loss.backward()
                total += loss.item()
                frac += f.item() * int(m.sum()) / n_tok
            if not self.sharded:  # FSDP2 reduce-scattered them in the backward
                reduce_gradients([p for p in critic.parameters() if p.requires_grad], ranks)
            total, frac = sum_over_ranks([total, frac], ranks)
            clip = train_cfg.max_grad_norm if train_cfg.max_grad_norm > 0 else float("inf")
            gn = norm_value(torch.nn.utils.clip_grad_norm_(critic.parameters(), clip))
            if math.isfinite(gn) and math.isfinite(total) and gn > 0:
                opt.step()
            losses.append(total)
            fracs.append(frac)
            norms.append(gn)
        opt.zero_grad(set_to_none=True)
        m = exp.completion_mask
        v_sum = torch.where(m, exp.old_values.double(), torch.zeros((), dtype=torch.float64, device=m.device)).sum()
        value_sum, count = sum_over_ranks([float(v_sum), float(m.sum())], ranks)
        return {
            "value_loss": sum(losses) / len(losses),
            "value_clip_frac": sum(fracs) / len(fracs),
            "critic_grad_norm": sum(norms) / len(norms),
            "value_mean": value_sum / max(count, 1.0),
        }

    def state_dict(self) -> dict[str, Any]:
        """The value model's weights and its optimizer's state. Sharded (FSDP2): gathered to full
        tensors on rank 0's CPU (the optimizer's keyed by parameter names), empty elsewhere; every
        rank must call it."""
        critic = self._bound()
        if self.sharded:
            weights, opt_state = full_state(critic, self._optimizer())
            return {"critic": weights, "critic_optimizer": opt_state}
        return {"critic": critic.state_dict(), "critic_optimizer": self._optimizer().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: a checkpoint without a value model (written by another estimator).
        """
        if "critic" not in state:
            raise ValueError(
                "algo.estimator=ppo: the checkpoint holds no value model (written by another "
                "estimator?); start a new run (train.resume=none)"
            )
        if self.sharded:  # every rank holds the full state: each loads its shards from it
            load_full_state(self._bound(), self._optimizer(), state["critic"], state["critic_optimizer"])
            return
        self._bound().load_state_dict(state["critic"])
        self._optimizer().load_state_dict(state["critic_optimizer"])
