"""The ``cpu`` backend: grpokit's CPU speed and memory work, installed by
:func:`grpokit.backends.install_backend` (nothing else imports this package).

- training forward (:meth:`CpuBackend.logprobs`): each distinct prompt runs once and its KV cache
  is shared by the group's rows (:mod:`.shared_prompt`, with gradient aliases); memory-lean
  RMSNorm, SwiGLU MLP, input embedding (sparse gradient) and LM head + log-softmax + gather
  (:mod:`.ops`, put into the model by :mod:`.fused`); SDPA on grouped KV heads and a one-token
  decode attention (:mod:`.attention`);
- generation (:meth:`CpuBackend.generation`, :meth:`CpuBackend.prefill`): linear weights
  packed once for oneDNN (:mod:`.packed`), a shared and static prompt-prefix cache
  (:mod:`.generation`).

Each piece gives the plain path's numbers (``tests/backends/cpu/test_fused.py``,
``tests/models/test_policy_fast.py``, ``tests/backends/cpu/test_ops.py``). Each steps aside, running the
stock code, where it could not be exact: a module whose structure is not the one it replaces (a
projection that is not a plain ``nn.Linear``, e.g. a LoRA wrapper added later), tensors off the
CPU, autocast (the fused modules), no gradient (the fused modules, which save nothing then). It
refuses to run a backward in a process group of more than one rank (its gradient aliases add into
``.grad`` past the DDP/FSDP hooks, its embedding gradient is sparse), unless the model's gradients
are summed after the backward (``grpokit.backends.mark_grads_reduced_after_backward``: grpokit's
``train.parallel=ddp``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from grpokit.backends.base import (
    Backend,
    ForwardBatch,
    grads_reduced_after_backward,
    logits_to_logprobs,
    plain_forward,
    sampler_support,
    world_size,
)
from grpokit.backends.cpu.fused import apply_fused_ops, fused_head, remove_fused_ops
from grpokit.backends.cpu.ops import linear_token_logprobs
from grpokit.backends.cpu.shared_prompt import grad_alias, shared_prompt_forward


class CpuBackend(Backend):
    """See the module docstring. Option: ``recompute_mlp`` (:func:`.fused.apply_fused_ops`)."""

    name = "cpu"
    options = ("recompute_mlp",)

    # takes only the names in ``options``: install_backend passes no other
    def install(self, model: torch.nn.Module, *, recompute_mlp: bool = True) -> dict[str, int]:  # type: ignore[override]
        return apply_fused_ops(model, recompute_mlp=recompute_mlp)

    def remove(self, model: torch.nn.Module) -> None:
        remove_fused_ops(model)

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
        """As the plain path, computed with the shared prompt (``share_prompt``, where a prompt
        repeats) and, without autocast, the fused head (:func:`.ops.linear_token_logprobs`: no
        ``(N, T, V)`` logits kept; with ``entropy_grad`` its backward adds the entropy's gradient;
        with a sampler's support, renormalized over it block by block).
        Tensors off the CPU take the plain path.

        Raises:
            RuntimeError: gradient recording on in a process group of more than one rank.
        """
        if batch.prompt_ids.device.type != "cpu":
            return super().logprobs(
                model,
                batch,
                temperature=temperature,
                with_entropy=with_entropy,
                autocast_bf16=autocast_bf16,
                share_prompt=share_prompt,
                entropy_grad=entropy_grad,
            )
        if torch.is_grad_enabled() and (n := world_size()) > 1 and not grads_reduced_after_backward(model):
            raise RuntimeError(
                f"backend cpu: torch.distributed world size {n}: its gradient aliases bypass the "
                "DDP/FSDP hooks; install the plain backend (model.backend=plain or auto)"
            )
        head = None if autocast_bf16 else fused_head(model)
        net = model if head is None else head[0]  # with the fused head: the decoder, for hidden states
        out = shared_prompt_forward(model, net, batch, autocast_bf16) if share_prompt else None
        if out is None:
            out = plain_forward(model, net, batch, autocast_bf16)
        if head is not None:  # (N, T, H) hidden states -> log-probs, no (N, T, V) logits kept
            weight = head[1]
            if torch.is_grad_enabled() and weight.requires_grad:  # tied to the embedding: see grad_alias
                weight = grad_alias(weight)
            return linear_token_logprobs(
                out,
                weight,
                batch.completion_ids,
                temperature=temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                support=sampler_support(batch),
            )
        return logits_to_logprobs(out, batch, temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)

    def generation(
        self, model: torch.nn.Module, rows: int, *, packed_weights: bool
    ) -> contextlib.AbstractContextManager[int]:
        """Linear layers on weights packed once for oneDNN (``packed_weights``; CPU weights only)."""
        if not packed_weights:
            return contextlib.nullcontext(0)
        from grpokit.backends.cpu.packed import packed_linear_weights

        return packed_linear_weights(model, rows)

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
        """The shared and/or static prompt-prefix cache (:func:`.generation.prefix_cache`), under the
        keyword ``model.forward`` takes it by; nothing where it does not apply."""
        from grpokit.backends.base import cache_kwarg
        from grpokit.backends.cpu.generation import prefix_cache

        cache = prefix_cache(model, ids, mask, share=share, static=static, max_len=max_len, prefix=prefix)
        return {} if cache is None else {cache_kwarg(model.forward): cache}
