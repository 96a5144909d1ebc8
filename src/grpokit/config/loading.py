"""Reading a recipe: YAML file, dotted overrides, type checks, then :func:`grpokit.config.checks.validate`."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from grpokit.config.checks import validate
from grpokit.config.fields import RecipeError, choices_of
from grpokit.config.schema import RENAMED_KEYS, Recipe, fields_of, hints_of, walk_recipe
from grpokit.config.trl_names import TRL_NAMES, grpokit_form, keys_named, recipe_keys
from grpokit.config.yaml_io import DuplicateKeyError, load_yaml, yaml_problem
from grpokit.utils.textio import NotUtf8Error, read_utf8


def _check_type(key: str, value: Any, annotation: Any) -> Any:
    """Return ``value`` converted to ``annotation`` where lossless (int -> float), else raise."""
    hint = annotation
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]  # the one the value is, else the first
        hint = next((a for a in members if isinstance(value, typing.get_origin(a) or a)), members[0])
    base = typing.get_origin(hint) or hint
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base is bool and not isinstance(value, bool):
        raise RecipeError(f"{key}: expected true/false, got {value!r}")
    if base is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RecipeError(f"{key}: expected an integer, got {value!r}")
    if not isinstance(value, base):
        raise RecipeError(f"{key}: expected {base.__name__}, got {type(value).__name__} {value!r}")
    return value


def recipe_from_dict(raw: dict) -> Recipe:
    """Build and validate a ``Recipe`` from nested dicts; unknown keys raise ``RecipeError``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"recipe: expected a mapping of sections, got {type(raw).__name__}")
    sections = fields_of(Recipe)
    kwargs = {}
    for sec, values in raw.items():
        if sec not in sections:
            close = difflib.get_close_matches(str(sec), list(sections), n=1, cutoff=0.75)
            raise RecipeError(
                f"unknown recipe section {sec!r}; allowed: {', '.join(sections)}"
                + (f"; did you mean {close[0]}?" if close else "")
            )
        cls = hints_of(Recipe)[sec]
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise RecipeError(f"{sec}: expected a mapping, got {values!r}")
        hints, allowed = hints_of(cls), fields_of(cls)
        sub = {}
        for key, val in values.items():
            if key not in allowed:
                hint = RENAMED_KEYS.get(f"{sec}.{key}")
                raise RecipeError(
                    f"unknown recipe key {sec}.{key}; "
                    + (
                        f"it is now {hint}"
                        if hint
                        else f"allowed in {sec}: {', '.join(allowed)}{_did_you_mean(sec, key)}"
                    )
                )
            sub[key] = _check_type(f"{sec}.{key}", val, hints[key])
        kwargs[sec] = cls(**sub)
    recipe = Recipe(**kwargs)
    validate(recipe)
    return recipe


def _did_you_mean(sec: str, key: Any) -> str:
    """``"; did you mean algo.beta?"`` for unknown recipe key ``sec.key``, or "" when nothing is close: the
    key of that name in another section (``rollout.beta``), the key a TRL name means (``train.num_generations``:
    ``rollout.group_size``), else the closest key of the section, else of any section (difflib, on the
    names without their section).

    >>> _did_you_mean("train", "max_step"), _did_you_mean("rollout", "beta"), _did_you_mean("train", "xyz")
    ('; did you mean train.max_steps?', '; did you mean algo.beta?', '')
    >>> _did_you_mean("train", "num_generations")
    "; did you mean rollout.group_size? (num_generations is TRL's name)"
    """
    key = str(key)
    elsewhere = [k for k in keys_named(key) if not k.startswith(f"{sec}.")]
    if elsewhere:
        return f"; did you mean {elsewhere[0]}?"
    trl = TRL_NAMES.get(key)
    if trl is not None and trl.key is not None:
        return f"; did you mean {trl.key}? ({key} is TRL's name)"
    # names, not sec.name:
    own = difflib.get_close_matches(key, list(fields_of(hints_of(Recipe)[sec])), n=1, cutoff=0.75)
    if own:  # the shared "train." would make every key of the section look close
        return f"; did you mean {sec}.{own[0]}?"
    other = difflib.get_close_matches(key, sorted({k.split(".")[1] for k in recipe_keys()}), n=1, cutoff=0.8)
    return f"; did you mean {keys_named(other[0])[0]}?" if other else ""  # the schema's first section of it


