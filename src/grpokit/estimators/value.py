"""The value model of the PPO baseline: a copy of the policy's backbone with a scalar head.

``V(s_t)`` for completion token ``t`` is read where the policy's logits for token ``t`` are read:
the hidden state at the position before it (the prompt and the completion up to ``t − 1``), from one
``[prompt ; completion]`` pass with the same masks and position ids as
:func:`grpokit.models.logprobs.completion_logprobs` (``grpokit.backends.base.plain_forward``). The head starts
at zero (weight and bias), so the first values are 0 and the first advantages are the returns.

A LoRA policy (a peft model, ``model.lora``) gives a plain decoder: its weights with the adapters
folded in, copied (:func:`grpokit.models.lora.merged_copy`; the policy keeps its adapters, nothing is merged
in place). The value model is then trained in full, as without LoRA.

A policy sharded by FSDP2 (``train.parallel=fsdp2``) gives a plain decoder of its class built from
its full weights (gathered on every rank); the trainer then shards the value model the same way
(each decoder layer, then the model with the head). Its forward runs through ``__call__`` so that
FSDP2's hooks gather the shards.
"""

from __future__ import annotations

import copy

import torch

from grpokit.backends.base import ForwardBatch, plain_forward
from grpokit.models.lora import is_peft_model, merged_copy
from grpokit.utils.distributed import is_sharded, load_full_parameters, plain_model
from grpokit.utils.lora_shards import merged_full_parameters


def _backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder of a causal LM (``model.base_model``, e.g. ``LlamaModel``). Not for a peft
    model, whose ``base_model`` is peft's ``LoraModel`` (:meth:`ValueModel.from_policy` merges a copy)."""
    base = getattr(model, "base_model", None)
    if not isinstance(base, torch.nn.Module) or base is model:
        raise ValueError(f"value model: {type(model).__name__} has no separate decoder (base_model) to copy")
    return base


class ValueModel(torch.nn.Module):
    """``backbone`` (a decoder returning ``last_hidden_state``) and a ``Linear(H, 1)`` head.

    Build it with :meth:`from_policy`. Parameters are float32 unless the backbone's are not.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        p = next(backbone.parameters())
        self.head = torch.nn.Linear(hidden_size, 1, device=p.device, dtype=p.dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: torch.nn.Module) -> ValueModel:
        """A deep copy of ``policy``'s decoder (its current weights; trainable) and a zero head, in
        eval mode (no dropout), on the policy's device. A LoRA (peft) policy: the decoder of a
        merged copy (base weights plus the adapters' current delta; no adapter layers in it). A
        policy sharded by FSDP2: a plain decoder with its full weights (:func:`_unsharded_decoder`;
        every rank must call this), not yet sharded.

        Raises:
            ValueError: ``policy`` has no decoder to copy or no ``config.hidden_size``; a sharded
                LoRA policy.
        """
        if is_sharded(policy):
            backbone = _unsharded_decoder(policy)
        elif is_peft_model(policy):
            backbone = _backbone(merged_copy(policy))  # already a copy: the policy keeps its adapters
        else:
            backbone = copy.deepcopy(_backbone(policy))
        hidden = getattr(getattr(policy, "config", None), "hidden_size", None)
        if not hidden:
            raise ValueError(f"value model: {type(policy).__name__}.config has no hidden_size")
        backbone.requires_grad_(True)
        return cls(backbone, hidden).eval()

    def values(self, batch: ForwardBatch, *, autocast_bf16: bool = False) -> torch.Tensor:
        """``(N, T)`` float32 values of ``batch``'s completion tokens (an Experience or a
        micro-batch of one: ids and masks are read). Gradients flow unless called under no_grad."""
        return self(batch, autocast_bf16=autocast_bf16)  # through __call__: FSDP2's hooks

    def forward(self, batch: ForwardBatch, autocast_bf16: bool = False) -> torch.Tensor:  # noqa: D401 - nn.Module protocol
        hidden = plain_forward(self, self.backbone, batch, autocast_bf16)  # (N, T, H)
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()


def _unsharded_decoder(policy: torch.nn.Module) -> torch.nn.Module:
    """A plain (unsharded) decoder of ``policy``'s architecture holding its full weights: the decoder
    of :func:`grpokit.utils.distributed.plain_model` (from its config, attention implementation and
    dtype, built in a forked RNG so the run's random state is the one process's), filled from
    FSDP2's shards one unit at a time on every rank; on the policy's device.

    A LoRA (peft) policy: the adapters folded into the gathered weights unit by unit
    (:func:`grpokit.utils.lora_shards.merged_full_parameters`), as one process's merged copy.
    """
    plain = plain_model(policy)
    load_full_parameters(policy, plain, merged_full_parameters(policy))  # one sharded unit gathered at a time
    return _backbone(plain)
