"""Continuous turn batching for multi-turn rollouts: one decode loop over all rows, where a row whose
turn ends gets its environment's answer and goes on at the next decode step, while the other rows
keep decoding; every row keeps its KV cache across its turns.

:func:`grpokit.rollout.multiturn.generate_multiturn` with ``turn_batching="continuous"`` (the
default) runs this loop; ``"lockstep"`` runs one batched ``generate`` per turn instead, which
re-reads each row's transcript at every turn and makes a row that finished its turn wait for the
turn's longest row. What the two cost (``bench/multiturn.py``): lockstep's turn ``k`` takes
``max_r len(turn_k of r)`` decode steps and a prefill of every transcript; here a row's turn
boundary costs its appended tokens alone (fed in the steps the other rows decode in).

One decode step feeds each of the ``n`` rows still going its next token (``(n, 1)`` input; at most
:data:`FEED_PER_STEP` tokens, shorter inputs left-padded and masked): a decoding row its last
drawn token, a row resuming after an observation the observation's tokens one a step, drawing its
next token once all are in. So every step is a one-token step for every row, the cache grows by one
column per step, and position ids count each row's real tokens: each row sees
``prompt + transcript`` as the trainer's forward does. Rows that are done leave the cache
(``DynamicCache.batch_select_indices``). The loop takes as many steps as the longest transcript
has tokens.

Sampling is the lockstep loop's, token for token: token ``j`` of turn ``k`` of row ``(b, g)`` draws
with column ``j`` of ``row_uniforms(turn_seed(seed, k), [(first_prompt + b, g)], max_new_tokens)``
(inverse CDF, the recipe's temperature / top-k / top-p / min-p warpers) or by argmax (temperature
0); a turn ends at an EOS, at the token completing one of the environment's stop strings (checked
on the decoded turn), or at its token limit. An episode answers when its row's turn ends, before
the next decode step (in threads, together, for an environment with ``parallel_steps``), so the
rows of a step wait for that step's slowest answer, and a row's tokens depend on its seed and
transcript alone (up to float rounding of the batch's shapes), as in lockstep. With ``overlap``
(``turn_batching="continuous_overlap"``) a ``parallel_steps`` environment answers while the loop
decodes the other rows: the waiting row feeds nothing (a masked column in its cache) and resumes
at the first step after its answer is ready, so a slow call holds its own row alone, at the price
of bit-reproducibility (:class:`_Answers`).

Sampling replay (a truncating warper on, :func:`grpokit.rollout.hf.records_support`): each drawn
token also keeps the set it was drawn from and the sampler's log-prob of it
(:func:`grpokit.rollout.sampling.drawn_from`), kept with the turn's tokens in the transcript.

Applies to models whose KV cache is a plain growing one (``DynamicCache`` with full-attention
layers only), with the inverse-CDF sampler or greedy decoding and no repetition penalty;
:func:`applies` says so, and ``generate_multiturn`` runs lockstep elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.envs.base import Episode
from grpokit.rollout.engine import SamplingParams
from grpokit.rollout.turns import PARALLEL_STEPS, append_observation, ask_episodes, keep_turn, turn_seed

__all__ = ["FEED_PER_STEP", "applies", "continuous_rows"]

#: the most tokens a row feeds in one decode step: a row resuming after an observation feeds it
#: this many tokens a step (and samples once all are in), so a step stays a one-token step for
#: every row instead of padding all rows to the observation's length
FEED_PER_STEP = 1


def _empty_cache(model: Any) -> Any:
    """A fresh ``DynamicCache`` for ``model`` when all its layers are plain growing KV layers, else None."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=model.config)
    except Exception:  # an unusual config, an older transformers: do not guess
        return None
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return cache


def applies(model: Any, params: SamplingParams) -> bool:
    """Whether :func:`continuous_rows` can sample ``params`` with ``model``: a plain growing KV
    cache (:func:`_empty_cache`), greedy or inverse-CDF sampling, no repetition penalty."""
    sampler_ok = params.temperature == 0 or params.sampler == "inverse_cdf"
    return sampler_ok and params.repetition_penalty == 1.0 and _empty_cache(model) is not None


