"""Held-out accuracy split by a column of the held-out rows (MAWPS: ``type`` = singleop, addsub,
singleeq, multiarith), for evaluations of one recipe's held-out problems.

Usage: python experiments/scripts/heldout_by_kind.py RECIPE.yaml EVAL.json [EVAL.json ...] [--column type]

Each EVAL.json is a run's ``eval_before.json``/``eval_after.json``/``eval_stepN.json`` or the
``--output`` of ``grpokit eval --heldout-of RECIPE`` (one row per model of its ``models``). Its
per-problem ``outcomes`` must be in the order of the recipe's held-out rows
(:class:`grpokit.eval.evaluate.HeldOutEval`); a length that differs is an error naming the file.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def heldout_rows(recipe_path: str) -> list[dict]:
    """The held-out rows of a recipe's run, in the order its evaluations score them."""
    from grpokit.config import load_recipe
    from grpokit.data.rows import section_rows
    from grpokit.eval.evaluate import HeldOutEval

    recipe = load_recipe(recipe_path)
    return HeldOutEval(recipe, section_rows(recipe, "data")).rows


def outcomes_of(path: Path) -> dict[str, list[bool]]:
    """``{label: per-problem outcomes}`` of one evaluation JSON (a run's or ``grpokit eval``'s)."""
    data, label = json.loads(path.read_text()), f"{path.parent.name}/{path.stem}"
    if "outcomes" in data:
        return {label: data["outcomes"]}
    if "models" in data:
        return {f"{label}:{name}": m["outcomes"] for name, m in data["models"].items()}
    raise ValueError(f"{path}: no 'outcomes' and no 'models' (not an evaluation JSON)")


def by_kind(rows: list[dict], outcomes: list[bool], column: str, label: str = "outcomes") -> dict[str, tuple[int, int]]:
    """``{kind: (correct, total)}`` over ``rows[i][column]``.

    Raises:
        ValueError: ``outcomes`` and ``rows`` differ in length, or a row lacks ``column``.
    """
    if len(outcomes) != len(rows):
        raise ValueError(
            f"{label}: {len(outcomes)} outcomes for {len(rows)} held-out rows (another recipe's evaluation?)"
        )
    missing = [i for i, r in enumerate(rows) if column not in r]
    if missing:
        raise ValueError(f"held-out row {missing[0]} has no column {column!r} (columns: {sorted(rows[missing[0]])})")
    correct, total = Counter(), Counter()
    for row, ok in zip(rows, outcomes):
        total[row[column]] += 1
        correct[row[column]] += bool(ok)
    return {k: (correct[k], total[k]) for k in sorted(total)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("evals", nargs="+", type=Path)
    ap.add_argument("--column", default="type")
    ns = ap.parse_args(argv)
    rows = heldout_rows(ns.recipe)
    table = {label: by_kind(rows, o, ns.column, label) for p in ns.evals for label, o in outcomes_of(p).items()}
    kinds = sorted({k for t in table.values() for k in t})
    print("| evaluation | " + " | ".join(f"{k} (n = {next(iter(table.values()))[k][1]})" for k in kinds) + " | all |")
    print("| --- " * (len(kinds) + 2) + "|")
    for label, t in table.items():
        cells = [f"{t[k][0] / t[k][1]:.3f}" for k in kinds]
        c, n = sum(v[0] for v in t.values()), sum(v[1] for v in t.values())
        print(f"| {label} | " + " | ".join(cells) + f" | {c / n:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
