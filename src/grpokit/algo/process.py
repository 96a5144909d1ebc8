"""Process-supervision advantages (DeepSeekMath §4.1.3): step rewards z-scored against every step
reward of the group, then credited to the tokens (``algo.process_advantage``: sum / mean / diff /
change). The statistics are :mod:`grpokit.algo.advantages`' (float64, exact zero for a constant
group, "constant" up to rounding).
"""

from __future__ import annotations

import torch

from ._checks import check_dim, check_group_size, check_same_shape
from ._stats import pooled_stats, rounding_eps, row_scales, saturate

PROCESS_MODES = ("sum", "mean", "diff", "change")
"""The ``mode`` values of :func:`process_advantages` (``algo.process_advantage``)."""


def _reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``out[:, t] = Σ_{t' ≥ t} x[:, t']``."""
    return x.flip(1).cumsum(1).flip(1)


def _previous_scored(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """At each position, the value at the nearest ``valid`` position strictly before it in the same
    row (0 where there is none)."""
    t = values.shape[1]
    idx = torch.where(
        valid, torch.arange(t, device=values.device).expand_as(valid), torch.full_like(valid, -1, dtype=torch.long)
    )
    last = idx.cummax(dim=1).values  # last valid position at or before t
    prev = torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], dim=1)  # ... strictly before t
    got = values.gather(1, prev.clamp(min=0))
    return torch.where(prev >= 0, got, torch.zeros_like(got))


def _own_step_end(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """At each position, the value at the nearest ``valid`` position at or after it in the same row
    (the end of the token's own step; 0 after the row's last one)."""
    t = values.shape[1]
    idx = torch.where(
        valid, torch.arange(t, device=values.device).expand_as(valid), torch.full_like(valid, t, dtype=torch.long)
    )
    nxt = idx.flip(1).cummin(dim=1).values.flip(1)  # first valid position at or after t
    got = values.gather(1, nxt.clamp(max=t - 1))
    return torch.where(nxt < t, got, torch.zeros_like(got))


def _pooled_step_rewards(
    fn: str, step_rewards: torch.Tensor, step_end_mask: torch.Tensor, completion_mask: torch.Tensor, group_size: int
) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Checks the inputs of ``fn`` and pools each group's scored step rewards: ``(B, valid (N, T),
    pooled (B, G·T) float64 divided by scale_of, scale_of (B, 1), (mean, std, varies) of each group)``."""
    check_dim(fn, "step_rewards", step_rewards, 2)
    check_same_shape(fn, step_rewards=step_rewards, step_end_mask=step_end_mask, completion_mask=completion_mask)
    n, t = step_rewards.shape
    b = check_group_size(fn, n, group_size)
    r = step_rewards.double()
    valid = step_end_mask.bool() & completion_mask.bool() & torch.isfinite(r)
    pooled_r, pooled_valid = r.reshape(b, group_size * t), valid.reshape(b, group_size * t)
    scale_of = row_scales(pooled_r, pooled_valid)  # (B, 1), as in group_advantages
    pooled_r = pooled_r / scale_of
    return b, valid, pooled_r, scale_of, pooled_stats(pooled_r, pooled_valid, rounding_eps(step_rewards.dtype))


