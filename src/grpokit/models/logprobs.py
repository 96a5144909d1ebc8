"""Log-probs of completions under a causal LM: the forward pass shared by policy, π_old and π_ref.

:func:`completion_logprobs` runs through the backend installed on the model
(:func:`grpokit.backends.install_backend`; ``plain``, the stock transformers forward, when none
was): ``plain`` runs one forward over ``[prompt ; completion]`` per row; ``cpu``
(:mod:`grpokit.backends.cpu`) runs each distinct prompt once and shares its KV cache with the
group's rows, with fused memory-lean ops. Both give the same numbers (``tests/models/test_policy_fast.py``
and ``tests/backends/cpu/test_fused.py`` check log-probs, loss and gradients against each other).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from grpokit.backends import autocast_context, checkpointing_active, distinct_rows, get_backend
from grpokit.experience import Experience
from grpokit.models.lora import adapters_disabled, is_peft_model

__all__ = [
    "autocast_context",
    "batch_logprobs",
    "checkpointing_active",
    "completion_logprobs",
    "distinct_rows",
    "enable_gradient_checkpointing",
    "LogprobScorer",
    "reference_logprobs",
]


def completion_logprobs(
    model: torch.nn.Module,
    batch: Experience,
    *,
    temperature: float,
    with_entropy: bool = False,
    autocast_bf16: bool = False,
    share_prompt: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of ``batch.completion_ids`` given the prompts, under ``model``.

    ``batch``: an :class:`~grpokit.experience.Experience` (or a micro-batch of one, ``exp.rows``);
    only its ids, masks and ``sampler_support`` are read. Rows of a group are contiguous.

    The input is ``[prompt ; completion]`` with ``attention_mask = [prompt_mask ; completion_attention]``
    and position ids counted over unmasked tokens (as ``generate`` counts them with left padding).
    Logits are divided by ``temperature`` and normalized over the **full vocabulary**: the
    distribution the sampler drew from with that temperature and no truncating warper. With
    ``top_k``/``top_p``/``min_p`` the batch carries ``sampler_support``, the set each token was
    drawn from, and the softmax is taken over that set alone (sampling replay, docs/design.md,
    "Temperature"; tests/rollout/test_sampler_agreement.py): the same for the policy, π_old and π_ref,
    which all score their batches through here.

    Runs through ``model``'s backend (:func:`grpokit.backends.get_backend`): ``plain`` (none
    installed) computes the logits at the completion positions only and
    :func:`grpokit.algo.token_logprobs`; ``cpu`` gives the same values with fewer tokens and less
    memory (:class:`grpokit.backends.cpu.CpuBackend`).

    ``share_prompt`` (default on): lets the backend run each distinct prompt once and reuse its KV
    cache for all rows that carry it (``cpu``; ``plain`` runs one forward per row anyway). The cpu
    backend falls back to one forward per row when no prompt repeats, the prompt is one token long,
    the model's cache has sliding-window/static layers, or gradient checkpointing is active.

    Gradients: call ``.backward()`` on a loss built from ``logp``. Under the cpu backend the
    shared-prompt pass and the fused head run on aliases of the weights whose gradients hooks add
    into the parameters' ``.grad``; ``torch.autograd.grad(loss, params)`` or
    ``backward(inputs=...)`` would miss those parts (use the plain backend for them).

    Returns:
        ``logp`` ``(N, T)`` float32 and, if ``with_entropy`` or ``entropy_grad``, the entropy
        ``(N, T)`` (nats of ``softmax(logits / temperature)``, over the support when replayed):
        without gradient, or with one when ``entropy_grad`` (the loss's entropy bonus,
        ``algo.entropy_coef``; only then does its backward cost anything).
    """
    return get_backend(model).logprobs(
        model,
        batch,
        temperature=temperature,
        with_entropy=with_entropy or entropy_grad,
        autocast_bf16=autocast_bf16,
        share_prompt=share_prompt,
        entropy_grad=entropy_grad,
    )


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
    # cast: nn.Module types its attributes Tensor | Module
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
        cast(Callable[..., None], model.activation_checkpointing_enable)(activation_checkpointing_kwargs=kw)
    else:  # pragma: no cover - older transformers
        cast(Callable[..., None], model.gradient_checkpointing_enable)(gradient_checkpointing_kwargs=kw)
    n = 0
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            module.training = True  # this module only; its children keep eval()
            n += 1
    if n == 0:
        raise ValueError(f"model.gradient_checkpointing: no checkpointable layer in {type(model).__name__}")
    return n


