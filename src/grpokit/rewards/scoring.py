"""The scoring base shared by learned reward models: batched forward passes read at known positions.

A learned reward model (an outcome reward model, :mod:`grpokit.rewards.rm`; a process reward model,
:mod:`grpokit.process.prm`) turns each row into token ids and the positions where a score is read
(the last real token of the text; the tag after each step). :class:`PositionScorer` runs those rows
through the model in batches and reads the per-token output there:

- rows are sorted by length and cut into batches of ``batch_size`` (fewer pad tokens);
- each batch is padded on ``padding_side`` with an attention mask and explicit
  ``position_ids = cumsum(mask) - 1`` (when the model takes them), so a row scores the same alone
  or in a batch, padded left or right;
- rows longer than ``max_length`` are cut to their first ``max_length`` tokens and positions beyond
  the cut score None (callers that read the end of a text cut from the left before, see
  :func:`keep_last`);
- everything runs under ``torch.inference_mode()``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["PositionScorer", "keep_last", "Scores"]

Scores = list[list[float | None]]
Row = tuple[Sequence[int], Sequence[int]]  # (token ids, positions to read)


def keep_last(ids: Sequence[int], max_length: int | None) -> list[int]:
    """The last ``max_length`` tokens of ``ids`` (all of them if ``max_length`` is None).

    >>> keep_last([1, 2, 3, 4], 2)
    [3, 4]
    """
    ids = list(ids)
    return ids if max_length is None or len(ids) <= max_length else ids[len(ids) - max_length :]


def logits_output(model: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    """Per-token outputs of ``model(**kwargs)``: ``.logits`` (or the first element), ``(B, T, C)``."""
    output = model(**kwargs)
    return output.logits if hasattr(output, "logits") else output[0]


class PositionScorer:
    """Batched, padded forward passes of pre-tokenized rows, read at the requested positions.

    Args:
        model: moved to ``device`` (and ``dtype`` if given) and put in eval mode.
        pad_id: token id written at padded positions (masked out by the attention mask).
        batch_size: rows per forward pass (>= 1).
        device, dtype: where to run / the model dtype (None keeps it).
        padding_side: ``"left"`` or ``"right"``.
        max_length: cut rows to this many tokens (positions beyond it score None); None = no cut.
        forward: ``(model, kwargs) -> (B, T, C)`` per-token outputs; default
            :func:`logits_output`. ``kwargs`` holds ``input_ids``/``attention_mask`` ``(B, T)``
            int64 and, when the model's ``forward`` takes it, ``position_ids``.
        keep_only_read: pass ``logits_to_keep`` (the read positions) to a model that takes it, so
            that only those positions are projected onto the vocabulary (causal LMs).

    Raises:
        ValueError: ``batch_size < 1`` or a bad ``padding_side``.
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        batch_size: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        padding_side: str = "right",
        max_length: int | None = None,
        forward: Callable[[Any, dict[str, Any]], torch.Tensor] | None = None,
        keep_only_read: bool = True,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        self.model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
        self.model.eval()
        self.device, self.pad_id, self.batch_size = torch.device(device), pad_id, batch_size
        self.padding_side, self.max_length = padding_side, max_length
        self.forward = forward or logits_output
        params = inspect.signature(self.model.forward).parameters
        self.takes_positions = "position_ids" in params
        self.takes_keep = keep_only_read and forward is None and "logits_to_keep" in params

    @torch.inference_mode()
    def score(self, rows: Sequence[Row], read: Callable[[torch.Tensor], torch.Tensor]) -> Scores:
        """Read every row's outputs at its positions.

        Args:
            rows: ``(ids, positions)`` per row; ``positions`` index ``ids``.
            read: ``(K, C) float32 -> (K,)``: the outputs at the K read positions of a batch to
                one score each (e.g. a softmax over two candidate tokens).

        Returns:
            ``scores[i][k]``: the score at ``rows[i]``'s k-th position (None past ``max_length``).
        """
        limit = self.max_length
        out: Scores = [[None] * len(pos) for _, pos in rows]
        todo = []
        for i, (ids, pos) in enumerate(rows):
            keep = [k for k, p in enumerate(pos) if limit is None or p < limit]
            if keep:
                todo.append((i, list(ids[:limit] if limit else ids), keep))
        todo.sort(key=lambda r: len(r[1]))
        for b in range(0, len(todo), self.batch_size):
            batch = todo[b : b + self.batch_size]
            kwargs, where_r, where_t = self._pad(batch, rows)
            t_index = torch.tensor(where_t)
            if self.takes_keep:  # only project the needed positions onto the vocab
                cols = torch.unique(t_index)  # sorted
                kwargs["logits_to_keep"] = cols.to(self.device)
                t_index = torch.searchsorted(cols, t_index)
            per_token = self.forward(self.model, kwargs)
            picked = per_token[torch.tensor(where_r, device=per_token.device), t_index.to(per_token.device)]
            scores = read(picked.float()).tolist()  # (K,)
            owners = [(i, k) for i, _, keep in batch for k in keep]
            for (i, k), s in zip(owners, scores):
                out[i][k] = float(s)
        return out

    def _pad(
        self, batch: list[tuple[int, list[int], list[int]]], rows: Sequence[Row]
    ) -> tuple[dict[str, Any], list[int], list[int]]:
        """Model inputs of one batch, and the (row, column) of every read position in it."""
        width = max(len(ids) for _, ids, _ in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        where_r, where_t = [], []
        for r, (i, ids, keep) in enumerate(batch):
            off = width - len(ids) if self.padding_side == "left" else 0
            input_ids[r, off : off + len(ids)] = torch.tensor(ids)
            attn[r, off : off + len(ids)] = 1
            for k in keep:
                where_r.append(r)
                where_t.append(off + rows[i][1][k])
        kwargs: dict[str, Any] = {"input_ids": input_ids.to(self.device), "attention_mask": attn.to(self.device)}
        if self.takes_positions:
            kwargs["position_ids"] = (attn.cumsum(-1) - 1).clamp(min=0).to(self.device)
        return kwargs, where_r, where_t
