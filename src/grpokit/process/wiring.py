"""Process supervision's reward from the recipe: ``algo.process_reward`` -> a guarded callable
``(prompts, completions, steps, **columns) -> list[list[float | None] | None]`` that
:class:`grpokit.process.scorer.ProcessScorer` calls."""

from __future__ import annotations

from collections.abc import Callable

from grpokit.rewards.calling import RewardSignatureError, check_signature
from grpokit.rewards.guard import GuardedReward
from grpokit.utils.importing import import_object

__all__ = ["BUILTIN_PROCESS_REWARDS", "resolve_process_reward"]

BUILTIN_PROCESS_REWARDS = {"arithmetic": "grpokit.process.verifier:arithmetic_step_rewards"}
"""Built-in ``algo.process_reward`` names -> ``"module:function"`` (imported when resolved)."""


def resolve_process_reward(recipe) -> Callable:
    """``algo.process_reward``: ``arithmetic`` (the rule-based step verifier), ``module:function``
    (a module on ``sys.path`` or in the working directory) or ``path/to/file.py:function``
    (:func:`grpokit.utils.importing.import_object`): a callable
    ``(prompts, completions, steps, **columns) -> list[list[float | None]]`` (or TRL's keyword
    form, or ``async``: :mod:`grpokit.rewards.calling`), its signature checked, wrapped with the
    recipe's reward timeout and fault policy.

    Raises:
        ValueError: unknown name, module not importable, attribute missing or not callable; every
            message starts with ``algo.process_reward``.
        RewardSignatureError: its signature cannot take ``(prompts, completions, steps=, **columns)``
            (starts the same way).
    """
    name = recipe.algo.process_reward
    spec = BUILTIN_PROCESS_REWARDS.get(name, name)
    if ":" not in spec:
        raise ValueError(
            f"algo.process_reward: unknown {name!r}; built-in: "
            f"{', '.join(BUILTIN_PROCESS_REWARDS)}, or module:function or path/to/file.py:function"
        )
    try:
        fn = import_object(spec, what="process reward")
        check_signature(fn, f"process reward {spec!r}", extra=("steps",))
    except RewardSignatureError as e:
        raise RewardSignatureError(f"algo.process_reward: {e}") from None
    except ValueError as e:
        raise ValueError(f"algo.process_reward: {e}") from e
    rc = recipe.rewards
    return GuardedReward(
        f"process:{name}",
        fn,
        timeout_s=rc.timeout_s,
        on_error=rc.on_error,
        isolation=rc.isolation,
        extra_keywords=("steps",),
    )
