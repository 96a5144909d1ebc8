"""Process supervision's reward from the recipe: ``algo.process_reward`` -> a guarded callable
``(prompts, completions, steps, **columns) -> list[list[float | None] | None]`` that
:class:`grpokit.process.scorer.ProcessScorer` calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from grpokit.rewards.calling import RewardSignatureError, check_signature
from grpokit.rewards.guard import GuardedReward
from grpokit.utils.importing import import_object

if TYPE_CHECKING:
    from grpokit.config import Recipe

__all__ = ["BUILTIN_PROCESS_REWARDS", "PRM_PREFIX", "resolve_process_reward"]

PRM_PREFIX = "prm:"
"""``algo.process_reward: prm:FOLDER``: a PRM that :func:`grpokit.process.prm_train.train_prm` wrote."""

BUILTIN_PROCESS_REWARDS = {"arithmetic": "grpokit.process.verifier:arithmetic_step_rewards"}
"""Built-in ``algo.process_reward`` names -> ``"module:function"`` (imported when resolved)."""


def _load_prm(recipe: Recipe, folder: str) -> Callable:
    """The PRM in ``folder`` (:func:`~grpokit.process.prm_train.load_prm`) on ``rewards.rm_device``
    (``auto``: ``model.device``, cuda when that is ``auto`` and a GPU is there) with
    ``rewards.rm_dtype``/``rm_batch_size``/``rm_max_length``."""
    from grpokit.process.prm_train import load_prm
    from grpokit.utils.dtypes import dtype_of

    rc = recipe.rewards
    if not folder.strip():
        raise ValueError(f"algo.process_reward: expected '{PRM_PREFIX}FOLDER', got {recipe.algo.process_reward!r}")
    device = recipe.model.device if rc.rm_device == "auto" else rc.rm_device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        prm = load_prm(
            folder.strip(),
            device=device,
            dtype=dtype_of(rc.rm_dtype, "rewards.rm_dtype"),
            batch_size=rc.rm_batch_size,
            max_length=rc.rm_max_length,
        )
    except (OSError, ValueError) as e:
        raise ValueError(f"algo.process_reward: {recipe.algo.process_reward!r}: {e}") from e
    prm.__name__ = recipe.algo.process_reward
    return prm


def resolve_process_reward(recipe: Recipe) -> Callable:
    """``algo.process_reward``: ``arithmetic`` (the rule-based step verifier), ``prm:FOLDER`` (a
    trained PRM, :func:`_load_prm`; run in a thread: the model stays in this process), ``module:function``
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
    rc = recipe.rewards
    if name.startswith(PRM_PREFIX):
        prm = _load_prm(recipe, name[len(PRM_PREFIX) :])
        return GuardedReward(
            f"process:{name}",
            prm,
            timeout_s=rc.timeout_s,
            on_error=rc.on_error,
            isolation="thread",
            extra_keywords=("steps",),
        )
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
    return GuardedReward(
        f"process:{name}",
        fn,
        timeout_s=rc.timeout_s,
        on_error=rc.on_error,
        isolation=rc.isolation,
        extra_keywords=("steps",),
    )
