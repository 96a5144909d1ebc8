"""Which recipe a ``grpokit train`` command line means, and where each of its values came from.

- ``RECIPE`` is a file, or a packaged recipe by name (``arith``, ``arith.yaml``, ``recipes/arith.yaml``,
  from any folder; a file of that name in the working folder comes first): :func:`find_recipe`.
- No recipe: the packaged demo recipe (``recipes/demo.yaml``), announced in the run's first line. An
  override of ``data.dataset`` then starts the data section, and one of ``rewards.functions`` the
  rewards section, from the defaults (:data:`DEMO_SECTION_OF`): the demo's split, ``data.skip=100``,
  prompt template and reward weights belong to its MAWPS rows and its two rewards, not to the user's.
- Every key's origin (the user's file and line, the command line, the demo recipe, or the default) is
  kept, and :func:`source_note` adds it to an error that names the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.config import Recipe, RecipeError, load_recipe, recipe_from_dict
from grpokit.config.loading import apply_overrides, key_lines
from grpokit.config.packaged import DEFAULT_RECIPE, PACKAGED_RECIPES, demo_raw, find_recipe, packaged_recipes
from grpokit.config.schema import walk_recipe
from grpokit.config.trl_names import grpokit_form
from grpokit.utils.textio import read_utf8

__all__ = [
    "DEFAULT_RECIPE",
    "DEMO_SECTION_OF",
    "PACKAGED_RECIPES",
    "RecipeArgs",
    "demo_raw",
    "find_recipe",
    "flag_answer",
    "flag_values",
    "command_recipe",
    "packaged_recipes",
    "source_note",
    "split_overrides",
]

#: with no recipe (the demo runs), an override of one of these keys starts its section from the defaults
DEMO_SECTION_OF = {"data.dataset": "data", "rewards.functions": "rewards"}

_DEMO_ORIGIN = "from the demo recipe (no recipe was given)"


def _file_key_lines(path: Path) -> dict[str, int]:
    """``{"train.max_steps": line}`` for each key a recipe file sets (1-based lines, from
    :func:`grpokit.config.loading.key_lines`; {} when it cannot be read)."""
    try:
        text = read_utf8(path)
    except (OSError, ValueError):
        return {}
    return {key: line for key, line in key_lines(text).items() if key.count(".") == 1}


@dataclass
class RecipeArgs:
    """A ``grpokit train`` command line's recipe: ``path`` (None: the demo recipe, whose nested dicts
    less the sections started afresh are ``demo``), the ``overrides``, and ``fresh``: the demo sections
    the overrides start from the defaults."""

    path: Path | None
    overrides: list[str]
    demo: dict | None = None
    fresh: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, recipe: str | None, overrides: list[str]) -> RecipeArgs:
        """The recipe argument (or None) and the overrides of a command line.

        Raises:
            RecipeError: a recipe that is neither a file nor a packaged name (:func:`find_recipe`).
        """
        if recipe is not None:
            return cls(find_recipe(recipe), list(overrides))
        demo = demo_raw()
        keys = {o.partition("=")[0].strip() for o in overrides}
        fresh = [sec for key, sec in DEMO_SECTION_OF.items() if key in keys]
        for sec in fresh:
            demo.pop(sec, None)
        return cls(None, list(overrides), demo, fresh)

    @property
    def announcement(self) -> str | None:
        """What the run says first: that the demo runs (and which of its sections do not), or which packaged
        recipe a name found; None for a recipe file given by its path."""
        if self.path is None:
            why = "".join(
                f"; {key} given, so the {sec} section starts from the defaults, not the demo's"
                for key, sec in DEMO_SECTION_OF.items()
                if sec in self.fresh
            )
            return (
                f"no recipe given: running the packaged demo recipe ({DEFAULT_RECIPE}; `grpokit train --help` "
                f"shows its values){why}"
            )
        if self.path.is_relative_to(PACKAGED_RECIPES):  # found by name
            return f"recipe: the packaged {self.path}"
        return None

    def load(self) -> Recipe:
        """The recipe (validated).

        Raises:
            RecipeError: as :func:`grpokit.config.load_recipe`.
        """
        if self.demo is None:
            return load_recipe(self.path, self.overrides)
        return recipe_from_dict(apply_overrides(self.demo, self.overrides))

    def sources(self) -> dict[str, tuple[str, str]]:
        """Where each key set came from: ``key -> (origin, how it is named there)``, e.g.
        ``("from r.yaml", "train.max_steps line 4")``, ``("from the command line", "train.max_steps")``,
        ``(_DEMO_ORIGIN, "train.max_steps")``; keys left out have their defaults."""
        out = {}
        for sec, values in (self.demo or {}).items():
            for key in values or {}:
                out[f"{sec}.{key}"] = (_DEMO_ORIGIN, f"{sec}.{key}")
        if self.path is not None:
            for key, line in _file_key_lines(self.path).items():
                out[key] = (f"from {self.path}", f"{key} line {line}")
        for text in self.overrides:
            key = text.partition("=")[0].strip()
            out[key] = ("from the command line", key)
        return out


_NAMED_KEY = re.compile(r"\b(model|data|rollout|rewards|algo|train|eval|sft)\.([a-z0-9_]+)(=?)")


def source_note(message: str, sources: dict[str, tuple[str, str]], recipe: Recipe | None = None) -> str:
    """Where the recipe keys ``message`` names got their values (:meth:`RecipeArgs.sources`), grouped
    by origin, e.g. `` (from the command line: data.dataset; defaults: data.split)``, or "" when it
    names none. Left out: a key after ``e.g.`` (an example), ``use``, ``set``, ``did you mean`` or ``grpokit:``
    (advice, :func:`grpokit.config.trl_names.grpokit_form`'s among them, and the keys joined to it by
    ``or``), and with ``recipe``, a ``key=value`` whose value is not the recipe's (advice such as
    ``use rewards.on_error=none``); a key whose file and line start the message already.

    >>> where = {"data.skip": ("from r.yaml", "data.skip line 3")}
    >>> source_note("data.split='x' data.skip=5: no rows left; e.g. train.max_steps=9", where)
    ' (defaults: data.split; from r.yaml: data.skip line 3)'
    >>> source_note("override 'split=x': use data.split=x or eval.split=x", where)
    ''
    """
    fields = {key for key, _, _ in walk_recipe(Recipe())}
    groups: dict[str, list[str]] = {}
    seen: set[str] = set()
    advice = False  # the previous key was advice: one joined to it by "or" is too
    for m in _NAMED_KEY.finditer(message):
        key = f"{m.group(1)}.{m.group(2)}"
        before = message[: m.start()]
        advice = before.endswith(("e.g. ", "use ", "set ", "did you mean ", "grpokit: ")) or (
            advice and before.endswith(" or ")
        )
        if key not in fields or key in seen or advice:
            continue
        if m.group(3) and recipe is not None:
            value = getattr(getattr(recipe, m.group(1)), m.group(2))
            if not message.startswith((repr(value), str(value)), m.end()):
                continue
        seen.add(key)
        origin, named = sources.get(key, ("defaults", key))
        if origin.startswith("from ") and message.startswith(f"{origin[5:]}:{named.rpartition(' line ')[2]}: "):
            continue  # the message starts with the file and line already (grpokit.config.load_recipe)
        groups.setdefault(origin, []).append(named)
    return f" ({'; '.join(f'{o}: ' + ', '.join(n) for o, n in groups.items())})" if groups else ""


_OVERRIDE_ARG = re.compile(r"[a-z_]+\.[a-z0-9_]+=")


def split_overrides(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """A command line's bare words as ``(positional arguments, section.key=value overrides)``.

    >>> split_overrides(["long", "sft.epochs=2", "runs/x"])
    (['long', 'runs/x'], ['sft.epochs=2'])
    """
    overrides = [w for w in words if _OVERRIDE_ARG.match(w)]
    return [w for w in words if not _OVERRIDE_ARG.match(w)], overrides


def flag_answer(words: Sequence[str], known: Sequence[str]) -> str | None:
    """One line for the first ``--name[=value]`` of a command line's ``words`` that is none of the command's
    own flags (``known``) but the name of a recipe key or TRL's (``--max_steps=2``, ``--max-steps 2``,
    ``--num_generations 8``): the grpokit form (:func:`grpokit.config.trl_names.grpokit_form`); None when
    there is no such flag (argparse then says what it says of an unknown flag).

    >>> flag_answer(["r.yaml", "--max-steps", "2"], ["--no-progress"])
    '--max-steps 2: use train.max_steps=2'
    >>> flag_answer(["--num_generations=8"], []), flag_answer(["--no-progress", "--verbose"], ["--no-progress"])
    ("--num_generations=8: num_generations is TRL's name; grpokit: rollout.group_size=8", None)
    """
    for i, word in enumerate(words):
        if not word.startswith("--") or word.partition("=")[0] in known:
            continue
        name, eq, value = word[2:].partition("=")
        nxt = words[i + 1] if i + 1 < len(words) else None
        if not eq and nxt is not None and not nxt.startswith("-") and "=" not in nxt:
            word, value = f"{word} {nxt}", nxt  # --max-steps 2
        form = grpokit_form(name, value if eq or value else None)
        if form is not None:
            return f"{word}: {form}"
    return None


def flag_values(ns: Any, flag_keys: Mapping[str, str], **values: Any) -> dict[str, tuple[str, Any]]:
    """``{"--flag": ("section.key", value)}`` for :func:`command_recipe`: each argparse ``dest`` of
    ``flag_keys`` with the recipe key it sets and its parsed value (``values`` replace some, e.g. a
    flag's text parsed further).

    >>> from types import SimpleNamespace
    >>> flag_values(SimpleNamespace(batch_size=4, split=None), {"batch_size": "sft.batch_size", "split": "sft.split"})
    {'--batch-size': ('sft.batch_size', 4), '--split': ('sft.split', None)}
    """
    return {
        f"--{dest.replace('_', '-')}": (key, values[dest] if dest in values else getattr(ns, dest))
        for dest, key in flag_keys.items()
    }


def command_recipe(path: Path, overrides: Sequence[str], flags: Mapping[str, tuple[str, Any]]) -> Recipe:
    """The recipe of a ``grpokit sft`` or ``grpokit eval`` command line: the file at ``path``, then the
    ``section.key=value`` overrides, then the flags given (``flags``: ``"--flag" -> ("section.key", value)``,
    value None where the flag was not given). A flag is the same key as the override, so the schema's
    defaults, help and checks are the command's.

    Raises:
        RecipeError: as :func:`grpokit.config.load_recipe`; a message about a key a flag set starts
            with that flag (``--learning-rate: sft.learning_rate: must be > 0, got 0.0``).
    """
    given = {flag: (key, v) for flag, (key, v) in flags.items() if v is not None}
    try:
        return load_recipe(path, list(overrides), values={key: v for key, v in given.values()})
    except RecipeError as e:
        for flag, (key, _) in given.items():
            if str(e).startswith(f"{key}:"):
                raise RecipeError(f"{flag}: {e}") from None
        raise
