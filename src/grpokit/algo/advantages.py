"""Advantage estimators: GRPO outcome supervision (DeepSeekMath §4.1.2), the outcome baselines other
trainers ship (RLOO, REINFORCE++-baseline: :func:`outcome_advantages`), GAE (PPO). Process
supervision (§4.1.3) is in :mod:`grpokit.algo.process`, on the same statistics.

All statistics are computed in float64 so that a constant group gives advantages of exactly 0, on
rewards divided by a power of two (exact) so that rewards up to float64's largest value give finite
advantages. "Constant" means equal up to rounding (:func:`constant_groups`): rewards such as ``0.3``
and ``0.1 + 0.2`` are one value, whatever ``eps`` is.
"""

from __future__ import annotations

import torch

from ._checks import check_dim, check_group_size, check_same_shape
from ._stats import pooled_stats, rounding_eps, row_scales, saturate, varies
from .catalog import ADVANTAGE_BASELINES, BASELINE_SCALES, register_advantage_baseline

#: the ``scale`` values of :func:`group_advantages`
SCALES = ("group", "batch", "none")


def constant_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups are constant: their advantages are exactly 0 (``group_advantages``, any ``scale``
    and ``eps``). The trainer's ``frac_zero_std`` is the mean of this.

    A group is constant when it has fewer than two scorable (finite) rewards, or when

        ``max(r) − min(r) <= ROUNDING_ULPS · finfo(rewards.dtype).eps · max|r|``  (``ROUNDING_ULPS = 16``)

    over its scorable rewards: the rewards are equal up to rounding. A reward that is a weighted
    sum of n terms, computed two ways (``0.1 + 0.2`` and ``0.3``), differs by up to about
    ``(n + 1) · eps · Σ|terms|`` (each of n products and n − 1 sums rounds by ``eps/2``, on each
    side); 16 ulps cover sums of up to ~15 terms of the result's size, and are far below any
    difference a reward means to make (a relative 3.6e-15 for float64 rewards, 1.9e-6 for
    float32: 1 and 1 + 1e-12 in float64 still differ; bfloat16's is a coarse 12.5%). ``eps`` is
    the *input* dtype's (float32 rewards carry float32 residue even though the statistics run in
    float64); integer and bool rewards are exact and must be identical. Not caught: residue of
    cancellation, e.g. ``0.1 + 0.2 − 0.3 = 5.6e-17`` next to ``0.0``, which is not small relative
    to ``max|r|`` — round such rewards where they are made. Computed on the rewards divided by a
    power of two (exact), so rewards near float64's range are tested without overflow.

    Args:
        rewards: ``(N,)`` float (or integer/bool), ``N = B·G``, each group's G rewards contiguous;
            NaN/±inf = unscorable.
        group_size: G.

    Returns:
        ``(B,)`` bool, True where the group is constant.

    Raises:
        ValueError: ``rewards`` not 1-D, N not divisible by ``group_size``.

    Example:
        >>> r = torch.tensor([0.3, 0.1 + 0.2, 0.3, 1.0, 0.0, 1.0], dtype=torch.float64)
        >>> 0.1 + 0.2 == 0.3, constant_groups(r, 3).tolist()
        (False, [True, False])
        >>> constant_groups(torch.tensor([1.0, float("nan"), 1.0, 1.0 + 1e-12], dtype=torch.float64), 2).tolist()
        [True, False]
    """
    check_dim("constant_groups", "rewards", rewards, 1)
    b = check_group_size("constant_groups", rewards.shape[0], group_size)
    r = rewards.double().view(b, group_size)  # (B, G)
    valid = torch.isfinite(r)
    return ~varies(r / row_scales(r, valid), valid, rounding_eps(rewards.dtype))


def _safe_div(num: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    """``num / denom``, and 0 where ``denom`` is 0 (a constant group with ``eps = 0``: 0/0)."""
    denom = denom.expand_as(num)
    return torch.where(denom > 0, num / torch.where(denom > 0, denom, 1.0), torch.zeros_like(num))


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """Outcome-supervision advantages: each reward normalized within its group of G completions.

    ``A_i = (r_i − mean(r_group)) / (std(r_group) + eps)`` (DeepSeekMath §4.1.2), std = sample std
    (ddof=1). Every token of completion i later gets ``A_i``.

    - ``scale="group"``: divide by the group's std (the paper).
    - ``scale="batch"``: mean per group, divide by the sample std of all scorable rewards of the batch.
    - ``scale="none"``: only subtract the group mean (Dr. GRPO, arXiv 2503.20783).

    Unscorable rewards (NaN, ±inf) are left out of the mean and std and get 0. A group with fewer
    than two scorable rewards, or whose rewards are equal up to rounding (:func:`constant_groups`:
    spread <= 16 ulps of the input dtype at max|r|, so ``0.3`` and ``0.1 + 0.2`` are equal), gets
    exactly 0, whatever ``eps`` (statistics in float64). With ``scale="batch"`` the batch's std is
    used only if the whole batch varies by the same rule (else every advantage is 0).

    Args:
        rewards: ``(N,)`` float, ``N = B·G``, each group's G rewards contiguous; NaN = unscorable.
        group_size: G.
        scale: ``"group" | "batch" | "none"``.
        eps: added to the std (ignored for ``scale="none"``).

    Returns:
        ``(N,)`` advantages in ``rewards.dtype`` (float32 for integer input); finite for any
        finite rewards (``scale="none"`` clamps a difference beyond the dtype's range to its max).

    Raises:
        ValueError: ``rewards`` not 1-D, N not divisible by ``group_size``, unknown ``scale``.

    Example:
        >>> a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)  # mean 0.25, std 0.5
        >>> [round(x, 4) for x in a.tolist()]  # 0.75 / 0.5001, -0.25 / 0.5001
        [1.4997, -0.4999, -0.4999, -0.4999]
    """
    check_dim("group_advantages", "rewards", rewards, 1)
    b = check_group_size("group_advantages", rewards.shape[0], group_size)
    if scale not in SCALES:
        raise ValueError(f"group_advantages: scale must be one of {SCALES}, got {scale!r}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r = rewards.double().view(b, group_size)  # (B, G)
    valid = torch.isfinite(r)
    scale_of = row_scales(r, valid)  # (B, 1); statistics of r / scale, then scaled back
    if scale == "batch":
        scale_of = scale_of.amax().expand_as(scale_of)
    x = r / scale_of
    tol = rounding_eps(rewards.dtype)
    mean, std, spread = pooled_stats(x, valid, tol)
    centred = torch.where(valid & spread[:, None], x - mean[:, None], torch.zeros_like(x))
    if scale == "group":
        adv = _safe_div(centred, std[:, None] + eps / scale_of)  # = (r - mean_r) / (std_r + eps)
    elif scale == "batch":
        _, batch_std, batch_varies = pooled_stats(x.reshape(1, -1), valid.reshape(1, -1), tol)
        adv = _safe_div(centred, batch_std + eps / scale_of) if bool(batch_varies) else torch.zeros_like(r)
    else:
        adv = centred * scale_of  # may exceed the dtype's range for rewards near it: saturated
    return saturate(adv.reshape(-1), out_dtype)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Leave-one-out baseline (RLOO, Ahmadian et al. 2024, arXiv 2402.14740, the RLOO estimator): each
    reward minus the mean of the *other* scorable rewards of its group, unscaled.

    ``A_i = r_i − (1/(k−1)) Σ_{j≠i} r_j = k/(k−1) · (r_i − mean(r_group))`` with ``k`` the group's
    scorable rewards (``k = G`` when all are scorable: Dr. GRPO's advantage times ``G/(G−1)``).
    Unscorable rewards (NaN, ±inf) are left out of the baseline and get 0, as in
    :func:`group_advantages`; a group with fewer than two scorable rewards (no one to leave out) or
    whose rewards are equal up to rounding (:func:`constant_groups`) gets exactly 0. Statistics in
    float64 on rewards divided by a power of two (exact).

    Args:
        rewards: ``(N,)`` float, ``N = B·G``, each group's G rewards contiguous; NaN = unscorable.
        group_size: G.

    Returns:
        ``(N,)`` advantages in ``rewards.dtype`` (float32 for integer input); a value beyond the
        dtype's range is clamped to its largest finite value.

    Raises:
        ValueError: ``rewards`` not 1-D, N not divisible by ``group_size``.

    Example:
        >>> a = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
        >>> a.tolist()  # 1 − (0+0+0)/3, 0 − (1+0+0)/3
        [1.0, -0.3333333432674408, -0.3333333432674408, -0.3333333432674408]
    """
    check_dim("rloo_advantages", "rewards", rewards, 1)
    b = check_group_size("rloo_advantages", rewards.shape[0], group_size)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r = rewards.double().view(b, group_size)  # (B, G)
    valid = torch.isfinite(r)
    scale_of = row_scales(r, valid)  # (B, 1)
    x = r / scale_of
    mean, _, spread = pooled_stats(x, valid, rounding_eps(rewards.dtype))
    k = valid.sum(dim=1, keepdim=True).double()  # (B, 1) scorable rewards
    centred = torch.where(valid & spread[:, None], x - mean[:, None], torch.zeros_like(x))
    adv = centred * (k / (k - 1).clamp(min=1)) * scale_of  # = r_i − mean of the others
    return saturate(adv.reshape(-1), out_dtype)


