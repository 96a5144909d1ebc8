"""Completion masks from EOS tokens (never from the pad id)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import check_dim


def mask_completions(completion_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """Mark the tokens of each completion that count, up to and including the first EOS.

    Args:
        completion_ids: ``(N, T)`` integer token ids as sampled (padding after the end may use any
            id, the EOS id included).
        eos_token_ids: every id that ends a completion (e.g. ``<|im_end|>`` and ``<|endoftext|>``).

    Returns:
        ``(N, T)`` bool ``completion_mask``: True for tokens up to and including the first token that is
        any of ``eos_token_ids``; all True for a row with no EOS (truncated at max length). The mask is
        never derived from the pad id, so ``pad == eos`` keeps the first EOS in the loss.

    Raises:
        ValueError: ``completion_ids`` not 2-D, or ``eos_token_ids`` empty.

    Example:
        >>> ids = torch.tensor([[5, 6, 2, 2, 2], [5, 6, 7, 8, 9]])
        >>> mask_completions(ids, [2]).int().tolist()
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    """
    check_dim("mask_completions", "completion_ids", completion_ids, 2)
    if len(eos_token_ids) == 0:
        raise ValueError("mask_completions: eos_token_ids is empty; pass at least one EOS id")
    eos = torch.as_tensor(list(eos_token_ids), device=completion_ids.device)
    is_eos = torch.isin(completion_ids, eos).int()  # (N, T)
    eos_before = is_eos.cumsum(dim=1) - is_eos  # number of EOS strictly before each token
    return eos_before == 0


def completion_terminated(completion_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """``(N,)`` bool: True where the completion contains an EOS (False = truncated at max length).

    Example:
        >>> completion_terminated(torch.tensor([[5, 2], [5, 6]]), [2]).tolist()
        [True, False]
    """
    check_dim("completion_terminated", "completion_ids", completion_ids, 2)
    eos = torch.as_tensor(list(eos_token_ids), device=completion_ids.device)
    return torch.isin(completion_ids, eos).any(dim=1)
