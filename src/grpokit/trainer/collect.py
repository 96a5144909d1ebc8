"""Steps 1-4 of a GRPO step (:mod:`grpokit.trainer.loop`): take prompts, sample their groups through the
rollout engine, score them, compute advantages; and DAPO's dynamic sampling, which repeats these
for groups with signal. With several ranks (:mod:`grpokit.utils.distributed`) each rank samples and
scores its share and the shares are gathered, so everything after equals one process's.
"""

from __future__ import annotations

import time
from typing import Any

from grpokit.trainer.build import Run
from grpokit.config import AlgoConfig, RolloutConfig, TrainConfig
from grpokit.utils.distributed import Ranks, gather_objects
from grpokit.experience import Experience
from grpokit.utils.memory import release_memory
from grpokit.rewards.pipeline import ScoredRows, reward_metrics
from grpokit.trainer.state import next_prompt_indices


def sample_and_score(run: Run, step: int, n_prompts: int, *, round_: int, rollout_cfg: RolloutConfig,
                     train_cfg: TrainConfig) -> tuple[list[dict], Experience, dict[str, Any], float]:
    """Steps 1-4 for ``n_prompts`` new prompts: ``(rows, experience, metrics, reward_s)``; the
    experience (``n_prompts · rollout_cfg.group_size`` rows) carries rewards and advantages.

    ``rollout_cfg``/``train_cfg``: the recipe's ``rollout`` and ``train`` sections (``group_size``,
    ``seed``). Round 0 is seeded ``seed·100003 + step`` (as always); dynamic sampling's extra rounds
    add ``1000003·round``. Raises what the engine and the reward pipeline raise."""
    seed, g, ranks = train_cfg.seed, rollout_cfg.group_size, run.ranks
    idx = next_prompt_indices(run.state, len(run.data.rows), n_prompts, seed)  # the same on every rank
    rows = [run.data.rows[i] for i in idx]
    per = n_prompts // ranks.world_size  # this rank samples and scores prompts first … first+per-1
    first = ranks.rank * per
    mine = idx[first: first + per]
    exp = run.engine.generate([run.data.prompts[i] for i in mine], g, run.sampling,
                              seed * 100003 + step + 1000003 * round_, first_prompt=first)
    release_memory()
    t_reward = time.perf_counter()
    scored = run.rewards.score_rows(exp, rows[first: first + per], run.data.columns)
    if ranks.active:  # the whole batch on every rank: advantages and metrics as one process has them
        exp, scored = gather_scored(exp, scored, ranks, run.tokenizer.pad_token_id)
    metrics = dict(reward_metrics(exp, scored.per_function), reward_failures=scored.failures)
    exp.advantages = run.algorithm.advantages(exp)
    return rows, exp, metrics, time.perf_counter() - t_reward


def refill_groups_with_signal(run: Run, step: int, rows: list[dict], exp: Experience, metrics: dict[str, Any], *,
                              algo_cfg: AlgoConfig, rollout_cfg: RolloutConfig,
                              train_cfg: TrainConfig) -> tuple[list[dict], Experience, dict[str, Any], float]:
    """Dynamic sampling (DAPO, arXiv 2503.14476 §3.2): groups whose rewards are all equal
    (``algo.constant_groups``; under process supervision, whose pooled step rewards are:
    ``algo.process_constant_groups``; advantage 0, no signal) are dropped and replaced by groups of new
    prompts, sampled in up to ``algo.max_sampling_rounds`` extra rounds, until B groups carry
    signal. If the rounds run out, the step trains on the groups with signal it has (fewer than
    B); if it has none, on round 0's batch as it is (the "no learning signal" warning says so).

    Advantages are recomputed over the kept groups (batch scaling sees the batch trained on); the
    reward metrics stay those of round 0 (the policy's own rate on fresh prompts), except
    ``reward_failures`` and the experience's ``gen_s``, summed over every round; ``dynamic/rounds``,
    ``dynamic/groups_sampled``, ``dynamic/groups_kept`` are added.

    ``algo_cfg``/``rollout_cfg``/``train_cfg``: the recipe's ``algo`` (``max_sampling_rounds``),
    ``rollout`` and ``train`` (``prompts_per_step`` = B, ``seed``) sections.
    Returns ``(rows, experience, metrics, extra_reward_s)``: at most B rows and their groups.
    """
    a, b = algo_cfg, train_cfg.prompts_per_step
    kept_rows, parts, extra_s, rounds, sampled = [], [], 0.0, 0, len(rows)
    cur_rows, cur, cur_metrics = rows, exp, metrics
    gen_s, failures = 0.0, 0  # over every round, dropped ones included
    while True:
        gen_s, failures = gen_s + cur.gen_s, failures + cur_metrics["reward_failures"]
        signal_groups = run.algorithm.groups_with_signal(cur)
        take = signal_groups[: b - len(kept_rows)]
        if take:
            kept_rows += [cur_rows[i] for i in take]
            parts.append(cur.select_groups(take))
        if len(kept_rows) >= b or rounds >= a.max_sampling_rounds:
            break
        rounds += 1
        cur_rows, cur, cur_metrics, dt = sample_and_score(run, step, b - len(kept_rows), round_=rounds,
                                                          rollout_cfg=rollout_cfg, train_cfg=train_cfg)
        extra_s, sampled = extra_s + dt, sampled + len(cur_rows)
    metrics = dict(metrics, reward_failures=failures,
                   **{"dynamic/rounds": rounds, "dynamic/groups_sampled": sampled, "dynamic/groups_kept": len(kept_rows)})
    if not kept_rows:
        exp.gen_s = gen_s
        return rows, exp, metrics, extra_s
    out = Experience.concat(parts, run.tokenizer.pad_token_id)
    out.gen_s = gen_s
    out.advantages = run.algorithm.advantages(out)
    return kept_rows, out, metrics, extra_s


def gather_scored(exp: Experience, scored: ScoredRows, ranks: Ranks, pad_id: int) -> tuple[Experience, ScoredRows]:
    """Every rank's scored share of a step (its experience with rewards, and the reward functions'
    values per row) joined in rank order into the whole batch, on every rank: what one process
    would hold after scoring (``Experience.concat``: prompts left-padded, completions right-padded
    with ``pad_id``). ``gen_s`` is the slowest rank's (they generate at the same time); failures
    are summed. The experience comes back on ``exp``'s device."""
    parts = gather_objects((exp.to("cpu"), scored), ranks)
    whole = Experience.concat([e for e, _ in parts], pad_id).to(exp.device)
    whole.gen_s = max(e.gen_s for e, _ in parts)
    per_function = {k: [v for _, sc in parts for v in sc.per_function[k]] for k in scored.per_function}
    return whole, ScoredRows(per_function, sum(sc.failures for _, sc in parts))