def batch_logprobs(
    model: torch.nn.Module,
    batch: Experience,
    *,
    temperature: float,
    micro_batch_size: int,
    autocast_bf16: bool = False,
    share_prompt: bool = True,
) -> torch.Tensor:
    """``(N, T)`` log-probs without gradient (π_old, π_ref), computed in micro-batches through
    ``model``'s backend (:func:`completion_logprobs`), under ``torch.inference_mode()`` (an FSDP2
    model under ``torch.no_grad()``: the parameters it gathers must stay normal tensors)."""
    from grpokit.utils.distributed import is_sharded

    out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)
    with torch.no_grad() if is_sharded(model) else torch.inference_mode():
        for sl, sub in batch.micro_batches(micro_batch_size):
            lp, _ = completion_logprobs(
                model, sub, temperature=temperature, autocast_bf16=autocast_bf16, share_prompt=share_prompt
            )
            out[sl, : lp.shape[1]] = lp
    return out


def reference_logprobs(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    batch: Experience,
    *,
    temperature: float,
    micro_batch_size: int,
    autocast_bf16: bool = False,
    share_prompt: bool = True,
) -> torch.Tensor:
    """``(N, T)`` log-probs under π_ref, without gradient: ``ref_model``'s when one is loaded, else,
    for a LoRA policy (``model.lora``: no reference model is loaded), ``model``'s with its adapters
    disabled (the frozen base model, :func:`grpokit.models.lora.adapters_disabled`). The one place that
    decides where π_ref comes from: the loop and the algorithms call this.

    Raises:
        ValueError: no ``ref_model`` and ``model`` has no adapters.
    """
    kw: dict[str, Any] = dict(
        temperature=temperature,
        micro_batch_size=micro_batch_size,
        autocast_bf16=autocast_bf16,
        share_prompt=share_prompt,
    )
    if ref_model is not None:
        return batch_logprobs(ref_model, batch, **kw)
    if not is_peft_model(model):
        raise ValueError(
            "π_ref: no reference model was loaded and the policy has no LoRA adapters to disable "
            "(grpokit.trainer.build.build_run loads one when algo.beta > 0)"
        )
    with adapters_disabled(model):
        return batch_logprobs(model, batch, **kw)


@dataclass
class LogprobScorer:
    """A run's per-token log-probs with its constants bound once (built by
    :func:`grpokit.trainer.build.build_run`; the loop and the algorithms call it, never the functions
    above with the constants spelled out).

    Attributes:
        model: the policy π_θ; ref_model: π_ref, or None (β = 0, or LoRA: the policy with its
            adapters disabled, :func:`reference_logprobs`).
        temperature: ``rollout.temperature`` (logits divided by it, as the sampler did; a batch's
            ``sampler_support`` is replayed too: :func:`completion_logprobs`).
        micro_batch_size: ``train.micro_batch_size`` (rows per forward).
        autocast_bf16: ``model.autocast_bf16``.
        share_prompt: let the backend run each distinct prompt once (default on; the benchmark's
            ``--plain`` switches it off to measure what it saves).
    """

    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    temperature: float
    micro_batch_size: int
    autocast_bf16: bool = False
    share_prompt: bool = True

    def micro_batch(
        self, mb: Experience, *, with_entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`completion_logprobs` of the policy on one micro-batch, with gradient: ``(n, T)``
        float32 log-probs and, with ``with_entropy`` or ``entropy_grad``, ``(n, T)`` entropies
        (nats; with gradient when ``entropy_grad``)."""
        return completion_logprobs(
            self.model,
            mb,
            temperature=self.temperature,
            with_entropy=with_entropy,
            autocast_bf16=self.autocast_bf16,
            share_prompt=self.share_prompt,
            entropy_grad=entropy_grad,
        )

    def policy(self, exp: Experience) -> torch.Tensor:
        """``(N, T)`` float32 log-probs of the policy as it is now, without gradient (π_old before an
        update): :func:`batch_logprobs`."""
        return batch_logprobs(
            self.model,
            exp,
            temperature=self.temperature,
            micro_batch_size=self.micro_batch_size,
            autocast_bf16=self.autocast_bf16,
            share_prompt=self.share_prompt,
        )

    def reference(self, exp: Experience) -> torch.Tensor:
        """``(N, T)`` float32 log-probs under π_ref, without gradient (:func:`reference_logprobs`;
        raises its ``ValueError``)."""
        return reference_logprobs(
            self.model,
            self.ref_model,
            exp,
            temperature=self.temperature,
            micro_batch_size=self.micro_batch_size,
            autocast_bf16=self.autocast_bf16,
            share_prompt=self.share_prompt,
        )
