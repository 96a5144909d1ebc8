"""Environments of multi-turn rollouts: the seam (:mod:`grpokit.envs.base`), the ``tools``
environment (:mod:`grpokit.envs.tools`) and its calculator (:mod:`grpokit.envs.calculator`)."""

from grpokit.envs.base import ENVIRONMENTS, Environment, Episode, Observation, load_env

__all__ = ["ENVIRONMENTS", "Environment", "Episode", "Observation", "load_env"]
