"""The attention function the cpu backend registers with transformers (``"grpokit_sdpa"``, set by
:func:`grpokit.backends.cpu.fused.apply_fused_ops`; only the cpu backend registers it).

It acts on CPU tensors only: for tensors on any other device (a model moved after the backend was
installed) it hands the call to transformers' own ``sdpa_attention_forward`` unchanged.

transformers' ``sdpa`` implementation repeats each key/value head ``num_heads / num_kv_heads``
times (``repeat_kv``) before calling ``F.scaled_dot_product_attention`` whenever a mask is given
on CPU, and the backward keeps the repeated copies: for SmolLM2 (9 query / 3 KV heads, a batch
of 8 completions sharing a ~100-token prompt) 86 MB per micro-batch in bf16. PyTorch's SDPA takes
grouped heads itself (``enable_gqa=True``): same values, a third of that memory, and a faster
backward on CPU.

One-token decoding without gradient (generation) takes a plain matmul–softmax–matmul path with
the query heads of each KV head folded into one matmul: PyTorch's CPU flash kernel spends
~0.7 ms per layer call on 32 rows × 230 cached positions (bf16), this path ~0.35 ms; generation of
the benchmark's 32 × 64 tokens went from 6.5 to 5.8 s (profiled). Its numerics are those of
transformers' ``eager`` attention (scores from a matmul in the model's dtype, softmax in float32).
Everything else (no mask, position biases, softcapping, attention weights requested) goes to
transformers' own ``sdpa_attention_forward`` unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

NAME = "grpokit_sdpa"


def grpokit_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1) over grouped KV heads.

    Args:
        module: the attention module (``num_key_value_groups`` = query heads per KV head).
        query: ``(B, H, q, d)``; key, value: ``(B, H_kv, k, d)``.
        attention_mask: ``(B, 1, q, k)`` bool (True = attend) or additive float, or None.

    Returns:
        ``(B, q, H, d)`` attention output (transformers' layout) and None (no weights). Tensors
        off the CPU (:func:`acts_on`) go to transformers' ``sdpa_attention_forward``.

    Raises:
        RuntimeError: from torch, on shapes that do not broadcast.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if not acts_on(query):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    special = any(kwargs.get(k) is not None for k in ("position_bias", "softcap")) or kwargs.get("output_attentions")
    if (
        not special
        and query.shape[2] == 1
        and not torch.is_grad_enabled()
        and not dropout
        and (attention_mask is None or attention_mask.shape[1] == 1)
    ):
        return _decode_attention(query, key, value, attention_mask, scaling), None
    if special or attention_mask is None or query.shape[2] == 1 or groups == 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # (B, H, q, d)
    return out.transpose(1, 2).contiguous(), None


def acts_on(query: torch.Tensor) -> bool:
    """Whether :func:`grpokit_sdpa_attention` computes the call itself: CPU tensors only."""
    return query.device.type == "cpu"


def _decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """One query token per row: ``softmax(q·Kᵀ·scale + mask) · V`` with the query heads of each KV
    head folded into one small matmul (``(B, H_kv, H/H_kv, d) @ (B, H_kv, d, k)``), softmax in
    float32. ``(B, 1, H, d)`` out."""
    b, h, _, d = query.shape
    h_kv = key.shape[1]
    q = query.reshape(b, h_kv, h // h_kv, d)
    scores = torch.matmul(q, key.transpose(-1, -2)).float()  # (B, H_kv, H/H_kv, k)
    scores.mul_(d**-0.5 if scaling is None else scaling)
    if attention_mask is not None:  # (B, 1, 1, k): bool (True = attend) or additive
        if attention_mask.dtype == torch.bool:
            scores.masked_fill_(~attention_mask, float("-inf"))
        else:
            scores.add_(attention_mask)
    out = torch.matmul(scores.softmax(-1).to(value.dtype), value)  # (B, H_kv, H/H_kv, d)
    return out.reshape(b, 1, h, d)


def register() -> str:
    """Register :func:`grpokit_sdpa_attention` (and transformers' SDPA mask builder) under
    :data:`NAME`; idempotent. Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grpokit_sdpa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
