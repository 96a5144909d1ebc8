"""The variants of :func:`grpokit.algo.policy_loss`, each a small pure function of tensors (torch only)
chosen by a recipe key (docs/loss_variants.md), never by the training loop:

- the importance ratio of a token (``algo.importance_level``): its own ``π_θ/π_old`` (PPO, GRPO), its
  sequence's length-normalized ratio (GSPO), or that value with the token's own gradient
  (GSPO-token) — :func:`token_ratio`, :func:`sequence_ratio`, :func:`sequence_token_ratio`;
- the surrogate (``algo.policy_loss``): the clipped one, optionally bounded for ``A < 0`` by dual clip
  (``algo.dual_clip_c``) or TRL's ``δ`` (``algo.delta``) — :func:`clip_surrogate` on
  :func:`clipped_objective`; or CISPO's clipped, detached weight on ``log π_θ`` —
  :func:`cispo_surrogate` on :func:`cispo_objective`;
- the sampler correction (``algo.is_correction``, with ``C = algo.tis_cap``): truncated (TIS) or
  masked (MIS, per token or per sequence) importance weights ``π_old/π_sampler`` —
  :func:`truncated_weights`, :func:`masked_token_weights`, :func:`masked_sequence_weights`;
- the entropy bonus (``algo.entropy_coef``) — :func:`entropy_bonus`.

Each variant is registered under its recipe name in :mod:`grpokit.algo.catalog` (the decorators
below), where :func:`grpokit.algo.policy_loss` looks it up.

Shapes: ``(N, T)`` with ``completion_mask`` bool, True = the token counts. Every function selects
masked entries out (``torch.where``) before any ``exp`` or product.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .catalog import IMPORTANCE_LEVELS as IMPORTANCE_LEVEL_REGISTRY
from .catalog import (
    SAMPLER_CORRECTIONS,
    Correction,
    ImportanceRatio,
    register_importance_level,
    register_sampler_correction,
    register_surrogate,
)
from .catalog import SURROGATES as SURROGATE_REGISTRY

if TYPE_CHECKING:
    from .loss_types import LossConfig


def sequence_log_ratio(log_ratio: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """``(N,)`` mean of ``log_ratio`` ``(N, T)`` over each row's counted tokens: ``log s_i`` of GSPO
    (arXiv 2507.18071, §4.1), ``s_i = (π_θ(y_i)/π_old(y_i))^(1/|y_i|)``. A row without counted
    tokens gets 0; masked entries are selected out before the sum (NaN/±inf there change nothing).

    Example:
        >>> lr = torch.tensor([[0.2, 0.4, float("nan")], [0.0, 0.0, 0.0]])
        >>> sequence_log_ratio(lr, torch.tensor([[True, True, False], [False] * 3])).tolist()
        [0.30000001192092896, 0.0]
    """
    keep = completion_mask.bool()
    total = torch.where(keep, log_ratio, torch.zeros_like(log_ratio)).sum(-1)
    return total / keep.sum(-1).clamp(min=1).to(log_ratio.dtype)


@register_importance_level("token")
def token_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    live: torch.Tensor,
) -> ImportanceRatio:
    """``importance_level="token"``: each token's own ``log r_t = logp − old_logp`` (DeepSeekMath
    eq. 3), 0 where ``live`` ``(N, T)`` bool (counted and ``A != 0``) is False — selected before any
    ``exp``, so the value and gradient there are exactly 0 whatever the log-probs.

    Example:
        >>> m = torch.ones(1, 2, dtype=torch.bool)
        >>> token_ratio(torch.tensor([[0.5, -0.1]]), torch.zeros(1, 2), torch.ones(1), m, m).log_ratio.tolist()
        [[0.5, -0.10000000149011612]]
    """
    return ImportanceRatio(torch.where(live, logp - old_logp, torch.zeros_like(logp)), None)


@register_importance_level("sequence")
def sequence_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    live: torch.Tensor,
) -> ImportanceRatio:
    """``importance_level="sequence"`` (GSPO, arXiv 2507.18071 §4.1): ``log s_i``
    (:func:`sequence_log_ratio`) at every live token of row ``i``; its gradient w.r.t. ``logp_it`` is
    ``1/|y_i|`` for every counted token. Every counted token of a row enters ``s_i``, whatever its
    advantage.

    Raises:
        ValueError: ``(N, T)`` advantages (GSPO has one per sequence; GSPO-token takes them).

    Example:
        >>> lp, old = torch.tensor([[0.5, -0.1]]), torch.zeros(1, 2)
        >>> m = torch.ones(1, 2, dtype=torch.bool)
        >>> [round(x, 6) for x in sequence_ratio(lp, old, torch.ones(1), m, m).log_ratio[0].tolist()]
        [0.2, 0.2]
    """
    if advantages.dim() == 2:
        raise ValueError(
            "policy_loss: importance_level 'sequence' needs one advantage per sequence (N,); per-token "
            "advantages (N, T) take importance_level 'sequence_token' (GSPO-token)"
        )
    seq = sequence_log_ratio(logp - old_logp, completion_mask)  # (N,)
    return ImportanceRatio(torch.where(live, seq[:, None].expand_as(logp), torch.zeros_like(logp)), seq)


@register_importance_level("sequence_token")
def sequence_token_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    live: torch.Tensor,
) -> ImportanceRatio:
    """``importance_level="sequence_token"`` (GSPO-token, arXiv 2507.18071 §4.3):
    ``sg(log s_i) + logp_it − sg(logp_it)``, i.e. ``s_it = sg[s_i]·π_θ(y_it)/sg[π_θ(y_it)]``: the
    value of ``log s_i``, the gradient of the token's own ``logp``, so that ``(N, T)`` advantages
    weight each token. 0 where not ``live``.

    Example:
        >>> lp, old = torch.tensor([[0.5, -0.1]]), torch.zeros(1, 2)
        >>> m = torch.ones(1, 2, dtype=torch.bool)
        >>> [round(x, 6) for x in sequence_token_ratio(lp, old, torch.ones(1, 2), m, m).log_ratio[0].tolist()]
        [0.2, 0.2]
    """
    zeros = torch.zeros_like(logp)
    seq = sequence_log_ratio(logp - old_logp, completion_mask)  # (N,)
    own = torch.where(live, logp, zeros)  # a NaN log-prob where not live never reaches the gradient
    log_ratio = seq.detach()[:, None].expand_as(logp) + (own - own.detach())
    return ImportanceRatio(torch.where(live, log_ratio, zeros), seq)


def clipped_objective(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float = 0.0,
    delta: float = 0.0,
) -> torch.Tensor:
    """``(N, T)`` clipped surrogate objective (to maximize; the loss is its negative).

    ``min(r̃·A, clip(r, 1 − ε_low, 1 + ε_high)·A)`` with ``r̃ = min(r, δ)`` when ``delta = δ > 0``
    (TRL's ``delta``: the INTELLECT-2 report's two-sided clipping, arXiv 2505.07291; with
    ``δ > 1 + ε_high`` it bounds only ``A < 0`` tokens, at ``δ·A``), else ``r̃ = r``; then, with
    ``dual_clip_c = c > 1``, ``max(·, c·A)`` where ``A < 0`` (dual-clip PPO, Ye et al. 2020, arXiv
    1912.09729). Both bound the loss of an ``A < 0`` token whose ratio ran away (``r > c`` or
    ``r > δ``: loss ``−c·A``, gradient 0) where plain clipping leaves ``−r·A``, unbounded.

    Example:
        >>> r, a = torch.tensor([5.0, 5.0, 0.5]), torch.tensor([-1.0, 1.0, -1.0])
        >>> clipped_objective(r, a, eps_low=0.2, eps_high=0.2, dual_clip_c=3.0).tolist()
        [-3.0, 1.2000000476837158, -0.800000011920929]
    """
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    unclipped = ratio.clamp(max=delta) if delta > 0 else ratio
    objective = torch.minimum(unclipped * advantages, clipped * advantages)
    if dual_clip_c > 0:
        objective = torch.where(advantages < 0, torch.maximum(objective, dual_clip_c * advantages), objective)
    return objective


def cispo_objective(
    log_ratio: torch.Tensor, logp: torch.Tensor, advantages: torch.Tensor, *, eps_low: float, eps_high: float
) -> torch.Tensor:
    """``(N, T)`` CISPO objective (MiniMax-M1, arXiv 2506.13585, §3.1):
    ``sg(clip(r, 1 − ε_low, 1 + ε_high))·A·logp``.

    The clipped ratio is a constant weight, so every token keeps the gradient ``w·A`` of
    ``log π_θ`` — clipped ones included (with the clipped surrogate a clipped token has none).
    ``ε_low >= 1`` means no lower bound (MiniMax's practice: ``1 − ε_low <= 0 < r``). The value
    is not the clipped surrogate's: it carries ``logp`` (on-policy, the gradient is GRPO's ``A``,
    the value ``A·logp``). ``log_ratio`` is clamped to ``[log(1 − ε_low), log(1 + ε_high)]``
    before the ``exp``: an overflowing ratio gives ``1 + ε_high``.

    Example:
        >>> lr, lp = torch.log(torch.tensor([2.0, 0.5])), torch.tensor([-1.0, -2.0])
        >>> cispo_objective(lr, lp, torch.tensor([1.0, 1.0]), eps_low=0.2, eps_high=0.2).tolist()
        [-1.2000000476837158, -1.600000023841858]
    """
    low = math.log(1.0 - eps_low) if eps_low < 1 else -math.inf
    weight = torch.exp(log_ratio.detach().clamp(min=low, max=math.log1p(eps_high)))
    return weight * advantages * logp


def _log_w(old_logp: torch.Tensor, sampler_logp: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``(N, T)`` ``log w_t = log π_old − log π_sampler``, 0 where masked (before any ``exp``)."""
    return torch.where(keep, old_logp.detach() - sampler_logp, torch.zeros_like(old_logp))


