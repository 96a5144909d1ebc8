"""The recipe: typed dataclasses that are the one source of defaults, help text and validation.

A recipe is a YAML file with the sections below (``model``, ``data``, ``rollout``, ``rewards``,
``algo``, ``train``, ``eval``, ``sft``, the settings of ``grpokit sft``, and ``prm``, those of
``grpokit prm``); ``grpokit train RECIPE.yaml key.sub=value ...`` overrides single keys (``grpokit
sft``, ``grpokit prm`` and ``grpokit eval`` take the same overrides).
Each field's ``help`` metadata is what ``grpokit train --help`` prints.

Modules: :mod:`grpokit.config.schema` (the sections and their fields), :mod:`grpokit.config.checks`
(validation) and :mod:`grpokit.config.loading` (YAML, overrides, ``--help``); every name is
re-exported here.
"""

from __future__ import annotations

from grpokit.config.checks import validate
from grpokit.config.fields import RecipeError, Registry, choices_of, lora_options
from grpokit.config.loading import help_text, load_recipe, parse_override, recipe_from_dict
from grpokit.config.schema import (
    RENAMED_KEYS,
    AlgoConfig,
    DataConfig,
    EvalConfig,
    ModelConfig,
    PrmConfig,
    Recipe,
    RewardsConfig,
    RolloutConfig,
    SftConfig,
    TrainConfig,
)
from grpokit.config.yaml_io import DuplicateKeyError

__all__ = [
    "RENAMED_KEYS",
    "AlgoConfig",
    "DataConfig",
    "DuplicateKeyError",
    "EvalConfig",
    "ModelConfig",
    "Recipe",
    "RecipeError",
    "Registry",
    "RewardsConfig",
    "RolloutConfig",
    "PrmConfig",
    "SftConfig",
    "TrainConfig",
    "choices_of",
    "help_text",
    "load_recipe",
    "lora_options",
    "parse_override",
    "recipe_from_dict",
    "validate",
]
