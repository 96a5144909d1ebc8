"""The GRPO objective: clipped token-ratio surrogate, KL penalty, loss aggregation (DeepSeekMath eq. 3)."""

from __future__ import annotations

import torch

from ._checks import check_dim, check_same_shape
from .kl import kl_penalty

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


def aggregate_loss(
    per_token_loss: torch.Tensor,
    completion_mask: torch.Tensor,
    aggregation: str = "seq_mean_token_mean",
    *,
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce ``(N, T)`` per-token losses to a scalar.

    - ``"seq_mean_token_mean"``: ``1/N_glob Σ_i 1/|o_i| Σ_t l_it`` (DeepSeekMath eq. 3).
    - ``"token_mean"``: ``Σ_i Σ_t l_it / tokens_glob`` (DAPO, arXiv 2503.14476).
    - ``"seq_mean_token_sum_norm"``: ``Σ_i Σ_t l_it / (N_glob · max_completion_length)``
      (Dr. GRPO, arXiv 2503.20783).

    ``N_glob`` and ``tokens_glob`` default to this batch's sequence and unmasked-token counts. For
    micro-batching, pass the counts of the whole batch: the micro-batch losses (and gradients) then
    sum to the full-batch one. A sequence without unmasked tokens adds 0 to the numerator and counts
    in ``N_glob``; nothing produces NaN.

    Args:
        per_token_loss: ``(N, T)`` float.
        completion_mask: ``(N, T)`` bool.
        aggregation: one of ``AGGREGATIONS``.
        max_completion_length: required for ``seq_mean_token_sum_norm``.
        num_sequences: ``N_glob`` (>= 1). num_tokens: ``tokens_glob`` (>= 1 when given).

    Returns:
        0-dim tensor.

    Raises:
        ValueError: unknown aggregation, missing ``max_completion_length``, mismatched shapes.

    Example:
        >>> l = torch.tensor([[-1.0, -1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
        >>> m = torch.tensor([[True, True, False, False], [True, True, True, True]])
        >>> aggregate_loss(l, m, "token_mean").item()  # (-2 + 4) / 6
        0.3333333432674408
    """
    fn = "aggregate_loss"
    check_same_shape(fn, per_token_loss=per_token_loss, completion_mask=completion_mask)
    mask = completion_mask.to(per_token_loss.dtype)
    n_seq = per_token_loss.shape[0] if num_sequences is None else num_sequences
    masked = per_token_loss * mask
    if aggregation == "seq_mean_token_mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / max(n_seq, 1)
    if aggregation == "token_mean":
        n_tok = mask.sum() if num_tokens is None else mask.new_tensor(float(num_tokens))
        return masked.sum() / torch.clamp(n_tok, min=1.0)
    if aggregation == "seq_mean_token_sum_norm":
        if not max_completion_length or max_completion_length < 1:
            raise ValueError(
                f"{fn}: aggregation 'seq_mean_token_sum_norm' needs max_completion_length >= 1, "
                f"got {max_completion_length}"
            )
        return masked.sum() / (max(n_seq, 1) * max_completion_length)
    raise ValueError(f"{fn}: aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    kl_estimator: str = "k3",
    aggregation: str = "seq_mean_token_mean",
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    sampler_logp: torch.Tensor | None = None,
    tis_cap: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO loss: negative clipped surrogate plus β·KL, aggregated over tokens and sequences.

    Per token (DeepSeekMath eq. 3, clip-higher from DAPO):
    ``r = exp(logp − old_logp)``,
    ``l_t = −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A) + β·KL_t`` with ``KL_t = kl_penalty(logp,
    ref_logp, kl_estimator)``; then ``aggregate_loss``. With ``old_logp = logp.detach()`` (μ = 1,
    on-policy) the ratio is 1 by value and the gradient is ``−A·∇logp``.

    Truncated importance sampling (``tis_cap = C > 0``; Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"): when the tokens were sampled by another
    engine (vLLM) whose probabilities ``sampler_logp`` differ from π_old's, the surrogate term of
    each token is weighted by ``w = min(exp(old_logp − sampler_logp), C)`` (no gradient through
    ``w``; the KL term is not weighted): ``l_t = −w·min(r·A, clip(r)·A) + β·KL_t``.

    Args:
        logp: ``(N, T)`` float log-probs under π_θ (requires grad for training).
        old_logp: ``(N, T)`` log-probs under π_old (no grad).
        advantages: ``(N,)`` (broadcast over tokens) or ``(N, T)``.
        completion_mask: ``(N, T)`` bool, True = token counts.
        ref_logp: ``(N, T)`` under π_ref; required when ``beta > 0``.
        beta: KL coefficient β >= 0. clip_eps_low / clip_eps_high: ε_low, ε_high >= 0.
        kl_estimator: ``"k1" | "k2" | "k3"``.
        aggregation, max_completion_length, num_sequences, num_tokens: see ``aggregate_loss``.
        sampler_logp: ``(N, T)`` the sampler's log-probs of the tokens (at the same temperature);
            required when ``tis_cap > 0``. tis_cap: C >= 0 of truncated importance sampling
            (0 = off).

    Returns:
        ``(loss, stats)``; ``stats`` (detached, masked means over this batch's tokens):
        ``clip_frac_low`` (share of tokens with r < 1−ε_low and A < 0: clipped, no gradient),
        ``clip_frac_high`` (r > 1+ε_high and A > 0), ``kl``, ``ratio_mean``, ``num_tokens``;
        with ``tis_cap > 0`` also ``tis_weight_mean`` (mean w) and ``tis_capped_frac`` (w = C).

    Raises:
        ValueError: mismatched shapes, β > 0 without ``ref_logp``, ``tis_cap > 0`` without
        ``sampler_logp``, negative β, ε or C, unknown aggregation or estimator.

    Example:
        >>> lp = torch.zeros(2, 3, requires_grad=True)
        >>> loss, st = policy_loss(lp, lp.detach(), torch.tensor([1.0, -1.0]),
        ...                        torch.ones(2, 3, dtype=torch.bool))
        >>> loss.item(), st["ratio_mean"].item()
        (0.0, 1.0)
    """
    fn = "policy_loss"
    check_dim(fn, "logp", logp, 2)
    check_same_shape(fn, logp=logp, old_logp=old_logp, completion_mask=completion_mask)
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(
                f"{fn}: advantages {tuple(advantages.shape)} must be (N,) or (N, T) with logp "
                f"{tuple(logp.shape)}"
            )
        advantages = advantages[:, None]
    else:
        check_same_shape(fn, advantages=advantages, logp=logp)
    if beta < 0 or clip_eps_low < 0 or clip_eps_high < 0:
        raise ValueError(
            f"{fn}: beta, clip_eps_low, clip_eps_high must be >= 0, got {beta}, {clip_eps_low}, "
            f"{clip_eps_high}"
        )
    if tis_cap < 0:
        raise ValueError(f"{fn}: tis_cap must be >= 0 (0 = off), got {tis_cap}")
    advantages = advantages.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    tis = None
    if tis_cap > 0:
        if sampler_logp is None:
            raise ValueError(f"{fn}: tis_cap={tis_cap} > 0 needs sampler_logp (the rollout engine's log-probs)")
        check_same_shape(fn, logp=logp, sampler_logp=sampler_logp)
        tis = torch.exp(old_logp.detach() - sampler_logp.to(logp.dtype)).clamp(max=tis_cap)
        per_token = per_token * tis
    mask = completion_mask.bool()
    if beta > 0:
        if ref_logp is None:
            raise ValueError(f"{fn}: beta={beta} > 0 needs ref_logp (the reference model's log-probs)")
        check_same_shape(fn, logp=logp, ref_logp=ref_logp)
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        per_token = per_token + beta * kl
    elif ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
    else:
        kl = torch.zeros_like(logp)
    loss = aggregate_loss(
        per_token,
        mask,
        aggregation,
        max_completion_length=max_completion_length,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
    )
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp(min=1.0)
        low = (ratio < 1.0 - clip_eps_low) & (advantages < 0)
        high = (ratio > 1.0 + clip_eps_high) & (advantages > 0)
        stats = {
            "clip_frac_low": (low.to(m.dtype) * m).sum() / n,
            "clip_frac_high": (high.to(m.dtype) * m).sum() / n,
            "kl": (kl.detach() * m).sum() / n,
            "ratio_mean": (ratio.detach() * m).sum() / n,
            "num_tokens": m.sum(),
        }
        if tis is not None:
            stats["tis_weight_mean"] = (tis * m).sum() / n
            stats["tis_capped_frac"] = ((tis >= tis_cap).to(m.dtype) * m).sum() / n
    return loss, stats