def _mis_needs_cap_above_one(fn: str, config: LossConfig) -> None:
    if 0 < config.tis_cap <= 1:
        raise ValueError(
            f"{fn}: is_correction {config.is_correction!r} keeps w in [1/C, C]: tis_cap = C must be > 1, "
            f"got {config.tis_cap}"
        )


@register_sampler_correction("tis")
def truncated_weights(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor, *, cap: float
) -> Correction:
    """``is_correction="tis"``: ``min(w_t, C)`` (truncated importance sampling, Yao et al. 2025;
    TRL's ``token_truncate``); an overflow (inf) is capped at C. Logs ``tis_weight_mean`` and
    ``tis_capped_frac`` (the share with ``w = C``)."""
    keep = completion_mask.bool()
    weights = torch.exp(_log_w(old_logp, sampler_logp, keep)).clamp(max=cap)
    return Correction(weights, torch.zeros_like(keep), {"tis_weight_mean": weights, "tis_capped_frac": weights >= cap})


def _masked_weights(log_w: torch.Tensor, keep: torch.Tensor, cap: float) -> Correction:
    """MIS: ``exp(log_w)`` where ``|log w| <= log C`` (compared in log space: NaN and overflows are
    outside), else 0 and dropped."""
    zeros = torch.zeros_like(log_w)
    inside = log_w.abs() <= math.log(cap)  # False for NaN
    weights = torch.where(inside, torch.exp(torch.where(inside, log_w, zeros)), zeros)
    dropped = keep & ~inside
    return Correction(weights, dropped, {"mis_weight_mean": weights, "mis_dropped_frac": dropped})


