"""The recipe of a library run (:func:`make_recipe`): a recipe plus the Python objects that take the
place of its names (:mod:`grpokit.api`'s docstring), put in this process's table
(:mod:`grpokit.utils.given`)."""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpokit.config import Recipe, RecipeError, recipe_from_dict
from grpokit.config.loading import apply_overrides
from grpokit.config.packaged import demo_raw, find_recipe
from grpokit.config.yaml_io import load_yaml
from grpokit.utils.given import give
from grpokit.utils.textio import read_utf8

__all__ = ["Objects", "importable_spec", "make_recipe", "rows_of"]

#: with the demo recipe (no recipe given), these arguments start their section from the defaults
_FRESH_SECTION = {"rows": "data", "rewards": "rewards"}

#: the keys of a recipe's dataset that ``rows=`` / ``eval_rows=`` drop with it (they belong to its rows);
#: the prompt template and the system prompt stay (they are the recipe's, whatever the rows)
_ROWS_KEYS = {
    "data": ("split", "skip", "limit", "shuffle_seed", "options", "prompt_field", "answer_field"),
    "eval": ("split", "limit", "options", "scorer"),
}


def _label(obj: Any) -> str:
    """A readable name for ``obj``: a function's name, a partial's function's, a class's or an instance's class's."""
    inner = getattr(obj, "func", None)  # functools.partial
    base = obj if inner is None or not callable(inner) else inner
    name = getattr(base, "__name__", None) if not isinstance(base, type) else base.__name__
    if name is None:
        name = type(base).__name__
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)).strip("_") or "object"
    return name


def importable_spec(obj: Any) -> str | None:
    """``module:qualname`` when importing it gives back ``obj`` itself (a function or class defined at
    a module's top level, not in ``__main__``); else None.

    >>> import os.path
    >>> importable_spec(os.path.join)
    'posixpath:join'
    >>> importable_spec(lambda x: x) is None
    True
    """
    module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qual or module == "__main__" or "<" in qual:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qual.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qual}" if found is obj else None


class Objects:
    """The Python objects of one :class:`Trainer`, named (``obj:NAME`` or an importable spec)."""

    def __init__(self) -> None:
        self.given: dict[str, tuple[str, Any]] = {}  # name -> ("object" | "rows", value)
        self._labels: set[str] = set()

    def name(self, obj: Any, *, what: str) -> str:
        """The recipe's name for a callable or class ``obj`` (a string is a name already).

        Raises:
            TypeError: ``obj`` is neither a string nor callable (names ``what``)."""
        if isinstance(obj, str):
            return obj
        if not callable(obj):
            raise TypeError(f"{what}: expected a name or a callable, got {type(obj).__name__} {obj!r}")
        spec = importable_spec(obj)
        if spec is not None:
            return spec
        for name, (kind, value) in self.given.items():
            if kind == "object" and value is obj:
                return name
        label, n = _label(obj), 2
        while label in self._labels:
            label = f"{_label(obj)}_{n}"
            n += 1
        self._labels.add(label)
        name = f"obj:{label}"
        self.given[name] = ("object", obj)
        return name

    def rows(self, data: Any, *, what: str) -> str:
        """The recipe's name for rows ``data`` (a string is a dataset name already): ``obj:rows-<hash>``
        (the same rows give the same name, so a run resumes with them).

        Raises:
            TypeError: not a list/iterable of mappings (names ``what`` and the row)."""
        if isinstance(data, (str, Path)):
            return str(data)
        rows = rows_of(data, what=what)
        digest = hashlib.sha1(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:10]
        name = f"obj:{what.split('.')[0]}-rows-{digest}"
        self.given[name] = ("rows", rows)
        return name

    def give_all(self) -> None:
        """Put every object in the process's table (again: another Trainer may have replaced one)."""
        for name, (kind, value) in self.given.items():
            label = name[len("obj:") :]
            if kind == "rows":
                give(label, rows=value)
            else:
                give(label, value)


