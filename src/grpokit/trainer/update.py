"""Steps 5-6 of the loop (:mod:`grpokit.trainer.loop`): the update of one step's experience.
π_ref's and π_old's log-probs where needed, then μ = ``train.num_iterations`` gradient passes, each
one optimizer step over micro-batches normalized by the whole batch's counts (so accumulation
equals one big batch), and the sums the step logs, summed over ranks.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from grpokit.algo import LogprobGap
from grpokit.config import TrainConfig
from grpokit.experience import Experience
from grpokit.models.lora import adapter_dropout
from grpokit.trainer.build import Run
from grpokit.utils.distributed import gather_objects, norm_value, reduce_gradients, sum_over_ranks
from grpokit.utils.memory import release_memory


class UpdateOutcome(Enum):
    """What one gradient pass's optimizer step did (:func:`_apply_update`); the step logs how many of
    its μ passes were ``SKIPPED`` (``skipped_updates``) and ``ZERO_GRAD`` (``zero_grad_updates``)."""

    APPLIED = "applied"  # the optimizer stepped
    ZERO_GRAD = "zero_grad"  # the gradient was exactly 0: nothing to learn, no step (AdamW would still move)
    SKIPPED = "skipped"  # the loss or the gradient norm was not finite: no step, counted toward max_consecutive_skips


def optimize(run: Run, exp: Experience, *, keep_rows: torch.Tensor | None = None) -> dict[str, Any]:
    """Steps 5-6 on ``exp`` (``advantages`` set): reference/old log-probs, then μ =
    ``train.num_iterations`` passes of ``run.algorithm``'s loss, each one optimizer step over
    micro-batches of ``train.micro_batch_size`` rows normalized by the whole batch's counts.

    ``keep_rows`` ``(N,)`` bool (overlong filtering): rows False are left out of the loss (their
    tokens are masked, and the sequence and token counts are those of the kept rows); they are
    still fed to the model, so attention masks stay as sampled. The algorithm may hold the policy
    still this step (``updates_policy``: PPO's critic warm-up: no pass, ``policy_updated`` 0, loss
    and grad norm 0) and runs its own updates after the policy's (``update_auxiliary``: PPO's value
    model; its metrics are added).

    With several ranks ``exp`` is this rank's share; an update makes three kinds of collective: the
    batch's counts (one call, first), per pass the gradients (``ddp``) and the loss (the skip
    decision), and the update's logged sums (one call, last: :meth:`UpdateTotals.sum_over_ranks`).
    Returns the update's metrics (loss, kl, clip fractions, ratio, entropy, grad norm, lr, skipped
    and zero-gradient updates, ``ref_s``, ``policy_updated``)."""
    t = run.recipe.train
    t0 = time.perf_counter()
    _score_old_and_reference(run, exp)
    release_memory()  # heap pages freed by the no-grad passes go back to the OS (grpokit.utils.memory)
    ref_s = time.perf_counter() - t0
    loss_mask = exp.completion_mask if keep_rows is None else exp.completion_mask & keep_rows[:, None]
    counts = BatchCounts.of(exp, loss_mask, keep_rows, run.ranks)
    totals = UpdateTotals()
    grad_norms: list[float] = []
    lrs: list[float] = []
    outcomes: list[UpdateOutcome] = []
    gap = LogprobGap()  # the sampler's log-probs against π_old's (engines that report them: vllm)
    passes = t.num_iterations if run.algorithm.updates_policy(run.state.step + 1) else 0  # 0: PPO's critic warm-up
    for it in range(passes):
        run.optimizer.zero_grad(set_to_none=True)
        loss_total = _gradient_pass(run, exp, loss_mask, counts, totals, gap if it == 0 else None)
        gn, outcome = _apply_update(run, t, loss_total)
        grad_norms.append(gn)
        lrs.append(float(run.optimizer.param_groups[0]["lr"]))  # the rate this update uses (before the schedule moves)
        outcomes.append(outcome)
        with warnings.catch_warnings():  # the schedule follows updates applied or not
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*optimizer.step")
            run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    totals.sum_over_ranks(run.ranks, gap)  # this rank's share of every logged sum -> the batch's
    aux = run.algorithm.update_auxiliary(exp, loss_mask, t)  # PPO: the value model
    run.engine.sync_weights()
    mu = max(passes, 1)
    return {
        **totals.means(mu),
        "grad_norm": sum(grad_norms) / mu,
        "lr": sum(lrs) / len(lrs) if lrs else float(run.optimizer.param_groups[0]["lr"]),
        "skipped_updates": outcomes.count(UpdateOutcome.SKIPPED),
        "zero_grad_updates": outcomes.count(UpdateOutcome.ZERO_GRAD),
        "ref_s": ref_s,
        "policy_updated": int(passes > 0),
        **aux,
        **gap.metrics(),
    }


@dataclass(frozen=True)
class BatchCounts:
    """The whole batch's counts that normalize every micro-batch's loss: ``sequences`` (kept rows,
    at least 1), ``loss_tokens`` (tokens of ``loss_mask``) and ``completion_tokens`` (every
    completion token: the entropy's denominator)."""

    sequences: int
    loss_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, exp: Experience, loss_mask: torch.Tensor, keep_rows: torch.Tensor | None, ranks: Any) -> BatchCounts:
        """Counted on this rank's share and summed over ranks (one collective)."""
        n = len(exp) if keep_rows is None else int(keep_rows.sum())
        c = sum_over_ranks([n, int(loss_mask.sum()), int(exp.completion_mask.sum())], ranks)
        return cls(max(int(c[0]), 1), int(c[1]), int(c[2]))