@register_sampler_correction("mis_token", check=_mis_needs_cap_above_one)
def masked_token_weights(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor, *, cap: float
) -> Correction:
    """``is_correction="mis_token"``: ``w_t`` where ``1/C <= w_t <= C``, else 0 (masked importance
    sampling; TRL's ``token_mask``, verl's token-level mask). Logs ``mis_weight_mean`` and
    ``mis_dropped_frac`` (the share given weight 0)."""
    keep = completion_mask.bool()
    return _masked_weights(_log_w(old_logp, sampler_logp, keep), keep, cap)


@register_sampler_correction("mis_sequence", check=_mis_needs_cap_above_one)
def masked_sequence_weights(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor, *, cap: float
) -> Correction:
    """``is_correction="mis_sequence"``: ``ρ_i = Π_t w_it`` over the row's counted tokens (the
    sequence's likelihood ratio, as TRL's ``sequence_mask`` and verl's ``sequence`` level), for
    every token of the row where ``1/C <= ρ_i <= C``, else 0. Logs as ``mis_token``."""
    keep = completion_mask.bool()
    log_w = _log_w(old_logp, sampler_logp, keep)
    return _masked_weights(log_w.sum(-1, keepdim=True).expand_as(log_w), keep, cap)  # log ρ_i at row i's tokens


