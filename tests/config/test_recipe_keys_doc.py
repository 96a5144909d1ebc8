"""``docs/recipe_keys.md`` is what the schema says: every recipe key, its default, choices and help."""

from __future__ import annotations

from pathlib import Path

from grpokit.config.reference import recipe_keys_markdown
from grpokit.config.schema import Recipe, walk_recipe

PAGE = Path(__file__).resolve().parents[2] / "docs/recipe_keys.md"


def test_the_page_is_the_schemas():
    assert PAGE.read_text(encoding="utf-8") == recipe_keys_markdown(), "stale: run `make recipe-keys`"


def test_every_key_has_its_row_with_its_default():
    text = recipe_keys_markdown()
    for key, _value, _field in walk_recipe(Recipe()):
        assert f"| `{key}` | " in text, key
    assert "| `train.max_steps` | int | `" in text
    assert "| `model.dtype` | str | `'float32'` | `float32`, `bfloat16` |" in text
