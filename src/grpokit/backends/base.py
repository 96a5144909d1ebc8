"""What every backend shares: the :class:`Backend` interface, the stock transformers forward
(``plain``) and the small helpers both backends use. Imports torch and :mod:`grpokit.algo` only.

The plain path is transformers' own: one forward over ``[prompt ; completion]`` per row
(:func:`plain_forward`), the full logits at the completion positions,
:func:`grpokit.algo.token_logprobs` on them; generation is ``model.generate`` as it comes (its own
``DynamicCache``, ``F.linear`` on the plain weights).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch

from grpokit.algo import token_entropy, token_logprobs


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` lives: its ``device`` attribute (transformers models), else its first
    parameter's device, else the CPU."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def world_size() -> int:
    """Ranks of the initialized ``torch.distributed`` process group (1 without one)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


_REDUCED_AFTER_BACKWARD = "_grpokit_grads_reduced_after_backward"


def mark_grads_reduced_after_backward(model: torch.nn.Module) -> None:
    """Declare that ``model``'s gradients are summed over ranks *after* each backward, from
    ``param.grad`` (``train.parallel=ddp``: :func:`grpokit.utils.distributed.reduce_gradients`), not by
    hooks during it: the cpu backend's gradient aliases, which write ``param.grad`` directly, are
    then exact in a process group of several ranks."""
    setattr(model, _REDUCED_AFTER_BACKWARD, True)


def grads_reduced_after_backward(model: torch.nn.Module) -> bool:
    """True when :func:`mark_grads_reduced_after_backward` was called on ``model``."""
    return bool(getattr(model, _REDUCED_AFTER_BACKWARD, False))


