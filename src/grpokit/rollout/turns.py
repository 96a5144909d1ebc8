"""What a multi-turn rollout does to one row between two decode steps, whichever loop batches the
turns (:mod:`grpokit.rollout.multiturn`'s lockstep, :mod:`grpokit.rollout.continuous`): the row's
transcript (:class:`RowTranscript`), a turn's seed (:func:`turn_seed`), where a turn ends
(:func:`cut_turn`), keeping a turn (:func:`keep_turn`), the episodes' answers
(:func:`ask_episodes`), appending an observation (:func:`append_observation`) and the rows'
transcripts as one :class:`~grpokit.experience.Experience` (:func:`transcripts_experience`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.envs.base import Episode, Observation
from grpokit.experience import Experience
from grpokit.rollout.engine import request_seed

__all__ = [
    "ENV_COUNTS",
    "PARALLEL_STEPS",
    "RowTranscript",
    "append_observation",
    "ask_episodes",
    "cut_turn",
    "keep_turn",
    "transcripts_experience",
    "turn_seed",
]

#: the per-row counts a multi-turn rollout reports (besides an environment's own)
ENV_COUNTS = ("turns", "env_tokens", "budget_cut")

#: the most episodes stepping at once, for an environment with ``parallel_steps``
PARALLEL_STEPS = 8


def turn_seed(seed: int, turn: int) -> int:
    """The seed of turn ``turn`` of a ``generate(…, seed)`` call: ``seed`` for turn 0, else a hash of both.

    >>> turn_seed(7, 0), turn_seed(7, 1) == turn_seed(7, 1) != turn_seed(7, 2)
    (7, True)
    """
    return int(seed) if turn == 0 else request_seed(int(seed), 2**40 + int(turn), 0)


@dataclass
class RowTranscript:
    """One row's turns: ``ids`` the transcript's token ids, ``model`` True on the model's tokens,
    ``logprobs`` the sampler's log-prob of each model token where the engine reports them (0.0 on
    the environment's tokens and where it does not), ``supports`` the set each model token was
    drawn from where a truncating sampler recorded it (sampling replay: a ``(W,)`` tensor of
    :mod:`grpokit.algo.support`; None on the environment's tokens and where it did not)."""

    ids: list[int] = field(default_factory=list)
    model: list[bool] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    logprobs: list[float] = field(default_factory=list)
    supports: list[torch.Tensor | None] = field(default_factory=list)

    def add(
        self,
        ids: Sequence[int],
        by_model: bool,
        logprobs: Sequence[float] | None = None,
        supports: Sequence[torch.Tensor] | None = None,
    ) -> None:
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"RowTranscript.add: {len(ids)} tokens but {len(logprobs)} log-probs")
        if supports is not None and len(supports) != len(ids):
            raise ValueError(f"RowTranscript.add: {len(ids)} tokens but {len(supports)} supports")
        self.ids.extend(int(i) for i in ids)
        self.model.extend([by_model] * len(ids))
        self.logprobs.extend([0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs])
        self.supports.extend([None] * len(ids) if supports is None else list(supports))

    def count(self, counts: Mapping[str, int]) -> None:
        for k, v in counts.items():
            self.counts[k] = self.counts.get(k, 0) + int(v)


def cut_turn(tokenizer: Any, new: list[int], eos: set[int], stops: Sequence[str], limit: int) -> tuple[int, str]:
    """``(kept, how)``: the turn's first ``kept`` tokens, ending at the first EOS (``how="eos"``), the
    token completing the first stop string (``"stop"``), or the token limit (``"limit"``)."""
    new = new[:limit]
    end_eos = next((i for i, t in enumerate(new) if t in eos), None)
    upto = len(new) if end_eos is None else end_eos
    if stops and any(s in tokenizer.decode(new[:upto], skip_special_tokens=False) for s in stops):
        for j in range(1, upto + 1):  # the shortest prefix that holds a stop string
            if any(s in tokenizer.decode(new[:j], skip_special_tokens=False) for s in stops):
                return j, "stop"
    if end_eos is not None:
        return end_eos + 1, "eos"
    return len(new), "limit"


