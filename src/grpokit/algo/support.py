"""The set of tokens a truncating sampler drew each token from, recorded per position: what the
trainer renormalizes π_old, π_θ and π_ref over (sampling replay; docs/design.md, "Temperature").

With ``top_k``, ``top_p`` or ``min_p`` the sampler draws token ``t`` of a row from
``softmax(logits / τ)`` restricted to the set ``S_t`` its warpers kept, renormalized. The rollout
engine records ``S_t`` exactly as the sampler had it (ties and warper order included), and the
trainer scores ``log π(y_t) = z_y − logsumexp_{v ∈ S_t} z_v`` (``z = logits / τ``) for every policy
on that one fixed set.

A *support* is a tensor ``(..., W)`` (``(N, T, W)`` in an experience), in one of two forms:

- **ids** (``int32``): the kept token ids of each position, in any order, padded with ``-1``;
  ``W`` = the largest kept set. ``4·W`` bytes a position.
- **bits** (``uint8``): bit ``v % 8`` of byte ``v // 8`` is set iff token ``v`` is kept;
  ``W = ceil(V / 8)`` bytes a position.

:func:`from_mask` picks the smaller (ids while ``4·K < ceil(V / 8)``, ``K`` the largest kept
set: ``top_k = 50`` of a 49,152-token vocabulary costs 200 bytes a position rather than 6,144; a
near-uniform top-p set costs the bitmask); :func:`unify` brings parts of both forms to one (bits
when any part is bits) before they are joined.

**An empty position** (no id, no bit) **is not truncated**: its log-probs are the full
vocabulary's. Positions the sampler did not draw with a truncating warper are empty: tokens after
the first EOS, right padding, a multi-turn row's environment tokens. A drawn position is never
empty (every warper keeps at least one token), so the rule cannot be mistaken for a drawn one.

Imports torch only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: the padding of the ids form
EMPTY_ID = -1
#: positions converted per chunk when ids become bits (bounds the ``(chunk, V)`` bool temporary)
_CHUNK = 1024


def is_ids(support: torch.Tensor) -> bool:
    """True for the ids form (``int32``), False for bits (``uint8``).

    Raises:
        ValueError: another dtype.
    """
    if support.dtype == torch.int32:
        return True
    if support.dtype == torch.uint8:
        return False
    raise ValueError(f"support: int32 (ids) or uint8 (bits) expected, got {support.dtype}")


def pack_bits(kept: torch.Tensor) -> torch.Tensor:
    """``(..., V)`` bool -> the bits form ``(..., ceil(V / 8))`` uint8.

    >>> pack_bits(torch.tensor([[True, False, True, False, False, False, False, False, True]])).tolist()
    [[5, 1]]
    """
    v = kept.shape[-1]
    pad = -v % 8
    if pad:
        kept = torch.nn.functional.pad(kept, (0, pad), value=False)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=kept.device)
    return (kept.view(*kept.shape[:-1], -1, 8).to(torch.uint8) * weights).sum(-1, dtype=torch.uint8)


def _unpack_bits(bits: torch.Tensor) -> torch.Tensor:
    """``(..., W)`` uint8 -> ``(..., 8·W)`` bool."""
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return ((bits.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)


def from_mask(kept: torch.Tensor) -> torch.Tensor:
    """The support of ``kept`` (``(..., V)`` bool, True = kept) in the smaller form.

    >>> kept = torch.zeros(2, 64, dtype=torch.bool); kept[0, [3, 9]] = True
    >>> from_mask(kept).tolist()  # 2 ids cost 8 bytes, as many as 64 bits: bits (3 -> 2**3, 9 -> 2**1)
    [[8, 2, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]]
    >>> kept = torch.zeros(2, 256, dtype=torch.bool); kept[0, [3, 9]] = True; kept[1, 7] = True
    >>> from_mask(kept).tolist()  # 2 ids (8 bytes) < 256 bits (32 bytes): ids, -1 = padding
    [[3, 9], [7, -1]]
    """
    v = kept.shape[-1]
    k = max(int(kept.sum(-1).max()), 1) if kept.numel() else 1
    return pack_bits(kept) if 4 * k >= -(-v // 8) else pack_ids(kept)


def pack_ids(kept: torch.Tensor) -> torch.Tensor:
    """``(..., V)`` bool -> the ids form ``(..., K)`` int32, each position's kept ids ascending,
    padded with ``-1`` (``K`` = the largest kept set, at least 1).

    >>> pack_ids(torch.tensor([[False, True, True], [False, False, False]])).tolist()
    [[1, 2], [-1, -1]]
    """
    v = kept.shape[-1]
    flat = kept.reshape(-1, v)
    counts = flat.sum(-1)  # (M,)
    k = max(int(counts.max()), 1) if flat.shape[0] else 1
    rows, cols = flat.nonzero(as_tuple=True)  # row-major: each row's ids ascending
    starts = counts.cumsum(0) - counts  # (M,) where each row's ids begin in `cols`
    slot = torch.arange(len(rows), device=kept.device) - starts[rows]
    out = torch.full((flat.shape[0], k), EMPTY_ID, dtype=torch.int32, device=kept.device)
    out[rows, slot] = cols.to(torch.int32)
    return out.view(*kept.shape[:-1], k)


def restricted(support: torch.Tensor) -> torch.Tensor:
    """``(...)`` bool: True where a kept set is recorded (the position is truncated), False on
    empty positions (full vocabulary)."""
    return (support != (EMPTY_ID if is_ids(support) else 0)).any(-1)


def to_mask(support: torch.Tensor, start: int, stop: int, *, truncated: torch.Tensor | None = None) -> torch.Tensor:
    """``(..., stop − start)`` bool: which of the vocabulary ids ``start … stop − 1`` each position
    may draw; all True on an empty position.

    Args:
        support: ``(..., W)`` in either form.
        start, stop: the vocabulary block (``0, V`` for all of it).
        truncated: :func:`restricted` of ``support`` when the caller already has it (a loop over
            vocabulary blocks computes it once).

    >>> s = torch.tensor([[2, 0, -1], [-1, -1, -1]], dtype=torch.int32)
    >>> to_mask(s, 0, 4).int().tolist()  # row 1 is empty: every token
    [[1, 0, 1, 0], [1, 1, 1, 1]]
    >>> to_mask(pack_bits(to_mask(s, 0, 4)), 1, 3).int().tolist()  # the bits form, ids 1 and 2
    [[0, 1], [1, 1]]
    """
    width = stop - start
    if truncated is None:
        truncated = restricted(support)
    if is_ids(support):
        ids = support.long() - start
        inside = (support != EMPTY_ID) & (ids >= 0) & (ids < width)
        out = torch.zeros(*support.shape[:-1], width + 1, dtype=torch.bool, device=support.device)
        out.scatter_(-1, torch.where(inside, ids, width), True)  # outside the block: the dropped last column
        out = out[..., :width]
    else:
        b0, b1 = start // 8, -(-stop // 8)
        out = _unpack_bits(support[..., b0:b1])[..., start - 8 * b0 : stop - 8 * b0]
        if out.shape[-1] < width:  # ids past the bits' width are never kept
            out = torch.nn.functional.pad(out, (0, width - out.shape[-1]), value=False)
    return out | ~truncated.unsqueeze(-1)


def contains(support: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``(...)`` bool: whether each position's ``token_ids`` entry lies in its kept set (True on
    empty positions).

    >>> s = torch.tensor([[2, 0, -1], [-1, -1, -1]], dtype=torch.int32)
    >>> contains(s, torch.tensor([1, 5])).tolist()
    [False, True]
    """
    ids = token_ids.long()
    if is_ids(support):
        inside = (support.long() == ids.unsqueeze(-1)).any(-1)
    else:
        byte = support.gather(-1, (ids // 8).clamp(max=support.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        inside = ((byte.long() >> (ids % 8)) & 1).bool() & (ids // 8 < support.shape[-1])
    return inside | ~restricted(support)


def sizes(support: torch.Tensor) -> torch.Tensor:
    """``(...)`` long: the number of kept tokens of each position (0 on empty positions).

    >>> sizes(torch.tensor([[2, 0, -1], [-1, -1, -1]], dtype=torch.int32)).tolist()
    [2, 0]
    """
    if is_ids(support):
        return (support != EMPTY_ID).sum(-1)
    return _unpack_bits(support).sum(-1)


def to_bits(support: torch.Tensor, width: int) -> torch.Tensor:
    """``support`` in the bits form of ``width`` bytes (``ceil(V / 8)``); a bits support of that
    width is returned as it is.

    Raises:
        ValueError: a bits support of another width; an id at or past ``8·width``.
    """
    if not is_ids(support):
        if support.shape[-1] != width:
            raise ValueError(f"support: bits of width {support.shape[-1]}, expected {width}")
        return support
    if support.numel() and int(support.max()) >= 8 * width:
        raise ValueError(f"support: id {int(support.max())} does not fit {width} bytes of bits")
    flat = support.reshape(-1, support.shape[-1])
    out = torch.empty(flat.shape[0], width, dtype=torch.uint8, device=support.device)
    for s in range(0, flat.shape[0], _CHUNK):
        out[s : s + _CHUNK] = pack_bits(to_mask(flat[s : s + _CHUNK], 0, 8 * width))
    # to_mask makes an empty position all True; its bits must stay empty
    out[~restricted(flat)] = 0
    return out.view(*support.shape[:-1], width)


def unify(parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``parts`` (each ``(..., W_i)``) in one form and width, ready to be joined: all ids -> ids
    padded to the widest; any bits -> every part as bits.

    Raises:
        ValueError: bits parts of different widths (different vocabularies).
    """
    if all(is_ids(p) for p in parts):
        w = max(p.shape[-1] for p in parts)
        return [torch.nn.functional.pad(p, (0, w - p.shape[-1]), value=EMPTY_ID) for p in parts]
    widths = {p.shape[-1] for p in parts if not is_ids(p)}
    if len(widths) > 1:
        raise ValueError(f"support: bits parts of widths {sorted(widths)} (different vocabularies)")
    (w,) = widths
    return [to_bits(p, w) for p in parts]


def pad_positions(support: torch.Tensor, width: int) -> torch.Tensor:
    """``(N, T, W)`` -> ``(N, width, W)``, the new positions empty (``width >= T``)."""
    extra = width - support.shape[1]
    if extra == 0:
        return support
    return torch.nn.functional.pad(support, (0, 0, 0, extra), value=EMPTY_ID if is_ids(support) else 0)


def cleared(support: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """A copy of ``support`` with the positions where ``where`` (``(...)`` bool) is True made empty."""
    return support.masked_fill(where.unsqueeze(-1), EMPTY_ID if is_ids(support) else 0)


def check(support: torch.Tensor, n: int, t: int) -> None:
    """Raise ``ValueError`` unless ``support`` is ``(n, t, W)`` in one of the two forms."""
    if support.dim() != 3 or tuple(support.shape[:2]) != (n, t):
        raise ValueError(f"sampler_support: shape {tuple(support.shape)}, expected (N, T, W) with (N, T) = {(n, t)}")
    is_ids(support)