def sampler_weights(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    cap: float,
    mode: str = "tis",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, T)`` importance weights (no gradient) of the sampler correction ``mode`` (a name of
    :data:`~grpokit.algo.catalog.SAMPLER_CORRECTIONS`: ``"tis"``, ``"mis_token"``,
    ``"mis_sequence"``), and ``(N, T)`` bool "dropped" (True where MIS set the weight to 0; all
    False for TIS). ``w_t = π_old/π_sampler``. Masked entries are selected out before the ``exp``;
    ranges are compared in log space, so an overflowing ratio is dropped (MIS) or capped (TIS),
    never inf. NaN ratios are dropped by MIS.

    Raises:
        ValueError: unknown ``mode``.

    Example:
        >>> old, m = torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)
        >>> sampler = torch.log(torch.tensor([[0.25, 1.0, 2.0]]))  # w = 4, 1, 0.5
        >>> sampler_weights(old, sampler, m, cap=3.0, mode="mis_token")[0].tolist()
        [[0.0, 1.0, 0.5]]
    """
    correction = SAMPLER_CORRECTIONS.lookup(mode, "sampler_weights")(old_logp, sampler_logp, completion_mask, cap=cap)
    return correction.weights, correction.dropped


def entropy_bonus(
    entropy: torch.Tensor, completion_mask: torch.Tensor, *, num_tokens: int | None = None
) -> torch.Tensor:
    """0-dim mean entropy over counted tokens, ``Σ_counted H_t / tokens_glob`` (``tokens_glob``: this
    batch's counted tokens, or the whole batch's ``num_tokens`` when micro-batching, so that the
    micro-batches' terms sum to the batch mean). The loss subtracts ``coef ·`` it (TRL's
    ``entropy_coef``: a token mean whatever the loss aggregation). Masked entries are selected
    out (NaN there changes nothing, gradient 0).

    Example:
        >>> h = torch.tensor([[1.0, 3.0, float("nan")]])
        >>> entropy_bonus(h, torch.tensor([[True, True, False]])).item()
        2.0
    """
    keep = completion_mask.bool()
    total = torch.where(keep, entropy, torch.zeros_like(entropy)).sum()
    n = keep.sum() if num_tokens is None else num_tokens
    return total / max(int(n), 1)


def _cispo_only_per_token(fn: str, config: LossConfig) -> None:
    if config.importance_level != "token":
        raise ValueError(
            f"{fn}: surrogate 'cispo' weights each token by its own ratio; importance_level must be 'token'"
        )
    if config.dual_clip_c or config.delta:
        raise ValueError(f"{fn}: dual_clip_c and delta bound the clipped surrogate; surrogate 'cispo' has none")


def _weight_clipped(
    ratio: torch.Tensor, advantages: torch.Tensor, live: torch.Tensor, *, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO's clip flags: a live token whose weight was clipped, whatever the sign of A."""
    return (ratio < 1.0 - eps_low) & live, (ratio > 1.0 + eps_high) & live


