"""The prompt-prefix KV cache the cpu backend hands ``generate`` (moved from ``grpokit.rollout.hf``).

- shared prefix: ``generate`` would run the prefill over all ``N = B·G`` rows, i.e. each prompt G
  times. Instead the first ``P-1`` prompt columns of each *distinct* prompt run once; their KV
  cache is repeated to the rows and handed to ``generate``, which then only runs the last prompt
  column before sampling.
- static cache: a preallocated ``StaticCache`` of ``P + max_new_tokens`` positions written in
  place, instead of a ``DynamicCache`` that concatenates (copies) every layer's whole cache at every
  new token; on CPU the copies cost about a third of a decode step. No ``torch.compile`` is
  involved (the generation config sets ``disable_compile=True``).

Neither changes the sampled tokens (``tests/models/test_policy_fast.py``).
"""

from __future__ import annotations

from typing import Any, cast

import torch

from grpokit.backends.base import cache_kwarg, distinct_rows
from grpokit.backends.cpu.shared_prompt import dynamic_prefix_cache


def prefix_cache(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    share: bool,
    static: bool,
    max_len: int,
    prefix: int | None = None,
) -> Any:
    """The KV cache to hand ``generate`` for the prompt rows ``ids`` ``(n, P)``, or None (then
    ``generate`` prefills all rows into its default ``DynamicCache``).

    ``share``: the first ``C`` columns (``prefix``, at most ``P-1``; default ``P-1``) run once per
    distinct such prefix, then are repeated to the rows; ``generate`` runs the rest. A multi-turn
    rollout passes its rows as ``[prompt ; transcript]`` with ``prefix`` = the prompt's width, so
    the G rows of a group share their prompt's pass at every turn. ``static``: the cache is a
    ``StaticCache`` of ``max_len`` positions (the shared prefix, if any, copied into it). Models
    whose layers are not plain growing KV layers get None.
    """
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    n, p = ids.shape
    cols = p - 1 if prefix is None else min(int(prefix), p - 1)
    if dynamic_prefix_cache(model) is None:  # sliding-window / recurrent layers: leave it to generate
        return None
    first, inverse = distinct_rows(ids[:, :cols], mask[:, :cols]) if share and cols > 0 else (torch.arange(n), None)
    shared = inverse is not None and len(first) < n
    if not shared and not static:
        return None
    if static:
        out = StaticCache(config=model.config, max_cache_len=max_len)
        if any(type(layer) is not StaticLayer for layer in out.layers):
            return None
        if not shared:
            return out  # generate prefills it like any cache
    # a DynamicCache of DynamicLayers (checked above for this model), filled below; Any: transformers
    # types its layers as a union of layer kinds and their keys/values as Optional
    prefix_kv: Any = dynamic_prefix_cache(model)
    attn = mask[first, :cols].long()
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)  # as generate numbers left-padded rows
    model(
        input_ids=ids[first, :cols],
        attention_mask=attn,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(model.forward): prefix_kv},
    )  # (U, heads, C, d) per layer
    if not static:
        prefix_kv.batch_select_indices(inverse)  # (U, ...) -> (n, ...)
        return prefix_kv
    for layer, src in zip(out.layers, prefix_kv.layers):  # each a StaticLayer (checked above)
        cast(StaticLayer, layer).update(src.keys[inverse], src.values[inverse])  # written in place at positions 0 … C-1
    return out
