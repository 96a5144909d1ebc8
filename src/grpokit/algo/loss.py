"""The GRPO objective: clipped token-ratio surrogate, KL penalty, loss aggregation (DeepSeekMath eq. 3).

:func:`policy_loss` composes the variants its :class:`~grpokit.algo.loss_types.LossConfig` names,
each looked up in :mod:`grpokit.algo.catalog` (the built-in ones: :mod:`grpokit.algo.surrogates`
and :mod:`grpokit.algo.aggregation`); it never branches on a variant's name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from . import catalog
from ._checks import check_dim, check_same_shape
from .aggregation import aggregate_loss
from .catalog import Correction
from .kl import kl_penalty
from .loss_types import LossConfig, LossOutput, LossStats
from .surrogates import entropy_bonus

#: ``ratio_mean`` reads the log-ratio clamped to ±20 nats (ratio within ``[2e-9, 4.9e8]``), so that
#: an overflowing ratio (a token with A = 0, or one the clip holds still) logs a finite mean.
LOG_RATIO_STATS_CLAMP = 20.0

#: the default of :func:`policy_loss`: plain GRPO, no KL (frozen, so one instance serves every call)
DEFAULT_LOSS_CONFIG = LossConfig()


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    config: LossConfig = DEFAULT_LOSS_CONFIG,
    *,
    ref_logp: torch.Tensor | None = None,
    sampler_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
) -> LossOutput:
    """GRPO loss: negative surrogate plus β·KL, aggregated over tokens and sequences, with the
    variants ``config`` names (docs/loss_variants.md).

    Per token, by default (DeepSeekMath eq. 3, clip-higher from DAPO): ``r = exp(logp − old_logp)``,
    ``l_t = −w_t·min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A) + β·KL_t`` with ``KL_t = kl_penalty(logp,
    ref_logp, kl_estimator)``; then the aggregation; then minus ``entropy_coef · H`` (``H`` the mean
    of ``entropy`` over the counted tokens, of the whole batch when ``num_tokens`` is given). With
    ``old_logp = logp.detach()`` (μ = 1, on-policy) the ratio is 1 by value and the gradient is
    ``−A·∇logp``. The steps, each a registry of :mod:`grpokit.algo.catalog`:

    1. ``config.is_correction`` (when ``tis_cap = C > 0``): the weights ``w_t`` of
       ``π_old/π_sampler`` (no gradient; the KL term is not weighted): TIS ``min(w, C)`` (Yao et al.
       2025) or MIS (0 outside ``[1/C, C]``, per token or sequence; a dropped token counts for nothing);
    2. ``config.importance_level``: the ratio — per token, GSPO's per-sequence ``s_i`` (one loss per
       sequence; ``advantages`` ``(N,)``) or GSPO-token's;
    3. ``config.surrogate``: the clipped objective (with ``dual_clip_c``/``delta``: bounded for
       ``A < 0``), or CISPO's ``sg(clip(r))·A·logp``;
    4. ``config.aggregation``: :func:`aggregate_loss`.

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
        config: the scalars and variant names, validated when built (:class:`LossConfig`).
        ref_logp: ``(N, T)`` under π_ref; required when ``config.beta > 0``.
        sampler_logp: ``(N, T)`` the sampler's log-probs of the tokens (at the same temperature);
            required when ``config.tis_cap > 0``.
        entropy: ``(N, T)`` per-token entropies of π_θ (with gradient); required when
            ``config.entropy_coef > 0``.
        num_sequences, num_tokens: the whole batch's counts when micro-batching (:func:`aggregate_loss`).

    Returns:
        :class:`LossOutput` ``(loss, stats)``; ``stats`` a :class:`LossStats` (detached, masked means
        over this batch's tokens): ``clip_frac_low`` (share of tokens with r < 1−ε_low and A < 0:
        clipped, no gradient), ``clip_frac_high`` (r > 1+ε_high and A > 0), ``kl``, ``ratio_mean``
        (of the token ratio ``exp(clamp(logp − old_logp, ±LOG_RATIO_STATS_CLAMP))``: finite),
        ``num_tokens``; with ``tis_cap > 0`` also ``tis_weight_mean`` (mean w) and
        ``tis_capped_frac`` (w = C), or for MIS ``mis_weight_mean`` and ``mis_dropped_frac`` (share
        of tokens given weight 0); with ``dual_clip_c`` ``clip_frac_dual`` (A < 0 and r > c), with
        ``delta`` ``clip_frac_delta`` (A < 0 and r > δ). CISPO's ``clip_frac_low/high``: tokens with
        A ≠ 0 whose weight was clipped, whatever the sign of A. At sequence levels the clip
        fractions count **sequences** (a row is clipped when one of its tokens' terms is) and
        ``seq_ratio_mean`` is the mean ``s_i``: the share of the ``num_sequences`` sequences scaled
        by ``num_tokens / this batch's tokens``, so that the token-weighted sum of the micro-batches'
        stats (as the trainer sums every stat) is the whole batch's share.

    Raises:
        ValueError: mismatched shapes, ``beta > 0`` without ``ref_logp``, ``tis_cap > 0`` without
        ``sampler_logp``, ``entropy_coef > 0`` without ``entropy``, ``(N, T)`` advantages with
        ``importance_level="sequence"``. (A bad config raises when the :class:`LossConfig` is built.)

    Example:
        >>> lp = torch.zeros(2, 3, requires_grad=True)
        >>> loss, st = policy_loss(lp, lp.detach(), torch.tensor([1.0, -1.0]),
        ...                        torch.ones(2, 3, dtype=torch.bool), LossConfig(clip_eps_high=0.28))
        >>> loss.item(), st.ratio_mean.item(), sorted(st.as_dict())
        (0.0, 1.0, ['clip_frac_high', 'clip_frac_low', 'kl', 'num_tokens', 'ratio_mean'])
    """
    fn, c = "policy_loss", config
    given = _checked_advantages(fn, logp, old_logp, advantages, completion_mask)  # (N, 1) or (N, T)
    mask = completion_mask.bool()
    zeros = torch.zeros_like(logp)
    # Tokens that count for nothing change nothing: a masked token, or one with A = 0 (its surrogate
    # is 0 whatever the ratio), gets A = 0 and log-ratio 0 *before* any exp or product, so that
    # neither the value nor the gradient can meet inf·0 (a where only after the exp would keep the
    # value but not the gradient, whose chain rule still multiplies 0 by inf).
    adv = torch.where(mask, given.to(logp.dtype).expand_as(logp), zeros)  # (N, T)
    correction = _sampler_correction(fn, c, logp, old_logp, sampler_logp, mask)
    live = adv != 0
    if correction is not None:
        live = live & ~correction.dropped  # a token MIS drops counts for nothing, as one with A = 0
    ratio = catalog.IMPORTANCE_LEVELS.lookup(c.importance_level, fn)(logp, old_logp, advantages, mask, live)
    objective = catalog.SURROGATES.lookup(c.surrogate, fn)(
        ratio.log_ratio,
        logp,
        adv,
        live,
        eps_low=c.clip_eps_low,
        eps_high=c.clip_eps_high,
        dual_clip_c=c.dual_clip_c,
        delta=c.delta,
    )
    per_token = torch.where(live, -objective, zeros)
    if correction is not None:
        per_token = per_token * correction.weights  # 0 where MIS dropped the token (its term is 0 already)
    kl = _kl_per_token(fn, c, logp, ref_logp, mask)
    if c.beta > 0:
        per_token = per_token + c.beta * kl
    loss = aggregate_loss(
        per_token,
        mask,
        c.aggregation,
        max_completion_length=c.max_completion_length,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
    )
    if c.entropy_coef > 0:
        loss = loss - c.entropy_coef * _entropy_mean(fn, c, logp, entropy, mask, num_tokens)
    with torch.no_grad():
        stats = _loss_stats(
            c, logp, old_logp, adv, mask, live, kl, ratio.seq_log_ratio, correction, num_sequences, num_tokens
        )
    return LossOutput(loss, stats)


def _checked_advantages(
    fn: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, completion_mask: torch.Tensor
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
    return advantages


def _sampler_correction(
    fn: str,
    c: LossConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor | None,
    mask: torch.Tensor,
) -> Correction | None:
    """The sampler correction ``c.is_correction`` names, or None when it is off (``tis_cap = 0``)."""
    if c.tis_cap == 0:
        return None
    if sampler_logp is None:
        raise ValueError(f"{fn}: tis_cap={c.tis_cap} > 0 needs sampler_logp (the rollout engine's log-probs)")
    check_same_shape(fn, logp=logp, sampler_logp=sampler_logp)
    weigh = catalog.SAMPLER_CORRECTIONS.lookup(c.is_correction, fn)
    return weigh(old_logp, sampler_logp.to(logp.dtype), mask, cap=c.tis_cap)


def _kl_per_token(
    fn: str, c: LossConfig, logp: torch.Tensor, ref_logp: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor:
    """``(N, T)`` ``KL_t`` (0 where masked; all 0 without ``ref_logp``)."""
    if c.beta > 0 and ref_logp is None:
        raise ValueError(f"{fn}: beta={c.beta} > 0 needs ref_logp (the reference model's log-probs)")
    zeros = torch.zeros_like(logp)
    if ref_logp is None:
        return zeros
    check_same_shape(fn, logp=logp, ref_logp=ref_logp)
    # masked tokens: both log-probs 0 before the estimator, so KL_t = 0 exactly, gradient 0
    return kl_penalty(torch.where(mask, logp, zeros), torch.where(mask, ref_logp.to(logp.dtype), zeros), c.kl_estimator)


def _entropy_mean(
    fn: str,
    c: LossConfig,
    logp: torch.Tensor,
    entropy: torch.Tensor | None,
    mask: torch.Tensor,
    num_tokens: int | None,
) -> torch.Tensor:
    """0-dim :func:`~grpokit.algo.surrogates.entropy_bonus` of ``entropy`` (required here)."""
    if entropy is None:
        raise ValueError(f"{fn}: entropy_coef={c.entropy_coef} > 0 needs entropy (the policy's, with gradient)")
    check_same_shape(fn, logp=logp, entropy=entropy)
    return entropy_bonus(entropy.to(logp.dtype), mask, num_tokens=num_tokens)


def _loss_stats(
    c: LossConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    live: torch.Tensor,
    kl: torch.Tensor,
    seq_log: torch.Tensor | None,
    correction: Correction | None,
    num_sequences: int | None,
    num_tokens: int | None,
) -> LossStats:
    """:func:`policy_loss`'s statistics; call under ``torch.no_grad()``. ``advantages``: ``(N, T)``, 0
    where masked; ``seq_log``: ``(N,)`` ``log s_i`` at a sequence level, else None."""
    zeros = torch.zeros_like(logp)
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1.0)

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x if x.is_floating_point() else x.to(m.dtype), zeros).sum() / n

    # the ratio as it is, for the statistics only: masked tokens left out, log-ratio clamped to
    # ±LOG_RATIO_STATS_CLAMP so that an overflowing ratio (of a token with A = 0, or a clipped one)
    # logs a finite mean
    raw = (logp - old_logp).detach()
    share: Callable[[torch.Tensor], torch.Tensor] = masked_mean
    true_ratio = raw.exp()  # may be inf: compared only, never summed
    optional: dict[str, Any] = {}  # LossStats' optional fields, by name
    if seq_log is not None:
        seq_log = seq_log.detach()
        true_ratio = seq_log.exp()[:, None].expand_as(raw)  # s_i at every token of row i
        # a sequence's share of the batch, weighted so that the loop's token-weighted sum is exact
        per_seq = (float(num_tokens) if num_tokens is not None else m.sum()) / max(
            logp.shape[0] if num_sequences is None else num_sequences, 1
        )
        share = functools.partial(_sequence_share, mask=mask, per_seq=per_seq, n=n)
        s = torch.where(mask.any(-1), seq_log.clamp(-LOG_RATIO_STATS_CLAMP, LOG_RATIO_STATS_CLAMP).exp(), 0.0)
        optional["seq_ratio_mean"] = s.sum() * per_seq / n
    flags = catalog.SURROGATE_CLIP_FLAGS.get(c.surrogate, catalog.clipped_by_sign)
    low, high = flags(true_ratio, advantages, live, eps_low=c.clip_eps_low, eps_high=c.clip_eps_high)
    for key, bound in (("clip_frac_dual", c.dual_clip_c), ("clip_frac_delta", c.delta)):
        if bound > 0:
            optional[key] = share((true_ratio > bound) & (advantages < 0))
    if correction is not None:
        optional.update({key: masked_mean(x) for key, x in correction.logged.items()})
    return LossStats(
        clip_frac_low=share(low),
        clip_frac_high=share(high),
        kl=masked_mean(kl.detach()),
        ratio_mean=masked_mean(raw.clamp(-LOG_RATIO_STATS_CLAMP, LOG_RATIO_STATS_CLAMP).exp()),
        num_tokens=m.sum(),
        **optional,
    )


def _sequence_share(
    flag: torch.Tensor, *, mask: torch.Tensor, per_seq: torch.Tensor | float, n: torch.Tensor
) -> torch.Tensor:
    """The share of the batch of the rows with a flagged counted token: each ``per_seq / n``."""
    return (flag & mask).any(-1).to(n.dtype).sum() * per_seq / n