def process_constant_groups(
    step_rewards: torch.Tensor,
    step_end_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """Which groups carry no process signal: :func:`process_advantages` gives them 0 at every token
    (any ``mode`` and ``eps``). Dynamic sampling under process supervision drops these groups.

    A group is constant when its G completions hold fewer than two scored steps (finite step
    rewards at ``step_end_mask`` positions inside ``completion_mask``), or when all its scored step
    rewards, pooled over the G completions, are equal up to rounding (the rule of
    :func:`constant_groups`). A group whose completions all end right but differ in a wrong middle
    step is *not* constant, though its outcome rewards are.

    Args:
        step_rewards: ``(N, T)`` float; read only where ``step_end_mask`` is True.
        step_end_mask: ``(N, T)`` bool, True at the last token of each step.
        completion_mask: ``(N, T)`` bool, True = token counts.
        group_size: G; ``N = B·G`` with each group contiguous.

    Returns:
        ``(B,)`` bool, True where the group is constant.

    Raises:
        ValueError: mismatched shapes, not 2-D, N not divisible by ``group_size``.

    Example:
        >>> r = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
        >>> ends = torch.tensor([[True, True]] * 4)
        >>> process_constant_groups(r, ends, torch.ones(4, 2, dtype=torch.bool), 2).tolist()
        [False, True]
    """
    _, _, _, _, (_, _, varies) = _pooled_step_rewards(
        "process_constant_groups", step_rewards, step_end_mask, completion_mask, group_size
    )
    return ~varies


def process_advantages(
    step_rewards: torch.Tensor,
    step_end_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    group_size: int,
    *,
    eps: float = 1e-4,
    mode: str = "sum",
) -> torch.Tensor:
    """Process-supervision advantages per token (DeepSeekMath §4.1.3).

    Each step reward ``r_k`` (stored at the last token of step k, where ``step_end_mask`` is True)
    is normalized with the mean and sample std of *all* step rewards of the group's G completions
    pooled together: ``r̃_k = (r_k − mean) / (std + eps)``. A token's advantage is the sum of the
    normalized rewards of the steps ending at or after it: ``A_t = Σ_{k: end(k) ≥ t} r̃_k``.
    Tokens after the last step end, and masked tokens, get 0. Step rewards that are NaN
    (unscorable), or sit on masked tokens, are left out of the statistics and count as 0. A group
    with fewer than two scored steps, or all its step rewards equal up to rounding (the rule of
    :func:`constant_groups` on the pooled step rewards, input dtype's eps), gets 0 everywhere.

    ``mode`` (``algo.process_advantage``) chooses how the normalized step rewards ``r̃_k`` of a
    completion become token advantages; for a token of step ``j`` of a completion with ``K`` scored
    steps:

    - ``sum`` (the paper's formula, the default): ``A = Σ_{k=j..K} r̃_k``. A completion with more
      steps adds more terms, so a long run of above-average steps can out-earn a short right answer
      (``docs/process_vs_outcome.md``).
    - ``mean``: ``A = (Σ_{k=j..K} r̃_k) / (K − j + 1)``, the mean of the same terms: no more weight
      for more steps.
    - ``diff``: the sum over step rewards taken as differences ``r̃_k − r̃_{k−1}`` (``r̃_0 = 0``),
      which telescopes to ``A = r̃_K − r̃_{j−1}``: a token is credited with the change from the step
      before its own to the completion's last step.
    - ``change``: ``A = r̃_j − r̃_{j−1}`` (``r̃_0 = 0``), the change its own step made, not
      telescoped over the later steps: a step that keeps a right (or a wrong) prefix as it was gets
      0, the step that breaks a right prefix gets the drop. In a group whose completions all end
      wrong (a verifier's last step scores lowest), ``diff`` gives no token a positive advantage
      (``r̃_K ≤ r̃_{j−1}``) and every first step ``r̃_K < 0``; ``change`` credits a right first step
      and blames only the step that broke (``docs/process_supervision.md``, "Credit per step").

    Args:
        step_rewards: ``(N, T)`` float; read only where ``step_end_mask`` is True.
        step_end_mask: ``(N, T)`` bool, True at the last token of each step.
        completion_mask: ``(N, T)`` bool, True = token counts.
        group_size: G; ``N = B·G`` with each group contiguous.
        eps: added to the pooled std.
        mode: ``sum``, ``mean``, ``diff`` or ``change`` (above).

    Returns:
        ``(N, T)`` advantages, dtype of ``step_rewards`` (float32 for integer input).

    Raises:
        ValueError: mismatched shapes, not 2-D, N not divisible by ``group_size``, unknown ``mode``.

    Example:
        >>> r = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
        >>> ends = torch.tensor([[True, False], [True, False]])
        >>> process_advantages(r, ends, torch.ones(2, 2, dtype=torch.bool), 2).tolist()
        [[0.7070068120956421, 0.0], [-0.7070068120956421, 0.0]]
    """
    fn = "process_advantages"
    if mode not in PROCESS_MODES:
        raise ValueError(f"{fn}: mode must be one of {PROCESS_MODES}, got {mode!r}")
    n, t = step_rewards.shape
    b, valid, pooled_r, scale_of, (mean, std, varies) = _pooled_step_rewards(
        fn, step_rewards, step_end_mask, completion_mask, group_size
    )
    norm = (pooled_r - mean[:, None]) / (std[:, None] + eps / scale_of)
    norm = torch.where(valid.reshape(b, -1) & varies[:, None], norm, torch.zeros_like(norm))
    norm = norm.reshape(n, t)
    if mode in ("diff", "change"):  # r̃_k − r̃_{k−1} at each scored step end (r̃_0 = 0)
        norm = torch.where(valid, norm - _previous_scored(norm, valid), norm)
    # change: A_t = that difference at the end of t's own step; else A_t = sum_{t' >= t} norm_{t'}
    adv = _own_step_end(norm, valid) if mode == "change" else _reverse_cumsum(norm)
    if mode == "mean":
        adv = adv / _reverse_cumsum(valid.to(adv.dtype)).clamp(min=1.0)
    adv = torch.where(completion_mask.bool(), adv, torch.zeros_like(adv))
    return saturate(adv, step_rewards.dtype if step_rewards.is_floating_point() else torch.float32)
