"""Loss aggregation (``algo.loss_aggregation``): ``(N, T)`` per-token losses to a scalar, each way a
function registered in :data:`grpokit.algo.catalog.AGGREGATIONS` (torch only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import catalog
from ._checks import check_same_shape
from .catalog import register_aggregation

if TYPE_CHECKING:
    from .loss_types import LossConfig


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(
    masked: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_sequences: int,
    num_tokens: int | None,
    max_completion_length: int | None,
) -> torch.Tensor:
    """``1/N_glob Σ_i 1/|o_i| Σ_t l_it`` (DeepSeekMath eq. 3): each sequence's token mean, averaged."""
    per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.sum() / max(num_sequences, 1)


@register_aggregation("token_mean")
def token_mean(
    masked: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_sequences: int,
    num_tokens: int | None,
    max_completion_length: int | None,
) -> torch.Tensor:
    """``Σ_i Σ_t l_it / tokens_glob`` (DAPO, arXiv 2503.14476): one mean over every counted token."""
    n_tok = mask.sum() if num_tokens is None else mask.new_tensor(float(num_tokens))
    return masked.sum() / torch.clamp(n_tok, min=1.0)


def _max_length(fn: str, max_completion_length: int | None) -> int:
    if not max_completion_length or max_completion_length < 1:
        raise ValueError(
            f"{fn}: aggregation 'seq_mean_token_sum_norm' needs max_completion_length >= 1, got {max_completion_length}"
        )
    return max_completion_length


def _needs_max_length(fn: str, config: LossConfig) -> None:
    _max_length(fn, config.max_completion_length)


@register_aggregation("seq_mean_token_sum_norm", check=_needs_max_length)
def seq_mean_token_sum_norm(
    masked: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_sequences: int,
    num_tokens: int | None,
    max_completion_length: int | None,
) -> torch.Tensor:
    """``Σ_i Σ_t l_it / (N_glob · max_completion_length)`` (Dr. GRPO, arXiv 2503.20783): a constant
    normalizer, no length bias.

    Raises:
        ValueError: ``max_completion_length`` missing or < 1.
    """
    return masked.sum() / (max(num_sequences, 1) * _max_length("aggregate_loss", max_completion_length))


#: the built-in names of ``algo.loss_aggregation`` (the registry: :data:`grpokit.algo.catalog.AGGREGATIONS`)
AGGREGATIONS = catalog.AGGREGATIONS.names()


def aggregate_loss(
    per_token_loss: torch.Tensor,
    completion_mask: torch.Tensor,
    aggregation: str = "seq_mean_token_mean",
    *,
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce ``(N, T)`` per-token losses to a scalar with the aggregation ``aggregation`` names
    (:data:`grpokit.algo.catalog.AGGREGATIONS`):

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
        aggregation: a name of :data:`grpokit.algo.catalog.AGGREGATIONS`.
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
    reduce = catalog.AGGREGATIONS.lookup(aggregation, fn)
    keep = completion_mask.bool()
    masked = torch.where(keep, per_token_loss, torch.zeros_like(per_token_loss))  # not l·mask: inf·0 = NaN
    return reduce(
        masked,
        keep.to(per_token_loss.dtype),
        num_sequences=per_token_loss.shape[0] if num_sequences is None else num_sequences,
        num_tokens=num_tokens,
        max_completion_length=max_completion_length,
    )
