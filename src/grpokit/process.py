"""Process supervision in the loop: split completions into steps, score each step, advantages.

DeepSeekMath §4.1.3: the score of step k judges the solution up to and including step k; step
scores are normalized over all steps of the group's G completions; a token's advantage is the sum
of the normalized scores of the steps ending at or after it (``algo.process_advantages``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from grpokit import algo
from grpokit.rewards.guard import GuardedReward
from grpokit.rewards.steps import scatter_step_rewards, step_end_masks, step_texts

BUILTIN_PROCESS_REWARDS = {"arithmetic": "grpokit.rewards.verifier:arithmetic_step_rewards"}


def resolve_process_reward(recipe) -> Callable:
    """``algo.process_reward``: ``arithmetic`` (the rule-based step verifier) or ``module:function``,
    a callable ``(prompts, completions, steps, **columns) -> list[list[float | None]]``, wrapped with
    the recipe's reward timeout and fault policy.

    Raises:
        ValueError: unknown name, module not importable, attribute missing.
    """
    from grpokit.rewards.base import _import_spec

    name = recipe.algo.process_reward
    spec = BUILTIN_PROCESS_REWARDS.get(name, name)
    if ":" not in spec:
        raise ValueError(f"algo.process_reward: unknown {name!r}; built-in: "
                         f"{', '.join(BUILTIN_PROCESS_REWARDS)}, or module:function")
    fn = _import_spec(spec)
    rc = recipe.rewards
    return GuardedReward(f"process:{name}", fn, timeout_s=rc.timeout_s, on_error=rc.on_error,
                         isolation=rc.isolation)


def process_step_advantages(s, rows: list[dict], rollout, prompts: list[str], columns: dict[str, list]):
    """Token advantages ``(N, T)`` from per-step scores, and step metrics for the log.

    A row the process reward cannot score (``None`` instead of its list of step scores: the
    guard's ``rewards.on_error=none`` gives that for a row whose call raised or timed out) has every
    step unscored (NaN step rewards), so its advantages are 0; it is counted in
    ``process_unscorable_frac``.

    Returns:
        ``(advantages (N, T) float32, metrics)``; metrics: ``step_count_mean`` (steps per
        completion), ``step_reward_mean``/``step_reward_std`` (over the scored steps; None / 0.0
        when fewer than 1 / 2), ``steps_scored_frac`` (finite step scores / steps),
        ``process_unscorable_frac`` (completions with no scored step / N).

    Raises:
        ValueError: a row of scores is not None and not one score per step (the message names the
            row), from :func:`grpokit.rewards.steps.scatter_step_rewards`.
    """
    recipe = s.recipe
    ends, spans = step_end_masks(rollout.completion_ids, rollout.completion_mask, rollout.completions,
                                 recipe.algo.step_rule, s.tokenizer)
    steps = [step_texts(text, sp) for text, sp in zip(rollout.completions, spans)]
    scores = s.process_reward(prompts, rollout.completions, steps=steps, **columns)
    step_rewards, num_steps = scatter_step_rewards(scores, ends, dtype=torch.float64)
    adv = algo.process_advantages(step_rewards, ends, rollout.completion_mask, recipe.rollout.group_size,
                                  eps=recipe.algo.advantage_eps, mode=recipe.algo.process_advantage)
    scored_mask = ends.bool() & torch.isfinite(step_rewards)  # (N, T)
    scored = step_rewards[scored_mask]  # (S,) float64
    total = int(num_steps.sum())
    metrics: dict[str, Any] = {
        "step_count_mean": float(num_steps.float().mean()),
        "step_reward_mean": float(scored.mean()) if len(scored) else None,
        "step_reward_std": float(scored.std()) if len(scored) > 1 else 0.0,  # sample std (ddof=1)
        "steps_scored_frac": len(scored) / total if total else 0.0,
        "process_unscorable_frac": float((scored_mask.sum(dim=1) == 0).double().mean()),
    }
    return adv.float(), metrics
