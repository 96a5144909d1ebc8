"""Multi-turn rollouts with Hugging Face ``generate``: the model writes a turn, an environment
(:mod:`grpokit.envs`) answers, the model goes on; one token sequence per row.

How the rows' turns are batched (``turn_batching``): ``"continuous"`` (the default) runs one decode
loop in which a row resumes right after its environment answers, its KV cache kept across turns
(:mod:`grpokit.rollout.continuous`; the same tokens as lockstep); ``"lockstep"`` runs the steps
below, one batched ``generate`` per turn. For each of the ``N = B·G`` rows (grouped as
:func:`grpokit.rollout.hf.generate_rollouts` groups them), turn ``k = 0, 1, …`` (at most ``max_turns``):

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

Sampling replay (a truncating warper, :func:`grpokit.rollout.hf.records_support`): each model token
keeps the set it was drawn from and the sampler's log-prob of it, in both loops; the experience
carries them as ``sampler_support`` (empty on the environment's tokens) and ``sampler_logprobs``.

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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from grpokit.backends import model_device
from grpokit.envs.base import Environment, Episode
from grpokit.experience import Experience
from grpokit.rollout.engine import SamplingParams, check_prompts
from grpokit.rollout.turns import (
    ENV_COUNTS,
    RowTranscript,
    append_observation,
    ask_episodes,
    keep_turn,
    transcripts_experience,
    turn_seed,
)

if TYPE_CHECKING:
    from grpokit.config import RolloutConfig

__all__ = [
    "ENV_COUNTS",
    "TURN_BATCHING",
    "MultiTurnEngine",
    "RowTranscript",
    "env_options",
    "generate_multiturn",
    "turn_seed",
]

#: the values of ``rollout.turn_batching``: how a multi-turn rollout batches its rows' turns
TURN_BATCHING = ("continuous", "continuous_overlap", "lockstep")


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
    turn_batching: str = "continuous",
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
        turn_batching: ``"continuous"`` (:mod:`grpokit.rollout.continuous`: one decode loop, each
            row's KV cache kept across its turns; lockstep where it does not apply),
            ``"continuous_overlap"`` (the same, a ``parallel_steps`` environment answering while
            the other rows decode: same tokens up to float rounding) or ``"lockstep"`` (one
            ``generate`` per turn, the steps 1-3 above). Same tokens.

    Returns:
        :class:`~grpokit.experience.Experience` with ``attention_mask`` set, and ``env_counts``:
        per-row counts (``turns``, ``env_tokens``, ``budget_cut``, and the episodes' own such as
        ``tool_calls``) as ``{name: (N,) long tensor}``.

    Raises:
        ValueError: as ``generate_rollouts``; ``len(rows) != len(prompts)``; ``max_turns < 1``;
            ``max_total_tokens < 1``; an unknown ``turn_batching``.
    """
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
    stops = list(env.stop_strings)
    parallel = bool(getattr(env, "parallel_steps", False))
    t0 = time.perf_counter()
    if turn_batching not in TURN_BATCHING:
        raise ValueError(f"rollout.turn_batching must be one of {TURN_BATCHING}, got {turn_batching!r}")
    from grpokit.rollout import continuous

    run = _Rollout(
        model, tokenizer, prompt_lists, rows_t, episodes, params, G, budget, max_turns, eos, stops, seed,
        first_prompt, parallel, pad_id, chunk_size, sampler_dtype, share_prompt, packed_weights,
    )  # fmt: skip
    if turn_batching.startswith("continuous") and continuous.applies(model, params):
        _continuous(run, overlap=turn_batching == "continuous_overlap")
    else:
        _lockstep(run, static_cache=static_cache)
    return transcripts_experience(tokenizer, prompt_lists, rows_t, G, pad_id, device, time.perf_counter() - t0)


@dataclass
class _Rollout:
    """What both turn-batching loops take: the sampling model and its rows (prompts, transcripts
    filled in place, episodes), and :func:`generate_multiturn`'s settings."""

    model: Any
    tokenizer: Any
    prompt_lists: list[list[int]]
    rows_t: list[RowTranscript]
    episodes: list[Episode]
    params: SamplingParams
    G: int
    budget: int
    max_turns: int
    eos: list[int]
    stops: list[str]
    seed: int | None
    first_prompt: int
    parallel: bool
    pad_id: int
    chunk_size: int | None
    sampler_dtype: torch.dtype | None
    share_prompt: bool
    packed_weights: bool


