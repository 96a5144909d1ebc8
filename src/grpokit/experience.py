"""One typed batch of experience: what a rollout engine returns and what the loop trains on.

``N = B·G`` completions, grouped by prompt: rows ``b·G … b·G+G-1`` come from prompt ``b``
(``group_index[b·G + g] == b``). Shapes (``P`` prompt width, ``T`` completion width):

- ``prompt_ids``/``prompt_mask`` ``(N, P)`` long/bool, left-padded (mask False on padding);
- ``completion_ids``/``completion_mask`` ``(N, T)`` long/bool, mask True up to and including the
  first EOS;
- ``group_index`` ``(N,)`` long; ``truncated`` ``(N,)`` bool (no EOS within the limit);
- filled in by the loop as it goes: ``rewards`` ``(N,)`` float64 (NaN = unscorable); with
  process supervision ``step_rewards`` ``(N, T)`` float64 (a step's score on its last token, 0
  elsewhere, NaN on unscored steps) and ``step_ends`` ``(N, T)`` bool; ``advantages`` ``(N,)`` or
  ``(N, T)`` float32; ``old_logprobs``/``ref_logprobs`` ``(N, T)`` float32; with a value model
  (PPO) ``old_values``/``returns`` ``(N, T)`` float32 (its estimates at sampling, the GAE targets);
- set by rollout engines that report them (``vllm``; ``hf`` with a truncating sampler):
  ``sampler_logprobs`` ``(N, T)`` float32, the sampler's own log-probs of the sampled tokens at the
  sampling temperature, over the set it drew from (0 on masked tokens);
- set by a truncating sampler (``rollout.top_k``/``top_p``/``min_p`` on the ``hf`` engine):
  ``sampler_support`` ``(N, T, W)``, the set of tokens each token was drawn from
  (:mod:`grpokit.algo.support`: kept ids or a bitmask; empty = not truncated). Every log-prob and
  entropy of the batch (π_old, π_θ, π_ref) is renormalized over it (sampling replay,
  docs/design.md, "Temperature");
- set by multi-turn rollouts (:mod:`grpokit.rollout.multiturn`): ``attention_mask`` ``(N, T)`` bool,
  every completion token the model attends to: its own tokens (``completion_mask``) and the
  environment's (tool results, feedback), which are context but never trained on. None: the
  completion is the model's alone (``completion_mask``). :attr:`Experience.completion_attention`
  is the one to build the forward pass's attention from; every loss, KL, ratio and statistic
  reads ``completion_mask``. ``env_counts``: per-row counts of the episode (``turns``,
  ``tool_calls``, ``env_tokens``, ...), ``{name: (N,) long}``;
- set by the reward pipeline: ``reward_parts``, each reward function's value per row (before its
  weight), ``{function name: (N,) float64}`` (NaN = the function gave None), what ``samples.jsonl``
  shows beside the weighted total ``rewards``.

Slicing (:meth:`Experience.rows`) cuts the columns that are padding in every selected row, per-token
fields along with the ids, so a micro-batch carries exactly the width it needs. Imports only torch
(and :mod:`grpokit.algo.support`, torch alone).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.algo import support as _support

#: per-token fields (N, T) besides the ids: sliced and padded along with ``completion_ids``
TOKEN_FIELDS = (
    "step_rewards",
    "step_ends",
    "old_logprobs",
    "ref_logprobs",
    "old_values",
    "returns",
    "sampler_logprobs",
    "attention_mask",
)
#: per-token fields (N, T, ·): sliced along with the ids like :data:`TOKEN_FIELDS`
TOKEN_ROW_FIELDS = ("sampler_support",)
#: per-row fields held as ``{name: (N,) tensor}``, and the value :meth:`Experience.concat` gives the
#: rows of a part that lacks a name
ROW_DICT_FIELDS = {"env_counts": 0, "reward_parts": float("nan")}


def rank_share(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """The items ``first … last-1`` of ``n`` that ``rank`` takes: contiguous shares in rank order,
    ``rank·n//W … (rank+1)·n//W`` (equal when ``W`` divides ``n``; else they differ by one, and a
    rank may have none). The prompts a rank samples and the groups it trains on
    (:meth:`Experience.shard`).

    >>> rank_share(4, 1, 2), rank_share(3, 0, 2), rank_share(3, 1, 2), rank_share(1, 0, 2)
    ((2, 4), (0, 1), (1, 3), (0, 0))
    """
    return rank * n // world_size, (rank + 1) * n // world_size


@dataclass
class Experience:
    """A batch of grouped completions and what the loop computed for them (module docstring)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    group_index: torch.Tensor
    group_size: int
    truncated: torch.Tensor | None = None
    completions: list[str] = field(default_factory=list)
    rewards: torch.Tensor | None = None
    step_rewards: torch.Tensor | None = None
    step_ends: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    sampler_logprobs: torch.Tensor | None = None
    sampler_support: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    env_counts: dict[str, torch.Tensor] | None = None
    reward_parts: dict[str, torch.Tensor] | None = None
    gen_s: float = 0.0
    """Wall-clock seconds the rollout engine spent generating these rows."""

    def __post_init__(self) -> None:
        n, t = self.completion_ids.shape
        for name in (
            "prompt_ids",
            "prompt_mask",
            "completion_mask",
            "group_index",
            "truncated",
            "rewards",
            "advantages",
            *TOKEN_FIELDS,
            *TOKEN_ROW_FIELDS,
        ):
            v = getattr(self, name)
            if v is not None and v.shape[0] != n:
                raise ValueError(f"Experience.{name}: {v.shape[0]} rows, completion_ids has {n}")
        for name in ("completion_mask", *TOKEN_FIELDS):
            v = getattr(self, name)
            if v is not None and tuple(v.shape) != (n, t):
                raise ValueError(f"Experience.{name}: shape {tuple(v.shape)}, expected (N, T) = {(n, t)}")
        if self.sampler_support is not None:
            _support.check(self.sampler_support, n, t)
        for field_name in ROW_DICT_FIELDS:
            for name, v in (getattr(self, field_name) or {}).items():
                if tuple(v.shape) != (n,):
                    raise ValueError(f"Experience.{field_name}[{name!r}]: shape {tuple(v.shape)}, expected ({n},)")
        am = self.attention_mask
        if am is not None and am.device.type != "meta" and bool((self.completion_mask & ~am.bool()).any()):
            raise ValueError("Experience.attention_mask: False on a token that completion_mask trains on")
        if self.completions and len(self.completions) != n:
            raise ValueError(f"Experience.completions: {len(self.completions)} texts for {n} rows")
        if self.group_size < 1 or n % self.group_size:
            raise ValueError(f"Experience: {n} rows are not whole groups of group_size={self.group_size}")
        if self.group_size > 1 and n and self.group_index.device.type != "meta":  # meta: shapes only
            # the layout every consumer relies on: each group's rows contiguous, group_size of them
            g = self.group_index.view(-1, self.group_size)
            if not bool((g == g[:, :1]).all()):
                raise ValueError(
                    f"Experience.group_index: rows of a group must be {self.group_size} contiguous rows "
                    f"(group_size), got {self.group_index.tolist()}"
                )

    @classmethod
    def grouped(
        cls,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        group_size: int,
        **kw: Any,
    ) -> Experience:
        """An experience whose rows are consecutive groups of ``group_size`` (``group_index`` made here)."""
        n = completion_ids.shape[0]
        index = torch.arange(n // max(group_size, 1), device=completion_ids.device).repeat_interleave(group_size)
        return cls(prompt_ids, prompt_mask, completion_ids, completion_mask, index, group_size, **kw)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def completion_attention(self) -> torch.Tensor:
        """``(N, T)`` bool: the completion tokens attended to (``attention_mask``, else ``completion_mask``)."""
        return self.completion_mask if self.attention_mask is None else self.attention_mask

    @property
    def num_groups(self) -> int:
        """``N / group_size``."""
        return len(self) // self.group_size

    @property
    def device(self) -> torch.device:
        """The device of the ids (every tensor of an experience lives there; :meth:`to` moves them)."""
        return self.completion_ids.device

    def replace(self, **changes: Any) -> Experience:
        """A copy with ``changes`` (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> Experience:
        """Every tensor moved to ``device`` (a copy; tensors already there are shared)."""
        moved: dict = {
            f.name: v.to(device)
            for f in dataclasses.fields(self)
            if isinstance(v := getattr(self, f.name), torch.Tensor)
        }
        return self.replace(**moved, **self._row_dicts(lambda v: v.to(device)))

    def _row_dicts(self, each: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
        """Each of :data:`ROW_DICT_FIELDS` with ``each`` applied to its tensors (None stays None)."""
        return {
            f: None if (d := getattr(self, f)) is None else {k: each(v) for k, v in d.items()} for f in ROW_DICT_FIELDS
        }

    def rows(self, idx: slice | torch.Tensor) -> Experience:
        """Rows ``idx`` (a slice, an index tensor or a bool mask), with the prompt columns that are
        padding in every selected row cut from the left and the completion columns cut from the right.

        The rows keep their ``group_index``; ``group_size`` stays when they are whole groups, each
        contiguous, and is 1 otherwise (a micro-batch cutting through groups: it is for the forward
        pass, never for group statistics).
        """
        if isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
            idx = idx.nonzero().flatten()
        pm, cm = self.prompt_mask[idx], self.completion_mask[idx]
        p_used = pm.any(0).nonzero()
        p0 = int(p_used[0]) if len(p_used) else pm.shape[1] - 1
        c_used = self.completion_attention[idx].any(0).nonzero()
        t1 = int(c_used[-1]) + 1 if len(c_used) else 1
        sel = range(len(self))[idx] if isinstance(idx, slice) else idx.tolist()

        def row(v: Any) -> Any:  # a tensor, or None for a field not set
            return None if v is None else v[idx]

        def tok(v: Any) -> Any:
            return None if v is None else v[idx][:, :t1]

        adv = self.advantages
        return Experience(
            prompt_ids=self.prompt_ids[idx][:, p0:],
            prompt_mask=pm[:, p0:],
            completion_ids=self.completion_ids[idx][:, :t1],
            completion_mask=cm[:, :t1],
            group_index=self.group_index[idx],
            group_size=self._whole_groups(self.group_index[idx]),
            truncated=row(self.truncated),
            completions=[self.completions[i] for i in sel] if self.completions else [],
            rewards=row(self.rewards),
            advantages=None if adv is None else (adv[idx] if adv.dim() == 1 else tok(adv)),
            gen_s=self.gen_s,
            **self._row_dicts(lambda v: v[idx]),
            **{name: tok(getattr(self, name)) for name in (*TOKEN_FIELDS, *TOKEN_ROW_FIELDS)},
        )

    def _whole_groups(self, index: torch.Tensor) -> int:
        """``group_size`` for rows with group numbers ``index`` when they are whole groups, each
        contiguous, else 1."""
        g = self.group_size
        if g == 1 or len(index) % g:
            return 1
        v = index.view(-1, g)
        whole = bool((v == v[:, :1]).all()) and len(set(v[:, 0].tolist())) == v.shape[0]
        return g if whole else 1

    def micro_batches(self, size: int) -> Iterator[tuple[slice, Experience]]:
        """``(rows, experience)`` for consecutive micro-batches of at most ``size`` rows."""
        if size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {size}")
        for start in range(0, len(self), size):
            sl = slice(start, min(start + size, len(self)))
            yield sl, self.rows(sl)

    def select_groups(self, groups: Sequence[int]) -> Experience:
        """The rows whose ``group_index`` is each of ``groups``, in that order, renumbered
        ``0 … len(groups)-1``; the columns keep their width.

        Raises:
            ValueError: a group number that no row carries.
        """
        g = self.group_size
        first = {int(b): i for i, b in reversed(list(enumerate(self.group_index.tolist())))}
        missing = [b for b in groups if int(b) not in first]
        if missing:
            raise ValueError(f"Experience.select_groups: no rows of groups {missing}")
        idx = torch.tensor([first[int(b)] + k for b in groups for k in range(g)], dtype=torch.long, device=self.device)
        sel = idx.tolist()
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, v in out.items():
            if isinstance(v, torch.Tensor):
                out[name] = v[idx]
        out["completions"] = [self.completions[i] for i in sel] if self.completions else []
        out.update(self._row_dicts(lambda v: v[idx]))
        out["group_index"] = torch.arange(len(groups), device=self.device).repeat_interleave(g)
        return Experience(**out)

    def shard(self, rank: int, world_size: int) -> Experience:
        """Rank ``rank``'s share of whole groups (:func:`rank_share`: equal shares when ``W`` divides
        ``B``, as ``train.prompts_per_step`` must; a dynamic-sampling batch of fewer groups splits into
        shares one group apart, and a rank may get none).

        Raises:
            ValueError: ``rank`` is outside ``0 … world_size-1``.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"Experience.shard: rank {rank} outside 0..{world_size - 1}")
        return self.select_groups(range(*rank_share(self.num_groups, rank, world_size)))

    def padded_share(self, rank: int, world_size: int) -> tuple[Experience, torch.Tensor]:
        """Rank ``rank``'s share (:meth:`shard`) topped up to ``ceil(B/W)`` groups with copies of group
        0, so that every rank feeds the model the same number of rows: under FSDP2 each forward gathers
        every layer on every rank, so the ranks must run equal numbers of micro-batches (a dynamic
        sampling batch of fewer groups than ``train.prompts_per_step`` splits unevenly). The copies
        attend as sampled (``attention_mask``) but none of their tokens counts (``completion_mask``
        False, advantages 0).

        Returns:
            ``(share, real)``: ``real`` ``(N_share,)`` bool, False on the copies (the update's
            ``keep_rows``: they are left out of the batch's counts too).

        Raises:
            ValueError: ``rank`` is outside ``0 … world_size-1``.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"Experience.padded_share: rank {rank} outside 0..{world_size - 1}")
        first, last = rank_share(self.num_groups, rank, world_size)
        pad = -(-self.num_groups // world_size) - (last - first)
        share = self.select_groups([*range(first, last), *[0] * pad])
        real = torch.ones(len(share), dtype=torch.bool, device=share.device)
        if pad:
            real[(last - first) * self.group_size :] = False
            share.attention_mask = share.completion_attention.clone()
            share.completion_mask = share.completion_mask & real[:, None]
            if share.advantages is not None:
                adv = share.advantages
                share.advantages = torch.where(real[:, None] if adv.dim() == 2 else real, adv, torch.zeros_like(adv))
        return share, real

    @staticmethod
    def concat(parts: Sequence[Experience], pad_id: int) -> Experience:
        """One experience holding the groups of ``parts`` in order (same ``group_size``): prompts
        left-padded and completions right-padded with ``pad_id`` (masks False, per-token fields 0
        on the padding), group indices renumbered, ``gen_s`` summed.

        Raises:
            ValueError: ``parts`` empty, or group sizes differ.
        """
        if not parts:
            raise ValueError("Experience.concat: no experience given")
        g = parts[0].group_size
        if any(e.group_size != g for e in parts):
            raise ValueError(f"Experience.concat: group sizes differ: {[e.group_size for e in parts]}")
        p = max(e.prompt_ids.shape[1] for e in parts)
        t = max(e.completion_ids.shape[1] for e in parts)

        def pad(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
            extra = width - x.shape[1]
            return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)

        def cat(name: str, width: int | None = None, value: float = 0, left: bool = False) -> Any:
            # the parts' field joined; None where no part sets it
            vals = [getattr(e, name) for e in parts]
            if all(v is None for v in vals):
                return None
            if any(v is None for v in vals):
                raise ValueError(f"Experience.concat: {name} set in some parts only")
            if width is not None or (vals[0].dim() == 2 and name == "advantages"):
                vals = [pad(v, width or t, value, left) for v in vals]
            return torch.cat(vals)

        n_groups = sum(e.num_groups for e in parts)
        row_dicts: dict[str, Any] = {
            f: _concat_row_dicts([getattr(e, f) for e in parts], [len(e) for e in parts], fill)
            for f, fill in ROW_DICT_FIELDS.items()
        }
        return Experience(
            prompt_ids=cat("prompt_ids", p, pad_id, True),
            prompt_mask=cat("prompt_mask", p, False, True),
            completion_ids=cat("completion_ids", t, pad_id),
            completion_mask=cat("completion_mask", t, False),
            group_index=torch.arange(n_groups, device=parts[0].device).repeat_interleave(g),
            group_size=g,
            truncated=cat("truncated"),
            completions=[c for e in parts for c in e.completions],
            rewards=cat("rewards"),
            advantages=cat("advantages"),
            gen_s=sum(e.gen_s for e in parts),
            step_rewards=cat("step_rewards", t, 0.0),
            step_ends=cat("step_ends", t, False),
            old_logprobs=cat("old_logprobs", t),
            ref_logprobs=cat("ref_logprobs", t),
            sampler_logprobs=cat("sampler_logprobs", t),
            sampler_support=_concat_supports([e.sampler_support for e in parts], t),
            **row_dicts,
            attention_mask=None
            if all(e.attention_mask is None for e in parts)
            else torch.cat([pad(e.completion_attention, t, False, False) for e in parts]),
        )


def _concat_supports(parts: list[torch.Tensor | None], t: int) -> torch.Tensor | None:
    """The parts' ``sampler_support`` in one form (:func:`grpokit.algo.support.unify`), each padded to
    ``t`` positions (empty: not truncated), joined; None if no part has one.

    Raises:
        ValueError: some parts have one and others not (a batch half replayed would mix distributions).
    """
    if all(p is None for p in parts):
        return None
    if any(p is None for p in parts):
        raise ValueError("Experience.concat: sampler_support set in some parts only")
    return torch.cat([_support.pad_positions(p, t) for p in _support.unify([p for p in parts if p is not None])])


def _concat_row_dicts(
    parts: list[dict[str, torch.Tensor] | None], sizes: list[int], fill: float
) -> dict[str, torch.Tensor] | None:
    """The parts' ``{name: (n,) tensor}`` joined in order (a name a part lacks is ``fill`` on its
    rows, in the dtype the other parts give it); None if no part has any."""
    if all(c is None for c in parts):
        return None
    names = sorted({k for c in parts for k in (c or {})})
    out = {}
    for k in names:
        like = next(c[k] for c in parts if c and k in c)
        out[k] = torch.cat(
            [
                (c or {}).get(k, torch.full((n,), fill, dtype=like.dtype, device=like.device))
                for c, n in zip(parts, sizes)
            ]
        )
    return out
