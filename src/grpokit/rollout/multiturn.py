"""Multi-turn rollouts with Hugging Face ``generate``: the model writes a turn, an environment
(:mod:`grpokit.envs`) answers, the model goes on; one token sequence per row.

For each of the ``N = B·G`` rows (grouped as :func:`grpokit.rollout.hf.generate_rollouts` groups them),
turn ``k = 0, 1, …`` (at most ``max_turns``):

1. the row's context is its prompt and its transcript so far, as token ids (never re-tokenized);
   the active rows are left-padded and sampled by one batched ``generate`` (the backend's fast
   paths, the inverse-CDF sampler), at most ``max_new_tokens`` tokens and what the row's budget
   ``max_total_tokens`` leaves, stopping a row at an EOS or at the first of the environment's
   ``stop_strings`` its turn contains (checked on the decoded last tokens at every decode step);
2. the turn's tokens are kept as sampled, up to and including the EOS or the token that completes
   the stop string (tokens a row drew after that are dropped);
3. a turn that ended at an EOS or a stop string goes to the row's episode
   (:meth:`grpokit.envs.Episode.step`); its observation text (with ``Observation.role``, first
   rendered as a chat message by :mod:`grpokit.rollout.chat_turns`) is tokenized once (no special
   tokens added) and appended, unless the episode is done, ``max_turns`` are used, or it would not fit the
   budget with one more model token. A turn cut by a token limit ends the row (``truncated``).

Seeding (inverse-CDF sampler): turn ``k`` of row ``(b, g)`` draws from
``request_seed(turn_seed(seed, k), first_prompt + b, g)`` (:func:`turn_seed`; turn 0 uses ``seed``
itself, so a row that calls no tool samples what the single-turn engine samples), so a row's tokens
depend on its own seed and transcript alone, whatever rows share the call.

The :class:`~grpokit.experience.Experience`: ``completion_ids`` the whole transcript (model and
environment tokens), ``completion_mask`` True on the model's tokens only, ``attention_mask`` True on
all of them; ``completions`` the transcript decoded without special tokens.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from grpokit.backends import model_device
from grpokit.envs.base import Environment, Episode, Observation
from grpokit.experience import Experience
from grpokit.rollout.engine import SamplingParams, check_prompts, request_seed

if TYPE_CHECKING:
    from grpokit.config import RolloutConfig

__all__ = ["ENV_COUNTS", "MultiTurnEngine", "RowTranscript", "env_options", "generate_multiturn", "turn_seed"]

#: the most episodes stepping at once, for an environment with ``parallel_steps``
PARALLEL_STEPS = 8

#: the per-row counts a multi-turn rollout reports (besides an environment's own)
ENV_COUNTS = ("turns", "env_tokens", "budget_cut")


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


def _turn_inputs(
    prompts: list[list[int]], transcripts: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """``(ids, mask, prefix)`` of a turn's rows. Turn 0 (no transcript yet): the prompts left-padded,
    prefix None. Later turns: ``[prompt block ; transcript block]``, each left-padded on its own
    (so a row can have padding between its prompt and its transcript), prefix = the prompt block's
    width, so a backend that shares prompts (the cpu backend) runs each distinct prompt once per
    turn and only the transcripts per row. Padding is masked out and position ids count real tokens, so the
    model sees each row as ``prompt + transcript``."""
    from grpokit.rollout.hf import left_padded

    p_ids, p_mask = left_padded(prompts, pad_id)
    if not any(transcripts):
        return p_ids, p_mask, None
    t_ids, t_mask = left_padded(transcripts, pad_id)
    return torch.cat([p_ids, t_ids], 1), torch.cat([p_mask, t_mask], 1), p_ids.shape[1]


class _StopAtText:
    """A ``StoppingCriteria``: True for the rows whose new tokens (after ``width`` columns) end in
    text holding one of ``stops`` (decoded from the last ``tail`` tokens)."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], width: int):
        self.tokenizer, self.stops, self.width = tokenizer, list(stops), width
        self.tail = max(len(s) for s in self.stops) + 2  # a token holds at least one character

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> torch.Tensor:
        new = input_ids[:, self.width :]
        texts = self.tokenizer.batch_decode(new[:, -self.tail :].tolist(), skip_special_tokens=False)
        return torch.tensor([any(s in t for s in self.stops) for t in texts], dtype=torch.bool, device=input_ids.device)


def _cut_turn(tokenizer: Any, new: list[int], eos: set[int], stops: Sequence[str], limit: int) -> tuple[int, str]:
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


