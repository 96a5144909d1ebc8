"""What a multi-turn rollout does to one row between two decode steps, whichever loop batches the
turns (:mod:`grpokit.rollout.multiturn`'s lockstep, :mod:`grpokit.rollout.continuous`): the row's
transcript (:class:`RowTranscript`), a turn's seed (:func:`turn_seed`), where a turn ends
(:func:`cut_turn`), keeping a turn (:func:`keep_turn`), the episodes' answers
(:func:`ask_episodes`) and appending an observation (:func:`append_observation`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpokit.envs.base import Episode, Observation
from grpokit.rollout.engine import request_seed

__all__ = [
    "PARALLEL_STEPS",
    "RowTranscript",
    "append_observation",
    "ask_episodes",
    "cut_turn",
    "keep_turn",
    "turn_seed",
]

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
    """One row's turns: ``ids`` the transcript's token ids, ``model`` True on the model's tokens."""

    ids: list[int] = field(default_factory=list)
    model: list[bool] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, ids: Sequence[int], by_model: bool) -> None:
        self.ids.extend(int(i) for i in ids)
        self.model.extend([by_model] * len(ids))

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
) -> tuple[str, str] | None:
    """Keep the turn's tokens in ``t``; ``(its text, "eos" | "stop")`` for the episode to answer, or
    None when a token limit ended the row."""
    kept, how = cut_turn(tokenizer, new, eos, stops, limit)
    start = len(t.ids)
    t.add(new[:kept], True)
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
    text = obs.text or ""
    if obs.role is not None and text:
        from grpokit.rollout.chat_turns import chat_message_text

        text = chat_message_text(tokenizer, obs.role, text, after_eos=how == "eos")
    env_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(t.ids) + len(env_ids) + 1 > budget:
        t.done, t.truncated = True, True
        t.count({"budget_cut": 1})
        return
    t.add(env_ids, False)
    t.count({"env_tokens": len(env_ids)})
