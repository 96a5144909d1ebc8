"""Issue #33's comparison on the multi-step task: outcome vs process supervision (rule verifier, learned
PRM, iterative PRM) from the same warm-up, steps and data (``recipes/steps.yaml``).

    python experiments/scripts/process_arms.py run [--only ARM ...] [--seeds 0 1]   # trains what is missing
    python experiments/scripts/process_arms.py table [--seeds 0 1] [--json OUT]

Every run is ``grpokit train recipes/steps.yaml train.seed=S`` plus the arm's keys, in
``runs/steps/<arm>_s<S>``. The PRM arms need ``runs/steps/prm`` (``grpokit prm label`` then
``grpokit prm train recipes/steps.yaml``; ``make process-steps`` runs them first). A run whose
``eval_after.json`` exists is skipped, so an interrupted ``run`` continues (``grpokit train``
resumes the unfinished run from its checkpoint). Only the outcome arm evaluates before training (the
warm-up is the same for all).

``table`` prints, per seed, held-out greedy accuracy (Wilson 95 %) at the recipe's last step, the
paired difference against the outcome arm of the same seed (Newcombe 95 %, exact McNemar p), the
last 5 steps' completion length, the step count of the completions logged at the last sampled step
(``samples.jsonl``; lines) and the training minutes; then each arm of ``ALSO_PAIRED`` paired with the
fixed-PRM arm of its seed, and what an iterative arm's PRM refreshes cost; no model runs.
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
from grpokit.metrics import read_metrics

OUT = Path("runs/steps")
RECIPE = "recipes/steps.yaml"
PRM = OUT / "prm"
PROCESS = ["algo.supervision=process", "algo.process_advantage=diff"]

# name -> (recipe keys, what it is). Order: the order of the table.
ARMS: dict[str, tuple[list[str], str]] = {
    "outcome": ([], "outcome supervision (reasoning_gym's answer check)"),
    "rule": ([*PROCESS, "algo.process_reward=arithmetic"], "process, rule verifier"),
    "rule_change": (
        ["algo.supervision=process", "algo.process_advantage=change", "algo.process_reward=arithmetic"],
        "process, rule verifier, each step credited with its own change only",
    ),
    "prm": ([*PROCESS, f"algo.process_reward=prm:{PRM}"], "process, learned PRM (fixed)"),
    "prm_outcome": (
        [*PROCESS, f"algo.process_reward=prm:{PRM}", "algo.process_last_step=outcome"],
        "process, learned PRM on the steps before the answer, the answer check on the last",
    ),
    "prm_iterative": (
        [*PROCESS, f"algo.process_reward=prm:{PRM}", "prm.refresh_steps=10"],
        "process, learned PRM retrained every 10 steps (DeepSeekMath 4.1.3)",
    ),
}

# arm -> the arm of the same seed it is also paired with (the issue's "iterative >= non-iterative")
ALSO_PAIRED = {"prm_iterative": "prm", "prm_outcome": "prm"}


def run(names: list[str], seeds: list[int], shared: list[str]) -> None:
    exe = Path(sys.executable).with_name("grpokit")
    for seed in seeds:
        for name in names:
            keys, _ = ARMS[name]
            out = OUT / f"{name}_s{seed}"
            if (out / "eval_after.json").exists():
                print(f"[arms] {out}: done, skipped", flush=True)
                continue
            before = [] if name == "outcome" else ["eval.before=false"]
            cmd = [str(exe), "train", RECIPE, f"train.seed={seed}", *shared, *keys, *before, f"train.output_dir={out}"]
            print("[arms] " + " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, env={**os.environ})


def _metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def _outcomes(path: Path) -> list[bool]:
    return [bool(x) for x in json.loads(path.read_text())["outcomes"]]


def _mean_last(rows: list[dict], key: str, n: int = 5) -> float | None:
    vals = [m[key] for m in rows if key in m][-n:]
    return statistics.fmean(vals) if vals else None


def _sampled_steps(out: Path) -> float | None:
    """Mean step count (``lines``) of the completions logged at the run's last sampled step."""
    from grpokit.process import split_steps

    path = out / "samples.jsonl"
    if not path.exists():
        return None
    rows = read_metrics(path)  # JSON lines, as metrics.jsonl
    if not rows:
        return None
    last = max(r["step"] for r in rows)
    return statistics.fmean(len(split_steps(r["completion"], "lines")) for r in rows if r["step"] == last)