def rows_of(data: Any, *, what: str = "rows") -> list[dict[str, Any]]:
    """``data`` as a list of dicts: a list or other iterable of mappings, a ``datasets.Dataset``, a
    pandas ``DataFrame``.

    Raises:
        TypeError: a mapping (a ``DatasetDict``: pick a split), a string, or an item that is not a
            mapping (names ``what`` and the row index).
        ValueError: no rows.
    """
    if hasattr(data, "to_dict") and hasattr(data, "columns") and not hasattr(data, "features"):
        data = data.to_dict("records")  # a pandas DataFrame
    if isinstance(data, Mapping):
        keys = ", ".join(map(str, list(data)[:5]))
        raise TypeError(f"{what}: a mapping ({keys}); give a list of row dicts (a DatasetDict: pick a split)")
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise TypeError(f"{what}: expected a list of dicts, a datasets.Dataset or an iterable of dicts, got {data!r}")
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise TypeError(f"{what}: row {i} is a {type(row).__name__}, not a mapping: {row!r}")
        rows.append(dict(row))
    if not rows:
        raise ValueError(f"{what}: no rows")
    return rows


def _raw_recipe(recipe: Any, fresh: Sequence[str]) -> tuple[dict, str | None]:
    """The recipe's nested dicts, and what to say about it (the demo runs)."""
    if recipe is None:
        raw = demo_raw()
        for sec in fresh:
            raw.pop(sec, None)
        note = "no recipe given: running the packaged demo recipe" + "".join(
            f"; the {sec} section starts from the defaults" for sec in fresh
        )
        return raw, note
    if isinstance(recipe, Recipe):
        return recipe.to_dict(), None
    if isinstance(recipe, Mapping):
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in recipe.items()}, None
    if isinstance(recipe, (str, Path)):
        return load_yaml(read_utf8(find_recipe(recipe))) or {}, None
    raise TypeError(f"recipe: expected a name, a path, a dict or a grpokit.Recipe, got {type(recipe).__name__}")


def _overrides(raw: dict, overrides: Mapping[str, Any] | Sequence[str]) -> None:
    """Apply ``overrides`` to ``raw``: ``"section.key=value"`` strings (YAML values) or a mapping of
    dotted keys (or of section names to mappings of their keys) to Python values; a bare key (TRL's
    ``num_generations``, grpokit's ``max_steps``) is answered with the grpokit form."""
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            sec, dot, name = str(key).partition(".")
            if not dot and isinstance(value, Mapping):  # {"train": {"max_steps": 2}}: a section's keys
                _overrides(raw, {f"{sec}.{k}": v for k, v in value.items()})
                continue
            if not dot or not name:
                from grpokit.config.trl_names import grpokit_form

                form = grpokit_form(str(key), str(value)) if not dot else None  # max_steps, TRL's num_generations
                raise RecipeError(f"override {key!r}: expected section.key; " + (form or "e.g. train.max_steps"))
            section = raw.setdefault(sec, {})
            if not isinstance(section, dict):
                raise RecipeError(f"{sec}: expected a mapping")
            section[name] = value
    else:
        if isinstance(overrides, str):
            overrides = [overrides]
        apply_overrides(raw, list(overrides))


def _section(raw: dict, sec: str) -> dict:
    section = raw.get(sec)
    if section is None:
        section = raw[sec] = {}
    if not isinstance(section, dict):
        raise RecipeError(f"{sec}: expected a mapping")
    return section