@register_surrogate("clip")
def clip_surrogate(
    log_ratio: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    live: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float,
    delta: float,
) -> torch.Tensor:
    """``surrogate="clip"`` (PPO, DeepSeekMath eq. 3, clip-higher from DAPO): :func:`clipped_objective`
    of ``r = exp(log_ratio)``, with dual clip / δ when set. The log-ratio is bounded first where
    ``min()`` would select the clipped constant anyway, so that ``exp`` stays finite: a token with
    ``A > 0`` whose ratio overflows takes ``(1 + ε_high)·A`` with zero gradient; one with ``A < 0``
    has ``−r·A`` (inf) unless dual clip or δ bound it.

    Example:
        >>> lr, live = torch.log(torch.tensor([[2.0, 0.5]])), torch.ones(1, 2, dtype=torch.bool)
        >>> a = torch.tensor([[1.0, -1.0]])
        >>> clip_surrogate(lr, lr, a, live, eps_low=0.2, eps_high=0.2, dual_clip_c=0.0, delta=0.0).tolist()
        [[1.2000000476837158, -0.800000011920929]]
    """
    # A > 0 and r > 1 + ε_high: min() takes the clipped constant. Bounding the log-ratio at
    # log(1 + ε_high) + 1 there leaves every value min() can select unchanged and keeps exp finite;
    # likewise for A < 0 at log(bound) + 1 when dual clip or δ hold r > bound at bound·A.
    log_ratio = torch.where(advantages > 0, log_ratio.clamp(max=math.log1p(eps_high) + 1.0), log_ratio)
    bounds = [b for b in (dual_clip_c, delta) if b > 0]
    if bounds:
        log_ratio = torch.where(advantages < 0, log_ratio.clamp(max=math.log(min(bounds)) + 1.0), log_ratio)
    return clipped_objective(
        torch.exp(log_ratio), advantages, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c, delta=delta
    )


@register_surrogate("cispo", check=_cispo_only_per_token, clip_flags=_weight_clipped)
def cispo_surrogate(
    log_ratio: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    live: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float,
    delta: float,
) -> torch.Tensor:
    """``surrogate="cispo"`` (MiniMax-M1, arXiv 2506.13585 §3.1): :func:`cispo_objective` on the live
    tokens' ``logp``. Needs ``importance_level="token"`` and neither dual clip nor δ (its weight is
    bounded at ``1 + ε_high`` already); its ``clip_frac_low/high`` count live tokens whose weight was
    clipped, whatever the sign of A.

    Example:
        >>> lr, live = torch.log(torch.tensor([[2.0]])), torch.ones(1, 1, dtype=torch.bool)
        >>> lp = torch.tensor([[-1.0]])
        >>> cispo_surrogate(lr, lp, torch.ones(1, 1), live, eps_low=0.2, eps_high=0.2, dual_clip_c=0.0, delta=0.0)
        tensor([[-1.2000]])
    """
    live_logp = torch.where(live, logp, torch.zeros_like(logp))
    return cispo_objective(log_ratio, live_logp, advantages, eps_low=eps_low, eps_high=eps_high)


#: the built-in names of ``algo.importance_level``, ``algo.policy_loss``, ``algo.is_correction`` (the
#: registries themselves, with any name added later: :mod:`grpokit.algo.catalog`)
IMPORTANCE_LEVELS = IMPORTANCE_LEVEL_REGISTRY.names()
SURROGATES = SURROGATE_REGISTRY.names()
IS_CORRECTIONS = SAMPLER_CORRECTIONS.names()
