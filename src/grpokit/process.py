"""Process supervision in the loop: split completions into steps, score each step, advantages.

DeepSeekMath §4.1.3: the score of step k judges the solution up to and including step k; step
scores are normalized over all steps of the group's G completions; a token's advantage is the sum
of the normalized scores of the steps ending at or after it (``algo.process_advantages``).
"""

from __future__ import annotations

import math
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
    return GuardedReward(f"process:{name}", fn, timeout_s=rc.timeout_s, on_error=rc.on_error)


def process_step_advantages(s, rows: list[dict], rollout, prompts: list[str], columns: dict[str, list]):
    """Token advantages ``(N, T)`` from per-step scores, and step metrics for the log."""
    recipe = s.recipe
    ends, spans = step_end_masks(rollout.completion_ids, rollout.completion_mask, rollout.completions,
                                 recipe.algo.step_rule, s.tokenizer)
    steps = [step_texts(text, sp) for text, sp in zip(rollout.completions, spans)]
    scores = s.process_reward(prompts, rollout.completions, steps=steps, **columns)
    step_rewards, num_steps = scatter_step_rewards(scores, ends, dtype=torch.float64)
    adv = algo.process_advantages(step_rewards, ends, rollout.completion_mask, recipe.rollout.group_size,
                                  eps=recipe.algo.advantage_eps)
    flat = [v for row in scores for v in row]
    scored = [v for v in flat if v is not None and not math.isnan(v)]
    mean = sum(scored) / len(scored) if scored else None
    std = (math.sqrt(sum((v - mean) ** 2 for v in scored) / (len(scored) - 1)) if len(scored) > 1 else 0.0)
    metrics: dict[str, Any] = {
        "step_count_mean": float(num_steps.float().mean()),
        "step_reward_mean": mean,
        "step_reward_std": std,
        "steps_scored_frac": len(scored) / len(flat) if flat else 0.0,
    }
    return adv.float(), metrics
