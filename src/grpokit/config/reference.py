"""``docs/recipe_keys.md``: every recipe key with its type, default, choices and help, generated from
the schema (:mod:`grpokit.config.schema`), so no key is named in no doc.

    .venv/bin/python -m grpokit.config.reference > docs/recipe_keys.md   # make recipe-keys

``tests/config/test_recipe_keys_doc.py`` fails when the committed page is not what this writes.
"""

from __future__ import annotations

import typing

from grpokit.config.fields import choices_of
from grpokit.config.schema import Recipe, fields_of, walk_recipe

__all__ = ["recipe_keys_markdown"]

_HEAD = """# Recipe keys

Every key a recipe sets, section by section, with its type, default, allowed values and what it does.
Generated from the schema (`grpokit.config.schema`) by `make recipe-keys`; do not edit by hand
(`tests/config/test_recipe_keys_doc.py` fails when this page and the schema differ). A recipe file writes
each key under its section (`train:` then `max_steps: 8`); the command line writes `train.max_steps=8`.
"""


_TABLE_HEAD = "| key | type | default | choices | what it does |\n| --- | --- | --- | --- | --- |"


def _type_name(annotation: object) -> str:
    """``int``, ``str | None``, ``list[str]``: a field's annotation as the page shows it."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None) or str(annotation)
    return str(text).replace("typing.", "")


def _cell(text: object) -> str:
    """``text`` for a Markdown table cell (pipes escaped, one line)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def recipe_keys_markdown() -> str:
    """The page: a table per section of ``key | type | default | choices | help``.

    Returns:
        Markdown text ending in a newline; the same on every call for the same schema (registry
        choices are read with their modules imported).
    """
    hints = {sec: typing.get_type_hints(cls) for sec, cls in _section_classes().items()}
    out = [_HEAD]
    current = None
    for key, value, f in walk_recipe(Recipe()):
        sec, name = key.split(".")
        if sec != current:
            current = sec
            out.append(f"\n## `{sec}`\n\n{_TABLE_HEAD}")
        choices = choices_of(f)
        out.append(
            f"| `{key}` | {_cell(_type_name(hints[sec][name]))} | `{_cell(repr(value))}` | "
            f"{_cell(', '.join(f'`{c}`' for c in choices)) if choices else ''} | {_cell(f.metadata.get('help', ''))} |"
        )
    return "\n".join(out) + "\n"


def _section_classes() -> dict[str, type]:
    """``{"model": ModelConfig, ...}``: the dataclass of each recipe section."""
    return {sec: typing.get_type_hints(Recipe)[sec] for sec in fields_of(Recipe)}


if __name__ == "__main__":
    print(recipe_keys_markdown(), end="")