def _is_text_field(sec: str, key: str) -> bool:
    """Whether ``sec.key`` is a ``str`` (or ``str | None``) field of the recipe."""
    cls = hints_of(Recipe).get(sec)
    hint = hints_of(cls).get(key) if dataclasses.is_dataclass(cls) else None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next((a for a in typing.get_args(hint) if a is not type(None)), None)
    return hint is str


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.max_steps=5"`` -> ``(["train", "max_steps"], 5)``; the value is parsed as YAML.

    An empty value is ``None``. For text fields (``data.prompt_template``, ...) a value that YAML
    reads as something other than a string or null (``{question}`` is a YAML mapping, ``42`` an
    int) or cannot parse at all is kept as the literal text after the first ``=``.
    """
    if "=" not in text:
        raise RecipeError(f"override {text!r}: expected key.sub=value")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        form = grpokit_form(key, value) if len(parts) == 1 else None  # max_steps=2, num_generations=8 (TRL's)
        raise RecipeError(f"override {text!r}: key must be section.name; " + (form or "e.g. train.max_steps"))
    if not value.strip():
        return parts, None
    text_field = _is_text_field(*parts)
    try:
        parsed = load_yaml(value)
    except yaml.YAMLError as e:
        if not text_field:
            raise RecipeError(f"override {text!r}: value is not valid YAML: {e}") from None
        return parts, value
    if text_field and parsed is not None and not isinstance(parsed, str):
        return parts, value
    return parts, parsed


def load_recipe(
    path: str | Path | None = None, overrides: list[str] | tuple = (), values: Mapping[str, Any] | None = None
) -> Recipe:
    """Read a YAML recipe (or the defaults when ``path`` is None), apply dotted overrides, then
    ``values`` (``{"section.key": value}``, already typed: a command's flags), validate.

    The file is read as UTF-8 whatever the locale.

    Raises:
        RecipeError: unknown section/key, wrong type or out-of-range value; a file that is missing
            or unreadable, not UTF-8 (message: file, line, byte offset), not valid YAML (file,
            line, column) or that writes a section or key twice, at any depth (file, the key, both
            lines). Messages are one line.
    """
    raw: dict = {}
    lines: dict[str, int] = {}
    if path is not None:
        try:
            text = read_utf8(path)
            raw = load_yaml(text) or {}
        except FileNotFoundError:
            raise RecipeError(f"recipe file not found: {path}") from None
        except OSError as e:  # a folder, no permission, ...
            raise RecipeError(f"recipe {path}: cannot read: {e.strerror or e}") from None
        except NotUtf8Error as e:  # "<path>: line N: not valid UTF-8 (byte 0x.. at offset K ...)"
            raise RecipeError(f"recipe {e}") from None
        except DuplicateKeyError as e:  # "train.max_steps is written twice (lines 2 and 7); ..."
            raise RecipeError(f"recipe {path}: {e}") from None
        except yaml.YAMLError as e:
            raise RecipeError(f"recipe {path}: not valid YAML: {yaml_problem(e)}") from None
        if not isinstance(raw, dict):
            raise RecipeError(f"recipe {path}: expected a mapping of sections")
        lines = key_lines(text)
        _refuse_flat_names(raw, path, lines)
    from_file = {k for k in lines if "." in k} - {str(o).partition("=")[0].strip() for o in overrides}
    raw = apply_overrides(raw, overrides)
    for dotted, value in (values or {}).items():
        sec, key = dotted.split(".")
        if raw.get(sec) is None:  # absent, or an empty section ("sft:")
            raw[sec] = {}
        if not isinstance(raw[sec], dict):
            raise RecipeError(f"{sec}: expected a mapping")
        raw[sec][key] = value
    try:
        return recipe_from_dict(raw)
    except RecipeError as e:  # about a key or section the file wrote: its file and line first
        m = _UNKNOWN.match(str(e)) or _KEYED.match(str(e))
        named = next(g for g in m.groups() if g) if m else ""
        top = ".".join(named.split(".")[:2])  # model.lora.rr: the file wrote model.lora
        if named in lines and (top in from_file or "." not in named) and top not in (values or {}):
            raise RecipeError(f"{path}:{lines[named]}: {e}") from None
        raise


_UNKNOWN = re.compile(r"unknown recipe (?:key ([a-z_]+(?:\.\w+)+);|section '([^']*)';)")
_KEYED = re.compile(r"([a-z_]+(?:\.\w+)+): ")  # "train.max_steps: expected an integer, ..."


def key_lines(text: str) -> dict[str, int]:
    """``{"train": 3, "train.max_steps": 4, "model.lora.r": 7}``: the 1-based line of each section
    and key, at any depth, a recipe's YAML ``text`` writes ({} when it does not parse)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out: dict[str, int] = {}

    def walk(mapping: Any, prefix: str) -> None:
        for key, value in mapping.value if isinstance(mapping, yaml.MappingNode) else ():
            name = f"{prefix}{key.value}"
            out[name] = key.start_mark.line + 1
            walk(value, f"{name}.")

    walk(node, "")
    return out


def _yaml_text(value: Any) -> str:
    """A scalar as a recipe writes it (``true``, ``null``, ``1e-05``, ``org/m``)."""
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def _refuse_flat_names(raw: dict, path: str | Path, lines: Mapping[str, int]) -> None:
    """A file written as TRL's flat config (``model_name_or_path: ...``, ``learning_rate: ...`` at the
    top): refused with the recipe key of each name, as the command line answers them
    (:func:`grpokit.config.trl_names.grpokit_form`), with their lines.

    Raises:
        RecipeError: a top-level name that is not a section but a recipe key's name or TRL's.
    """
    sections = fields_of(Recipe)
    flat = [(str(k), v) for k, v in raw.items() if k not in sections]
    forms = [(k, grpokit_form(k, None if isinstance(v, (dict, list)) else _yaml_text(v))) for k, v in flat]
    if not any(form for _, form in forms):
        return  # an unknown section: recipe_from_dict names it (and a near section name)
    said = "; ".join(
        f"line {lines.get(k, '?')}: " + (form or f"{k} is neither a recipe key's name nor TRL's") for k, form in forms
    )
    raise RecipeError(
        f"recipe {path}: a recipe's top level holds sections ({', '.join(sections)}), each with its keys, "
        f"not TRL's flat names: {said}"
    )


def apply_overrides(raw: dict, overrides: list[str] | tuple = ()) -> dict:
    """``raw`` (a recipe's nested dicts, changed in place and returned) with the dotted
    ``overrides`` (:func:`parse_override`) set, in order.

    Raises:
        RecipeError: an override that does not parse, or a section of ``raw`` that is not a mapping.
    """
    for text in overrides:
        (sec, key), value = parse_override(text)
        raw.setdefault(sec, {})
        if not isinstance(raw[sec], dict):
            raise RecipeError(f"{sec}: expected a mapping")
        raw[sec][key] = value
    return raw


def help_text(other: dict | None = None, label: str = "demo", sections: tuple[str, ...] | None = None) -> str:
    """Every recipe key (of ``sections``; None: all) with its type, default and help, for
    ``grpokit train --help`` (and ``grpokit sft --help``).

    ``other``: a recipe's nested dicts (the demo recipe's); a key it sets to another value than the
    default is shown with ``(label: value)`` after the default."""
    lines = []
    for key, value, f in walk_recipe(Recipe()):
        sec, name = key.split(".")
        if sections is not None and sec not in sections:
            continue
        choices = choices_of(f, import_registry=False)
        extra = f" [{' | '.join(choices)}]" if choices else ""
        section = (other or {}).get(sec) or {}
        if name in section and section[name] != value:
            extra += f"  ({label}: {section[name]!r})"
        lines.append(f"  {key} = {value!r}{extra}\n      {f.metadata['help']}")
    return "\n".join(lines)
