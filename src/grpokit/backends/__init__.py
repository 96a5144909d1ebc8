"""grpokit.backends: how a model's log-probs are taken and how it generates, one switchable
backend per model, installed through one hook.

Backends (``model.backend``):

- ``plain``: the stock transformers forward (one pass over ``[prompt ; completion]``, the logits,
  :func:`grpokit.algo.token_logprobs`) and ``model.generate`` as it comes. Exact anywhere: any
  device, any number of processes, peft/LoRA wrappers.
- ``cpu``: grpokit's CPU speed and memory work (:mod:`grpokit.backends.cpu`): the shared-prompt
  training forward with its gradient aliases, fused RMSNorm/MLP/embedding/LM-head log-probs, the
  grouped-heads and one-token decode attention, packed oneDNN weights and a shared/static prompt
  cache in generation. The same numbers as ``plain`` (tests compare log-probs, loss and every
  gradient), only on a model on the CPU in one process without peft wrappers.
- ``auto`` (the default): ``cpu`` where nothing makes it inexact, else ``plain``
  (:func:`choose_backend` says why).

Things ``cpu`` cannot be exact with, checked when it is installed:

- a model off the CPU (its kernels and the decode attention are written and tested for CPU; on
  CUDA maintained kernels, e.g. Liger's, do this job);
- a ``torch.distributed`` process group of more than one rank, or a DDP/FSDP-wrapped model: the
  gradient aliases add into ``param.grad`` past the hooks through which DDP/FSDP reduce, and the
  embedding's sparse gradient is not supported by FSDP. Exception: a model whose gradients are summed
  after the backward from ``param.grad`` (grpokit's own ``train.parallel=ddp``, declared with
  :func:`mark_grads_reduced_after_backward`);
- peft adapter (LoRA) modules: the fused MLP and head read ``gate_proj.weight``/``lm_head.weight``
  directly, which a wrapper's base weight is not (the fused modules also check this at every call
  and run their own forward for a wrapped projection).

``auto`` then installs ``plain`` and says which reason; an explicit ``cpu`` raises ``ValueError``
naming it. Only this module imports :mod:`grpokit.backends.cpu`. Usage::

    install_backend(model)   # prints and returns e.g. "backend cpu: model on cpu, one process, ..."
    backend_of(model)        # "cpu"
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.backends.base import (
    Backend,
    PlainBackend,
    autocast_context,
    checkpointing_active,
    distinct_rows,
    grads_reduced_after_backward,
    mark_grads_reduced_after_backward,
    model_device,
    world_size,
)

_ranks = world_size  # inexact_reasons' argument of that name shadows it

#: the values of ``model.backend``
NAMES = ("auto", "cpu", "plain")
_ATTR = "_grpokit_backend"  # on the model: an _Installed
_LOADED: dict[str, Backend] = {"plain": PlainBackend()}

__all__ = [
    "NAMES",
    "Backend",
    "autocast_context",
    "backend_of",
    "checkpointing_active",
    "choose_backend",
    "distinct_rows",
    "get_backend",
    "grads_reduced_after_backward",
    "inexact_reasons",
    "install_backend",
    "lora_modules",
    "mark_grads_reduced_after_backward",
    "model_device",
    "world_size",
]


@dataclass
class _Installed:
    name: str
    reason: str
    switched: dict[str, int] = field(default_factory=dict)


def _load(name: str) -> Backend:
    if name not in _LOADED:
        if name != "cpu":
            raise ValueError(f"model.backend: {name!r} is not one of {', '.join(NAMES)}")
        from grpokit.backends.cpu import CpuBackend  # the one import of the cpu backend

        _LOADED[name] = CpuBackend()
    return _LOADED[name]


def _option_names() -> set[str]:
    from grpokit.backends.cpu import CpuBackend

    return set(PlainBackend.options) | set(CpuBackend.options)


def lora_modules(model: torch.nn.Module) -> list[str]:
    """Names of the modules of ``model`` that are peft adapter layers: a ``lora_A`` attribute, or
    an instance of peft's ``BaseTunerLayer`` (looked up only if peft is already imported)."""
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    base = getattr(tuners, "BaseTunerLayer", None)
    return [
        name for name, m in model.named_modules() if hasattr(m, "lora_A") or (base is not None and isinstance(m, base))
    ]


def _wrapped_for_data_parallel(model: torch.nn.Module) -> str | None:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "DistributedDataParallel"
    if any(hasattr(m, "_fsdp_wrapped_module") for m in model.modules()):
        return "FullyShardedDataParallel"
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters()):
        return "DTensor parameters (FSDP2 / tensor parallel)"
    return None


