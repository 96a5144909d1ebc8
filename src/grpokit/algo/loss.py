"""The GRPO objective: clipped token-ratio surrogate, KL penalty, loss aggregation (DeepSeekMath eq. 3)."""

from __future__ import annotations

import math

import torch

from ._checks import check_dim, check_same_shape
from .kl import kl_penalty
from .surrogates import (
    check_variants,
    cispo_objective,
    clipped_objective,
    entropy_bonus,
    importance_log_ratio,
    sampler_weights,
    sequence_log_ratio,
)

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")

#: ``ratio_mean`` reads the log-ratio clamped to ±20 nats (ratio within ``[2e-9, 4.9e8]``), so that
#: an overflowing ratio (a token with A = 0, or one the clip holds still) logs a finite mean.
LOG_RATIO_STATS_CLAMP = 20.0


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
    in ``N_glob``; nothing produces NaN. Masked positions are left out by selection
    (``torch.where``), not multiplied by 0: a NaN or ±inf loss there changes neither the value nor
    the gradient (which is 0 there).

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
    keep = completion_mask.bool()
    mask = keep.to(per_token_loss.dtype)
    n_seq = per_token_loss.shape[0] if num_sequences is None else num_sequences
    masked = torch.where(keep, per_token_loss, torch.zeros_like(per_token_loss))  # not l·mask: inf·0 = NaN
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
    is_correction: str = "tis",
    importance_level: str = "token",
    surrogate: str = "clip",
    dual_clip_c: float = 0.0,
    delta: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
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
    ``is_correction="mis_token" | "mis_sequence"`` masks instead (weight 0 outside ``[1/C, C]``,
    :func:`grpokit.algo.surrogates.sampler_weights`).

    The variants (docs/loss_variants.md; each in :mod:`grpokit.algo.surrogates`), all off by default:

    - ``importance_level``: ``"token"`` (above); ``"sequence"`` (GSPO, arXiv 2507.18071 §4.1):
      ``r`` is the row's ``s_i = exp(mean_t(logp − old_logp))`` over its counted tokens, clipped with
      the same ``ε_low``/``ε_high``, and every counted token of row ``i`` carries
      ``l_i = −min(s_i·A_i, clip(s_i)·A_i)``: with ``seq_mean_token_mean`` the loss is the paper's
      ``1/N Σ_i l_i`` (``token_mean`` weights each sequence by its length); ``advantages`` must be
      ``(N,)``. ``"sequence_token"`` (GSPO-token, §4.3): the value of ``s_i`` with the gradient of
      each token's own log-prob, so ``(N, T)`` advantages (process supervision) weight each token.
    - ``surrogate="cispo"`` (MiniMax-M1, arXiv 2506.13585 §3.1): ``l_t = −sg(clip(r, 1 − ε_low,
      1 + ε_high))·A·logp``: clipped tokens keep their gradient; ``ε_low >= 1``: no lower bound.
    - ``dual_clip_c = c > 1`` (Ye et al. 2020, arXiv 1912.09729): for ``A < 0``, the objective is
      ``max(min(r·A, clip(r)·A), c·A)``; ``delta = δ > 1 + ε_high`` (TRL's ``delta``, INTELLECT-2):
      ``min(min(r, δ)·A, clip(r)·A)``. Both bound the loss of an ``A < 0`` token whose ratio ran
      away, where it was unbounded, and take its gradient.
    - ``entropy_coef > 0``: the loss minus ``coef · H``, ``H`` the mean of ``entropy`` (``(N, T)``,
      with gradient) over the counted tokens (of the whole batch when ``num_tokens`` is given).

    Tokens that count for nothing change nothing: masked tokens (``completion_mask`` False) are
    selected out (``torch.where``) of the surrogate, the KL, the entropy, every statistic and the
    gradient before any ``exp`` or product, so NaN/±inf log-probs or advantages there, or an extreme
    gap to ``ref_logp`` (k3's ``exp(d)``), leave loss, stats and gradient as in the clean batch. A
    token with ``A = 0`` adds exactly 0 to the surrogate and its gradient whatever its ratio (its KL
    term still counts; at sequence levels its log-ratio still enters its row's ``s_i``). A token
    with ``A > 0`` whose ratio overflows takes the clipped value with zero gradient; one with
    ``A < 0`` whose ratio overflows has an infinite loss (the trainer skips such an update) unless
    dual clip or δ bound it (then ``−c·A`` or ``−δ·A``, zero gradient). CISPO's weight is at most
    ``1 + ε_high`` whatever the ratio.

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
            required when ``tis_cap > 0``. tis_cap: C >= 0 of the sampler correction (0 = off).
        is_correction: ``"tis" | "mis_token" | "mis_sequence"`` (used when ``tis_cap > 0``).
        importance_level: ``"token" | "sequence" | "sequence_token"``.
        surrogate: ``"clip" | "cispo"``. dual_clip_c: c (0 = off). delta: δ (0 = off).
        entropy: ``(N, T)`` per-token entropies of π_θ (with gradient); required when
            ``entropy_coef > 0``. entropy_coef: the bonus's coefficient >= 0 (0 = off).

    Returns:
        ``(loss, stats)``; ``stats`` (detached, masked means over this batch's tokens):
        ``clip_frac_low`` (share of tokens with r < 1−ε_low and A < 0: clipped, no gradient),
        ``clip_frac_high`` (r > 1+ε_high and A > 0), ``kl``, ``ratio_mean`` (of the token ratio
        ``exp(clamp(logp − old_logp, ±LOG_RATIO_STATS_CLAMP))``: finite), ``num_tokens``;
        with ``tis_cap > 0`` also ``tis_weight_mean`` (mean w) and ``tis_capped_frac`` (w = C), or
        for MIS ``mis_weight_mean`` and ``mis_dropped_frac`` (share of tokens given weight 0);
        with ``dual_clip_c`` ``clip_frac_dual`` (A < 0 and r > c), with ``delta``
        ``clip_frac_delta`` (A < 0 and r > δ). CISPO's ``clip_frac_low/high``: tokens with A ≠ 0
        whose weight was clipped, whatever the sign of A. At sequence levels the clip fractions
        count **sequences** (a row is clipped when one of its tokens' terms is) and
        ``seq_ratio_mean`` is the mean ``s_i``: the share of the ``num_sequences`` sequences
        scaled by ``num_tokens / this batch's tokens``, so that the token-weighted sum of the
        micro-batches' stats (as the trainer sums every stat) is the whole batch's share.

    Raises:
        ValueError: mismatched shapes, β > 0 without ``ref_logp``, ``tis_cap > 0`` without
        ``sampler_logp``, ``entropy_coef > 0`` without ``entropy``, negative β, ε or C, unknown
        aggregation, estimator or variant name, a variant combination
        :func:`grpokit.algo.surrogates.check_variants` refuses, ``(N, T)`` advantages with
        ``importance_level="sequence"``.

    Example:
        >>> lp = torch.zeros(2, 3, requires_grad=True)
        >>> loss, st = policy_loss(lp, lp.detach(), torch.tensor([1.0, -1.0]),
        ...                        torch.ones(2, 3, dtype=torch.bool))
        >>> loss.item(), st["ratio_mean"].item()
        (0.0, 1.0)
    """
    fn = "policy_loss"
    advantages = _checked_advantages(fn, logp, old_logp, advantages, completion_mask, importance_level)
    if beta < 0 or clip_eps_low < 0 or clip_eps_high < 0:
        raise ValueError(
            f"{fn}: beta, clip_eps_low, clip_eps_high must be >= 0, got {beta}, {clip_eps_low}, {clip_eps_high}"
        )
    if tis_cap < 0:
        raise ValueError(f"{fn}: tis_cap must be >= 0 (0 = off), got {tis_cap}")
    check_variants(
        fn,
        importance_level=importance_level,
        surrogate=surrogate,
        is_correction=is_correction,
        dual_clip_c=dual_clip_c,
        delta=delta,
        clip_eps_high=clip_eps_high,
        tis_cap=tis_cap,
        entropy_coef=entropy_coef,
    )
    mask = completion_mask.bool()
    zeros = torch.zeros_like(logp)
    # Tokens that count for nothing change nothing: a masked token, or one with A = 0 (its surrogate
    # is 0 whatever the ratio), gets A = 0 and log-ratio 0 *before* any exp or product, so that
    # neither the value nor the gradient can meet inf·0 (a where only after the exp would keep the
    # value but not the gradient, whose chain rule still multiplies 0 by inf).
    advantages = torch.where(mask, advantages.to(logp.dtype).expand_as(logp), zeros)  # (N, T)
    live = advantages != 0
    weights = dropped = None
    if tis_cap > 0:
        if sampler_logp is None:
            raise ValueError(f"{fn}: tis_cap={tis_cap} > 0 needs sampler_logp (the rollout engine's log-probs)")
        check_same_shape(fn, logp=logp, sampler_logp=sampler_logp)
        weights, dropped = sampler_weights(old_logp, sampler_logp.to(logp.dtype), mask, cap=tis_cap, mode=is_correction)
        live = live & ~dropped  # a token MIS drops counts for nothing, as one with A = 0
    log_ratio = importance_log_ratio(logp, old_logp, mask, live, importance_level)  # (N, T), 0 where not live
    objective = _surrogate_objective(
        log_ratio, logp, advantages, live, surrogate, clip_eps_low, clip_eps_high, dual_clip_c, delta
    )
    per_token = torch.where(live, -objective, zeros)
    if weights is not None:
        per_token = per_token * weights  # 0 where MIS dropped the token (its term is 0 already)
    if beta > 0 and ref_logp is None:
        raise ValueError(f"{fn}: beta={beta} > 0 needs ref_logp (the reference model's log-probs)")
    if ref_logp is not None:
        check_same_shape(fn, logp=logp, ref_logp=ref_logp)
        # masked tokens: both log-probs 0 before the estimator, so KL_t = 0 exactly, gradient 0
        kl = kl_penalty(torch.where(mask, logp, zeros), torch.where(mask, ref_logp.to(logp.dtype), zeros), kl_estimator)
        if beta > 0:
            per_token = per_token + beta * kl
    else:
        kl = zeros
    loss = aggregate_loss(
        per_token,
        mask,
        aggregation,
        max_completion_length=max_completion_length,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
    )
    if entropy_coef > 0:
        if entropy is None:
            raise ValueError(f"{fn}: entropy_coef={entropy_coef} > 0 needs entropy (the policy's, with gradient)")
        check_same_shape(fn, logp=logp, entropy=entropy)
        loss = loss - entropy_coef * entropy_bonus(entropy.to(logp.dtype), mask, num_tokens=num_tokens)
    with torch.no_grad():
        stats = _loss_stats(
            logp,
            old_logp,
            advantages,
            mask,
            live,
            kl,
            importance_level=importance_level,
            surrogate=surrogate,
            clip_eps_low=clip_eps_low,
            clip_eps_high=clip_eps_high,
            dual_clip_c=dual_clip_c,
            delta=delta,
            num_sequences=num_sequences,
            num_tokens=num_tokens,
        )
        if weights is not None and dropped is not None:
            stats.update(_correction_stats(weights, dropped, mask, is_correction, tis_cap, logp.dtype))
    return loss, stats


def _checked_advantages(
    fn: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    importance_level: str,
) -> torch.Tensor:
    """``advantages`` as ``(N, 1)`` or ``(N, T)`` after the shape checks of :func:`policy_loss`."""
    check_dim(fn, "logp", logp, 2)
    check_same_shape(fn, logp=logp, old_logp=old_logp, completion_mask=completion_mask)
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(
                f"{fn}: advantages {tuple(advantages.shape)} must be (N,) or (N, T) with logp {tuple(logp.shape)}"
            )
        return advantages[:, None]
    check_same_shape(fn, advantages=advantages, logp=logp)
    if importance_level == "sequence":
        raise ValueError(
            f"{fn}: importance_level 'sequence' needs one advantage per sequence (N,); per-token "
            "advantages (N, T) take importance_level 'sequence_token' (GSPO-token)"
        )
    return advantages


def _surrogate_objective(
    log_ratio: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    live: torch.Tensor,
    surrogate: str,
    clip_eps_low: float,
    clip_eps_high: float,
    dual_clip_c: float,
    delta: float,
) -> torch.Tensor:
    """``(N, T)`` objective of each token (CISPO's, or the clipped one with dual clip / δ), from the
    log-ratios :func:`policy_loss` zeroed where a token is not ``live``."""
    if surrogate == "cispo":
        live_logp = torch.where(live, logp, torch.zeros_like(logp))
        return cispo_objective(log_ratio, live_logp, advantages, eps_low=clip_eps_low, eps_high=clip_eps_high)
    # A > 0 and r > 1 + ε_high: min() takes the clipped constant. Bounding the log-ratio at
    # log(1 + ε_high) + 1 there leaves every value min() can select unchanged and keeps exp finite;
    # likewise for A < 0 at log(bound) + 1 when dual clip or δ hold r > bound at bound·A.
    log_ratio = torch.where(advantages > 0, log_ratio.clamp(max=math.log1p(clip_eps_high) + 1.0), log_ratio)
    bounds = [b for b in (dual_clip_c, delta) if b > 0]
    if bounds:
        log_ratio = torch.where(advantages < 0, log_ratio.clamp(max=math.log(min(bounds)) + 1.0), log_ratio)
    return clipped_objective(
        torch.exp(log_ratio),
        advantages,
        eps_low=clip_eps_low,
        eps_high=clip_eps_high,
        dual_clip_c=dual_clip_c,
        delta=delta,
    )


def _loss_stats(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    live: torch.Tensor,
    kl: torch.Tensor,
    *,
    importance_level: str,
    surrogate: str,
    clip_eps_low: float,
    clip_eps_high: float,
    dual_clip_c: float,
    delta: float,
    num_sequences: int | None,
    num_tokens: int | None,
) -> dict[str, torch.Tensor]:
    """:func:`policy_loss`'s statistics but the sampler correction's (:func:`_correction_stats`); call
    under ``torch.no_grad()``. ``advantages``: ``(N, T)``, 0 where masked."""
    zeros = torch.zeros_like(logp)
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1.0)

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x, zeros).sum() / n

    # the ratio as it is, for the statistics only: masked tokens left out, log-ratio clamped to
    # ±LOG_RATIO_STATS_CLAMP so that an overflowing ratio (of a token with A = 0, or a clipped one)
    # logs a finite mean
    raw = (logp - old_logp).detach()
    if importance_level == "token":
        true_ratio = raw.exp()  # may be inf: compared only, never summed

        def share(flag: torch.Tensor) -> torch.Tensor:
            return masked_mean(flag.to(m.dtype))

    else:
        seq_log = sequence_log_ratio(raw, mask)  # (N,)
        true_ratio = seq_log.exp()[:, None].expand_as(raw)  # s_i at every token of row i
        has = mask.any(-1)
        # a sequence's share of the batch, weighted so that the loop's token-weighted sum is exact
        per_seq = (float(num_tokens) if num_tokens is not None else m.sum()) / max(
            logp.shape[0] if num_sequences is None else num_sequences, 1
        )

        def share(flag: torch.Tensor) -> torch.Tensor:
            return (flag & mask).any(-1).to(m.dtype).sum() * per_seq / n

    if surrogate == "cispo":
        low = (true_ratio < 1.0 - clip_eps_low) & live
        high = (true_ratio > 1.0 + clip_eps_high) & live
    else:
        low = (true_ratio < 1.0 - clip_eps_low) & (advantages < 0)
        high = (true_ratio > 1.0 + clip_eps_high) & (advantages > 0)
    stats = {
        "clip_frac_low": share(low),
        "clip_frac_high": share(high),
        "kl": masked_mean(kl.detach()),
        "ratio_mean": masked_mean(raw.clamp(-LOG_RATIO_STATS_CLAMP, LOG_RATIO_STATS_CLAMP).exp()),
        "num_tokens": m.sum(),
    }
    for key, bound in (("clip_frac_dual", dual_clip_c), ("clip_frac_delta", delta)):
        if bound > 0:
            stats[key] = share((true_ratio > bound) & (advantages < 0))
    if importance_level != "token":
        s = torch.where(has, seq_log.clamp(-LOG_RATIO_STATS_CLAMP, LOG_RATIO_STATS_CLAMP).exp(), 0.0)
        stats["seq_ratio_mean"] = s.sum() * per_seq / n
    return stats


def _correction_stats(
    weights: torch.Tensor,
    dropped: torch.Tensor,
    mask: torch.Tensor,
    is_correction: str,
    tis_cap: float,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """The sampler correction's statistics: masked token means of its weights, and the share capped
    at C (TIS) or dropped (MIS)."""
    m = mask.to(dtype)
    n = m.sum().clamp(min=1.0)
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x, zeros).sum() / n

    if is_correction == "tis":
        return {"tis_weight_mean": masked_mean(weights), "tis_capped_frac": masked_mean((weights >= tis_cap).to(dtype))}
    return {"mis_weight_mean": masked_mean(weights), "mis_dropped_frac": masked_mean(dropped.to(dtype))}
