"""The dtype names recipes use (``model.dtype``, ``rewards.rm_dtype``) and their torch dtypes."""

from __future__ import annotations

import torch

#: recipe name -> torch dtype
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_of(name: str, key: str = "dtype") -> torch.dtype:
    """The torch dtype a recipe names.

    Raises:
        ValueError: an unknown name (names ``key``, the recipe key, and the known names).

    >>> dtype_of("bfloat16")
    torch.bfloat16
    """
    if name not in DTYPES:
        raise ValueError(f"{key}: {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]
