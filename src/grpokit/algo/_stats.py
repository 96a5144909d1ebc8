"""Group statistics shared by the advantage estimators (:mod:`grpokit.algo.advantages`,
:mod:`grpokit.algo.process`, :mod:`grpokit.algo.reward_shaping`); private to ``grpokit.algo``.

Every statistic is float64, on rewards divided by a power of two (:func:`row_scales`, exact), so a
constant group gives advantages of exactly 0 and rewards up to float64's largest value stay finite.
"""

from __future__ import annotations

import torch

#: Rewards within this many units of rounding of each other are equal (see :func:`constant_groups`).
ROUNDING_ULPS = 16


def rounding_eps(dtype: torch.dtype) -> float:
    """Relative rounding unit of the *input* rewards: ``finfo(dtype).eps``; 0 for integer/bool
    rewards, which are exact (equal only when identical)."""
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def varies(values: torch.Tensor, valid: torch.Tensor, tol: float) -> torch.Tensor:
    """``(B,)`` bool: the row has >= 2 valid entries and ``max − min > ROUNDING_ULPS · tol ·
    max|value|`` over them. ``values``/``valid``: ``(B, K)`` float64, already divided by a power of
    two (exact, so the test is the same as on the rewards, without overflow or underflow)."""
    count = valid.sum(dim=1)
    big = torch.finfo(values.dtype).max
    vmax = torch.where(valid, values, torch.full_like(values, -big)).amax(dim=1)
    vmin = torch.where(valid, values, torch.full_like(values, big)).amin(dim=1)
    vabs = torch.where(valid, values.abs(), torch.zeros_like(values)).amax(dim=1)
    return (count >= 2) & (vmax - vmin > ROUNDING_ULPS * tol * vabs)


def pooled_stats(
    values: torch.Tensor, valid: torch.Tensor, tol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, sample std (ddof=1) and "spread" flag of each row over its ``valid`` entries (float64).

    ``values``/``valid``: ``(B, K)``. Returns ``mean (B,)``, ``std (B,)``, ``varies (B,)`` where ``varies``
    is False for rows with < 2 valid entries or all valid entries equal up to rounding (see
    :func:`constant_groups`; those get advantage 0 exactly).
    """
    count = valid.sum(dim=1)
    filled = torch.where(valid, values, torch.zeros_like(values))
    mean = filled.sum(dim=1) / count.clamp(min=1)
    dev = torch.where(valid, values - mean[:, None], torch.zeros_like(values))
    std = ((dev**2).sum(dim=1) / (count - 1).clamp(min=1)).sqrt()
    return mean, std, varies(values, valid, tol)


def row_scales(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(B, 1)`` powers of two ``2^(e-1)`` with ``e`` the binary exponent of each row's largest
    ``|valid value|`` (1 for a row with none): dividing by one is exact and leaves every valid
    value in ``(-2, 2)``, so sums and squares cannot overflow float64 (rewards up to its max)."""
    big = torch.where(valid, values.abs(), torch.zeros_like(values)).amax(dim=1, keepdim=True)
    _, exp = torch.frexp(big)  # big = m · 2^exp, m in [0.5, 1)
    return torch.where(big > 0, torch.ldexp(torch.ones_like(big), exp - 1), torch.ones_like(big))


def saturate(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype``, values beyond its range clamped to its largest finite value."""
    big = torch.finfo(dtype).max
    return x.clamp(-big, big).to(dtype)