@dataclass
class PassTotals:
    """One gradient pass's sums: the loss (this rank's share) and the loss stats, token-weighted
    over the batch (:meth:`grpokit.estimators.base.Algorithm.loss`'s stats: GRPO's kl, clip
    fractions, ratio_mean)."""

    loss: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class UpdateTotals:
    """The sums of one update's passes, and the entropy of the policy before it (pass 0)."""

    passes: list[PassTotals] = field(default_factory=list)
    entropy: float | None = None

    def new_pass(self) -> PassTotals:
        self.passes.append(PassTotals())
        return self.passes[-1]

    def sum_over_ranks(self, ranks: Any, gap: LogprobGap | None = None) -> None:
        """Replace this rank's sums by the whole batch's: one collective for every value, after one
        that agrees on which values there are (a rank whose share had no rows, in a dynamic-sampling
        step of fewer groups than ranks, ran no micro-batch and has no stat and no entropy: it adds 0)
        and carries ``gap``'s sums and maximum (the sampler's log-prob gap over the whole batch)."""
        if not ranks.active:
            return
        keys_mine = [(i, k) for i, p in enumerate(self.passes) for k in sorted(p.stats)]
        gap_mine = None if gap is None else (gap.total, gap.count, gap.max, gap.seen)
        every = gather_objects((keys_mine, self.entropy is not None, gap_mine), ranks)
        keys = sorted({key for ks, _, _ in every for key in ks})
        with_entropy = any(e for _, e, _ in every)
        if gap is not None:
            gaps = [g for _, _, g in every if g is not None]
            gap.total, gap.count = sum(g[0] for g in gaps), sum(g[1] for g in gaps)
            gap.max, gap.seen = max(g[2] for g in gaps), any(g[3] for g in gaps)
        values = [p.loss for p in self.passes] + [self.passes[i].stats.get(k, 0.0) for i, k in keys]
        values += [self.entropy or 0.0] if with_entropy else []
        summed = sum_over_ranks(values, ranks)
        for p, v in zip(self.passes, summed):
            p.loss = v
        for (i, k), v in zip(keys, summed[len(self.passes) :]):
            self.passes[i].stats[k] = v
        if with_entropy:
            self.entropy = summed[-1]

    def means(self, mu: int) -> dict[str, Any]:
        """``loss`` and each stat averaged over the ``mu`` passes (a stat missing in a pass counts
        0), and ``entropy``."""
        keys = sorted({k for p in self.passes for k in p.stats})
        out: dict[str, Any] = {"loss": sum(p.loss for p in self.passes) / mu}
        out.update({k: sum(p.stats.get(k, 0.0) for p in self.passes) / mu for k in keys})
        out["entropy"] = self.entropy
        return out


