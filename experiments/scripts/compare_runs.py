"""Compare runs side by side: a markdown table of held-out accuracy and reward, and one PNG of the
reward curves. Usage: python experiments/scripts/compare_runs.py OUT.png NAME=RUN_DIR [NAME=RUN_DIR ...]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grpokit.metrics import read_metrics
from grpokit.utils.importing import require


def _acc(run: Path, when: str) -> str:
    f = run / f"eval_{when}.json"
    if not f.exists():
        return "–"
    e = json.loads(f.read_text())
    return f"{e['accuracy']:.2f} ({e['correct']}/{e['total']})"


def _mean(rows, key, lo, hi):
    vals = [r[key] for r in rows if lo <= r["step"] <= hi and r.get(key) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def main(argv: list[str]) -> None:
    out_png, runs = Path(argv[0]), [a.split("=", 1) for a in argv[1:]]
    matplotlib = require("matplotlib", extra="plots", why="experiments/scripts/compare_runs.py")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    print("| run | steps | held-out acc. before | after | math_correct steps 1-5 | last 5 | KL last | s/step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, d in runs:
        run = Path(d)
        rows = read_metrics(run / "metrics.jsonl")
        n = rows[-1]["step"]
        print(
            f"| {name} | {n} | {_acc(run, 'before')} | {_acc(run, 'after')} | "
            f"{_mean(rows, 'rewards/math_correct', 1, 5):.3f} | "
            f"{_mean(rows, 'rewards/math_correct', n - 4, n):.3f} | {rows[-1]['kl']:.4f} | "
            f"{_mean(rows, 'step_s', 1, n):.0f} |"
        )
        steps = [r["step"] for r in rows]
        for ax, key in zip(axes, ("rewards/math_correct", "kl")):
            ax.plot(steps, [r.get(key) for r in rows], label=name)
            ax.set_title(key)
            ax.set_xlabel("step")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)


if __name__ == "__main__":
    main(sys.argv[1:])