def reinforce_pp_advantages(
    rewards: torch.Tensor, group_size: int, lengths: torch.Tensor, *, scale: str = "batch", eps: float = 1e-4
) -> torch.Tensor:
    """REINFORCE++ with a group baseline (Hu et al. 2025, arXiv 2501.03262, "REINFORCE++-baseline";
    OpenRLHF's ``advantage_estimator=reinforce_baseline``): the group mean subtracted, then the
    result normalized over the whole batch's completion *tokens*.

    ``c_i = r_i − mean(r_group)``; every token of completion i carries ``c_i``, and with ``L_i`` its
    counted tokens, over the batch's scorable completions:
    ``μ = Σ L_i c_i / Σ L_i``, ``σ² = Σ L_i (c_i − μ)² / Σ L_i`` (population variance over tokens),
    ``A_i = (c_i − μ) / max(σ, eps)`` (``scale="batch"``; OpenRLHF multiplies by
    ``rsqrt(clamp(σ², 1e-8))``, i.e. ``eps = 1e-4``) or ``A_i = c_i − μ`` (``scale="none"``,
    OpenRLHF's ``--no_std_norm``). Every token of a completion gets the same ``A_i`` (the KL is in
    the loss here, not in the reward, so the per-token return is the sequence's).

    Departure kept from the project's rules: a constant group (or one with < 2 scorable rewards,
    :func:`constant_groups`) gets exactly 0, not OpenRLHF's ``−μ/σ``; its rows still count in
    ``μ`` and ``σ`` with ``c = 0``, so every other row's value is OpenRLHF's. Unscorable rewards
    (NaN, ±inf) are left out of the group mean and of ``μ``, ``σ`` (their tokens do not count) and
    get 0. All in float64 on rewards divided by one power of two (exact).

    Args:
        rewards: ``(N,)`` float, ``N = B·G``, each group's G rewards contiguous; NaN = unscorable.
        group_size: G.
        lengths: ``(N,)`` counted tokens of each completion (``completion_mask.sum(1)``), >= 0.
        scale: ``"batch"`` (divide by the token std) or ``"none"``.
        eps: floor of the std (``scale="batch"``).

    Returns:
        ``(N,)`` advantages in ``rewards.dtype`` (float32 for integer input); all 0 when no group
        varies or no scorable completion has a token.

    Raises:
        ValueError: ``rewards``/``lengths`` not 1-D of one length, N not divisible by
            ``group_size``, a negative length, ``scale`` not ``batch``/``none``.

    Example:
        >>> a = reinforce_pp_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), 2, torch.tensor([1, 3, 2, 2]))
        >>> [round(x, 4) for x in a.tolist()]  # c = [.5, -.5, 0, 0]; μ = -1/8, σ = sqrt(7)/8; (c - μ)/σ
        [1.8898, -1.1339, 0.0, 0.0]
    """
    fn = "reinforce_pp_advantages"
    check_dim(fn, "rewards", rewards, 1)
    check_same_shape(fn, rewards=rewards, lengths=lengths)
    b = check_group_size(fn, rewards.shape[0], group_size)
    if scale not in BASELINE_SCALES["reinforce_pp"]:
        raise ValueError(f"{fn}: scale must be one of {BASELINE_SCALES['reinforce_pp']}, got {scale!r}")
    if bool((lengths < 0).any()):
        raise ValueError(f"{fn}: lengths must be >= 0, got {lengths.tolist()}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r = rewards.double().view(b, group_size)  # (B, G)
    valid = torch.isfinite(r)
    s = row_scales(r, valid).amax()  # one power of two for the whole batch
    x = r / s
    mean, _, spread = pooled_stats(x, valid, rounding_eps(rewards.dtype))
    signal = valid & spread[:, None]  # (B, G)
    c = torch.where(signal, x - mean[:, None], torch.zeros_like(x))  # constant groups: c = 0, still counted
    w = torch.where(valid, lengths.double().view(b, group_size), torch.zeros_like(x))  # tokens that count
    total = w.sum()
    if not bool(signal.any()) or total == 0:
        return torch.zeros_like(rewards, dtype=out_dtype)
    mu = (w * c).sum() / total
    dev = c - mu
    if scale == "batch":
        std = ((w * dev**2).sum() / total).sqrt()
        adv = dev / torch.clamp(std, min=eps / s)  # (c·s − μ·s) / max(σ·s, eps)
    else:
        adv = dev * s
    return saturate(torch.where(signal, adv, torch.zeros_like(adv)).reshape(-1), out_dtype)


# -- the outcome baselines (``algo.advantage_baseline``), registered with the scales each takes ------------


@register_advantage_baseline("group", scales=SCALES)
def group_baseline(
    rewards: torch.Tensor, group_size: int, *, scale: str, eps: float, lengths: torch.Tensor | None
) -> torch.Tensor:
    """``baseline="group"``: :func:`group_advantages` (GRPO; ``lengths`` unused)."""
    return group_advantages(rewards, group_size, scale=scale, eps=eps)


@register_advantage_baseline("rloo", scales=("none",))
def rloo_baseline(
    rewards: torch.Tensor, group_size: int, *, scale: str, eps: float, lengths: torch.Tensor | None
) -> torch.Tensor:
    """``baseline="rloo"``: :func:`rloo_advantages`, unscaled (with a std it is the group-mean
    baseline times ``k/(k−1)``)."""
    return rloo_advantages(rewards, group_size)


@register_advantage_baseline("reinforce_pp", scales=("batch", "none"))
def reinforce_pp_baseline(
    rewards: torch.Tensor, group_size: int, *, scale: str, eps: float, lengths: torch.Tensor | None
) -> torch.Tensor:
    """``baseline="reinforce_pp"``: :func:`reinforce_pp_advantages`, scaled by the batch's token std
    or not at all (OpenRLHF's ``--no_std_norm``).

    Raises:
        ValueError: no ``lengths``.
    """
    if lengths is None:
        raise ValueError("outcome_advantages: baseline 'reinforce_pp' needs lengths (counted tokens per completion)")
    return reinforce_pp_advantages(rewards, group_size, lengths, scale=scale, eps=eps)


BASELINES = ADVANTAGE_BASELINES.names()
"""The built-in ``baseline`` values of :func:`outcome_advantages` (``algo.advantage_baseline``; the
registry, with any name added later: :data:`grpokit.algo.catalog.ADVANTAGE_BASELINES`)."""


def outcome_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    baseline: str = "group",
    scale: str = "group",
    eps: float = 1e-4,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Outcome advantages with the baseline ``algo.advantage_baseline`` names, looked up in
    :data:`grpokit.algo.catalog.ADVANTAGE_BASELINES`: ``group`` = :func:`group_advantages` (``scale``
    group/batch/none), ``rloo`` = :func:`rloo_advantages` (``scale`` none), ``reinforce_pp`` =
    :func:`reinforce_pp_advantages` (``scale`` batch/none; needs ``lengths``). The scales each
    takes: :data:`grpokit.algo.catalog.BASELINE_SCALES` (RLOO is unscaled; REINFORCE++ scales by the
    batch's token std, or not at all; a group std is GRPO's). Shapes, dtypes and edge cases: those
    functions'.

    Raises:
        ValueError: unknown ``baseline``, a ``scale`` the baseline does not take
            (:data:`BASELINE_SCALES`), ``reinforce_pp`` without ``lengths``; and what the chosen
            function raises.

    Example:
        >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0])
        >>> outcome_advantages(r, 4, baseline="rloo", scale="none").tolist()[:2]
        [1.0, -0.3333333432674408]
    """
    estimate = ADVANTAGE_BASELINES.lookup(baseline, "outcome_advantages")
    if scale not in BASELINE_SCALES[baseline]:
        raise ValueError(
            f"outcome_advantages: baseline {baseline!r} takes scale {BASELINE_SCALES[baseline]}, got {scale!r}"
        )
    return estimate(rewards, group_size, scale=scale, eps=eps, lengths=lengths)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation for the PPO baseline (Schulman et al. 2016, arXiv 1506.02438).

    Over the unmasked tokens of each row, in order (masked tokens are skipped: the "next" token of
    ``t`` is the next unmasked one): ``δ_t = r_t + γ V_next − V_t`` (``V_next`` = 0 after the last
    unmasked token), ``A_t = δ_t + γλ A_next``, returns ``R_t = A_t + V_t``. Masked tokens get 0.
    γ = λ = 1 gives ``A_t = Σ_{l≥t} r_l − V_t``; λ = 0 gives ``A_t = δ_t``.

    Args:
        token_rewards: ``(N, T)`` float per-token rewards (e.g. the outcome reward at the last token).
        values: ``(N, T)`` float value estimates ``V(s_t)``.
        completion_mask: ``(N, T)`` bool, True = the token counts.
        gamma: discount γ in [0, 1]. lam: λ in [0, 1].

    Returns:
        ``(advantages, returns)``, both ``(N, T)`` in ``values``' dtype.

    Raises:
        ValueError: mismatched shapes.

    Example:
        >>> a, ret = gae_advantages(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2),
        ...                         torch.ones(1, 2, dtype=torch.bool), gamma=1.0, lam=1.0)
        >>> a.tolist()
        [[1.0, 1.0]]
    """
    check_same_shape("gae_advantages", token_rewards=token_rewards, values=values, completion_mask=completion_mask)
    mask = completion_mask.bool()
    v, r = values, token_rewards.to(values.dtype)
    adv = torch.zeros_like(v)
    next_v = torch.zeros_like(v[:, 0])
    next_a = torch.zeros_like(v[:, 0])
    for t in range(v.shape[1] - 1, -1, -1):
        m = mask[:, t]
        a = r[:, t] + gamma * next_v - v[:, t] + gamma * lam * next_a
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
        next_v = torch.where(m, v[:, t], next_v)
        next_a = torch.where(m, a, next_a)
    return adv, torch.where(mask, adv + v, torch.zeros_like(v))
