"""Argument checks shared by the algorithm core (torch only)."""

from __future__ import annotations

import torch


def check_same_shape(fn: str, **tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` naming ``fn`` and every argument's shape unless all shapes agree."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"{fn}: shapes must match, got {listed}")


def check_group_size(fn: str, n: int, group_size: int) -> int:
    """Return the number of groups ``B = n // group_size``; raise ``ValueError`` if it does not divide."""
    if group_size < 1:
        raise ValueError(f"{fn}: group_size must be >= 1, got {group_size}")
    if n % group_size:
        raise ValueError(f"{fn}: number of sequences N={n} is not divisible by group_size={group_size}")
    return n // group_size


def check_dim(fn: str, name: str, t: torch.Tensor, dim: int) -> None:
    """Raise ``ValueError`` unless ``t`` has ``dim`` dimensions."""
    if t.dim() != dim:
        raise ValueError(f"{fn}: {name} must be {dim}-D, got shape {tuple(t.shape)}")
