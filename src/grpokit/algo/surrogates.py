"""The variants of :func:`grpokit.algo.policy_loss`, each a small pure function of tensors (torch only)
chosen by a recipe key (docs/loss_variants.md), never by the training loop:

- the importance ratio of a token (``algo.importance_level``): its own ``π_θ/π_old`` (PPO, GRPO), its
  sequence's length-normalized ratio (GSPO), or that value with the token's own gradient
  (GSPO-token) — :func:`importance_log_ratio`;
- the surrogate (``algo.policy_loss``): the clipped one, optionally bounded for ``A < 0`` by dual clip
  (``algo.dual_clip_c``) or TRL's ``δ`` (``algo.delta``) — :func:`clipped_objective`; or CISPO's
  clipped, detached weight on ``log π_θ`` — :func:`cispo_objective`;
- the sampler correction (``algo.is_correction``, with ``C = algo.tis_cap``): truncated (TIS) or
  masked (MIS, per token or per sequence) importance weights ``π_old/π_sampler`` —
  :func:`sampler_weights`;
- the entropy bonus (``algo.entropy_coef``) — :func:`entropy_bonus`.

Shapes: ``(N, T)`` with ``completion_mask`` bool, True = the token counts. Every function selects
masked entries out (``torch.where``) before any ``exp`` or product.
"""

from __future__ import annotations

import math

import torch

#: ``algo.importance_level``
IMPORTANCE_LEVELS = ("token", "sequence", "sequence_token")
#: ``algo.policy_loss``
SURROGATES = ("clip", "cispo")
#: ``algo.is_correction``
IS_CORRECTIONS = ("tis", "mis_token", "mis_sequence")


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


def importance_log_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, completion_mask: torch.Tensor, live: torch.Tensor, level: str
) -> torch.Tensor:
    """``(N, T)`` log of the ratio each token's surrogate uses, 0 where ``live`` ``(N, T)`` bool
    (counted and ``A != 0``) is False — selected before any ``exp``, so the value and gradient there
    are exactly 0 whatever the log-probs.

    - ``"token"``: ``logp − old_logp`` (DeepSeekMath eq. 3).
    - ``"sequence"``: ``log s_i`` (:func:`sequence_log_ratio`) at every token of row ``i``; its
      gradient w.r.t. ``logp_it`` is ``1/|y_i|`` for every counted token (GSPO §4.1).
    - ``"sequence_token"``: ``sg(log s_i) + logp_it − sg(logp_it)``: the value of ``log s_i``, the
      gradient of the token's own ``logp`` (GSPO-token, §4.3: ``s_it = sg[s_i]·π_θ(y_it)/sg[π_θ(y_it)]``).

    Every counted token of a row enters ``s_i``, whatever its advantage.

    Raises:
        ValueError: unknown ``level``.

    Example:
        >>> lp, old = torch.tensor([[0.5, -0.1]]), torch.zeros(1, 2)
        >>> m = torch.ones(1, 2, dtype=torch.bool)
        >>> [round(x, 6) for x in importance_log_ratio(lp, old, m, m, "sequence")[0].tolist()]
        [0.2, 0.2]
    """
    zeros = torch.zeros_like(logp)
    if level == "token":
        return torch.where(live, logp - old_logp, zeros)
    if level not in IMPORTANCE_LEVELS:
        raise ValueError(f"importance_log_ratio: level must be one of {IMPORTANCE_LEVELS}, got {level!r}")
    seq = sequence_log_ratio(logp - old_logp, completion_mask)[:, None].expand_as(logp)  # (N, T)
    if level == "sequence_token":
        own = torch.where(live, logp, zeros)  # a NaN log-prob where not live never reaches the gradient
        seq = seq.detach() + (own - own.detach())
    return torch.where(live, seq, zeros)


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


