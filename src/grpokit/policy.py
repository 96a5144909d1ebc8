"""Log-probs of completions under a causal LM: the forward pass shared by policy, π_old and π_ref.

Two paths give the same numbers (``tests/test_policy_fast.py`` checks log-probs, loss and
gradients against each other):

- plain: one forward over ``[prompt ; completion]`` per row;
- shared prompt (the default where it applies): the G rows of a group carry the same prompt, so
  the prompt is run once per *distinct* prompt and its KV cache is repeated to the group's rows;
  then only the completion tokens run, attending to that cache. Gradients flow back through the
  repeated cache into the one prompt pass (the repeat's backward sums the G rows' gradients).
  For GSM8K-style prompts (~100 prompt tokens, 64 completion tokens, G = 8) this roughly halves
  the tokens the model processes, in the forward and the backward.

  The prompt pass runs on aliases of the parameters (same storage, own autograd leaves) whose
  gradients are added into the parameters' ``.grad`` as soon as each is complete. Without them
  every weight would be used by two passes, and autograd holds a weight's gradient from the
  completion pass until the prompt pass's arrives at the very end of the backward: a second copy
  of all weight gradients (0.25 GB for a 135M-parameter bf16 model) at the peak.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from grpokit.algo import token_entropy, token_logprobs
from grpokit.fused import fused_head
from grpokit.ops import linear_token_logprobs


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
    share_prompt: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of ``batch.completion_ids`` given the prompts, under ``model``.

    The input is ``[prompt ; completion]`` with ``attention_mask = [prompt_mask ; completion_mask]``
    and position ids counted over unmasked tokens (as ``generate`` counts them with left padding).
    Logits are divided by ``temperature`` and normalized over the **full vocabulary**: this is the
    distribution the sampler drew from when it sampled with that temperature and no truncating
    warper (``top_k``/``top_p``/``min_p`` off, which training recipes enforce; a truncated
    sampler's log-probs differ, tests/test_sampler_agreement.py). Only the logits that predict
    completion tokens are computed. A model prepared
    with :func:`grpokit.fused.apply_fused_ops` (and no autocast) goes through
    :func:`grpokit.ops.linear_token_logprobs`: same values, no ``(N, T, V)`` logits kept.

    ``share_prompt`` (default on): run each distinct prompt once and reuse its KV cache for all
    rows that carry it (see the module docstring). It falls back to the plain path when no prompt
    repeats, the prompt is one token long, the model's cache has sliding-window/static layers, or
    gradient checkpointing is active (it would drop the cache).

    Gradients: call ``.backward()`` on a loss built from ``logp``. The shared-prompt pass and a
    fused head run on aliases of the weights whose gradients hooks add into the parameters'
    ``.grad`` (module docstring); ``torch.autograd.grad(loss, params)`` or
    ``backward(inputs=...)`` would miss those parts (pass ``share_prompt=False`` and a model
    without :func:`grpokit.fused.apply_fused_ops` for them).

    Returns:
        ``logp`` ``(N, T)`` float32 and, if ``with_entropy``, the entropy ``(N, T)`` (no grad).
    """
    head = None if autocast_bf16 else fused_head(model)
    net = model if head is None else head[0]  # with the fused head: the decoder, for hidden states
    out = _shared_prompt_forward(model, net, batch, autocast_bf16) if share_prompt else None
    if out is None:
        out = _plain_forward(model, net, batch, autocast_bf16)
    if head is not None:  # (N, T, H) hidden states -> log-probs, no (N, T, V) logits kept
        weight = head[1]
        if torch.is_grad_enabled() and weight.requires_grad:  # tied to the embedding: see _grad_alias
            weight = _grad_alias(weight)
        return linear_token_logprobs(out, weight, batch.completion_ids, temperature=temperature,
                                     with_entropy=with_entropy)
    logp = token_logprobs(out, batch.completion_ids, temperature=temperature)
    entropy = token_entropy(out, temperature=temperature) if with_entropy else None
    return logp, entropy


def _last_positions(net: torch.nn.Module, keep: int, hidden_states: bool, **kw) -> torch.Tensor:
    """The last ``keep`` positions (all if 0) of ``net``'s output: logits ``(N, keep, V)`` for a
    causal LM, or hidden states ``(N, keep, H)`` when ``net`` is its decoder (``grpokit.fused``)."""
    if not hidden_states:
        return net(**kw, logits_to_keep=keep).logits
    hidden = net(**kw).last_hidden_state
    return hidden[:, -keep:] if keep else hidden