def _lockstep(run: _Rollout, *, static_cache: bool) -> None:
    """``turn_batching="lockstep"``: per turn, one batched ``generate`` over the rows still going
    (their prompts and transcripts re-read), then every ended turn's episode answers."""
    from grpokit.rollout import hf

    device = model_device(run.model)
    stopping = (lambda w: _StopAtText(run.tokenizer, run.stops, w)) if run.stops else None
    eos_set = set(run.eos)
    for k in range(run.max_turns):
        active = [r for r, t in enumerate(run.rows_t) if not t.done]
        if not active:
            break
        limits = {r: min(run.params.max_new_tokens, run.budget - len(run.rows_t[r].ids)) for r in active}
        turn_params = replace(run.params, max_new_tokens=max(limits.values()))
        prompts_k, transcripts_k = [run.prompt_lists[r // run.G] for r in active], [run.rows_t[r].ids for r in active]
        ids, mask, prefix = _turn_inputs(prompts_k, transcripts_k, run.pad_id)
        uniforms = None
        if run.seed is not None and turn_params.temperature > 0 and turn_params.sampler == "inverse_cdf":
            from grpokit.rollout.sampling import row_uniforms

            rows_k = [(run.first_prompt + r // run.G, r % run.G) for r in active]
            uniforms = row_uniforms(turn_seed(run.seed, k), rows_k, turn_params.max_new_tokens).to(device)
        gen_config = hf.build_generation_config(
            turn_params, eos_token_ids=run.eos, pad_token_id=run.pad_id, bos_token_id=run.tokenizer.bos_token_id
        )
        chunks = hf._generate_chunks(
            run.model,
            ids.to(device),
            mask.to(device),
            turn_params,
            gen_config,
            uniforms,
            rows=len(active) if run.chunk_size is None else run.chunk_size,
            seed=None if run.seed is None else turn_seed(run.seed, k),
            share_prompt=run.share_prompt,
            static_cache=static_cache,
            sampler_dtype=run.sampler_dtype,
            packed_weights=run.packed_weights,
            stopping=stopping,
            prefix=prefix,
        )
        new_rows = [row for c in chunks for row in c.tokens.tolist()]
        # sampling replay: each new token's kept set and the sampler's log-prob of it, per row
        supports = [
            None if c.support is None else c.support[i].unbind(0) for c in chunks for i in range(c.tokens.shape[0])
        ]
        logprobs = [
            None if c.logprobs is None else c.logprobs[i].tolist() for c in chunks for i in range(len(c.tokens))
        ]
        asks = []  # (row, the turn's text, how it ended): the turns an episode answers
        for r, new, sets, logps in zip(active, new_rows, supports, logprobs):
            ask = keep_turn(
                run.tokenizer,
                run.rows_t[r],
                new,
                eos_set,
                run.stops,
                limits[r],
                run.budget,
                logprobs=logps,
                supports=sets,
            )
            if ask is not None:
                asks.append((r, *ask))
        answers = ask_episodes(run.episodes, asks, parallel=run.parallel)
        for (r, _, how), obs in zip(asks, answers):
            append_observation(run.tokenizer, run.rows_t[r], obs, how, k, run.max_turns, run.budget)


def _continuous(run: _Rollout, *, overlap: bool = False) -> None:
    """``turn_batching="continuous"`` (``overlap``: ``"continuous_overlap"``):
    :func:`grpokit.rollout.continuous.continuous_rows` over
    consecutive chunks of ``chunk_size`` rows, under the model's backend (its generation context,
    its shared prompt-prefix cache) and a sampler copy in ``sampler_dtype``."""
    from grpokit.backends import get_backend
    from grpokit.rollout import hf
    from grpokit.rollout.continuous import continuous_rows
    from grpokit.rollout.sampler_copy import sampler_copy

    n = len(run.rows_t)
    rows = n if run.chunk_size is None else run.chunk_size
    backend = get_backend(run.model)
    with torch.inference_mode(), hf._seeded(run.seed, model_device(run.model)):
        sampler = run.model if run.sampler_dtype is None else sampler_copy(run.model, run.sampler_dtype)

        def prefill(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
            width = ids.shape[1]
            return backend.prefill(
                sampler, ids, mask, share=run.share_prompt, static=False, max_len=width, prefix=width - 1
            )

        with backend.generation(sampler, rows, packed_weights=run.packed_weights):
            for start in range(0, n, rows):
                part = range(start, min(n, start + rows))
                continuous_rows(
                    sampler,
                    run.tokenizer,
                    [run.prompt_lists[r // run.G] for r in part],
                    [run.rows_t[r] for r in part],
                    [run.episodes[r] for r in part],
                    [(run.first_prompt + r // run.G, r % run.G) for r in part],
                    run.params,
                    budget=run.budget,
                    max_turns=run.max_turns,
                    eos=set(run.eos),
                    stops=run.stops,
                    seed=run.seed,
                    parallel=run.parallel,
                    pad_id=run.pad_id,
                    prefill=prefill,
                    overlap=overlap,
                )


def env_options(r: RolloutConfig) -> dict[str, Any] | None:
    """The :class:`MultiTurnEngine` arguments of a recipe's ``rollout`` section (the environment
    ``rollout.env`` built with ``rollout.env_options``, ``max_turns``, ``max_total_tokens``,
    ``turn_batching``), or None
    without ``rollout.env``: what training, in-run evaluation and ``grpokit eval`` sample with.

    Raises:
        ValueError, ImportError: what :func:`grpokit.envs.load_env` raises (names ``rollout.env``).
    """
    from grpokit.envs import load_env

    if r.env is None:
        return None
    return dict(
        env=load_env(r.env, r.env_options),
        max_turns=r.max_turns,
        max_total_tokens=r.max_total_tokens,
        turn_batching=r.turn_batching,
    )


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
        turn_batching: str = "continuous",
    ):
        if turn_batching not in TURN_BATCHING:
            raise ValueError(f"rollout.turn_batching must be one of {TURN_BATCHING}, got {turn_batching!r}")
        self.model, self.tokenizer, self.env = model, tokenizer, env
        self.turn_batching = turn_batching
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
            turn_batching=self.turn_batching,
            **self.generate_options,
        )

    def sync_weights(self) -> None:
        """Nothing to do: the trained model samples."""
