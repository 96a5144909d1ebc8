"""Steps 1-3 of a GRPO step (:mod:`grpokit.trainer.loop`): take prompts, sample their groups through the
rollout engine, score them; and DAPO's dynamic sampling, which repeats these for groups with
signal. With several ranks (:mod:`grpokit.utils.distributed`) each rank samples and
scores its share and the shares are gathered, so everything after equals one process's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from grpokit.experience import Experience, rank_share
from grpokit.metrics import env_metrics
from grpokit.rewards.pipeline import ScoredRows, reward_metrics
from grpokit.rollout.engine import rows_for
from grpokit.trainer.build import Run
from grpokit.trainer.state import next_prompt_indices
from grpokit.utils.distributed import GatheredEngine, Ranks, gather_objects
from grpokit.utils.memory import release_memory


@dataclass
class Collected:
    """Steps 1-3 of a step: the prompts' rows, their scored groups, the reward metrics.

    ``experience`` carries ``rewards`` (and, under process supervision, ``step_rewards``/``step_ends``),
    not yet advantages (step 4, :func:`grpokit.trainer.loop.run_step`); ``metrics`` are the reward
    metrics (:func:`grpokit.rewards.pipeline.reward_metrics`, ``reward_failures``; with dynamic
    sampling also ``dynamic/*``); ``reward_s`` the seconds spent scoring (every round)."""

    rows: list[dict]
    experience: Experience
    metrics: dict[str, Any]
    reward_s: float


def sample_and_score(run: Run, step: int, n_prompts: int, *, round_: int = 0) -> Collected:
    """Steps 1-3 for ``n_prompts`` new prompts: ``n_prompts · rollout.group_size`` completions,
    scored, as the whole batch on every rank.

    Round 0 is seeded ``train.seed·100003 + step`` (as always); dynamic sampling's extra rounds add
    ``1000003·round``. Raises what the engine and the reward pipeline raise."""
    seed, g, ranks = run.recipe.train.seed, run.recipe.rollout.group_size, run.ranks
    idx = next_prompt_indices(run.state, len(run.data.rows), n_prompts, seed)  # the same on every rank
    rows = [run.data.rows[i] for i in idx]
    first, last = rank_share(n_prompts, ranks.rank, ranks.world_size)  # this rank's prompts first … last-1
    mine = idx[first:last]
    exp: Experience | None = None  # a rank with no share (a refill round of fewer prompts than ranks)
    scored: ScoredRows | None = None  # only joins the gather below
    t_reward = time.perf_counter()
    if mine:
        # a multi-turn engine's environment sees each row's columns
        extra = rows_for(run.engine, [run.data.rows[i] for i in mine])
        exp = run.engine.generate(
            [run.data.prompts[i] for i in mine],
            g,
            run.sampling,
            seed * 100003 + step + 1000003 * round_,
            first_prompt=first,
            **extra,
        )
        release_memory()
        if getattr(run.sampling, "truncates", False) and exp.sampler_support is None:
            # the recipe checks refuse such engines and samplers; this catches one that slipped past
            raise RuntimeError(
                "rollout.top_k/top_p/min_p: the rollout engine returned no sampler_support (the set each token "
                "was drawn from), so the loss would score another distribution than the one sampled; "
                "use rollout.engine=hf with rollout.sampler=inverse_cdf (docs/design.md, 'Temperature')"
            )
        t_reward = time.perf_counter()
        scored = run.rewards.score_rows(exp, rows[first:last], run.data.columns)
    elif isinstance(run.engine, GatheredEngine):  # fsdp2: the others' generate gathers the layers
        run.engine.join_without_prompts()
    if ranks.active:  # the whole batch on every rank: advantages and metrics as one process has them
        exp, scored = gather_scored(exp, scored, ranks, run.tokenizer.pad_token_id, device=run.device)
    assert exp is not None and scored is not None  # one process always has its share
    metrics = dict(reward_metrics(exp, scored.per_function), reward_failures=scored.failures, **env_metrics(exp))
    return Collected(rows, exp, metrics, time.perf_counter() - t_reward)


def refill_groups_with_signal(run: Run, step: int, first: Collected) -> Collected:
    """Dynamic sampling (DAPO, arXiv 2503.14476 §3.2): groups whose rewards are all equal
    (``algo.constant_groups``; under process supervision, whose pooled step rewards are:
    ``algo.process_constant_groups``; advantage 0, no signal) are dropped and replaced by groups of new
    prompts, sampled in up to ``algo.max_sampling_rounds`` extra rounds, until B =
    ``train.prompts_per_step`` groups carry signal. If the rounds run out, the step trains on the
    groups with signal it has (fewer than B); if it has none, on round 0's batch as it is (the "no
    learning signal" warning says so).

    The reward metrics stay those of round 0 (the policy's own rate on fresh prompts), except
    ``reward_failures``, the experience's ``gen_s`` and ``reward_s``, summed over every round;
    ``dynamic/rounds``, ``dynamic/groups_sampled``, ``dynamic/groups_kept`` are added. Returns at
    most B rows and their groups (advantages are computed after, over the batch trained on).
    """
    b, max_rounds = run.recipe.train.prompts_per_step, run.recipe.algo.max_sampling_rounds
    kept_rows: list[dict] = []
    parts: list[Experience] = []
    rounds, sampled = 0, len(first.rows)
    cur = first
    gen_s, failures, reward_s = 0.0, 0, 0.0  # over every round, dropped ones included
    while True:
        gen_s, failures = gen_s + cur.experience.gen_s, failures + cur.metrics["reward_failures"]
        reward_s += cur.reward_s
        take = run.algorithm.groups_with_signal(cur.experience)[: b - len(kept_rows)]
        if take:
            kept_rows += [cur.rows[i] for i in take]
            parts.append(cur.experience.select_groups(take))
        if len(kept_rows) >= b or rounds >= max_rounds:
            break
        rounds += 1
        cur = sample_and_score(run, step, b - len(kept_rows), round_=rounds)
        sampled += len(cur.rows)
    metrics = dict(
        first.metrics,
        reward_failures=failures,
        **{"dynamic/rounds": rounds, "dynamic/groups_sampled": sampled, "dynamic/groups_kept": len(kept_rows)},
    )
    if not kept_rows:
        first.experience.gen_s = gen_s
        return Collected(first.rows, first.experience, metrics, reward_s)
    out = Experience.concat(parts, run.tokenizer.pad_token_id)
    out.gen_s = gen_s
    return Collected(kept_rows, out, metrics, reward_s)


def gather_scored(
    exp: Experience | None, scored: ScoredRows | None, ranks: Ranks, pad_id: int, *, device: Any = None
) -> tuple[Experience, ScoredRows]:
    """Every rank's scored share of a step (its experience with rewards, and the reward functions'
    values per row) joined in rank order into the whole batch, on every rank: what one process
    would hold after scoring (``Experience.concat``: prompts left-padded, completions right-padded
    with ``pad_id``). A rank with no share passes None for both. ``gen_s`` is the slowest rank's
    (they generate at the same time); failures are summed. The experience comes back on ``device``
    (default: ``exp``'s; the CPU for a rank with no share)."""
    shared = gather_objects(None if exp is None else (exp.to("cpu"), scored), ranks)
    parts = [p for p in shared if p is not None]
    device = device if device is not None else exp.device if exp is not None else "cpu"
    whole = Experience.concat([e for e, _ in parts], pad_id).to(device)
    whole.gen_s = max(e.gen_s for e, _ in parts)
    names = parts[0][1].per_function
    per_function = {k: [v for _, sc in parts for v in sc.per_function[k]] for k in names}
    return whole, ScoredRows(per_function, sum(sc.failures for _, sc in parts))