def _plain_forward(model: torch.nn.Module, net: torch.nn.Module, batch: Batch, autocast_bf16: bool) -> torch.Tensor:
    """``(N, T, ·)`` outputs (logits or hidden states) at the positions predicting each completion
    token, from one ``[prompt ; completion]`` pass."""
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (N, P+T)
    attn = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1).long()
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    t = batch.completion_ids.shape[1]
    with autocast_context(autocast_bf16, ids.device):
        out = _last_positions(net, t + 1, net is not model, input_ids=ids, attention_mask=attn,
                              position_ids=position_ids, use_cache=False)
    return out[:, :-1]  # position P-1+t predicts completion token t


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct rows of a left-padded ``(N, P)`` batch: ``first`` ``(U,)`` (the first row index of
    each distinct row) and ``inverse`` ``(N,)`` (which distinct row each row is), padding ignored.

    >>> ids = torch.tensor([[0, 5, 6], [9, 5, 6], [0, 7, 6]]); m = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 1]]).bool()
    >>> first, inverse = distinct_rows(ids, m)
    >>> first[inverse].tolist()  # rows 0 and 1 differ only under padding
    [0, 0, 2]
    """
    key = ids.masked_fill(~mask, -1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)  # (N,)
    n = ids.shape[0]
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=ids.device), reduce="amin")
    # Number the distinct rows by first appearance, so `first` is increasing (grouped batches stay in order).
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=ids.device)
    return first[order], rank[inverse]


def dynamic_prefix_cache(model: torch.nn.Module):
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


def cache_kwarg(fn) -> str:
    """The keyword under which ``fn`` (a model's ``forward`` or ``generate``) takes a KV cache:
    ``cache`` (transformers >= 5.2x) or the older ``past_key_values``."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _shared_prompt_forward(model: torch.nn.Module, net: torch.nn.Module, batch: Batch,
                           autocast_bf16: bool) -> torch.Tensor | None:
    """The same outputs as :func:`_plain_forward` (run by ``net``: ``model`` or its decoder), with
    each distinct prompt run once.

    Pass 1: the first ``P-1`` prompt columns of the ``U`` distinct prompts fill a KV cache, which is
    then indexed to the ``N`` rows. Pass 2: ``[last prompt token ; completion[:-1]]`` (``T`` tokens
    per row) attends to it; its ``T`` outputs are exactly the positions that predict the ``T``
    completion tokens. Returns None when the shared path does not apply.
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
    attn = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1).long()  # (N, P+T)
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    kv = {cache_kwarg(net.forward): cache}
    with autocast_context(autocast_bf16, batch.prompt_ids.device):
        _last_positions(
            _with_own_grad_leaves(net), 1, net is not model, input_ids=batch.prompt_ids[first, : p - 1],
            attention_mask=attn[first, : p - 1], position_ids=position_ids[first, : p - 1], use_cache=True, **kv,
        )  # fills `cache`: (U, heads, P-1, d) per layer
        cache.batch_select_indices(inverse)  # (N, heads, P-1, d); differentiable gather
        rest = torch.cat([batch.prompt_ids[:, p - 1 :], batch.completion_ids[:, :-1]], dim=1)  # (N, T)
        return _last_positions(
            net, 0, net is not model, input_ids=rest, attention_mask=attn[:, : p - 1 + t],
            position_ids=position_ids[:, p - 1 : p - 1 + t], use_cache=True, **kv,
        )  # (N, T, ·): row position P-1+t predicts completion token t


def _with_own_grad_leaves(net: torch.nn.Module):
    """``net`` itself without gradient recording; else a callable that runs ``net`` with each
    trainable parameter replaced by its :func:`_grad_alias` (see the module docstring)."""
    if not torch.is_grad_enabled():
        return net
    aliases = {name: _grad_alias(p) for name, p in net.named_parameters() if p.requires_grad}
    return lambda **kw: torch.func.functional_call(net, aliases, (), kw)


def _grad_alias(param: torch.Tensor) -> torch.Tensor:
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
    grad = alias.grad  # sparse for an embedding (grpokit.ops.embedding): kept dense in param.grad
    if param.grad is None:
        param.grad = grad if grad.layout == torch.strided else grad.to_dense()
    else:
        param.grad.add_(grad)
    alias.grad = None


def enable_gradient_checkpointing(model: torch.nn.Module) -> int:
    """Turn on transformers' activation checkpointing for ``model`` kept in ``eval()``.

    transformers checkpoints a decoder layer only when the layer is in training mode, and the
    trainer keeps the model in ``eval()`` (no dropout, so sampler and trainer see the same π). So
    only the checkpointed layers' own ``training`` flag is set (not their children's): attention and
    dropout submodules stay in eval mode. Non-reentrant ``torch.utils.checkpoint``; layers run as
    usual without gradients (generation, reference passes).

    Returns:
        the number of layers that will checkpoint.

    Raises:
        ValueError: the model does not support gradient checkpointing.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"model.gradient_checkpointing: {type(model).__name__} does not support it")
    from transformers.modeling_layers import GradientCheckpointingLayer

    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:  # pragma: no cover - older transformers
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    n = 0
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            module.training = True  # this module only; its children keep eval()
            n += 1
    if n == 0:
        raise ValueError(f"model.gradient_checkpointing: no checkpointable layer in {type(model).__name__}")
    return n


def checkpointing_active(model: torch.nn.Module) -> bool:
    """True if a forward with gradient now would checkpoint some layer of ``model``."""
    return torch.is_grad_enabled() and any(
        getattr(m, "gradient_checkpointing", False) and m.training for m in model.modules()
    )


def micro_batches(n: int, size: int) -> list[slice]:
    """Consecutive row slices of at most ``size`` rows covering ``range(n)``."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.inference_mode()
def batch_logprobs(
    model: torch.nn.Module, batch: Batch, *, temperature: float, micro_batch_size: int,
    autocast_bf16: bool = False, share_prompt: bool = True,
) -> torch.Tensor:
    """``(N, T)`` log-probs without gradient (π_old, π_ref), computed in micro-batches."""
    out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
    for sl in micro_batches(len(batch), micro_batch_size):
        sub = batch.rows(sl)
        lp, _ = completion_logprobs(model, sub, temperature=temperature, autocast_bf16=autocast_bf16,
                                    share_prompt=share_prompt)
        out[sl, : lp.shape[1]] = lp
    return out
