"""Generation on linear-layer weights pre-packed for oneDNN (the cpu backend's generation context,
``generate_rollouts(packed_weights=True)``).

On CPU ``F.linear`` hands each call's weight to the BLAS library in its plain row-major layout,
and the library re-blocks (packs) the weight into its kernel's layout on every call. In training
that cost is spread over hundreds of rows; a decode step multiplies only ``N = B·G`` rows (one
token each) by every weight of the model, so the packing is a large part of the step. Inside
:func:`packed_linear_weights` each ``nn.Linear`` of the model runs on a copy of its weight packed
once (``torch.ops.mkldnn._reorder_linear_weight``) through oneDNN's linear
(``torch.ops.mkldnn._linear_pointwise``), the pair PyTorch's inductor uses for frozen CPU
weights.

Measured on the benchmark machine (2 cores, SmolLM2-135M, 32 rows, one token each, weights not in
cache): a 576×1536 layer 0.27 → 0.20 ms in bf16 and 0.64 → 0.34 ms in float32; the 49k×576 LM head
7.8 → 5.5 ms (bf16) and 25 → 10 ms (float32). bf16 outputs are bit-identical to ``F.linear``;
float32 ones differ by summation order (~1e-7 relative).

Memory: one packed copy of every linear weight while the context is open (the model's size
again, minus the embedding table when it is not tied to the head); freed on exit.
Packing costs ~1 ms per MB of weights once per context.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import cast

import torch

_OK_DTYPES = (torch.float32, torch.bfloat16)
_checked: dict[torch.dtype, bool] = {}


def _pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def packing_works(dtype: torch.dtype) -> bool:
    """Whether the packed linear gives ``F.linear``'s values for ``dtype`` on this machine
    (checked once per dtype on a random 5×40 by 24×40 product; False where the ops are missing)."""
    if dtype not in _OK_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    if dtype not in _checked:
        g = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((5, 40), (24, 40), (24,)))
        try:  # outside any autocast of the caller's: under CPU bf16 autocast F.linear computes in bf16
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                got = _packed_linear(x, _pack(w, 5), b)
                want = torch.nn.functional.linear(x, w, b)
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            _checked[dtype] = got.shape == want.shape and torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
        except (RuntimeError, AttributeError):  # op not built into this torch
            _checked[dtype] = False
    return _checked[dtype]


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packed = cast(torch.Tensor, self._grpokit_packed)  # set by packed_linear_weights
    if torch.is_grad_enabled() or x.dtype != packed.dtype or x.device.type != "cpu" or torch.is_autocast_enabled("cpu"):
        return type(self).forward(self, x)  # training, autocast (it casts in F.linear), other devices
    return _packed_linear(x, packed, self.bias)


@contextlib.contextmanager
def packed_linear_weights(model: torch.nn.Module, rows: int) -> Iterator[int]:
    """Within the context, every CPU ``nn.Linear`` of ``model`` (float32 or bf16) computes
    ``y = x·Wᵀ + b`` without gradient from a pre-packed copy of ``W`` (module docstring).

    Args:
        model: any module; its ``nn.Linear`` children are switched on the instances.
        rows: the number of rows the calls will mostly have (``N``, one decode step); the packed
            layout is chosen for it, other row counts give the same values.

    Yields:
        how many linear layers were switched (0 when oneDNN is missing or fails its check for the
        weights' dtype: the model then runs as before). The weights are read when the context
        opens: do not change them inside it.

    With gradient recording or autocast on, or for an input of another dtype, a layer runs its own
    forward. Empty weights are left alone.
    Two layers sharing one weight share one packed copy. On exit the instance ``forward`` s are
    removed and the packed copies dropped.
    """
    switched: list[torch.nn.Linear] = []
    packed: dict[tuple, torch.Tensor] = {}  # (address, shape, stride, dtype) -> packed copy
    try:
        with torch.no_grad():
            for m in model.modules():
                w = getattr(m, "weight", None)
                if (
                    type(m) is not torch.nn.Linear
                    or "forward" in vars(m)
                    or w is None
                    or w.device.type != "cpu"
                    or w.numel() == 0
                    or not packing_works(w.dtype)
                ):
                    continue
                key = (w.data_ptr(), tuple(w.shape), w.stride(), w.dtype)  # views may share a start
                if key not in packed:
                    packed[key] = _pack(w, max(int(rows), 1))
                m._grpokit_packed = packed[key]
                m.forward = types.MethodType(_forward, m)  # type: ignore[method-assign]  # on the instance
                switched.append(m)
        yield len(switched)
    finally:
        for m in switched:
            del m.forward
            del m._grpokit_packed
        packed.clear()
