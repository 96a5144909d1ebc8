"""Log-probs of completions under a causal LM: the forward pass shared by policy, π_old and π_ref."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from grpokit.algo import token_entropy, token_logprobs


@dataclass
class Batch:
    """One batch of rollouts, rows grouped (G completions of a prompt contiguous).

    ``prompt_ids``/``prompt_mask``: ``(N, P)`` left-padded; ``completion_ids``/``completion_mask``:
    ``(N, T)``, mask True = token counts (first EOS included).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def rows(self, idx: slice | torch.Tensor) -> "Batch":
        """Rows ``idx``, with columns that are padding in every selected row cut away."""
        pm, cm = self.prompt_mask[idx], self.completion_mask[idx]
        p_used = pm.any(0).nonzero()
        p0 = int(p_used[0]) if len(p_used) else pm.shape[1] - 1
        c_used = cm.any(0).nonzero()
        t1 = int(c_used[-1]) + 1 if len(c_used) else 1
        return Batch(
            self.prompt_ids[idx][:, p0:], pm[:, p0:], self.completion_ids[idx][:, :t1], cm[:, :t1]
        )


def autocast_context(enabled: bool, device: torch.device | str = "cpu"):
    """bf16 autocast on ``device`` when ``enabled``, else a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def completion_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    *,
    temperature: float,
    with_entropy: bool = False,
    autocast_bf16: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of ``batch.completion_ids`` given the prompts, under ``model``.

    The input is ``[prompt ; completion]`` with ``attention_mask = [prompt_mask ; completion_mask]``
    and position ids counted over unmasked tokens (as ``generate`` counts them with left padding),
    so the trainer scores exactly the distribution the sampler drew from. Only the last ``T + 1``
    positions' logits are computed (``logits_to_keep``); logits are divided by ``temperature``.

    Returns:
        ``logp`` ``(N, T)`` float32 and, if ``with_entropy``, the entropy ``(N, T)`` (no grad).
    """
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (N, P+T)
    attn = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1).long()
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    t = batch.completion_ids.shape[1]
    with autocast_context(autocast_bf16, ids.device):
        out = model(
            input_ids=ids, attention_mask=attn, position_ids=position_ids,
            logits_to_keep=t + 1, use_cache=False,
        )
    logits = out.logits[:, :-1]  # (N, T, V): position P-1+t predicts completion token t
    logp = token_logprobs(logits, batch.completion_ids, temperature=temperature)
    entropy = token_entropy(logits, temperature=temperature) if with_entropy else None
    return logp, entropy


def micro_batches(n: int, size: int) -> list[slice]:
    """Consecutive row slices of at most ``size`` rows covering ``range(n)``."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.inference_mode()
def batch_logprobs(
    model: torch.nn.Module, batch: Batch, *, temperature: float, micro_batch_size: int,
    autocast_bf16: bool = False,
) -> torch.Tensor:
    """``(N, T)`` log-probs without gradient (π_old, π_ref), computed in micro-batches."""
    out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
    for sl in micro_batches(len(batch), micro_batch_size):
        sub = batch.rows(sl)
        lp, _ = completion_logprobs(model, sub, temperature=temperature, autocast_bf16=autocast_bf16)
        out[sl, : lp.shape[1]] = lp
    return out