def generate_multiturn(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    group_size: int,
    params: SamplingParams,
    *,
    env: Environment,
    rows: Sequence[Mapping[str, Any]],
    eos_token_ids: Sequence[int],
    max_turns: int,
    max_total_tokens: int | None = None,
    chunk_size: int | None = None,
    seed: int | None = None,
    first_prompt: int = 0,
    sampler_dtype: torch.dtype | None = None,
    share_prompt: bool = True,
    static_cache: bool = True,
    packed_weights: bool = True,
) -> Experience:
    """Sample ``group_size`` multi-turn transcripts per prompt with ``env`` (module docstring).

    Args:
        model, tokenizer, prompts, group_size, params, eos_token_ids, chunk_size, seed,
            first_prompt, sampler_dtype, share_prompt, static_cache, packed_weights: as
            :func:`grpokit.rollout.hf.generate_rollouts` (``params.max_new_tokens``: per turn).
        env: the environment; each row's episode starts from ``rows[b]`` (prompt ``b``'s columns).
        rows: ``B`` mappings, the dataset rows of ``prompts``.
        max_turns: model turns per row (>= 1).
        max_total_tokens: the most transcript tokens per row (model and environment); None =
            ``max_turns · max_new_tokens``.

    Returns:
        :class:`~grpokit.experience.Experience` with ``attention_mask`` set, and ``env_counts``:
        per-row counts (``turns``, ``env_tokens``, ``budget_cut``, and the episodes' own such as
        ``tool_calls``) as ``{name: (N,) long tensor}``.

    Raises:
        ValueError: as ``generate_rollouts``; ``len(rows) != len(prompts)``; ``max_turns < 1``;
            ``max_total_tokens < 1``.
    """
    from grpokit.rollout import hf

    check_prompts(prompts, group_size, first_prompt)
    params.validate()
    if len(rows) != len(prompts):
        raise ValueError(f"generate_multiturn: {len(rows)} rows for {len(prompts)} prompts")
    if max_turns < 1:
        raise ValueError(f"rollout.max_turns must be >= 1, got {max_turns}")
    budget = max_turns * params.max_new_tokens if max_total_tokens is None else int(max_total_tokens)
    if budget < 1:
        raise ValueError(f"rollout.max_total_tokens must be >= 1, got {max_total_tokens}")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("tokenizer has no pad token; load it with grpokit.models.loading.load_tokenizer")
    eos = [int(i) for i in eos_token_ids]
    if not eos:
        raise ValueError("eos_token_ids is empty; pass at least one EOS id")
    from grpokit.models.loading import encode_prompts

    G, device = group_size, model_device(model)
    prompt_lists = encode_prompts(tokenizer, list(prompts))
    episodes: list[Episode] = [env.start(rows[b]) for b in range(len(prompts)) for _ in range(G)]
    rows_t = [RowTranscript() for _ in episodes]
    stops, eos_set = list(env.stop_strings), set(eos)
    stopping = (lambda w: _StopAtText(tokenizer, stops, w)) if stops else None
    t0 = time.perf_counter()
    for k in range(max_turns):
        active = [r for r, t in enumerate(rows_t) if not t.done]
        if not active:
            break
        limits = {r: min(params.max_new_tokens, budget - len(rows_t[r].ids)) for r in active}
        turn_params = replace(params, max_new_tokens=max(limits.values()))
        prompts_k, transcripts_k = [prompt_lists[r // G] for r in active], [rows_t[r].ids for r in active]
        ids, mask, prefix = _turn_inputs(prompts_k, transcripts_k, pad_id)
        uniforms = None
        if seed is not None and turn_params.temperature > 0 and turn_params.sampler == "inverse_cdf":
            from grpokit.rollout.sampling import row_uniforms

            rows_k = [(first_prompt + r // G, r % G) for r in active]
            uniforms = row_uniforms(turn_seed(seed, k), rows_k, turn_params.max_new_tokens).to(device)
        gen_config = hf.build_generation_config(
            turn_params, eos_token_ids=eos, pad_token_id=pad_id, bos_token_id=tokenizer.bos_token_id
        )
        chunks = hf._generate_chunks(
            model,
            ids.to(device),
            mask.to(device),
            turn_params,
            gen_config,
            uniforms,
            rows=len(active) if chunk_size is None else chunk_size,
            seed=None if seed is None else turn_seed(seed, k),
            share_prompt=share_prompt,
            static_cache=static_cache,
            sampler_dtype=sampler_dtype,
            packed_weights=packed_weights,
            stopping=stopping,
            prefix=prefix,
        )
        new_rows = [row for c in chunks for row in c.tolist()]
        asks = []  # (row, the turn's text, how it ended): the turns an episode answers
        for r, new in zip(active, new_rows):
            ask = _keep_turn(tokenizer, rows_t[r], new, eos_set, stops, limits[r], budget)
            if ask is not None:
                asks.append((r, *ask))
        answers = _ask_episodes(episodes, asks, parallel=bool(getattr(env, "parallel_steps", False)))
        for (r, _, how), obs in zip(asks, answers):
            _append_observation(tokenizer, rows_t[r], obs, how, k, max_turns, budget)
    return _experience(tokenizer, prompt_lists, rows_t, G, pad_id, device, time.perf_counter() - t0)


def _keep_turn(
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
    kept, how = _cut_turn(tokenizer, new, eos, stops, limit)
    start = len(t.ids)
    t.add(new[:kept], True)
    t.count({"turns": 1})
    if how == "limit":  # the turn's token limit or the row's budget
        t.done, t.truncated = True, True
        t.count({"budget_cut": int(len(t.ids) >= budget)})
        return None
    return tokenizer.decode(t.ids[start:], skip_special_tokens=True), how


def _ask_episodes(
    episodes: Sequence[Episode], asks: list[tuple[int, str, str]], *, parallel: bool
) -> list[Observation]:
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


def _append_observation(
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


def _experience(
    tokenizer: Any,
    prompt_lists: list[list[int]],
    rows_t: list[RowTranscript],
    group_size: int,
    pad_id: int,
    device: torch.device,
    gen_s: float,
) -> Experience:
    """The transcripts as an :class:`Experience` (module docstring), per-row counts in ``env_counts``."""
    from grpokit.rollout.hf import left_padded

    n = len(rows_t)
    t_width = max(1, max(len(t.ids) for t in rows_t))
    prompt_ids, prompt_mask = left_padded([prompt_lists[r // group_size] for r in range(n)], pad_id)
    completion_ids = torch.full((n, t_width), int(pad_id), dtype=torch.long)
    completion_mask = torch.zeros((n, t_width), dtype=torch.bool)
    attention = torch.zeros((n, t_width), dtype=torch.bool)
    for r, t in enumerate(rows_t):
        if t.ids:
            completion_ids[r, : len(t.ids)] = torch.tensor(t.ids, dtype=torch.long)
            completion_mask[r, : len(t.ids)] = torch.tensor(t.model, dtype=torch.bool)
            attention[r, : len(t.ids)] = True
    names = sorted({*ENV_COUNTS, *(k for t in rows_t for k in t.counts)})
    counts = {k: torch.tensor([t.counts.get(k, 0) for t in rows_t], dtype=torch.long) for k in names}
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
        gen_s=gen_s,
    )


def env_options(r: RolloutConfig) -> dict[str, Any] | None:
    """The :class:`MultiTurnEngine` arguments of a recipe's ``rollout`` section (the environment
    ``rollout.env`` built with ``rollout.env_options``, ``max_turns``, ``max_total_tokens``), or None
    without ``rollout.env``: what training, in-run evaluation and ``grpokit eval`` sample with.

    Raises:
        ValueError, ImportError: what :func:`grpokit.envs.load_env` raises (names ``rollout.env``).
    """
    from grpokit.envs import load_env

    if r.env is None:
        return None
    return dict(env=load_env(r.env, r.env_options), max_turns=r.max_turns, max_total_tokens=r.max_total_tokens)


class MultiTurnEngine:
    """The ``hf`` engine with an environment (``rollout.env``): :func:`generate_multiturn` on the
    trained model. ``generate`` takes the prompts' dataset ``rows`` (``wants_rows``)."""

    wants_rows = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        env: Environment,
        eos_token_ids: Sequence[int],
        max_turns: int,
        max_total_tokens: int | None = None,
        chunk_size: int | None = None,
        sampler_dtype: torch.dtype | None = None,
    ):
        self.model, self.tokenizer, self.env = model, tokenizer, env
        self.eos_token_ids, self.max_turns, self.max_total_tokens = list(eos_token_ids), max_turns, max_total_tokens
        self.chunk_size, self.sampler_dtype = chunk_size, sampler_dtype
        self.generate_options: dict[str, Any] = {}

    def generate(
        self,
        prompts: list[str],
        group_size: int,
        sampling: SamplingParams,
        seed: int,
        first_prompt: int = 0,
        rows: Sequence[Mapping[str, Any]] | None = None,
    ) -> Experience:
        """:func:`generate_multiturn` (``rows``: the prompts' dataset rows; None: empty rows)."""
        return generate_multiturn(
            self.model,
            self.tokenizer,
            prompts,
            group_size,
            sampling,
            env=self.env,
            rows=[{} for _ in prompts] if rows is None else rows,
            eos_token_ids=self.eos_token_ids,
            max_turns=self.max_turns,
            max_total_tokens=self.max_total_tokens,
            chunk_size=self.chunk_size,
            seed=seed,
            first_prompt=first_prompt,
            sampler_dtype=self.sampler_dtype,
            **self.generate_options,
        )

    def sync_weights(self) -> None:
        """Nothing to do: the trained model samples."""
