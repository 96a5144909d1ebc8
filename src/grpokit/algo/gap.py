"""How far the sampler's log-probs are from the trainer's: ``logprob_gap_mean`` / ``logprob_gap_max``.

A rollout engine other than the trained model itself (``rollout.engine: vllm``) samples with its own
kernels, and possibly its own precision; the ratio π_θ/π_old of the loss assumes the completions were
drawn from π_old as the *trainer* computes it. The per-token gap ``|log π_sampler(y_t) − log
π_old(y_t)|`` over the counted tokens says how true that is: ~1e-6 when both run the same weights in
float32, larger with bf16 or stale weights (a sampler that missed an update shows gaps of the
update's size). Imports torch only.
"""

from __future__ import annotations

import torch

from ._checks import check_same_shape


def logprob_gap(
    sampler_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[float, int, float]:
    """``(sum, count, max)`` of ``|sampler_logprobs − trainer_logprobs|`` over the True entries of
    ``mask``; all three ``(N, T)``. ``max`` is 0.0 when no entry counts. Summed over micro-batches by
    :class:`LogprobGap`.

    Raises:
        ValueError: the shapes differ, or ``mask`` is not bool.

    >>> s = torch.tensor([[-1.0, -2.0, -9.0]]); t = torch.tensor([[-1.5, -2.0, 0.0]])
    >>> logprob_gap(s, t, torch.tensor([[True, True, False]]))
    (0.5, 2, 0.5)
    """
    check_same_shape("logprob_gap", sampler_logprobs=sampler_logprobs, trainer_logprobs=trainer_logprobs, mask=mask)
    if mask.dtype != torch.bool:
        raise ValueError(f"logprob_gap: mask must be bool (True = the token counts), got {mask.dtype}")
    gap = (sampler_logprobs.detach().double() - trainer_logprobs.detach().double()).abs()[mask]
    if gap.numel() == 0:
        return 0.0, 0, 0.0
    return float(gap.sum()), int(gap.numel()), float(gap.max())


class LogprobGap:
    """Accumulates :func:`logprob_gap` over the micro-batches of one batch.

    >>> g = LogprobGap(); g.metrics()
    {}
    >>> m = torch.tensor([[True, False]])
    >>> g.add(torch.tensor([[-1.0, 0.0]]), torch.tensor([[-1.25, 5.0]]), m)
    >>> g.add(torch.tensor([[-2.0, 0.0]]), torch.tensor([[-2.75, 0.0]]), m)
    >>> g.metrics()
    {'logprob_gap_mean': 0.5, 'logprob_gap_max': 0.75}
    """

    def __init__(self) -> None:
        self.total, self.count, self.max, self.seen = 0.0, 0, 0.0, False

    def add(self, sampler_logprobs: torch.Tensor | None, trainer_logprobs: torch.Tensor, mask: torch.Tensor) -> None:
        """Add one micro-batch (``(n, T)`` each); a ``None`` ``sampler_logprobs`` (an engine that
        reports none, e.g. ``hf``) is skipped."""
        if sampler_logprobs is None:
            return
        s, c, m = logprob_gap(sampler_logprobs, trainer_logprobs, mask)
        self.total, self.count, self.max, self.seen = self.total + s, self.count + c, max(self.max, m), True

    def metrics(self) -> dict[str, float]:
        """``{"logprob_gap_mean", "logprob_gap_max"}`` over every counted token added, or ``{}`` when
        no micro-batch carried sampler log-probs (the metrics line then has no such keys)."""
        if not self.seen:
            return {}
        return {"logprob_gap_mean": self.total / max(self.count, 1), "logprob_gap_max": self.max}