def table(seeds: list[int], json_out: str | None) -> dict:
    report: dict = {"recipe": RECIPE, "seeds": {}}
    print(
        "| seed | arm | held-out (95 %) | − outcome, points (95 %) | only arm / only outcome | McNemar p "
        "| length, last 5 | steps, last sample | train min |\n" + "| --- " * 9 + "|"
    )
    for seed in seeds:
        base_path = OUT / f"outcome_s{seed}" / "eval_after.json"
        base = _outcomes(base_path) if base_path.exists() else None
        rows_out = report["seeds"][seed] = {}
        before = OUT / f"outcome_s{seed}" / "eval_before.json"
        if before.exists():
            got = _outcomes(before)
            lo, hi = wilson_interval(sum(got), len(got))
            rows_out["warmup"] = {"accuracy": sum(got) / len(got), "lo": lo, "hi": hi}
            print(f"| {seed} | warm-up | {sum(got) / len(got):.3f} [{lo:.3f}, {hi:.3f}] | | | | | | |")
        for name in ARMS:
            out = OUT / f"{name}_s{seed}"
            if not (out / "eval_after.json").exists():
                continue
            got = _outcomes(out / "eval_after.json")
            lo, hi = wilson_interval(sum(got), len(got))
            m = _metrics(out)
            minutes = sum(x.get("step_s", 0.0) for x in m) / 60
            entry = {
                "keys": ARMS[name][0],
                "accuracy": sum(got) / len(got),
                "lo": lo,
                "hi": hi,
                "length_last5": _mean_last(m, "completion_len_mean"),
                "steps_last_sample": _sampled_steps(out),
                "train_minutes": minutes,
                "outcomes": "".join("1" if x else "0" for x in got),  # to pair a later run with this one
            }
            cells = ["—", "—", "—"]
            if base is not None and name != "outcome":
                pc = paired_comparison(base, got)
                entry["paired_vs_outcome"] = pc
                cells = [
                    f"{100 * pc['diff']:+.1f} [{100 * pc['diff_lo']:+.1f}, {100 * pc['diff_hi']:+.1f}]",
                    f"{pc['b_only']} / {pc['a_only']}",
                    f"{pc['p_value']:.2g}",
                ]
            refresh = [x for x in m if "prm_refresh_s" in x]
            if refresh:  # iterative RL: what the PRM refreshes cost, inside train min
                entry["prm_refresh_minutes"] = sum(x["prm_refresh_s"] for x in refresh) / 60
                entry["prm_label_tokens"] = sum(x.get("prm_label_tokens", 0) for x in refresh)
            rows_out[name] = entry
            length = "—" if entry["length_last5"] is None else f"{entry['length_last5']:.1f}"
            steps = "—" if entry["steps_last_sample"] is None else f"{entry['steps_last_sample']:.2f}"
            print(
                f"| {seed} | {name} | {sum(got) / len(got):.3f} [{lo:.3f}, {hi:.3f}] | {' | '.join(cells)} "
                f"| {length} | {steps} | {minutes:.0f} |"
            )
        for name, other in ALSO_PAIRED.items():
            if name in rows_out and other in rows_out:
                pc = paired_comparison(
                    _outcomes(OUT / f"{other}_s{seed}" / "eval_after.json"),
                    _outcomes(OUT / f"{name}_s{seed}" / "eval_after.json"),
                )
                rows_out[name][f"paired_vs_{other}"] = pc
                print(
                    f"- seed {seed}: {name} − {other}: {100 * pc['diff']:+.1f} points "
                    f"[{100 * pc['diff_lo']:+.1f}, {100 * pc['diff_hi']:+.1f}], only {name} / only {other} "
                    f"{pc['b_only']} / {pc['a_only']}, McNemar p = {pc['p_value']:.2g}"
                )
            refresh = rows_out.get(name, {}).get("prm_refresh_minutes")
            if refresh is not None:
                print(
                    f"- seed {seed}: {name}'s PRM refreshes took {refresh:.1f} of its train minutes, "
                    f"{rows_out[name]['prm_label_tokens']} tokens generated for their labels"
                )
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--only", nargs="+", choices=list(ARMS), default=list(ARMS))
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    r.add_argument("--shared", nargs="*", default=[], help="keys added to every run")
    t = sub.add_parser("table")
    t.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    t.add_argument("--json")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        run(a.only, a.seeds, a.shared)
    else:
        table(a.seeds, a.json)


if __name__ == "__main__":
    main()