def make_recipe(
    recipe: Any = None,
    *,
    model: str | Path | None = None,
    rows: Any = None,
    eval_rows: Any = None,
    rewards: Sequence[Any] | None = None,
    reward_weights: Sequence[float] | None = None,
    process_reward: Any = None,
    env: Any = None,
    tools: Sequence[Any] | None = None,
    overrides: Mapping[str, Any] | Sequence[str] = (),
    _objects: Objects | None = None,
) -> Recipe:
    """The validated :class:`grpokit.Recipe` of ``recipe`` with the Python objects in their keys (the
    module docstring), ``model`` as ``model.name_or_path``, and ``overrides``. The objects are put in
    this process's table (:mod:`grpokit.utils.given`).

    Raises:
        RecipeError: an unknown key or a value out of range (names the key), a recipe not found, an
            unknown built-in reward name.
        TypeError: rows that are not mappings, an object that is not callable where a function
            belongs, a ``model`` that is not a path or name (names the argument).
    """
    objects = _objects if _objects is not None else Objects()
    fresh = [sec for arg, sec in _FRESH_SECTION.items() if {"rows": rows, "rewards": rewards}[arg] is not None]
    raw, _ = _raw_recipe(recipe, fresh if recipe is None else ())
    data, rw, algo, rollout, ev = (_section(raw, s) for s in ("data", "rewards", "algo", "rollout", "eval"))
    if model is not None:
        if not isinstance(model, (str, Path)):
            raise TypeError(
                f"model=: a path or a hub name, got a {type(model).__name__} (a loaded model: save_pretrained() "
                "it to a folder and give the folder)"
            )
        _section(raw, "model")["name_or_path"] = str(model)
    # the arguments replace the recipe's values, and the keys that belong to what they replace
    if rows is not None:
        for key in _ROWS_KEYS["data"]:
            data.pop(key, None)
        data["dataset"] = rows
    if eval_rows is not None:
        for key in _ROWS_KEYS["eval"]:
            ev.pop(key, None)
        ev.update(dataset=eval_rows, limit=None)
    if rewards is not None:
        one = isinstance(rewards, str) or callable(rewards)
        rw["functions"] = [rewards] if one else list(rewards)
        rw.pop("weights", None)  # the recipe's weights were its functions'
    if reward_weights is not None:
        rw["weights"] = list(reward_weights)
    if process_reward is not None:
        algo["process_reward"] = process_reward
        algo.setdefault("supervision", "process")
    if env is not None:
        rollout["env"] = env
    if tools is not None:
        if rollout.get("env") not in (None, "tools"):
            raise RecipeError(f"tools=: the tools environment runs tools; rollout.env is {rollout['env']!r}")
        rollout["env"] = "tools"
        rollout["env_options"] = dict(rollout.get("env_options") or {}, tools=list(tools))
    _overrides(raw, overrides)  # last: they may set any of the keys above
    data, rw, algo, rollout, ev = (_section(raw, s) for s in ("data", "rewards", "algo", "rollout", "eval"))
    # the Python objects anywhere in the recipe get their names
    for section, what in ((data, "data.dataset"), (ev, "eval.dataset")):
        if section.get("dataset") is not None and not isinstance(section["dataset"], (str, Path)):
            section["dataset"] = objects.rows(section["dataset"], what=what)
    if isinstance(rw.get("functions"), list):
        rw["functions"] = [objects.name(f, what=f"rewards.functions[{i}]") for i, f in enumerate(rw["functions"])]
        _check_builtin_names(rw["functions"])
    if ev.get("scorer") is not None:
        ev["scorer"] = objects.name(ev["scorer"], what="eval.scorer")
    if algo.get("process_reward") is not None:
        algo["process_reward"] = objects.name(algo["process_reward"], what="algo.process_reward")
    if rollout.get("env") is not None and not isinstance(rollout["env"], str):
        rollout["env"] = _env_name(objects, rollout["env"], rollout.get("env_options"))
    options = rollout.get("env_options")
    if isinstance(options, Mapping) and isinstance(options.get("tools"), list):
        rollout["env_options"] = dict(options)
        rollout["env_options"]["tools"] = [
            objects.name(t, what=f"rollout.env_options.tools[{i}]") for i, t in enumerate(options["tools"])
        ]
    objects.give_all()
    return recipe_from_dict(raw)


def _check_builtin_names(names: Sequence[Any]) -> None:
    """A reward name without ``:`` must be a built-in (or registered) one: said when the recipe is
    made, not when the run starts.

    Raises:
        RecipeError: an unknown name (names the entry, a close built-in, and the forms allowed)."""
    import difflib

    from grpokit.rewards.base import BUILTIN_REWARDS

    for i, name in enumerate(names):
        if isinstance(name, str) and ":" not in name and name not in BUILTIN_REWARDS:
            close = difflib.get_close_matches(name, list(BUILTIN_REWARDS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RecipeError(
                f"rewards.functions[{i}]: unknown reward {name!r}; {hint}built-in rewards: "
                f"{', '.join(sorted(BUILTIN_REWARDS))}; or give a Python function, 'module:function' or "
                "'path/to/file.py:function'"
            )


def _env_name(objects: Objects, env: Any, options: Any) -> str:
    """The name of an environment class, or of an instance (given as a factory that returns it)."""
    if isinstance(env, type):
        return objects.name(env, what="rollout.env")
    if options:
        raise RecipeError("rollout.env: an environment instance was given; its options are its own (drop env_options)")

    def factory() -> Any:
        return env

    factory.__name__ = type(env).__name__
    return objects.name(factory, what="rollout.env")
