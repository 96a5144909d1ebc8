"""LoRA adapters folded into the full weights of an FSDP2-sharded policy, one unit at a time: what a
separate sampler (vLLM) and PPO's value model take from a LoRA run under ``train.parallel=fsdp2``
(the one-process run takes :func:`grpokit.models.lora.merged_state_dict` / ``merged_copy``). peft is
not imported: adapter layers are recognised by their attributes (``base_layer``, ``lora_A``,
``lora_B``, ``scaling``, ``active_adapters``), as peft's ``LoraLayer`` has them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .distributed import fsdp_root, full_parameters

__all__ = ["merged_full_parameters"]


def _lora_layers(root: torch.nn.Module) -> dict[str, tuple[list[str], dict[str, float], bool]]:
    """``module name -> (active adapters, their scaling, fan_in_fan_out)`` of every LoRA layer.

    Raises:
        ValueError: an adapter that is not a plain linear LoRA (DoRA, ``lora_bias``, an embedding or
            convolution LoRA): its delta is not ``scaling · B · A``.
    """
    layers = {}
    for name, m in root.named_modules():
        if not (hasattr(m, "base_layer") and hasattr(m, "lora_A")):
            continue
        adapters = [a for a in getattr(m, "active_adapters", []) if a in m.lora_A]
        dora, bias = getattr(m, "use_dora", {}), getattr(m, "lora_bias", {})
        if not isinstance(m.base_layer, torch.nn.Linear) or any(dora.get(a) or bias.get(a) for a in adapters):
            raise ValueError(
                f"merged_full_parameters: {name} is not a plain linear LoRA layer (DoRA, lora_bias, embedding "
                "or convolution adapters are not merged from shards)"
            )
        layers[name] = (adapters, {a: float(m.scaling[a]) for a in adapters}, bool(getattr(m, "fan_in_fan_out", False)))
    return layers


def _part(name: str) -> tuple[str, str] | None:
    """``(layer, part)`` of a LoRA layer's parameter name: ``base.weight``/``base.bias`` (the wrapped
    linear's), ``A:adapter``/``B:adapter``; None for any other parameter."""
    if ".base_layer." in name:
        layer, rest = name.split(".base_layer.", 1)
        return layer, f"base.{rest}"
    for side in ("A", "B"):
        marker = f".lora_{side}."
        if marker in name:
            layer, rest = name.split(marker, 1)
            return layer, f"{side}:{rest.rsplit('.', 1)[0]}"
    return None


def merged_full_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` of a sharded model's weights with its active LoRA adapters folded in,
    under the plain model's names (``…q_proj.weight``; the adapters' own tensors are not yielded): for
    each LoRA linear ``W + s·(B @ A)`` (transposed for ``fan_in_fan_out``), ``s`` the adapter's
    ``scaling`` (``alpha / r``), computed as peft's ``get_delta_weight`` and ``merge`` do, so the
    values equal one process's merged weights bit for bit. Streams :func:`full_parameters`: one FSDP
    unit is gathered at a time, and a layer's merged weight is yielded once its base weight and its
    adapters have come (they live in the same unit). A model without adapters: :func:`full_parameters`.
    Every rank must consume it whole, in step.

    Raises:
        ValueError: an adapter that is not a plain linear LoRA.
        RuntimeError: a LoRA layer whose base weight or adapter tensors never came.
    """
    layers = _lora_layers(fsdp_root(model))
    if not layers:
        yield from full_parameters(model)
        return
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, full in full_parameters(model):
        found = _part(name)
        if found is None or found[0] not in layers:
            yield name, full
            continue
        layer, part = found
        adapters, scaling, transposed = layers[layer]
        if part.startswith(("A:", "B:")) and part[2:] not in adapters:
            continue  # an inactive adapter: not merged
        if part.startswith("base.") and part != "base.weight":
            yield f"{layer}.{part[len('base.') :]}", full  # the bias
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = full
        if "base.weight" in parts and all(f"A:{a}" in parts and f"B:{a}" in parts for a in adapters):
            del pending[layer]
            yield f"{layer}.weight", _merged(parts, adapters, scaling, transposed)
    if pending:
        raise RuntimeError(f"merged_full_parameters: incomplete LoRA layers {sorted(pending)[:3]}")


def _merged(parts: dict[str, Any], adapters: list[str], scaling: dict[str, float], transposed: bool) -> torch.Tensor:
    weight = parts["base.weight"]
    for a in adapters:
        delta = parts[f"B:{a}"] @ parts[f"A:{a}"]
        delta = (delta.T if transposed else delta) * scaling[a]
        weight = weight + delta.to(weight.dtype)
    return weight