def _score_old_and_reference(run: Run, exp: Experience) -> None:
    """Step 5: π_ref's log-probs when the algorithm needs them (LoRA: the adapters disabled), π_old's
    when μ > 1; each left alone when already set (an algorithm may have set them)."""
    if run.algorithm.needs_reference and exp.ref_logprobs is None:
        exp.ref_logprobs = run.logprobs.reference(exp)
    if run.recipe.train.num_iterations > 1 and exp.old_logprobs is None:
        exp.old_logprobs = run.logprobs.policy(exp)


def _gradient_pass(
    run: Run,
    exp: Experience,
    loss_mask: torch.Tensor,
    counts: BatchCounts,
    update: UpdateTotals,
    gap: LogprobGap | None,
) -> float:
    """One pass of step 6 over this rank's micro-batches: each loss normalized by the batch's
    ``counts``, backward into ``.grad``; the pass's loss and token-weighted stats go into a new
    :class:`PassTotals` of ``update``. In pass 0 (``gap`` given: before the first update logp is
    π_old's) also the entropy (``update.entropy``) and the sampler gap. Returns this rank's share
    of the loss."""
    totals, entropy = update.new_pass(), None
    for sl, mb in exp.micro_batches(run.recipe.train.micro_batch_size):
        with adapter_dropout(run.model):  # model.lora.dropout: in the gradient passes only (grpokit.models.lora)
            # the entropy: logged in pass 0; with gradient in every pass when the loss has an entropy bonus
            logp, ent = run.logprobs.micro_batch(
                mb, with_entropy=gap is not None, entropy_grad=run.algorithm.needs_entropy
            )
            loss, stats = run.algorithm.loss(
                logp,
                mb,
                loss_mask[sl, : mb.completion_ids.shape[1]],
                num_sequences=counts.sequences,
                num_tokens=counts.loss_tokens,
                entropy=ent,
            )
            loss.backward()  # inside: a checkpointed layer recomputes with the same dropout
        if gap is not None:
            gap.add(mb.sampler_logprobs, logp, mb.completion_mask)
        release_memory()
        totals.loss += loss.item()
        w = stats.num_tokens.item() / max(counts.loss_tokens, 1)  # token-weighted means over the batch
        for k, v in stats.means().items():
            totals.stats[k] = totals.stats.get(k, 0.0) + w * v.item()
        if ent is not None and gap is not None:
            ent_sum = torch.where(mb.completion_mask, ent.detach(), torch.zeros_like(ent)).sum()  # not ent·mask: NaN·0
            entropy = (entropy or 0.0) + float(ent_sum) / max(counts.completion_tokens, 1)
    if entropy is not None:
        update.entropy = entropy
    return totals.loss


def _apply_update(run: Run, t: TrainConfig, loss_total: float) -> tuple[float, UpdateOutcome]:
    """The optimizer step of one pass: gradients summed over ranks (ddp), clipped at
    ``t.max_grad_norm``; not applied when the gradient is exactly zero (nothing to learn: AdamW
    would move the weights by momentum and weight decay alone) or the loss or norm is not finite
    (counted in ``run.state.consecutive_skips``). Returns ``(grad norm, outcome)``, the same on every
    rank."""
    ranks, state = run.ranks, run.state
    if ranks.parallel == "ddp":  # fsdp2 reduce-scatters in backward; then every rank has the same gradient
        reduce_gradients([p for p in run.model.parameters() if p.requires_grad], ranks)
    loss_total = sum_over_ranks([loss_total], ranks)[0]  # the same skip decision on every rank
    clip = t.max_grad_norm if t.max_grad_norm > 0 else float("inf")
    gn = norm_value(torch.nn.utils.clip_grad_norm_(run.model.parameters(), clip))
    if gn == 0.0:
        state.consecutive_skips = 0
        return gn, UpdateOutcome.ZERO_GRAD
    if math.isfinite(gn) and math.isfinite(loss_total):
        run.optimizer.step()
        state.consecutive_skips = 0
        return gn, UpdateOutcome.APPLIED
    state.consecutive_skips += 1
    return gn, UpdateOutcome.SKIPPED
