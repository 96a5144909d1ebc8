"""grpokit.rollout: generation backends that turn prompts into grouped completions.

``hf`` (Hugging Face ``model.generate``, CPU or GPU) is the default backend. Heavier backends
(vLLM) live in their own modules and are imported lazily by whoever uses them.
"""

from .hf import Rollout, SamplingParams, build_generation_config, generate_rollouts

__all__ = ["Rollout", "SamplingParams", "build_generation_config", "generate_rollouts"]
