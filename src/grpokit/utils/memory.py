"""Return heap memory that PyTorch freed to the OS.

On glibc, memory freed by PyTorch's CPU allocator stays in the process's heap arenas (fragmented
by the mix of KV caches, activations and logits of varying shapes) and keeps counting as resident:
in a 135M-parameter GRPO step about 1 GB above the live tensors after three steps.
``release_memory`` calls ``malloc_trim(0)``, which hands free heap pages back; the trainer calls it
between phases (after generation, after the reference pass, after each micro-batch backward).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import lru_cache


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib.malloc_trim  # noqa: B018 - glibc only (musl has none)
        return lib
    except (OSError, AttributeError):
        return None


def release_memory() -> bool:
    """Return free heap memory to the OS (glibc ``malloc_trim(0)``); a no-op elsewhere.

    Returns:
        True if memory was released, False if nothing could be (or not glibc).
    """
    lib = _libc()
    return bool(lib.malloc_trim(0)) if lib is not None else False
