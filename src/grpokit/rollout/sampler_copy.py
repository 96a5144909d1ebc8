"""The bf16 sampler (``model.autocast_bf16``): a copy of the policy whose floating-point parameters
are bf16, made once per model and refreshed from it before every rollout; decode steps on CPU are
bound by reading the weights, and bf16 halves that. Under FSDP2 the copy is a plain model refreshed
one sharded unit at a time.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_SAMPLERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def sampler_copy(model: Any, dtype: torch.dtype) -> Any:
    """A copy of ``model`` whose floating-point *parameters* are ``dtype`` (buffers such as rotary
    frequencies stay as they are), with the weights of ``model`` right now. Made once per model and
    dtype, refreshed in place on every call (a cast-copy of the weights). A model sharded by FSDP2:
    :func:`_sharded_sampler_copy`."""
    from grpokit.utils.distributed import is_sharded

    if is_sharded(model):
        return _sharded_sampler_copy(model, dtype)
    if all(p.dtype == dtype for p in model.parameters() if p.is_floating_point()):
        return model
    per_model = _SAMPLERS.setdefault(model, {})
    copy = per_model.get(dtype)
    if copy is None:
        import copy as copy_mod

        with torch.inference_mode(False):  # normal tensors, so later refreshes work in or out of it
            copy = _cast_parameters(copy_mod.deepcopy(model).requires_grad_(False), dtype)
        per_model[dtype] = copy
    with torch.no_grad():
        for src, dst in zip(model.parameters(), copy.parameters()):
            dst.copy_(src)
    copy.generation_config = model.generation_config  # generate fills unset fields from it
    return copy


def _cast_parameters(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``module`` with each floating-point parameter's data cast to ``dtype`` in place (buffers kept)."""
    for p in module.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return module


def _sharded_sampler_copy(model: Any, dtype: torch.dtype) -> Any:
    """:func:`sampler_copy` of a model sharded by FSDP2: a plain model of its class
    (``transformers.AutoModelForCausalLM`` from its config and attention implementation, built once
    in a forked RNG: :func:`grpokit.utils.distributed.plain_model`; a LoRA policy's copy wrapped with
    the same adapters, unmerged, as one process's deep copy keeps them; its floating-point parameters
    in ``dtype``, buffers as built), refreshed on every call one FSDP unit at a time
    (:func:`grpokit.utils.distributed.load_full_parameters`: each unit's shards gathered, copied in,
    released), so at most one unit's full float32 weights exist beside the copy. Every rank must
    call it the same number of times (the gathers are collectives)."""
    from grpokit.models.lora import is_peft_model
    from grpokit.utils.distributed import fsdp_root, load_full_parameters, plain_model

    root = fsdp_root(model)
    per_model = _SAMPLERS.setdefault(model, {})
    copy = per_model.get(dtype)
    if copy is None:
        copy = plain_model(model)
        if is_peft_model(model):
            copy = _with_adapters_of(model, copy)
        copy.requires_grad_(False).eval()
        with torch.inference_mode(False):  # normal tensors, so later refreshes work in or out of it
            _cast_parameters(copy, dtype)
        per_model[dtype] = copy
    load_full_parameters(model, fsdp_root(copy))  # one sharded unit gathered at a time; the same names
    fsdp_root(copy).generation_config = root.generation_config
    return copy


def _with_adapters_of(model: Any, plain: torch.nn.Module) -> Any:
    """``plain`` wrapped by peft with ``model``'s adapter configurations (their weights are loaded
    after), its random adapter initialisation drawn from a forked RNG (the run's random state stays
    the one process's)."""
    import copy as copy_mod

    import peft

    configs = dict(model.peft_config)
    with torch.inference_mode(False), torch.random.fork_rng(devices=[]):
        first, *rest = configs
        wrapped = peft.get_peft_model(plain, copy_mod.deepcopy(configs[first]), adapter_name=first)
        for name in rest:
            wrapped.add_adapter(name, copy_mod.deepcopy(configs[name]))
        wrapped.set_adapter(model.active_adapter)
    return wrapped