def sampler_weights(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    cap: float,
    mode: str = "tis",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, T)`` importance weights (no gradient) of the sampler correction, and ``(N, T)`` bool
    "dropped" (True where MIS set the weight to 0; all False for TIS). ``w_t = π_old/π_sampler``:

    - ``"tis"``: ``min(w_t, C)`` (Yao et al. 2025; TRL's ``token_truncate``).
    - ``"mis_token"``: ``w_t`` where ``1/C <= w_t <= C``, else 0 (masked importance sampling;
      TRL's ``token_mask``, verl's token-level mask).
    - ``"mis_sequence"``: ``ρ_i = Π_t w_it`` over the row's counted tokens (the sequence's
      likelihood ratio, as TRL's ``sequence_mask`` and verl's ``sequence`` level), for every token of
      the row where ``1/C <= ρ_i <= C``, else 0.

    Masked entries are selected out before the ``exp``; ranges are compared in log space, so an
    overflowing ratio is dropped (MIS) or capped (TIS), never inf. NaN ratios are dropped by MIS.

    Raises:
        ValueError: unknown ``mode``.

    Example:
        >>> old, m = torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)
        >>> sampler = torch.log(torch.tensor([[0.25, 1.0, 2.0]]))  # w = 4, 1, 0.5
        >>> sampler_weights(old, sampler, m, cap=3.0, mode="mis_token")[0].tolist()
        [[0.0, 1.0, 0.5]]
    """
    keep = completion_mask.bool()
    zeros = torch.zeros_like(old_logp)
    log_w = torch.where(keep, old_logp.detach() - sampler_logp, zeros)
    if mode == "tis":
        return torch.exp(log_w).clamp(max=cap), torch.zeros_like(keep)  # an overflow (inf) is capped at C
    if mode not in IS_CORRECTIONS:
        raise ValueError(f"sampler_weights: mode must be one of {IS_CORRECTIONS}, got {mode!r}")
    if mode == "mis_sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)  # log ρ_i at every token of row i
    inside = log_w.abs() <= math.log(cap)  # False for NaN
    weights = torch.where(inside, torch.exp(torch.where(inside, log_w, zeros)), zeros)
    return weights, keep & ~inside


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


def check_variants(
    fn: str,
    *,
    importance_level: str,
    surrogate: str,
    is_correction: str,
    dual_clip_c: float,
    delta: float,
    clip_eps_high: float,
    tis_cap: float,
    entropy_coef: float,
) -> None:
    """Raise ``ValueError`` naming ``fn`` and the argument for a variant :func:`grpokit.algo.policy_loss`
    does not define: an unknown name; ``dual_clip_c`` not 0 and not > 1; ``delta`` not 0 and not
    > ``1 + clip_eps_high`` (TRL's recommendation: below it δ would also clip ``A > 0`` tokens);
    CISPO with a sequence-level ratio or with dual clip / δ (its weight is already bounded);
    masked importance sampling with ``0 < tis_cap <= 1`` (the interval ``[1/C, C]`` would hold at
    most 1); a negative ``entropy_coef``."""
    for name, value, known in (
        ("importance_level", importance_level, IMPORTANCE_LEVELS),
        ("surrogate", surrogate, SURROGATES),
        ("is_correction", is_correction, IS_CORRECTIONS),
    ):
        if value not in known:
            raise ValueError(f"{fn}: {name} must be one of {known}, got {value!r}")
    if dual_clip_c != 0 and not dual_clip_c > 1:
        raise ValueError(f"{fn}: dual_clip_c must be 0 (off) or > 1, got {dual_clip_c}")
    if delta != 0 and not delta > 1 + clip_eps_high:
        raise ValueError(f"{fn}: delta must be 0 (off) or > 1 + clip_eps_high = {1 + clip_eps_high}, got {delta}")
    if surrogate == "cispo" and importance_level != "token":
        raise ValueError(
            f"{fn}: surrogate 'cispo' weights each token by its own ratio; importance_level must be 'token'"
        )
    if surrogate == "cispo" and (dual_clip_c or delta):
        raise ValueError(f"{fn}: dual_clip_c and delta bound the clipped surrogate; surrogate 'cispo' has none")
    if is_correction != "tis" and 0 < tis_cap <= 1:
        raise ValueError(
            f"{fn}: is_correction {is_correction!r} keeps w in [1/C, C]: tis_cap = C must be > 1, got {tis_cap}"
        )
    if not entropy_coef >= 0:
        raise ValueError(f"{fn}: entropy_coef must be >= 0, got {entropy_coef}")