def keep_turn(
    tokenizer: Any,
    t: RowTranscript,
    new: list[int],
    eos: set[int],
    stops: Sequence[str],
    limit: int,
    budget: int,
    logprobs: Sequence[float] | None = None,
    supports: Sequence[torch.Tensor] | None = None,
) -> tuple[str, str] | None:
    """Keep the turn's tokens in ``t`` (and the sampler's ``logprobs`` of them and the ``supports``
    they were drawn from, one per token of ``new``, where given); ``(its text, "eos" | "stop")`` for
    the episode to answer, or None when a token limit ended the row."""
    kept, how = cut_turn(tokenizer, new, eos, stops, limit)
    start = len(t.ids)
    t.add(
        new[:kept],
        True,
        None if logprobs is None else list(logprobs)[:kept],
        None if supports is None else list(supports)[:kept],
    )
    t.count({"turns": 1})
    if how == "limit":  # the turn's token limit or the row's budget
        t.done, t.truncated = True, True
        t.count({"budget_cut": int(len(t.ids) >= budget)})
        return None
    return tokenizer.decode(t.ids[start:], skip_special_tokens=True), how


def ask_episodes(episodes: Sequence[Episode], asks: list[tuple[int, str, str]], *, parallel: bool) -> list[Observation]:
    """Each asked episode's answer to its turn, in order; with ``parallel`` (an environment whose
    ``parallel_steps`` is True: its episodes may step at once, e.g. tools that wait on processes)
    up to :data:`PARALLEL_STEPS` at a time in threads, so a slow call holds the round for its own
    time, not the sum of all."""

    def ask(item: tuple[int, str, str]) -> Observation:
        r, text, how = item
        return episodes[r].step(text, ended_by_eos=how == "eos")

    if not parallel or len(asks) < 2:
        return [ask(a) for a in asks]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(PARALLEL_STEPS, len(asks)), thread_name_prefix="grpokit-env") as pool:
        return list(pool.map(ask, asks))


def observation_ids(tokenizer: Any, obs: Observation, *, after_eos: bool) -> list[int]:
    """The token ids appended for ``obs``: its text tokenized as plain text, so a special token's
    string in it (``<|im_end|>``, ``<|im_start|>user``) stays characters and never becomes the
    control token (issue #57: a tool's output cannot forge a turn); with ``obs.role``, the chat
    template's own message frame around it (:func:`grpokit.rollout.chat_turns.chat_message_parts`)
    keeps its special tokens."""
    text = obs.text or ""
    if not text:
        return []
    plain = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if obs.role is None:
        return list(plain)
    from grpokit.rollout.chat_turns import chat_message_parts

    before, after = chat_message_parts(tokenizer, obs.role, after_eos=after_eos)
    frame = [tokenizer(x, add_special_tokens=False)["input_ids"] if x else [] for x in (before, after)]
    return [*frame[0], *plain, *frame[1]]


def append_observation(
    tokenizer: Any, t: RowTranscript, obs: Observation, how: str, turn: int, max_turns: int, budget: int
) -> None:
    """Count the episode's answer in ``t``, then append its observation or end the row."""
    t.count(obs.counts)
    if obs.done:
        t.done = True
        return
    if turn + 1 >= max_turns:  # no turn left to answer the observation
        t.done, t.truncated = True, how != "eos"
        return
    env_ids = observation_ids(tokenizer, obs, after_eos=how == "eos")
    if len(t.ids) + len(env_ids) + 1 > budget:
        t.done, t.truncated = True, True
        t.count({"budget_cut": 1})
        return
    t.add(env_ids, False)
    t.count({"env_tokens": len(env_ids)})


