"""grpokit: GRPO fine-tuning for causal LMs (outcome and process supervision)."""

import logging as _logging
import typing as _typing
from importlib.metadata import PackageNotFoundError as _NotFound
from importlib.metadata import version as _version

# transformers imports torchao (the optional extra grpokit[torchao], for the 8-bit optimizer)
# whenever it is installed; on a CPU machine torchao then logs that its CUDA-only extensions cannot
# load, and torch warns about torchao's enum registrations. Neither concerns a grpokit run. Only
# the loggers are set here: grpokit itself never imports torchao unless train.optimizer=adamw_8bit.
for _name in ("torchao", "torch.utils._pytree"):
    if _logging.getLogger(_name).level == _logging.NOTSET:
        _logging.getLogger(_name).setLevel(_logging.ERROR)

try:
    __version__ = _version("grpokit")
except _NotFound:  # a source tree that was not installed
    __version__ = "0+unknown"

#: the library API (grpokit.api), imported on first use so that `import grpokit` stays light
_API = {
    "Trainer": "grpokit.api",
    "make_recipe": "grpokit.api",
    "Callback": "grpokit.trainer.callbacks",
    "CallbackError": "grpokit.trainer.callbacks",
    "RunWarning": "grpokit.metrics",
    "RunSummary": "grpokit.trainer.summary",
    "StopReason": "grpokit.trainer.summary",
    "EvalResult": "grpokit.eval.evaluate",
    "StepMetrics": "grpokit.metrics.step",
    "Recipe": "grpokit.config",
    "RecipeError": "grpokit.config",
    "load_recipe": "grpokit.config",
    "Environment": "grpokit.envs",
    "Observation": "grpokit.envs",
    "Episode": "grpokit.envs",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> _typing.Any:
    """``grpokit.Trainer`` and the rest of :data:`_API`, imported when first used."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'grpokit' has no attribute {name!r}")


del _typing  # used by the annotation above only: the module's namespace (dir) stays as it was


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