def inexact_reasons(
    model: torch.nn.Module, *, device: torch.device | str | None = None, world_size: int | None = None
) -> list[str]:
    """Why the ``cpu`` backend could not be exact for ``model`` (empty: it can).

    Args:
        device: where the model runs (default: its parameters' device).
        world_size: the number of ranks (default: ``torch.distributed``'s, 1 without a process
            group).
    """
    reasons = []
    dev = torch.device(device) if device is not None else model_device(model)
    if dev.type != "cpu":
        reasons.append(f"model on {dev}")
    n = _ranks() if world_size is None else int(world_size)
    wrapper = _wrapped_for_data_parallel(model)
    if wrapper is not None:
        reasons.append(f"model wrapped as {wrapper} (grad aliases bypass DDP/FSDP hooks)")
    elif n > 1 and not grads_reduced_after_backward(model):
        reasons.append(f"torch.distributed world size {n} (grad aliases bypass DDP/FSDP hooks)")
    lora = lora_modules(model)
    if lora:
        more = f" and {len(lora) - 1} more" if len(lora) > 1 else ""
        reasons.append(f"LoRA modules found ({lora[0]}{more}: peft's forward is the exact one)")
    return reasons


def choose_backend(
    model: torch.nn.Module,
    requested: str = "auto",
    *,
    device: torch.device | str | None = None,
    world_size: int | None = None,
) -> tuple[str, str]:
    """The backend ``requested`` resolves to for ``model``, and why: ``(name, reason)``.

    ``auto``: ``cpu`` unless :func:`inexact_reasons` finds something, then ``plain``;
    ``plain``: always; ``cpu``: if exact, else an error.

    Raises:
        ValueError: ``requested`` is not in :data:`NAMES`; ``cpu`` requested where it cannot be
            exact (the message names ``model.backend`` and the reasons).
    """
    if requested not in NAMES:
        raise ValueError(f"model.backend: {requested!r} is not one of {', '.join(NAMES)}")
    if requested == "plain":
        return "plain", "model.backend=plain"
    reasons = inexact_reasons(model, device=device, world_size=world_size)
    if not reasons:
        n = _ranks() if world_size is None else int(world_size)
        where = "one process" if n == 1 else f"{n} ranks summing gradients after the backward (train.parallel=ddp)"
        return "cpu", f"model on cpu, {where}, no peft adapter modules (model.backend={requested})"
    if requested == "cpu":
        raise ValueError(
            f"model.backend=cpu cannot be exact here: {'; '.join(reasons)}. Use model.backend=auto or plain"
        )
    return "plain", "; ".join(reasons)


def install_backend(
    model: torch.nn.Module,
    name: str = "auto",
    *,
    announce: bool = True,
    device: torch.device | str | None = None,
    world_size: int | None = None,
    **options: Any,
) -> str:
    """Install the backend ``name`` (:data:`NAMES`) on ``model`` in place: the one hook.

    Call it once the model is where it will run (device, process group, adapters): ``auto``
    decides from that. A backend already installed is removed first (so installing ``plain``
    restores the stock model).

    Args:
        model: a transformers causal LM.
        name: ``auto``, ``cpu`` or ``plain``.
        announce: print the returned line (``[grpokit] backend …``).
        device, world_size: override what :func:`choose_backend` reads from the model and
            ``torch.distributed``.
        options: backend options; those of a backend not chosen are ignored (``recompute_mlp``:
            the cpu backend's MLP backward recomputes ``gate(x)``/``up(x)``).

    Returns:
        one line: ``"backend <name>: <why>"``.

    Raises:
        ValueError: an unknown name; ``cpu`` where it cannot be exact (see :func:`choose_backend`).
        TypeError: an option no backend takes.
    """
    unknown = sorted(set(options) - _option_names())
    if unknown:
        raise TypeError(f"install_backend: unknown option(s) {unknown}")
    chosen, reason = choose_backend(model, name, device=device, world_size=world_size)
    current = getattr(model, _ATTR, None)
    if current is not None:
        _load(current.name).remove(model)
    backend = _load(chosen)
    switched = backend.install(model, **{k: v for k, v in options.items() if k in backend.options})
    setattr(model, _ATTR, _Installed(chosen, reason, switched))
    line = f"backend {chosen}: {reason}"
    if switched:
        line += " [" + ", ".join(f"{k} {v}" for k, v in switched.items()) + "]"
    if announce:
        print(f"[grpokit] {line}", flush=True)
    return line


def backend_of(model: torch.nn.Module) -> str:
    """The name of the backend installed on ``model`` (``plain`` when none was)."""
    installed = getattr(model, _ATTR, None)
    return installed.name if installed is not None else "plain"


def get_backend(model: torch.nn.Module) -> Backend:
    """The :class:`Backend` object that runs ``model`` (used by :mod:`grpokit.models.logprobs` and
    :mod:`grpokit.rollout.hf`)."""
    return _load(backend_of(model))
