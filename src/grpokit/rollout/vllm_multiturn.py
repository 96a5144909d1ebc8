"""Multi-turn rollouts on the ``vllm`` engine (``rollout.engine: vllm`` with ``rollout.env``): vLLM
continues each row from its token ids, turn after turn.

Per turn ``k`` (at most ``max_turns``), every row still going is one vLLM request whose prompt is the
row's prompt ids followed by its transcript's ids so far (``TokensPrompt``; nothing is
re-tokenized: the model's tokens stay as sampled, the environment's as tokenized once when
appended), so vLLM's prefix cache serves the context it already read in earlier turns; within a
turn vLLM batches the rows itself. Then, as in :mod:`grpokit.rollout.multiturn` (shared steps in
:mod:`grpokit.rollout.turns`): each turn is cut at its first EOS, the token completing the first
of the environment's ``stop_strings`` or its token limit (``max_new_tokens`` and what the row's
budget leaves), the episodes answer, observations are appended.

Stop strings: vLLM runs without a tokenizer here (``skip_tokenizer_init``: grpokit decodes), so it
cannot match text. It stops a row at an EOS or at any token whose own text holds a stop string
(:func:`stop_token_ids`, e.g. ``"="`` and ``" ="`` for the ``equals`` call format); a stop
string spread over several tokens is found by :func:`~grpokit.rollout.turns.cut_turn` after the
turn, and the tokens drawn past it are dropped. The kept tokens are drawn as where the row
stopped at once (the rest of the turn is never seen).

Seeds: turn ``k`` of row ``(b, g)`` is the request seeded ``request_seed(turn_seed(seed, k),
first_prompt + b, g)``, so a row's draws depend on its seed and transcript alone (turn 0 draws
what the single-turn vllm engine draws). ``sampler_logprobs`` holds vLLM's log-prob of each model
token (0 on the environment's tokens), as the single-turn engine's. Weights: the single-turn
engine's (:class:`~grpokit.rollout.vllm_engine.VLLMRolloutEngine`: pushed before sampling when
stale).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from grpokit.envs.base import Environment, Episode
from grpokit.experience import Experience
from grpokit.rollout.engine import SamplingParams, check_prompts, request_seed
from grpokit.rollout.turns import (
    RowTranscript,
    append_observation,
    ask_episodes,
    keep_turn,
    transcripts_experience,
    turn_seed,
)
from grpokit.rollout.vllm_engine import VLLMRolloutEngine, check_sampling, sampling_kwargs

__all__ = ["VLLMMultiTurnEngine", "stop_token_ids"]

_STOP_IDS: dict[tuple[int, tuple[str, ...]], list[int]] = {}


def stop_token_ids(tokenizer: Any, stops: Sequence[str]) -> list[int]:
    """The ids of every vocabulary token whose own text (decoded alone, special tokens kept) holds
    one of ``stops``, sorted; ``[]`` without stops. Computed once per tokenizer and stops (one
    decode per vocabulary entry: about 0.2 s for SmolLM2's 49 152).

    A row that draws one of them has completed a stop string at that token, so vLLM may stop it
    there; a stop string spread over several tokens is not among them (module docstring)."""
    stops = tuple(s for s in stops if s)
    if not stops:
        return []
    key = (id(tokenizer), stops)
    if key not in _STOP_IDS:
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
        _STOP_IDS[key] = [i for i, text in enumerate(texts) if any(s in text for s in stops)]
    return _STOP_IDS[key]


class VLLMMultiTurnEngine(VLLMRolloutEngine):
    """The ``vllm`` engine with an environment (module docstring); ``generate`` takes the prompts'
    dataset ``rows`` (``wants_rows``).

    Args:
        env, max_turns, max_total_tokens: as :func:`grpokit.rollout.multiturn.generate_multiturn`.
        turn_batching: accepted for the recipe's ``rollout.turn_batching`` and not used: vLLM batches
            the rows of a turn itself, and its prefix cache keeps what earlier turns read.
        the rest: as :class:`~grpokit.rollout.vllm_engine.VLLMRolloutEngine`.

    Raises:
        ValueError: ``max_turns < 1``; ``max_total_tokens < 1``; as ``VLLMRolloutEngine``.
        ImportError: vLLM is not installed (names the ``vllm`` extra).
    """

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
        turn_batching: str = "continuous",
        **engine_kwargs: Any,
    ):
        if max_turns < 1:
            raise ValueError(f"rollout.max_turns must be >= 1, got {max_turns}")
        if max_total_tokens is not None and max_total_tokens < 1:
            raise ValueError(f"rollout.max_total_tokens must be >= 1, got {max_total_tokens}")
        super().__init__(model, tokenizer, eos_token_ids=eos_token_ids, **engine_kwargs)
        self.env, self.max_turns, self.max_total_tokens = env, int(max_turns), max_total_tokens

    def generate(
        self,
        prompts: list[str],
        group_size: int,
        sampling: SamplingParams,
        seed: int,
        first_prompt: int = 0,
        rows: Sequence[Mapping[str, Any]] | None = None,
    ) -> Experience:
        """``group_size`` multi-turn transcripts per prompt from the model's current weights; the
        :class:`~grpokit.experience.Experience` of :func:`grpokit.rollout.multiturn.generate_multiturn`
        plus ``sampler_logprobs`` ``(N, T)`` (sampling only; None when greedy).

        Raises:
            ValueError: as :meth:`VLLMRolloutEngine.generate`; ``len(rows) != len(prompts)``.
        """
        from grpokit.models.loading import encode_prompts

        check_prompts(prompts, group_size, first_prompt)
        check_sampling(sampling)
        rows = [{} for _ in prompts] if rows is None else rows
        if len(rows) != len(prompts):
            raise ValueError(f"rollout.engine=vllm: {len(rows)} rows for {len(prompts)} prompts")
        t0 = time.perf_counter()
        self._wake()
        self._push_weights_if_stale()
        G, budget = group_size, self.max_total_tokens or self.max_turns * sampling.max_new_tokens
        prompt_lists = encode_prompts(self.tokenizer, list(prompts))
        episodes: list[Episode] = [self.env.start(rows[b]) for b in range(len(prompts)) for _ in range(G)]
        rows_t = [RowTranscript() for _ in episodes]
        stops = list(self.env.stop_strings)
        kw = sampling_kwargs(sampling, eos_token_ids=self.eos_token_ids, seed=None)
        kw["stop_token_ids"] = sorted({*kw["stop_token_ids"], *stop_token_ids(self.tokenizer, stops)})
        for k in range(self.max_turns):
            active = [r for r, t in enumerate(rows_t) if not t.done]
            if not active:
                break
            asks = self._turn(k, active, rows_t, prompt_lists, G, kw, stops, budget, seed, first_prompt, sampling)
            parallel = bool(getattr(self.env, "parallel_steps", False))
            for (r, _, how), obs in zip(asks, ask_episodes(episodes, asks, parallel=parallel)):
                append_observation(self.tokenizer, rows_t[r], obs, how, k, self.max_turns, budget)
        self._sleep()
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        return transcripts_experience(
            self.tokenizer, prompt_lists, rows_t, G, pad, device, time.perf_counter() - t0,
            with_logprobs=sampling.temperature > 0,
        )  # fmt: skip

    def _turn(
        self,
        k: int,
        active: list[int],
        rows_t: list[RowTranscript],
        prompt_lists: list[list[int]],
        G: int,
        kw: dict[str, Any],
        stops: list[str],
        budget: int,
        seed: int,
        first_prompt: int,
        sampling: SamplingParams,
    ) -> list[tuple[int, str, str]]:
        """Turn ``k`` of the ``active`` rows: one vLLM request each, the turns kept in ``rows_t``;
        returns the ``(row, text, how)`` of the turns an episode answers."""
        limits = {r: min(sampling.max_new_tokens, budget - len(rows_t[r].ids)) for r in active}
        inputs, params = [], []
        for r in active:
            inputs.append(self.vllm.TokensPrompt(prompt_token_ids=prompt_lists[r // G] + rows_t[r].ids))
            s = request_seed(turn_seed(seed, k), first_prompt + r // G, r % G)
            params.append(self.vllm.SamplingParams(**dict(kw, max_tokens=limits[r], seed=s)))
        outs = self.shared.llm.generate(inputs, params, use_tqdm=False)
        eos, asks = set(self.eos_token_ids), []
        for r, o in zip(active, outs):
            tokens, logprobs = list(o.outputs[0].token_ids), None
            if sampling.temperature > 0:
                logprobs = [step[t].logprob for step, t in zip(o.outputs[0].logprobs, tokens)]
            ask = keep_turn(self.tokenizer, rows_t[r], tokens, eos, stops, limits[r], budget, logprobs)
            if ask is not None:
                asks.append((r, *ask))
        return asks
