"""What the recipe's schema (:mod:`grpokit.config.schema`) builds its fields from: the error a bad key
or value raises, the registries that give a key's choices, and the checks of list and mapping values
(``model.lora``) that the schema's loading and checking share."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from dataclasses import dataclass
from typing import Any


class RecipeError(ValueError):
    """A recipe key or value that is not allowed; the message names the key."""


@dataclass(frozen=True)
class Registry:
    """The choices of a recipe key that a registry keeps: the names of ``module.attr`` (a mapping or
    a tuple), e.g. ``rollout.engine``'s are :data:`grpokit.rollout.engine.ENGINES`. Read when a
    recipe is validated (:func:`choices_of`), not when this module is imported: ``grpokit.backends``
    and ``grpokit.estimators.base`` import torch. ``listed`` are the built-in names, which ``grpokit train
    --help`` prints without importing the module when it is not imported yet (a test checks that they
    equal the registry's)."""

    module: str
    attr: str
    listed: tuple[str, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.attr))

    def names_if_imported(self) -> tuple[str, ...]:
        """The registry's names when its module is imported (names added at run time included),
        else the built-in ``listed`` ones; imports nothing."""
        module = sys.modules.get(self.module)
        return tuple(getattr(module, self.attr)) if module is not None else self.listed


def choices_of(f: dataclasses.Field, *, import_registry: bool = True) -> tuple[str, ...] | None:
    """The allowed values of a recipe field (its ``choices`` metadata, a :class:`Registry`'s names
    read now; with ``import_registry=False`` its :meth:`Registry.names_if_imported`, which imports
    nothing), or None when any value of its type is allowed here."""
    choices = f.metadata.get("choices")
    if isinstance(choices, Registry):
        return choices.names() if import_registry else choices.names_if_imported()
    return choices


#: the keys of ``model.lora`` and their defaults (``target_modules``: a list of module names, or
#: ``all-linear``: every linear layer but the output head)
LORA_DEFAULTS: dict[str, Any] = {"r": 16, "alpha": 32, "target_modules": "all-linear", "dropout": 0.0}


def check_elements(key: str, items: list, check: Any, *, repeats: bool = True, twice_hint: str = "") -> None:
    """Each element of the list ``items`` of ``key`` through ``check(f"{key}[{i}]", element)`` (which
    raises :class:`RecipeError` naming that index); with ``repeats=False`` an element listed twice is
    refused, naming both indices (``twice_hint``: how to go on, appended to the message).

    Raises:
        RecipeError: from ``check``, or ``key[i]: 'x' is listed twice (also key[j]); list each once``.
    """
    first: dict[Any, int] = {}
    for i, item in enumerate(items):
        check(f"{key}[{i}]", item)
        if not repeats and item in first:
            raise RecipeError(
                f"{key}[{i}]: {item!r} is listed twice (also {key}[{first[item]}]); list each once" + twice_hint
            )
        first.setdefault(item, i)


def _module_name(key: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise RecipeError(f"{key}: expected a module name, got {value!r}")


def lora_options(value: Any, key: str = "model.lora") -> dict[str, Any] | None:
    """``model.lora`` checked and completed with :data:`LORA_DEFAULTS` (None stays None: off).

    Raises:
        RecipeError: not a mapping, an unknown key, ``r`` < 1 or not an integer, ``alpha`` <= 0,
            ``dropout`` outside [0, 1), ``target_modules`` neither a non-empty list of names nor
            ``all-linear``, or a name in it that is empty, not text or listed twice; the message
            names ``model.lora.<key>`` (and the list index: ``model.lora.target_modules[1]``).

    >>> lora_options({"r": 4})["alpha"], lora_options(None)
    (32, None)
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeError(f"{key}: expected a mapping {{r, alpha, target_modules, dropout}} or null, got {value!r}")
    unknown = sorted(set(value) - set(LORA_DEFAULTS))
    if unknown:
        raise RecipeError(f"unknown recipe key {key}.{unknown[0]}; allowed in {key}: {', '.join(LORA_DEFAULTS)}")
    out = {**LORA_DEFAULTS, **value}
    r, alpha, dropout, tm = out["r"], out["alpha"], out["dropout"], out["target_modules"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise RecipeError(f"{key}.r: the adapter rank must be an integer >= 1, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 or alpha == float("inf"):
        raise RecipeError(f"{key}.alpha: must be a number > 0 (the adapter scale is alpha / r), got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise RecipeError(f"{key}.dropout: must be in [0, 1), got {dropout!r}")
    if isinstance(tm, str):
        if tm != "all-linear":
            raise RecipeError(
                f"{key}.target_modules: a list of module names (e.g. [q_proj, v_proj]) or all-linear, got {tm!r}"
            )
    elif not isinstance(tm, list) or not tm:
        raise RecipeError(f"{key}.target_modules: a non-empty list of module names or all-linear, got {tm!r}")
    else:
        check_elements(f"{key}.target_modules", tm, _module_name, repeats=False)
    out["dropout"] = float(dropout)
    return out
