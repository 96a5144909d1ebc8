"""grpokit.rollout: rollout engines that turn prompts into grouped completions.

The seam is :mod:`grpokit.rollout.engine` (the :class:`RolloutEngine` protocol, :class:`SamplingParams`,
and the registry :func:`load_engine` reads ``rollout.engine`` from). ``hf`` (Hugging Face
``model.generate``, CPU or GPU) is the default engine; its module, and any heavier engine's, is
imported only when used (``generate_rollouts``/``build_generation_config`` below load it on first
access).
"""

from typing import Any

from grpokit.rollout.engine import ENGINES, RolloutEngine, SamplingParams, load_engine

__all__ = ["ENGINES", "RolloutEngine", "SamplingParams", "build_generation_config", "generate_rollouts", "load_engine"]


def __getattr__(name: str) -> Any:
    if name in ("generate_rollouts", "build_generation_config"):
        from grpokit.rollout import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'grpokit.rollout' has no attribute {name!r}")