def autocast_context(enabled: bool, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager[None]:
    """bf16 autocast on ``device`` when ``enabled``, else a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


class ForwardBatch(Protocol):
    """What a backend's forward reads of a batch: an :class:`~grpokit.experience.Experience` (or its
    micro-batch rows), or any object with these ``(N, P)``/``(N, T)`` tensors. ``completion_attention``
    and ``sampler_support`` are read when present (:func:`attended`, :func:`sampler_support`)."""

    @property
    def prompt_ids(self) -> torch.Tensor: ...  # (N, P) long, left-padded
    @property
    def prompt_mask(self) -> torch.Tensor: ...  # (N, P) bool/long: 1 on prompt tokens
    @property
    def completion_ids(self) -> torch.Tensor: ...  # (N, T) long, right-padded
    @property
    def completion_mask(self) -> torch.Tensor: ...  # (N, T) bool: the completion tokens scored


def last_positions(net: Callable[..., Any], keep: int, hidden_states: bool, **kw: Any) -> torch.Tensor:
    """The last ``keep`` positions (all if 0) of ``net``'s output: logits ``(N, keep, V)`` for a
    causal LM, or hidden states ``(N, keep, H)`` when ``net`` is its decoder (the cpu backend's
    fused head)."""
    if not hidden_states:
        return net(**kw, logits_to_keep=keep).logits
    hidden = net(**kw).last_hidden_state
    return hidden[:, -keep:] if keep else hidden


def plain_forward(
    model: torch.nn.Module, net: torch.nn.Module, batch: ForwardBatch, autocast_bf16: bool
) -> torch.Tensor:
    """``(N, T, ·)`` outputs (logits, or hidden states when ``net`` is ``model``'s decoder) at the
    positions predicting each completion token, from one ``[prompt ; completion]`` pass.

    Position ids are counted over unmasked tokens, as ``generate`` counts them with left padding.
    """
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (N, P+T)
    attn = torch.cat([batch.prompt_mask, attended(batch)], dim=1).long()
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    t = batch.completion_ids.shape[1]
    with autocast_context(autocast_bf16, ids.device):
        out = last_positions(
            net, t + 1, net is not model, input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False
        )
    return out[:, :-1]  # position P-1+t predicts completion token t


def logits_to_logprobs(
    logits: torch.Tensor,
    batch: ForwardBatch,
    temperature: float,
    *,
    with_entropy: bool,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(N, T)`` float32 log-probs of ``batch.completion_ids`` from ``(N, T, V)`` ``logits`` at
    ``temperature``, renormalized over the sampler's support where one was recorded
    (:func:`sampler_support`), and the entropy on the same distribution when ``with_entropy`` (with
    gradient when ``entropy_grad``), else None: the end of every backend's unfused path."""
    support = sampler_support(batch)
    logp = token_logprobs(logits, batch.completion_ids, temperature=temperature, support=support)
    if not with_entropy:
        return logp, None
    return logp, token_entropy(logits, temperature=temperature, differentiable=entropy_grad, support=support)


def attended(batch: ForwardBatch) -> torch.Tensor:
    """``(N, T)`` bool: the completion tokens of ``batch`` the forward attends to: its
    ``completion_attention`` (an :class:`~grpokit.experience.Experience`: the model's tokens and a
    multi-turn row's environment tokens), else its ``completion_mask``."""
    mask = getattr(batch, "completion_attention", None)
    return batch.completion_mask if mask is None else mask


def sampler_support(batch: ForwardBatch) -> torch.Tensor | None:
    """``(N, T, W)``: the tokens a truncating sampler drew each completion token from
    (``batch.sampler_support``, :mod:`grpokit.algo.support`), which every log-prob and entropy of
    ``batch`` is renormalized over (sampling replay), or None (no truncation: the full vocabulary)."""
    return getattr(batch, "sampler_support", None)


def cache_kwarg(fn: Callable[..., Any]) -> str:
    """The keyword under which ``fn`` (a model's ``forward`` or ``generate``) takes a KV cache:
    ``cache`` (transformers >= 5.2x) or the older ``past_key_values``."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def checkpointing_active(model: torch.nn.Module) -> bool:
    """True if a forward with gradient now would checkpoint some layer of ``model``."""
    return torch.is_grad_enabled() and any(
        getattr(m, "gradient_checkpointing", False) and m.training for m in model.modules()
    )


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct rows of a left-padded ``(N, P)`` batch: ``first`` ``(U,)`` (the first row index of
    each distinct row) and ``inverse`` ``(N,)`` (which distinct row each row is), padding ignored.

    >>> ids = torch.tensor([[0, 5, 6], [9, 5, 6], [0, 7, 6]])
    >>> m = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 1]]).bool()
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


class Backend:
    """How a model's log-probs are taken and how it generates. The base class is the plain path;
    a backend overrides what it does differently and must give the same numbers (tests compare
    log-probs, loss and every gradient with the plain path).

    Attributes:
        name: the registry name (``model.backend``).
        options: the keyword options :meth:`install` takes.
    """

    name = "plain"
    options: tuple[str, ...] = ()

    def install(self, model: torch.nn.Module, **options: Any) -> dict[str, int]:
        """Prepare ``model`` in place (nothing for the plain path); returns what was switched."""
        return {}

    def remove(self, model: torch.nn.Module) -> None:
        """Undo :meth:`install` on ``model``."""

    def logprobs(
        self,
        model: torch.nn.Module,
        batch: ForwardBatch,
        *,
        temperature: float,
        with_entropy: bool,
        autocast_bf16: bool,
        share_prompt: bool,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(N, T)`` float32 log-probs of ``batch.completion_ids`` (and the entropy if asked, with
        gradient when ``entropy_grad``), renormalized over ``batch.sampler_support`` where a
        truncating sampler recorded one (:func:`sampler_support`); see
        :func:`grpokit.models.logprobs.completion_logprobs`. ``share_prompt`` is a hint a backend
        may ignore (the plain path runs one forward per row)."""
        logits = plain_forward(model, model, batch, autocast_bf16)
        return logits_to_logprobs(logits, batch, temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)

    def generation(
        self, model: torch.nn.Module, rows: int, *, packed_weights: bool
    ) -> contextlib.AbstractContextManager[int]:
        """A context inside which ``model`` generates (``rows``: the rows of one decode step).
        Plain: nothing changes."""
        return contextlib.nullcontext(0)

    def prefill(
        self,
        model: torch.nn.Module,
        ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        share: bool,
        static: bool,
        max_len: int,
        prefix: int | None = None,
    ) -> dict[str, Any]:
        """Extra keyword arguments for ``model.generate`` on the prompt rows ``ids`` ``(n, P)``:
        a KV cache prefilled or preallocated by the backend, or nothing (``generate`` builds its
        own). ``prefix``: the leading columns rows may share (a multi-turn row's prompt, before its
        transcript); None = all but the last. Plain: nothing."""
        return {}


class PlainBackend(Backend):
    """The stock transformers forward and ``generate`` (:class:`Backend` as it is)."""

    name = "plain"
