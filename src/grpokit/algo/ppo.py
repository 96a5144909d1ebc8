"""PPO's pieces beyond GRPO's: per-token rewards, whitening and the clipped value loss.

The PPO baseline for LLMs (Ouyang et al. 2022, arXiv 2203.02155; the background of DeepSeekMath
§4.1): a value model V estimates each token's return; per-token rewards put the outcome reward on
the last completion token (and process rewards at step ends), optionally minus a per-token KL
penalty; GAE(γ, λ) (:func:`grpokit.algo.gae_advantages`) turns them into advantages, which are
whitened over the batch's unmasked tokens; the value model regresses on the returns with a clipped
loss (PPO2's value clipping).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._checks import check_dim, check_same_shape


def token_rewards(
    rewards: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    step_rewards: torch.Tensor | None = None,
    step_ends: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards ``(N, T)`` for GAE.

    Outcome: ``rewards[i]`` on row i's last unmasked token. Process (``step_rewards`` and
    ``step_ends`` given): the step reward at each step's last token (``step_ends``), and ``rewards``
    is not used. With ``kl`` (per-token KL(π‖π_ref) estimates) every unmasked token also gets
    ``−kl_coef · kl_t`` (the KL penalty in the reward, Ouyang et al. 2022 eq. 2). A row without an
    unmasked token gets nothing; a NaN or ±inf reward (unscorable, as in
    :func:`grpokit.algo.group_advantages`) counts as 0. Masked tokens are selected out
    (``torch.where``), so NaN/inf in ``kl`` or ``step_rewards`` there change nothing.

    Args:
        rewards: ``(N,)`` float outcome rewards.
        completion_mask: ``(N, T)`` bool.
        step_rewards: ``(N, T)`` float, read where ``step_ends`` is True (NaN there counts as 0).
        step_ends: ``(N, T)`` bool.
        kl: ``(N, T)`` float, or None. kl_coef: the KL coefficient β (>= 0).

    Returns:
        ``(N, T)`` float64 (zero on masked tokens).

    Raises:
        ValueError: mismatched shapes; only one of ``step_rewards``/``step_ends``.

    Example:
        >>> token_rewards(torch.tensor([1.0, 2.0]), torch.tensor([[True, True, False], [True, False, False]])).tolist()
        [[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]
    """
    fn = "token_rewards"
    check_dim(fn, "rewards", rewards, 1)
    check_dim(fn, "completion_mask", completion_mask, 2)
    if rewards.shape[0] != completion_mask.shape[0]:
        raise ValueError(f"{fn}: {rewards.shape[0]} rewards for {completion_mask.shape[0]} rows")
    if (step_rewards is None) != (step_ends is None):
        raise ValueError(f"{fn}: give both step_rewards and step_ends, or neither")
    mask = completion_mask.bool()
    out = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    if step_rewards is not None and step_ends is not None:  # both or neither (checked above)
        check_same_shape(fn, step_rewards=step_rewards, step_ends=step_ends, completion_mask=completion_mask)
        ends = step_ends.bool() & mask
        sr = step_rewards.double()
        out = torch.where(ends & torch.isfinite(sr), sr, out)
    else:
        has = mask.any(-1)
        last = (mask.long().cumsum(-1) == mask.sum(-1, keepdim=True)) & mask  # the last unmasked token
        r = rewards.double()
        value = torch.where(torch.isfinite(r), r, torch.zeros_like(r))[:, None].expand_as(out)
        out = torch.where(last & has[:, None], value, out)
    if kl is not None:
        check_same_shape(fn, kl=kl, completion_mask=completion_mask)
        if kl_coef != 0:  # 0·kl is not 0 for an infinite kl
            out = torch.where(mask, out - kl_coef * kl.double(), out)
    return out


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``(x − mean) / sqrt(var + eps)`` over the unmasked entries (population variance); masked
    entries are 0 and never read (selection, not multiplication: NaN/inf there change nothing).
    ``shift_mean=False`` only rescales (adds the mean back). With ``var + eps == 0`` (a constant
    batch and ``eps = 0``) the centred values are 0 (not ``0 · inf``).

    Args:
        values: ``(N, T)`` float.
        mask: ``(N, T)`` bool.
        all_reduce: sums a tensor across ranks in place and returns it (e.g. a
            ``torch.distributed.all_reduce`` wrapper), so that the statistics are the global
            batch's; None = this batch only.

    Returns:
        ``(N, T)`` in ``values``' dtype. With no unmasked entry: all zeros.

    Raises:
        ValueError: mismatched shapes.
    """
    check_same_shape("masked_whiten", values=values, mask=mask)
    keep = mask.bool()
    m = keep.to(torch.float64)
    zeros = torch.zeros_like(m)
    x = torch.where(keep, values.double(), zeros)
    sums = torch.stack([x.sum(), m.sum()])
    if all_reduce is not None:
        sums = all_reduce(sums)
    n = sums[1].clamp(min=1.0)
    mean = sums[0] / n
    sq = torch.where(keep, (x - mean) ** 2, zeros).sum()
    if all_reduce is not None:
        sq = all_reduce(sq.reshape(1))[0]
    var = sq / n
    inv_std = torch.where(var + eps > 0, torch.rsqrt(var + eps), torch.zeros_like(var))
    out = (x - mean) * inv_std
    if not shift_mean:
        out = out + mean
    return torch.where(keep, out, zeros).to(values.dtype)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss ``0.5 · max((V − R)², (clip(V, V_old − ε, V_old + ε) − R)²)``,
    averaged over unmasked tokens.

    Args:
        values: ``(N, T)`` float, the value model's current output (gradients flow through it).
        old_values: ``(N, T)`` float, its output when the batch was sampled.
        returns: ``(N, T)`` float, the GAE returns (targets).
        completion_mask: ``(N, T)`` bool.
        clip_eps: ε_v > 0 (``None``-like large values disable clipping in effect).
        num_tokens: the global unmasked-token count to divide by (micro-batches and ranks sum to
            the full-batch loss); default: this batch's.

    Returns:
        ``(loss, clip_frac)``: 0-dim loss; the fraction of unmasked tokens where the clipped term
        was the larger (those tokens give zero gradient). Masked tokens are selected out before
        any product (``torch.where``): NaN/inf values or returns there change neither value nor
        gradient (0 there).

    Raises:
        ValueError: mismatched shapes or ``clip_eps <= 0``.

    Example:
        >>> m = torch.ones(1, 1, dtype=torch.bool)
        >>> round(value_loss(torch.tensor([[0.5]]), torch.zeros(1, 1), torch.ones(1, 1), m)[0].item(), 6)
        0.32
    """
    fn = "value_loss"
    check_same_shape(fn, values=values, old_values=old_values, returns=returns, completion_mask=completion_mask)
    if not clip_eps > 0:
        raise ValueError(f"{fn}: clip_eps must be > 0, got {clip_eps}")
    keep = completion_mask.bool()
    mask = keep.to(values.dtype)
    zeros = torch.zeros_like(values)
    # masked tokens: all three 0 before the squares, so no inf reaches the value or the gradient
    values = torch.where(keep, values, zeros)
    old_values = torch.where(keep, old_values.to(values.dtype), zeros)
    returns = torch.where(keep, returns.to(values.dtype), zeros)
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    unclipped_sq = (values - returns) ** 2
    clipped_sq = (clipped - returns) ** 2
    per_token = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    n = mask.sum() if num_tokens is None else mask.new_tensor(float(num_tokens))
    loss = torch.where(keep, per_token, zeros).sum() / n.clamp(min=1.0)
    with torch.no_grad():
        frac = (keep & (clipped_sq > unclipped_sq)).to(mask.dtype).sum() / mask.sum().clamp(min=1.0)
    return loss, frac
