"""Issue #35's measured table: each loss/advantage variant for 30 steps on ``recipes/arith.yaml``.

    python experiments/scripts/loss_variants.py run [--only NAME ...] [--shared KEY=VALUE ...] [--out DIR]
    python experiments/scripts/loss_variants.py table [--out DIR] [--json OUT] [--plot OUT.png]

Every run is ``grpokit train recipes/arith.yaml`` with the shared settings below plus the variant's
own keys, in ``runs/variants/<name>``. A run whose ``eval_after.json`` exists is skipped, so an
interrupted ``run`` continues (``grpokit train`` resumes the unfinished run from its checkpoint).
The recipe's one gradient pass per batch (``train.num_iterations=1``) is kept: then the policy is
its own π_old (every ratio is exactly 1) and GSPO, CISPO and dual clip give plain GRPO's gradient
(docs/loss_variants.md says why), so their runs measure the run-to-run noise of float rounding
alone. ``plain`` is the baseline every other run is paired with on the same held-out problems
(greedy, step 30); ``--shared`` adds keys to every run (``train.num_iterations=2``); ``--out`` puts the
runs in another folder (default ``runs/variants``; e.g. ``runs/variants_mu2`` for the μ = 2 pairs, so
the μ = 1 runs there are not taken for them).

``table`` prints held-out accuracy (Wilson 95 %), the paired difference against ``plain``
(Newcombe 95 %, exact McNemar p), the median step time and the last steps' entropy and completion
length, from the runs' ``eval_after.json`` and ``metrics.jsonl`` (no model runs). The JSON keeps each
row's held-out answers (``outcomes``: one ``1``/``0`` per problem, in the evaluation's order), so a
run measured later can be paired with it after the run folders are gone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from grpokit.eval.stats import paired_comparison, wilson_interval

OUT = Path("runs/variants")
RECIPE = "recipes/arith.yaml"
SHARED = [
    "train.max_steps=30",
    "train.seed=0",
    "eval.every_steps=0",
    "train.sample_every=0",
]

# name -> (recipe keys, what it is). Order: the order of the table.
VARIANTS: dict[str, tuple[list[str], str]] = {
    "plain": ([], "GRPO (token ratio, clip 0.2, group z-score)"),
    "gspo": (
        ["algo.importance_level=sequence", "algo.clip_eps_low=3e-4", "algo.clip_eps_high=4e-4"],
        "GSPO, sequence ratio, ε 3e-4/4e-4",
    ),
    "gspo_token": (
        ["algo.importance_level=sequence_token", "algo.clip_eps_low=3e-4", "algo.clip_eps_high=4e-4"],
        "GSPO-token, ε 3e-4/4e-4",
    ),
    "cispo": (["algo.policy_loss=cispo", "algo.clip_eps_low=1.0"], "CISPO, weight capped at 1.2, no lower bound"),
    "dual_clip": (["algo.dual_clip_c=3"], "dual clip c = 3 (= TRL δ = 3)"),
    "entropy": (["algo.entropy_coef=0.01"], "entropy bonus k = 0.01"),
    "entropy_adaptive": (
        ["algo.entropy_coef=0.01", "algo.entropy_target=0.5", "algo.entropy_coef_lr=0.05"],
        "adaptive entropy bonus, H* = 0.5",
    ),
    "rloo": (["algo.advantage_baseline=rloo", "algo.advantage_scale=none"], "RLOO baseline, unscaled"),
    "reinforce_pp": (
        ["algo.advantage_baseline=reinforce_pp", "algo.advantage_scale=batch"],
        "REINFORCE++-baseline (batch z-score)",
    ),
    "overlong": (["algo.overlong_buffer=8"], "DAPO overlong penalty, L_cache = 8 of 32"),
    "top_p": (["rollout.top_p=0.9"], "top-p 0.9 with sampling replay"),
}


def run(names: list[str], shared: list[str]) -> None:
    exe = Path(sys.executable).with_name("grpokit")
    for name in names:
        keys, _ = VARIANTS[name]
        out = OUT / name
        if (out / "eval_after.json").exists():
            print(f"[variants] {name}: done, skipped", flush=True)
            continue
        before = [] if name == "plain" else ["eval.before=false"]
        cmd = [str(exe), "train", RECIPE, *SHARED, *shared, *keys, *before, f"train.output_dir={out}"]
        print("[variants] " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ})


def _metrics(name: str) -> list[dict]:
    path = OUT / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _num_iterations(name: str) -> int | None:
    """``train.num_iterations`` (μ) of the run, from its newest checkpoint's ``recipe.json``."""
    recipes = sorted((OUT / name).glob("checkpoint-*/recipe.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    return json.loads(recipes[-1].read_text())["train"]["num_iterations"] if recipes else None


def _outcomes(path: Path) -> list[bool]:
    return [bool(x) for x in json.loads(path.read_text())["outcomes"]]


def table(json_out: str | None, plot: str | None) -> dict:
    base = _outcomes(OUT / "plain" / "eval_after.json")
    start = _outcomes(OUT / "plain" / "eval_before.json")
    report: dict = {"shared": SHARED, "recipe": RECIPE, "out": str(OUT), "rows": {}}
    lo, hi = wilson_interval(sum(start), len(start))
    print(f"before training: {sum(start) / len(start):.3f} [{lo:.3f}, {hi:.3f}] ({sum(start)}/{len(start)})\n")
    print(
        "| variant | keys | held-out @30 (95 %) | vs plain, points (95 %) | only variant / only plain | McNemar p "
        "| step s (median) | entropy, last 5 | length, last 5 |\n" + "| --- " * 9 + "|"
    )
    for name, (keys, _) in VARIANTS.items():
        path = OUT / name / "eval_after.json"
        if not path.exists():
            continue
        got = _outcomes(path)
        rows = [m for m in _metrics(name) if "step_s" in m]
        pc = paired_comparison(base, got)
        lo, hi = wilson_interval(sum(got), len(got))
        step_s = statistics.median(m["step_s"] for m in rows) if rows else float("nan")
        ent = statistics.mean(m["entropy"] for m in rows[-5:]) if rows else float("nan")
        length = statistics.mean(m["completion_len_mean"] for m in rows[-5:]) if rows else float("nan")
        report["rows"][name] = {
            "keys": keys,
            "num_iterations": _num_iterations(name),
            "accuracy": sum(got) / len(got),
            "lo": lo,
            "hi": hi,
            "paired_vs_plain": pc,
            "step_s_median": step_s,
            "entropy_last5": ent,
            "length_last5": length,
            "outcomes": "".join("1" if x else "0" for x in got),
        }
        diff = (
            "—"
            if name == "plain"
            else f"{100 * pc['diff']:+.1f} [{100 * pc['diff_lo']:+.1f}, {100 * pc['diff_hi']:+.1f}]"
        )
        pval = "—" if name == "plain" else f"{pc['p_value']:.2g}"
        only = "—" if name == "plain" else f"{pc['b_only']} / {pc['a_only']}"
        print(
            f"| {name} | `{' '.join(keys) or '(recipe)'}` | {sum(got) / len(got):.3f} [{lo:.3f}, {hi:.3f}] | {diff} | "
            f"{only} | {pval} | {step_s:.1f} | {ent:.2f} | {length:.1f} |"
        )
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=1))
    if plot:
        _plot(plot)
    return report


def _plot(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in VARIANTS:
        rows = [m for m in _metrics(name) if "entropy" in m]
        if not rows:
            continue
        steps = [m["step"] for m in rows]
        style = {"linewidth": 2.5, "color": "black"} if name == "plain" else {"linewidth": 1.2}
        axes[0].plot(steps, [m["entropy"] for m in rows], label=name, **style)
        axes[1].plot(steps, [m["completion_len_mean"] for m in rows], label=name, **style)
    axes[0].set(xlabel="step", ylabel="entropy (nats/token)", title="policy entropy")
    axes[1].set(xlabel="step", ylabel="tokens", title="completion length")
    axes[1].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    r.add_argument("--shared", nargs="*", default=[], help="keys added to every run")
    r.add_argument("--out", default=str(OUT), help="the folder of the runs")
    t = sub.add_parser("table")
    t.add_argument("--json")
    t.add_argument("--plot")
    t.add_argument("--out", default=str(OUT), help="the folder of the runs")
    a = ap.parse_args(argv)
    OUT = Path(a.out)
    if a.cmd == "run":
        run(a.only, a.shared)
    else:
        table(a.json, a.plot)


if __name__ == "__main__":
    main()