@dataclass
class _Row:
    """One row of the loop: ``r`` its index in the rollout, ``pending`` the tokens it feeds next,
    ``turn`` the tokens of its current turn, ``limit`` that turn's token limit, ``u`` its uniforms;
    with sampling replay ``supports`` / ``logprobs``: each token's kept set and the sampler's
    log-prob of it."""

    r: int
    pending: list[int]
    turn: int = 0
    tokens: list[int] = field(default_factory=list)
    limit: int = 0
    u: torch.Tensor | None = None
    supports: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    waiting: Future | None = None  # its episode's answer, being computed (parallel environments)
    how: str = ""  # how its last turn ended ("eos", "stop", ...): given to append_observation


def continuous_rows(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    transcripts: Sequence[Any],
    episodes: Sequence[Episode],
    keys: Sequence[tuple[int, int]],
    params: SamplingParams,
    *,
    budget: int,
    max_turns: int,
    eos: set[int],
    stops: Sequence[str],
    seed: int | None,
    parallel: bool,
    pad_id: int,
    prefill: Any,
    overlap: bool = False,
) -> int:
    """Run the loop (module docstring) over ``n`` rows, filling their transcripts in place; returns
    the decode steps taken.

    Args:
        model: the sampling model (inference mode, the backend's generation context open).
        prompts: ``n`` prompt token-id lists; transcripts: ``n`` empty
            :class:`~grpokit.rollout.turns.RowTranscript`; episodes: ``n`` started episodes;
            keys: ``n`` ``(prompt index, sample index)`` pairs (the rows' uniform streams).
        params: per-turn sampling (``max_new_tokens`` per turn); :func:`applies` must hold.
        budget, max_turns, eos, stops, parallel: as ``generate_multiturn``.
        overlap: with ``parallel``, the episodes answer in threads while the loop decodes the other
            rows (``turn_batching="continuous_overlap"``); else before the next decode step.
        prefill: ``(ids, mask) -> {keyword: cache} | {}``: the backend's cache of the first
            ``P - 1`` columns of the prompts ``ids`` ``(n, P)`` (``Backend.prefill`` with
            ``prefix = P - 1``), or ``{}``.

    Raises:
        ValueError: ``n == 0``; :func:`applies` does not hold.
    """
    from grpokit.rollout.hf import left_padded

    n = len(prompts)
    if n == 0 or not applies(model, params):
        raise ValueError("continuous_rows: no rows, or a model / sampling it does not apply to (see applies)")
    device = next(model.parameters()).device
    ids, mask = left_padded(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    p = ids.shape[1]
    kw, cache = _prompt_cache(model, ids, mask, prefill)
    cols = mask[:, : p - 1]  # (n, L) the cache's real columns per row
    pos = cols.sum(1)  # (n,) real tokens in the cache per row
    rows = [_Row(r, [int(ids[r, -1])]) for r in range(n)]
    for row in rows:
        _start_turn(row, transcripts[row.r], keys[row.r], params, budget, seed)
    warpers = _warpers(params)
    from grpokit.rollout.hf import records_support

    record = records_support(params)  # _draw keeps each token's set and log-prob on its row
    steps = 0
    pool = ThreadPoolExecutor(PARALLEL_STEPS, thread_name_prefix="grpokit-env") if parallel and overlap else None
    answer = _Answers(
        tokenizer, transcripts, episodes, keys, params, pool, parallel, budget=budget, max_turns=max_turns, seed=seed
    )
    try:
        while rows:
            if all(row.waiting is not None for row in rows):  # nothing to decode: wait for the first answer
                wait([row.waiting for row in rows if row.waiting is not None], return_when=FIRST_COMPLETED)
            else:
                inp, new = _feed(rows, pad_id, device)
                position_ids = (pos.unsqueeze(1) + new.long().cumsum(1) - 1).clamp(min=0)
                cols = torch.cat([cols, new], 1)
                out = model(
                    input_ids=inp,
                    attention_mask=cols.long(),
                    position_ids=position_ids,
                    use_cache=True,
                    logits_to_keep=1,
                    **{kw: cache},
                )
                pos = pos + new.sum(1)
                steps += 1
                fed_all = [i for i, row in enumerate(rows) if not row.pending and row.waiting is None]  # they sample
                picked = [rows[i] for i in fed_all]
                drawn = _draw(out.logits[fed_all, -1].float(), picked, warpers, params) if picked else []
                asks = []
                for row, tok in zip(picked, drawn):
                    row.tokens.append(tok)
                    row.pending = [tok]
                    if _turn_ended(tokenizer, row, eos, stops):
                        ask = _keep(tokenizer, transcripts[row.r], row, eos, stops, budget, record)
                        if ask is not None:
                            asks.append((row, ask))
                answer.ask(asks)
            answer.take_ready(rows)
            keep = [i for i, row in enumerate(rows) if row.waiting is not None or not transcripts[row.r].done]
            if len(keep) < len(rows):
                idx = torch.tensor(keep, dtype=torch.long, device=device)
                if keep:
                    cache.batch_select_indices(idx)
                cols, pos, rows = cols[idx], pos[idx], [rows[i] for i in keep]
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return steps


def _feed(rows: list[_Row], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's input ``(n, w)`` long and its new-token mask ``(n, w)`` bool: each row's next
    :data:`FEED_PER_STEP` pending tokens (taken off ``pending``), left-padded; a waiting row feeds
    nothing (a masked column)."""
    feed = [row.pending[:FEED_PER_STEP] for row in rows]
    w = max(len(f) for f in feed)
    inp = torch.full((len(rows), w), int(pad_id), dtype=torch.long, device=device)
    new = torch.zeros((len(rows), w), dtype=torch.bool, device=device)
    for i, (row, f) in enumerate(zip(rows, feed)):
        if f:
            inp[i, w - len(f) :] = torch.tensor(f, dtype=torch.long)
            new[i, w - len(f) :] = True
            row.pending = row.pending[len(f) :]
    return inp, new


def _keep(tokenizer: Any, t: Any, row: _Row, eos: set[int], stops: Sequence[str], budget: int, record: bool) -> Any:
    """Keep ``row``'s ended turn in its transcript ``t`` (:func:`keep_turn`); the episode's ask
    ``(text, how)``, or None when the row is done."""
    ask = keep_turn(
        tokenizer,
        t,
        row.tokens,
        eos,
        stops,
        row.limit,
        budget,
        logprobs=row.logprobs if record else None,
        supports=row.supports if record else None,
    )
    if len(t.ids) != len(t.model) or (ask is None and not t.done):  # pragma: no cover - invariant
        raise RuntimeError("continuous_rows: the kept turn differs from the decoded one")
    return ask


@dataclass
class _Answers:
    """The episodes' answers to the rows' ended turns. Without a ``pool`` they are asked before the
    next decode step (together in threads for a ``parallel`` environment, :func:`ask_episodes`), so
    every row resumes at the step after its turn ended: a row's cache layout, and so its logits bit
    for bit, do not depend on timing. With one (``overlap``) each is asked in a thread and the loop
    decodes the other rows meanwhile: a row whose answer is ready resumes at the next step
    (:meth:`take_ready`), so a slow call holds its own row alone; but how many masked columns a
    waiting row's cache gets depends on timing, and a masked column moves logits by float rounding
    (1e-7 measured), so runs then agree to float rounding only. Either way a row's observation
    depends on its transcript alone."""

    tokenizer: Any
    transcripts: Sequence[Any]
    episodes: Sequence[Episode]
    keys: Sequence[tuple[int, int]]
    params: SamplingParams
    pool: ThreadPoolExecutor | None
    parallel: bool
    budget: int
    max_turns: int
    seed: int | None

    def ask(self, asks: list[tuple[_Row, tuple[str, str]]]) -> None:
        """Ask each ``(row, (text, how))``'s episode; answered now without a pool."""
        if self.pool is None:
            items = [(row.r, text, how) for row, (text, how) in asks]
            for (row, (_, how)), obs in zip(asks, ask_episodes(self.episodes, items, parallel=self.parallel)):
                row.how = how
                self._resume(row, obs)
            return
        for row, (text, how) in asks:
            row.how, row.pending = how, []
            row.waiting = self.pool.submit(self.episodes[row.r].step, text, ended_by_eos=how == "eos")

    def take_ready(self, rows: list[_Row]) -> None:
        """Resume every waiting row whose answer is ready (an episode's exception is raised here)."""
        for row in rows:
            if row.waiting is not None and row.waiting.done():
                obs, row.waiting = row.waiting.result(), None
                self._resume(row, obs)

    def _resume(self, row: _Row, obs: Any) -> None:
        """Append ``obs`` to ``row``'s transcript; unless that ended the row, it feeds its last
        token and the observation's next and starts its next turn."""
        t = self.transcripts[row.r]
        before = len(t.ids)
        append_observation(self.tokenizer, t, obs, row.how, row.turn, self.max_turns, self.budget)
        if not t.done:
            row.pending = [row.tokens[-1], *t.ids[before:]]
            row.turn += 1
            _start_turn(row, t, self.keys[row.r], self.params, self.budget, self.seed)


def _prompt_cache(model: Any, ids: torch.Tensor, mask: torch.Tensor, prefill: Any) -> tuple[str, Any]:
    """``(keyword, cache)``: the KV cache of the first ``P - 1`` columns of the prompts ``ids``
    ``(n, P)``, the backend's (shared between rows with one prompt) where it gives one, else a
    forward here."""
    from grpokit.backends.base import cache_kwarg

    kw = cache_kwarg(model.forward)
    if ids.shape[1] == 1:
        return kw, _empty_cache(model)
    extra = prefill(ids, mask) if prefill is not None else {}
    if extra:
        return next(iter(extra.items()))
    cache = _empty_cache(model)
    ids, attn = ids[:, :-1], mask[:, :-1].long()
    model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
        **{kw: cache},
    )
    return kw, cache


def _start_turn(row: _Row, t: Any, key: tuple[int, int], params: SamplingParams, budget: int, seed: int | None) -> None:
    """Begin ``row``'s turn ``row.turn``: its token limit and (seeded sampling) its uniform numbers."""
    row.tokens, row.limit = [], min(params.max_new_tokens, budget - len(t.ids))
    row.supports, row.logprobs = [], []
    row.u = None
    if seed is not None and params.temperature > 0:
        from grpokit.rollout.sampling import row_uniforms

        row.u = row_uniforms(turn_seed(seed, row.turn), [key], params.max_new_tokens)[0]


def _warpers(params: SamplingParams) -> list[Any]:
    """The recipe's logits warpers, as the inverse-CDF sampler applies them (none when greedy)."""
    if params.temperature == 0:
        return []
    from grpokit.rollout.sampling import InverseCDFSampler

    return InverseCDFSampler(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p
    ).warpers


def _draw(scores: torch.Tensor, rows: list[_Row], warpers: list[Any], params: SamplingParams) -> list[int]:
    """The next token of each row from its ``(n, V)`` float32 logits: argmax (greedy), else the
    inverse CDF at the row's uniform number for its turn's next token (torch's RNG without a seed).
    Sampling replay (:func:`grpokit.rollout.hf.records_support`): each row's ``supports`` and
    ``logprobs`` get the set the token was drawn from (``(W,)``, :mod:`grpokit.algo.support`) and
    the sampler's log-prob of it."""
    if params.temperature == 0:
        return scores.argmax(-1).tolist()
    from grpokit.rollout.hf import records_support
    from grpokit.rollout.sampling import drawn_from, sample_inverse_cdf

    for warp in warpers:
        scores = warp(None, scores)
    u = None
    if rows[0].u is not None:
        u = torch.stack([row.u[len(row.tokens)] for row in rows if row.u is not None])
    tokens = sample_inverse_cdf(scores, u=u)
    if records_support(params):
        supports, logprobs = drawn_from(scores, tokens)
        for row, support, logp in zip(rows, supports.unbind(0), logprobs.tolist()):
            row.supports.append(support)
            row.logprobs.append(logp)
    return tokens.tolist()


def _turn_ended(tokenizer: Any, row: _Row, eos: set[int], stops: Sequence[str]) -> bool:
    """Whether ``row``'s turn ended at its last token: an EOS, a stop string in the decoded turn
    (the first token completing it, as :func:`grpokit.rollout.turns.cut_turn` cuts), or the
    turn's token limit. It decodes the whole turn (at most ``max_new_tokens`` tokens) rather than
    a tail, so a stop string spanning tokens or a tokenizer's leading-space rule reads as
    ``cut_turn`` reads it; that costs 9 us for 32 tokens with SmolLM2's tokenizer, about 0.2 % of
    ``bench/multiturn.py``'s loop."""
    if row.tokens[-1] in eos:
        return True
    if stops:
        text = tokenizer.decode(row.tokens, skip_special_tokens=False)
        if any(s in text for s in stops):
            return True
    return len(row.tokens) >= row.limit
