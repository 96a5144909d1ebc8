"""The shared-prompt training forward and its gradient aliases (moved from ``grpokit.models.logprobs``).

The G rows of a group carry the same prompt, so the prompt is run once per *distinct* prompt and
its KV cache is repeated to the group's rows; then only the completion tokens run, attending to
that cache. Gradients flow back through the repeated cache into the one prompt pass (the repeat's
backward sums the G rows' gradients). For GSM8K-style prompts (~100 prompt tokens, 64 completion
tokens, G = 8) this roughly halves the tokens the model processes, in the forward and the backward.

The prompt pass runs on aliases of the parameters (same storage, own autograd leaves) whose
gradients are added into the parameters' ``.grad`` as soon as each is complete. Without them every
weight would be used by two passes, and autograd holds a weight's gradient from the completion pass
until the prompt pass's arrives at the very end of the backward: a second copy of all weight
gradients (0.25 GB for a 135M-parameter bf16 model) at the peak. The aliases add into ``.grad``
behind autograd's back, past the hooks through which DDP/FSDP reduce gradients: the backend hook
(:mod:`grpokit.backends`) does not install this backend in a process group of more than one rank.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from grpokit.backends.base import (
    ForwardBatch,
    attended,
    autocast_context,
    cache_kwarg,
    checkpointing_active,
    distinct_rows,
    last_positions,
)

if TYPE_CHECKING:
    from transformers import DynamicCache


def dynamic_prefix_cache(model: torch.nn.Module) -> DynamicCache | None:
    """An empty ``DynamicCache`` for ``model`` if every layer is a plain growing KV layer, else None
    (sliding-window, static or recurrent layers do not keep a reusable full prefix)."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # pragma: no cover - older transformers
        return None
    config = getattr(model, "config", None)
    if config is None:
        return None
    try:
        cache = DynamicCache(config=config)
    except Exception:  # unusual config: do not guess
        return None
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return cache


def shared_prompt_forward(
    model: torch.nn.Module, net: torch.nn.Module, batch: ForwardBatch, autocast_bf16: bool
) -> torch.Tensor | None:
    """The same outputs as :func:`grpokit.backends.base.plain_forward` (run by ``net``: ``model``
    or its decoder), with each distinct prompt run once.

    Pass 1: the first ``P-1`` prompt columns of the ``U`` distinct prompts fill a KV cache, which is
    then indexed to the ``N`` rows. Pass 2: ``[last prompt token ; completion[:-1]]`` (``T`` tokens
    per row) attends to it; its ``T`` outputs are exactly the positions that predict the ``T``
    completion tokens. Returns None when the shared path does not apply: no prompt repeats, the
    prompt is one token long, the model's cache has sliding-window/static layers, or gradient
    checkpointing is active (it would drop the cache).
    """
    n, p = batch.prompt_ids.shape
    t = batch.completion_ids.shape[1]
    if n < 2 or p < 2 or t < 1:
        return None
    if checkpointing_active(model):  # checkpointed layers drop the KV cache the rows would share
        return None
    first, inverse = distinct_rows(batch.prompt_ids, batch.prompt_mask)
    if len(first) == n:
        return None
    cache = dynamic_prefix_cache(model)
    if cache is None:
        return None
    attn = torch.cat([batch.prompt_mask, attended(batch)], dim=1).long()  # (N, P+T)
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    kv = {cache_kwarg(net.forward): cache}
    with autocast_context(autocast_bf16, batch.prompt_ids.device):
        last_positions(
            _with_own_grad_leaves(net),
            1,
            net is not model,
            input_ids=batch.prompt_ids[first, : p - 1],
            attention_mask=attn[first, : p - 1],
            position_ids=position_ids[first, : p - 1],
            use_cache=True,
            **kv,
        )  # fills `cache`: (U, heads, P-1, d) per layer
        cache.batch_select_indices(inverse)  # (N, heads, P-1, d); differentiable gather
        rest = torch.cat([batch.prompt_ids[:, p - 1 :], batch.completion_ids[:, :-1]], dim=1)  # (N, T)
        return last_positions(
            net,
            0,
            net is not model,
            input_ids=rest,
            attention_mask=attn[:, : p - 1 + t],
            position_ids=position_ids[:, p - 1 : p - 1 + t],
            use_cache=True,
            **kv,
        )  # (N, T, ·): row position P-1+t predicts completion token t


def _with_own_grad_leaves(net: torch.nn.Module) -> Callable[..., Any]:
    """``net`` itself without gradient recording; else a callable that runs ``net`` with each
    trainable parameter replaced by its :func:`grad_alias` (see the module docstring)."""
    if not torch.is_grad_enabled():
        return net
    aliases = {name: grad_alias(p) for name, p in net.named_parameters() if p.requires_grad}
    return lambda **kw: torch.func.functional_call(net, aliases, (), kw)


def grad_alias(param: torch.Tensor) -> torch.Tensor:
    """A leaf sharing ``param``'s storage whose gradient a post-accumulate hook adds into
    ``param.grad`` (and frees) as soon as autograd has it complete.

    For a weight used at two places of one graph (the prompt pass and the completion pass; a head
    tied to the embedding), autograd keeps the gradient of the later use until the earlier use's
    arrives at the end of the backward; with an alias for one of the uses each is added at once.
    """
    alias = param.detach().requires_grad_(True)
    alias.register_post_accumulate_grad_hook(functools.partial(_add_grad_into, param))
    return alias


def _add_grad_into(param: torch.Tensor, alias: torch.Tensor) -> None:
    grad = alias.grad  # sparse for an embedding (ops.embedding): kept dense in param.grad
    assert grad is not None  # a post-accumulate hook runs once the gradient is accumulated
    if param.grad is None:
        param.grad = grad if grad.layout == torch.strided else grad.to_dense()
    else:
        param.grad.add_(grad)
    alias.grad = None
