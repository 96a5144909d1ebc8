"""Reward shaping before the advantages: per-function normalization (GDPO), DAPO's soft overlong
penalty, and the outcome reward on process supervision's last step. Pure functions of tensors; the
reward pipeline (:mod:`grpokit.rewards.pipeline`) and the step scorer apply them where they combine
the rewards, so what they write is what every advantage estimator, dynamic sampling and the reward
metrics see.
"""

from __future__ import annotations

import torch

from ._checks import check_dim, check_group_size
from ._stats import saturate
from .advantages import group_advantages


def normalized_reward_sum(
    rewards: torch.Tensor, weights: torch.Tensor, group_size: int, *, eps: float = 1e-4
) -> torch.Tensor:
    """Each reward function's values z-scored within the group, then weighted and summed (GDPO,
    Liu et al. 2026, arXiv 2601.05242, "group reward-decoupled normalization"; TRL's
    ``multi_objective_aggregation="normalize_then_sum"``).

    ``R_i = Σ_k w_k · (r_ik − mean_g(r_·k)) / (std_g(r_·k) + eps)``, each column normalized as
    :func:`~grpokit.algo.group_advantages` with ``scale="group"`` normalizes rewards (sample std,
    ddof=1; a column constant in a group, up to rounding, gives exactly 0 there). Summing the raw
    weighted rewards first lets a reward with a wide spread drown the others, and distinct reward
    combinations collapse onto one advantage; normalizing each first keeps their differences.

    Unscorable entries keep :func:`grpokit.rewards.base.compute_rewards`'s rule: a row is
    unscorable (NaN) when any column with a non-zero weight is NaN/±inf there; such a row is left
    out of every column's group statistics. Columns with weight 0 are ignored (their NaN does not
    make a row unscorable). TRL's ``normalize_then_sum`` differs there: a row is unscorable only
    when every function returned None.

    Args:
        rewards: ``(N, K)`` float, one column per reward function, ``N = B·G`` with each group's G
            rows contiguous; NaN = that function could not score the row.
        weights: ``(K,)`` float, the functions' weights.
        group_size: G.
        eps: added to each column's group std.

    Returns:
        ``(N,)`` in ``rewards.dtype`` (float32 for integer input), NaN on unscorable rows; each
        group's scorable rows sum to 0 (up to rounding).

    Raises:
        ValueError: ``rewards`` not 2-D, ``weights`` not ``(K,)``, N not divisible by ``group_size``.

    Example:
        >>> r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 10.0], [0.0, 10.0]])  # correct?, length
        >>> [round(x, 3) for x in normalized_reward_sum(r, torch.tensor([1.0, 1.0]), 4).tolist()]
        [-0.0, -1.732, 1.732, 0.0]
        >>> # z_1 = ±0.5 / (0.57735 + 1e-4), z_2 = ±5 / (5.7735 + 1e-4): each ±0.866; the raw sums
        >>> # [1, 0, 11, 10] would rank the wrong row 3 far above the right row 0
    """
    fn = "normalized_reward_sum"
    check_dim(fn, "rewards", rewards, 2)
    n, k = rewards.shape
    if tuple(weights.shape) != (k,):
        raise ValueError(
            f"{fn}: weights must have shape ({k},) (one per column of rewards), got {tuple(weights.shape)}"
        )
    check_group_size(fn, n, group_size)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    if not rewards.is_floating_point():
        rewards = rewards.double()  # integers: exact, and NaN can mark the unscorable rows
    w = weights.double().to(rewards.device)
    live = w != 0  # (K,)
    ok = torch.isfinite(rewards[:, live]).all(dim=1)  # (N,) every weighted term scorable
    cols = torch.where(ok[:, None], rewards, torch.full_like(rewards, float("nan")))[:, live]
    # (N, K') -> (K'·N,): each column's groups stay contiguous, so one call normalizes every column
    z = group_advantages(cols.t().reshape(-1), group_size, scale="group", eps=eps).double().view(-1, n)  # (K', N)
    total = (w[live][:, None] * z).sum(dim=0)  # (N,)
    total = torch.where(ok, total, torch.full_like(total, float("nan")))
    return saturate(total, out_dtype)


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476 §3.4, eq. 13), a length
    reward added to the outcome reward:

    ``R_len(y) = 0`` if ``|y| ≤ L_max − L_cache``; ``(L_max − L_cache − |y|) / L_cache`` if
    ``L_max − L_cache < |y| ≤ L_max``; ``−1`` if ``|y| > L_max``,

    with ``L_max = max_length`` and ``L_cache = buffer``: 0 up to the buffer, then falling linearly
    to −1 at ``L_max`` (a completion cut at the limit gets −1). ``buffer = 0`` is off (all 0).

    Args:
        lengths: ``(N,)`` ``|y|``, the counted tokens of each completion (``completion_mask.sum(1)``),
            integer or float, >= 0.
        max_length: ``L_max`` >= 1.
        buffer: ``L_cache``, ``0 <= buffer <= max_length``.

    Returns:
        ``(N,)`` float64 penalties in ``[−1, 0]``.

    Raises:
        ValueError: ``lengths`` not 1-D or negative, ``max_length < 1``, ``buffer`` outside
            ``[0, max_length]``.

    Example:
        >>> overlong_penalty(torch.tensor([10, 12, 15, 16, 17]), 16, 4).tolist()  # soft zone 12 < |y| <= 16
        [0.0, 0.0, -0.75, -1.0, -1.0]
    """
    fn = "overlong_penalty"
    check_dim(fn, "lengths", lengths, 1)
    if max_length < 1:
        raise ValueError(f"{fn}: max_length must be >= 1, got {max_length}")
    if not 0 <= buffer <= max_length:
        raise ValueError(f"{fn}: buffer must be in [0, max_length={max_length}], got {buffer}")
    if bool((lengths < 0).any()):
        raise ValueError(f"{fn}: lengths must be >= 0, got {lengths.tolist()}")
    y = lengths.double()
    if buffer == 0:
        return torch.zeros_like(y)
    free = max_length - buffer  # L_max − L_cache
    soft = (free - y) / buffer
    zero, minus_one = torch.zeros_like(y), torch.full_like(y, -1.0)
    return torch.where(y <= free, zero, torch.where(y <= max_length, soft, minus_one))


def outcome_at_last_step(
    step_rewards: torch.Tensor, step_ends: torch.Tensor, completion_mask: torch.Tensor, rewards: torch.Tensor
) -> torch.Tensor:
    """Step rewards whose last step is scored by the outcome reward (``algo.process_last_step=outcome``).

    A Math-Shepherd PRM (arXiv 2312.08935 §3.3) is trained to say whether a prefix can still reach
    the answer; for the whole solution that is exactly what the outcome check says, without the
    PRM's error. So each completion's last counted step end gets ``rewards[i]`` and the PRM (or any
    step scorer) judges only the steps before it, as the rule verifier's outcome check does for its
    last step (:mod:`grpokit.process.verifier`, step 4). With ``algo.process_advantage=diff`` a
    token of step ``j`` then gets ``(r_i − s_{j−1}) / σ``: the outcome against the scorer's value of
    the prefix before its step (the group mean cancels), so extra steps cannot raise a completion's
    return.

    Args:
        step_rewards: ``(N, T)`` float, read where ``step_ends`` is True (NaN = unscored step).
        step_ends: ``(N, T)`` bool, True at the last token of each step.
        completion_mask: ``(N, T)`` bool, True = the token counts; step ends off it are ignored.
        rewards: ``(N,)`` float, the outcome reward of each completion (NaN = unscorable: the last
            step becomes unscored).

    Returns:
        ``(N, T)`` copy of ``step_rewards`` in its dtype; rows without a counted step end unchanged.

    Raises:
        ValueError: ``step_rewards``/``step_ends``/``completion_mask`` shapes differ or are not 2-D,
            ``rewards`` is not ``(N,)``, or ``step_ends`` is not bool.

    Example:
        >>> s = torch.tensor([[0.5, 0.0, 0.75, 0.0], [0.25, 0.5, 0.0, 0.0]])  # PRM scores at step ends
        >>> ends = torch.tensor([[True, False, True, False], [True, True, False, False]])
        >>> outcome_at_last_step(s, ends, torch.ones(2, 4, dtype=torch.bool), torch.tensor([0.0, 1.0])).tolist()
        [[0.5, 0.0, 0.0, 0.0], [0.25, 1.0, 0.0, 0.0]]
    """
    fn = "outcome_at_last_step"
    check_dim(fn, "step_rewards", step_rewards, 2)
    if step_ends.shape != step_rewards.shape or completion_mask.shape != step_rewards.shape:
        raise ValueError(
            f"{fn}: shapes must match, got step_rewards {tuple(step_rewards.shape)}, step_ends "
            f"{tuple(step_ends.shape)}, completion_mask {tuple(completion_mask.shape)}"
        )
    if step_ends.dtype != torch.bool:
        raise ValueError(f"{fn}: step_ends must be bool, got {step_ends.dtype}")
    n, t = step_rewards.shape
    if tuple(rewards.shape) != (n,):
        raise ValueError(f"{fn}: rewards must have shape ({n},) (one per row), got {tuple(rewards.shape)}")
    ends = step_ends & completion_mask.bool()
    has_step = ends.any(dim=1)
    # the last True column of each row: the largest position index among its step ends
    pos = torch.arange(t, device=ends.device).expand(n, t)
    last = torch.where(ends, pos, torch.full_like(pos, -1)).max(dim=1).values
    out = step_rewards.clone()
    rows = has_step.nonzero().flatten()
    out[rows, last[rows]] = rewards[rows].to(out.dtype)
    return out
