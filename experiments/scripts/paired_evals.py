"""Held-out accuracies and paired comparisons from saved evaluations (no model runs).

    python experiments/scripts/paired_evals.py base=runs/x/eval_before.json after=runs/x/eval_after.json \\
        --pair after:base [--json OUT.json]

Each NAME=FILE is an evaluation written by a run (``eval_before.json``, ``eval_step<N>.json``,
``eval_after.json``: one model's ``outcomes``) or by ``grpokit eval --output`` (its first model, or
``FILE#MODEL`` for another). Prints a markdown table: greedy accuracy with its Wilson 95 % interval
per evaluation, then per ``--pair A:B`` the paired difference A − B on the same problems (Newcombe
interval), the problems only A / only B solves and the exact McNemar p. Problems must be the same
(the same count, in the same order: evaluations of one recipe's held-out set are).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpokit.eval.stats import paired_comparison, wilson_interval


def outcomes(spec: str) -> list[bool]:
    """The per-problem greedy outcomes of ``FILE`` or ``FILE#MODEL``."""
    path, _, model = spec.partition("#")
    data = json.loads(Path(path).read_text())
    if "models" in data:
        models = data["models"]
        entry = models[model] if model else next(iter(models.values()))
    else:
        entry = data
    if not isinstance(entry.get("outcomes"), list):
        raise SystemExit(f"{spec}: no per-problem outcomes")
    return [bool(x) for x in entry["outcomes"]]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("evals", nargs="+", metavar="NAME=FILE")
    ap.add_argument("--pair", action="append", default=[], metavar="A:B")
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args(argv)
    got = {}
    for item in a.evals:
        name, _, spec = item.partition("=")
        got[name] = outcomes(spec)
    report: dict = {"accuracy": {}, "pairs": {}}
    print("| evaluation | held-out greedy (95 % Wilson) |\n| --- | --- |")
    for name, o in got.items():
        lo, hi = wilson_interval(sum(o), len(o))
        report["accuracy"][name] = {"value": sum(o) / len(o), "lo": lo, "hi": hi, "correct": sum(o), "n": len(o)}
        print(f"| {name} | {sum(o) / len(o):.3f} [{lo:.3f}, {hi:.3f}] ({sum(o)}/{len(o)}) |")
    if a.pair:
        print(
            "\n| A − B | difference (points, 95 % Newcombe) | only A | only B | McNemar p |"
            "\n| --- | --- | --- | --- | --- |"
        )
    for pair in a.pair:
        x, _, y = pair.partition(":")
        if len(got[x]) != len(got[y]):
            raise SystemExit(f"--pair {pair}: {len(got[x])} and {len(got[y])} problems")
        pc = paired_comparison(got[y], got[x])  # b - a: x - y
        report["pairs"][pair] = pc
        print(
            f"| {x} − {y} | {100 * pc['diff']:+.1f} [{100 * pc['diff_lo']:+.1f}, {100 * pc['diff_hi']:+.1f}] | "
            f"{pc['b_only']} | {pc['a_only']} | {pc['p_value']:.2g} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
