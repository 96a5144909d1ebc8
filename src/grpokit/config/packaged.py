"""The packaged recipes (``grpokit/recipes/*.yaml``) and how a recipe argument names one: a file, or a
packaged recipe by name (``arith``, ``arith.yaml``, ``recipes/arith.yaml``) from any folder. Used by the
command line (:mod:`grpokit.cli.recipe_args`) and the library API (:mod:`grpokit.api`)."""

from __future__ import annotations

from pathlib import Path

from grpokit.config.fields import RecipeError
from grpokit.config.yaml_io import load_yaml
from grpokit.utils.textio import read_utf8

__all__ = ["DEFAULT_RECIPE", "PACKAGED_RECIPES", "demo_raw", "find_recipe", "packaged_recipes"]

PACKAGED_RECIPES = Path(__file__).resolve().parents[1] / "recipes"
DEFAULT_RECIPE = PACKAGED_RECIPES / "demo.yaml"


def packaged_recipes() -> list[str]:
    """The names of the packaged recipes (``grpokit/recipes/*.yaml``), sorted: ``["arith", "demo", ...]``."""
    return sorted(p.stem for p in PACKAGED_RECIPES.glob("*.yaml"))


def find_recipe(name: str | Path) -> Path:
    """The recipe file a command-line argument names: the path itself when it exists, else the
    packaged recipe of that name (``arith``, ``arith.yaml``, ``recipes/arith.yaml``), from any folder.

    Raises:
        RecipeError: neither (the message lists the packaged names).
    """
    path = Path(name).expanduser()
    if path.exists():
        return path
    stem = path.name[: -len(path.suffix)] if path.suffix in (".yaml", ".yml") else path.name
    if path.parent in (Path("."), Path("recipes")) and stem in packaged_recipes():
        return PACKAGED_RECIPES / f"{stem}.yaml"
    raise RecipeError(
        f"recipe file not found: {name}; the packaged recipes, found by name from any folder: "
        f"{', '.join(packaged_recipes())}"
    )


def demo_raw() -> dict:
    """The packaged demo recipe's nested dicts."""
    return load_yaml(read_utf8(DEFAULT_RECIPE)) or {}