def transcripts_experience(
    tokenizer: Any,
    prompt_lists: list[list[int]],
    rows_t: list[RowTranscript],
    group_size: int,
    pad_id: int,
    device: torch.device,
    gen_s: float,
    *,
    with_logprobs: bool = False,
) -> Experience:
    """The ``N`` transcripts as an :class:`Experience`: ``completion_ids`` ``(N, T)`` the whole
    transcript (model and environment tokens, right-padded with ``pad_id``), ``completion_mask`` True
    on the model's tokens only, ``attention_mask`` True on all of them; prompts left-padded (row
    ``r`` has prompt ``r // group_size``); ``completions`` the transcripts decoded without special
    tokens; ``env_counts`` the per-row counts (:data:`ENV_COUNTS` and the episodes' own) as
    ``{name: (N,) long}``; with ``with_logprobs``, ``sampler_logprobs`` ``(N, T)`` float32 from
    :attr:`RowTranscript.logprobs` (0 off the model's tokens). Where the transcripts carry
    :attr:`RowTranscript.supports` (sampling replay), ``sampler_support`` ``(N, T, W)`` too (empty
    on the environment's tokens and the padding) and ``sampler_logprobs`` whatever ``with_logprobs``."""
    from grpokit.rollout.hf import left_padded

    n = len(rows_t)
    t_width = max(1, max(len(t.ids) for t in rows_t))
    prompt_ids, prompt_mask = left_padded([prompt_lists[r // group_size] for r in range(n)], pad_id)
    completion_ids = torch.full((n, t_width), int(pad_id), dtype=torch.long)
    completion_mask = torch.zeros((n, t_width), dtype=torch.bool)
    attention = torch.zeros((n, t_width), dtype=torch.bool)
    sampler = torch.zeros((n, t_width), dtype=torch.float32)
    for r, t in enumerate(rows_t):
        if t.ids:
            completion_ids[r, : len(t.ids)] = torch.tensor(t.ids, dtype=torch.long)
            completion_mask[r, : len(t.ids)] = torch.tensor(t.model, dtype=torch.bool)
            attention[r, : len(t.ids)] = True
            sampler[r, : len(t.ids)] = torch.tensor(t.logprobs, dtype=torch.float32)
    names = sorted({*ENV_COUNTS, *(k for t in rows_t for k in t.counts)})
    counts = {k: torch.tensor([t.counts.get(k, 0) for t in rows_t], dtype=torch.long) for k in names}
    support = _transcripts_support(rows_t, t_width)
    with_logprobs = with_logprobs or support is not None
    sampler_logprobs = sampler.masked_fill(~completion_mask, 0.0).to(device) if with_logprobs else None
    return Experience.grouped(
        prompt_ids.to(device),
        prompt_mask.to(device),
        completion_ids.to(device),
        completion_mask.to(device),
        group_size,
        truncated=torch.tensor([t.truncated for t in rows_t], dtype=torch.bool, device=device),
        completions=tokenizer.batch_decode([t.ids for t in rows_t], skip_special_tokens=True),
        attention_mask=attention.to(device),
        env_counts={k: v.to(device) for k, v in counts.items()},
        sampler_logprobs=sampler_logprobs,
        sampler_support=None if support is None else support.to(device),
        gen_s=gen_s,
    )


def _transcripts_support(rows_t: list[RowTranscript], t_width: int) -> torch.Tensor | None:
    """``(N, t_width, W)``: each model token's recorded set (:attr:`RowTranscript.supports`) at its
    place, in one form (:func:`grpokit.algo.support.unify`), empty elsewhere; None when no token has one."""
    from grpokit.algo import support as sup

    where = [(r, j) for r, t in enumerate(rows_t) for j, s in enumerate(t.supports) if s is not None]
    if not where:
        return None
    parts = sup.unify([s for t in rows_t for s in t.supports if s is not None])  # each (W,)
    out = sup.pad_positions(parts[0].new_empty((len(rows_t), 0, parts[0].shape[-1])), t_width)
    r_idx, j_idx = (torch.tensor(x, dtype=torch.long) for x in zip(*where))
    out[r_idx, j_idx] = torch.stack(parts).to(out.device)
    return out
