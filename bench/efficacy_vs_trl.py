"""grpokit vs TRL's GRPOTrainer on one recipe: held-out accuracy at equal steps and time to accuracy.

    python bench/efficacy_vs_trl.py                          # recipes/arith.yaml, 40 steps, seeds 0 and 1
    python bench/efficacy_vs_trl.py --quick                  # tiny: checks that the script works (minutes)
    python bench/efficacy_vs_trl.py --report-only            # rebuild the report from the run folders

Per seed, both peers train on the recipe (``train.seed=SEED``), one after the other (the order
alternates between seeds): grpokit with ``grpokit train`` (this venv), checkpointing every
``eval.every_steps``; TRL 1.16.0 with ``run_trl_efficacy.py`` (``.venv-bench``; its docstring lists
what is matched: rows and order, G, B, sampling, reward, loss aggregation, optimizer, schedule).

Both are scored by the same code on the same problems: grpokit's own held-out evaluation
(``grpokit.eval.evaluate.HeldOutEval``: greedy, ``eval.max_new_tokens``, the recipe's scorer) on the
held-out rows it gives for that seed. grpokit's periodic evaluations are read from its
``metrics.jsonl`` (``eval/greedy`` and its Wilson interval, ``train_minutes``: training wall-clock
without evaluations or checkpointing); each TRL checkpoint is loaded into grpokit's built run
(``load_model_weights``) and evaluated after the run (``run_trl_efficacy.py --evaluate``, in this
venv), at the training minutes TRL's callback recorded when it was saved (saving time left out).
The base model is evaluated by both pipelines (a check: the two must agree problem by problem); the
report also checks that both trained on the same questions in the same order (grpokit's
``samples.jsonl`` steps) at the same learning rates.

Report (``<out>/efficacy_vs_trl.json``, markdown on stdout, ``<out>/efficacy_vs_trl.png``):
  (a) equal steps: final accuracy of each peer per seed (Wilson 95 %), each one's gain over the
      base model, and grpokit − TRL paired on the same problems (Newcombe interval, exact McNemar
      p); "agree" when the interval contains 0;
  (b) equal wall-clock: accuracy vs training minutes per peer and seed, each peer's accuracy at the
      shorter of the two training times; time to accuracy: the first training minute at which each
      run reaches TRL's final accuracy on that seed's held-out draw, linear between evaluation
      points, and grpokit / TRL (mean times over seeds; goal <= 0.35).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOAL_RATIO = 0.35
QUICK_OVERRIDES = [
    "train.max_steps=2",
    "eval.every_steps=1",
    "eval.limit=40",
    "rollout.max_new_tokens=16",
    "eval.max_new_tokens=16",
    "rollout.group_size=4",
    "train.prompts_per_step=4",
    "train.micro_batch_size=8",
    "train.sample_every=1",
]
ECHO = re.compile(r"\[grpokit\] eval|\[trl efficacy\]|Error|error:")


# -- pure logic ----------------------------------------------------------------------------------


def time_to_accuracy(points: list[tuple[float, float]], target: float) -> float | None:
    """The first training minute at which a run's accuracy reaches ``target``.

    ``points``: ``(training minutes, accuracy)`` per evaluation, in training order (the base model
    at minute 0 first). Accuracy is taken as linear between evaluation points, so the crossing lies
    between the last point below ``target`` and the first point at or above it. None if no point
    reaches ``target``.

    >>> time_to_accuracy([(0.0, 0.1), (2.0, 0.3), (4.0, 0.5)], 0.4)
    3.0
    """
    prev = None
    for minutes, acc in points:
        if acc >= target:
            if prev is None:
                return float(minutes)
            m0, a0 = prev  # a0 < target <= acc
            return m0 + (target - a0) / (acc - a0) * (minutes - m0)
        prev = (minutes, acc)
    return None


def accuracy_at(points: list[tuple[float, float]], minute: float) -> float | None:
    """A run's accuracy at ``minute`` of training, linear between evaluation points; None outside
    the evaluated span.

    >>> accuracy_at([(0.0, 0.1), (2.0, 0.3)], 1.0)
    0.2
    """
    for (m0, a0), (m1, a1) in zip(points, points[1:]):
        if m0 <= minute <= m1:
            return a1 if m1 == m0 else a0 + (minute - m0) / (m1 - m0) * (a1 - a0)
    if len(points) == 1 and points[0][0] == minute:
        return points[0][1]
    return None


def time_to_accuracy_summary(grpokit: dict, trl: dict, goal: float = GOAL_RATIO) -> dict:
    """Time to TRL's final accuracy, per seed and as a ratio.

    ``grpokit``/``trl``: ``{seed: [(minutes, accuracy), ...]}``. Each seed has its own held-out
    draw, so the target of a seed is TRL's final accuracy **on that seed**; each run's time is
    :func:`time_to_accuracy` of that target (grpokit: None if it never gets there; TRL: the first
    minute it got there, at the latest its end). ``ratio`` = mean grpokit time / mean TRL time over
    the seeds both peers ran (None unless every grpokit run gets there); ``ratio_vs_trl_total`` uses
    TRL's full training times instead; ``ratios`` per seed.
    """
    seeds = sorted(set(trl) & set(grpokit))
    if not seeds:
        return {"target": None, "ratio": None, "met": None}
    targets = {s: trl[s][-1][1] for s in seeds}
    g_min = {s: time_to_accuracy(grpokit[s], targets[s]) for s in seeds}
    t_min = {s: time_to_accuracy(trl[s], targets[s]) for s in seeds}
    t_total = {s: trl[s][-1][0] for s in seeds}
    mean = lambda d: sum(d.values()) / len(d) if d and None not in d.values() else None  # noqa: E731
    g_mean, t_mean, t_total_mean = mean(g_min), mean(t_min), mean(t_total)
    ratio = g_mean / t_mean if g_mean is not None and t_mean else None
    return {
        "target": targets,
        "grpokit_minutes": g_min,
        "trl_minutes": t_min,
        "trl_reached": {s: True for s in seeds},
        "trl_total_minutes": t_total,
        "ratios": {s: (g_min[s] / t_min[s] if g_min[s] is not None and t_min[s] else None) for s in seeds},
        "grpokit_mean": g_mean,
        "trl_mean": t_mean,
        "ratio": ratio,
        "ratio_vs_trl_total": g_mean / t_total_mean if g_mean is not None and t_total_mean else None,
        "goal": goal,
        "met": None if ratio is None else ratio <= goal,
    }


def paired(before: list[bool], after: list[bool]) -> dict:
    """``after`` − ``before`` on the same problems (:func:`grpokit.eval.stats.paired_comparison`),
    with ``agree`` = its 95 % interval contains 0."""
    from grpokit.eval.stats import paired_comparison

    out = paired_comparison(before, after)
    out["agree"] = out["diff_lo"] <= 0.0 <= out["diff_hi"]
    return out


def fmt(x, spec=".3f") -> str:
    return "—" if x is None else format(x, spec)


def _acc(p: dict | None) -> str:
    return "—" if not p else f"{p['acc']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]"


def _diff(d: dict | None) -> str:
    return "—" if not d else f"{d['diff']:+.3f} [{d['diff_lo']:+.3f}, {d['diff_hi']:+.3f}] (p={d['p_value']:.2g})"


def render_report(summary: dict) -> str:
    """The markdown report of a summary (``build_summary``'s dict)."""
    out = [
        "### (a) Equal steps: held-out greedy accuracy after the last step (95 % Wilson; gains and "
        "grpokit − TRL paired on the same problems: Newcombe interval, exact McNemar p)",
        "| seed | step | n | base | grpokit | gain | TRL | gain | grpokit − TRL | agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["equal_steps"]:
        agree = "—" if not r.get("diff") else ("yes" if r["diff"]["agree"] else "no")
        out.append(
            f"| {r['seed']} | {r['step']} | {r['n']} | {_acc(r.get('base'))} | {_acc(r.get('grpokit'))} | "
            f"{_diff(r.get('grpokit_gain'))} | {_acc(r.get('trl'))} | {_diff(r.get('trl_gain'))} | "
            f"{_diff(r.get('diff'))} | {agree} |"
        )
    out += [
        "",
        "### (b) Equal wall-clock: accuracy vs training minutes",
        "| peer | seed | step | training min | accuracy [95 %] |",
        "|---|---|---|---|---|",
    ]
    for run in summary["runs"]:
        for p in run.get("points", []):
            out.append(f"| {run['peer']} | {run['seed']} | {p['step']} | {p['minutes']:.2f} | {_acc(p)} |")
    if summary.get("equal_wallclock"):
        out += ["", "| seed | at training minute | grpokit accuracy | TRL accuracy |", "|---|---|---|---|"]
        for r in summary["equal_wallclock"]:
            out.append(f"| {r['seed']} | {r['minutes']:.2f} | {fmt(r['grpokit'])} | {fmt(r['trl'])} |")
    t = summary["time_to_accuracy"]
    if t.get("target") is not None:
        out += [
            "",
            "Time to TRL's final accuracy on the same seed's held-out draw, linear between evaluations:",
            "| seed | target (TRL final) | grpokit min | TRL min | TRL total min | grpokit / TRL |",
            "|---|---|---|---|---|---|",
        ]
        for s in sorted(t["target"], key=str):
            out.append(
                f"| {s} | {t['target'][s]:.3f} | {fmt(t['grpokit_minutes'].get(s), '.2f')} | "
                f"{fmt(t['trl_minutes'].get(s), '.2f')} | {fmt(t['trl_total_minutes'].get(s), '.2f')} | "
                f"{fmt(t['ratios'].get(s), '.2f')} |"
            )
        verdict = "—" if t["met"] is None else ("met" if t["met"] else "not met")
        if t["ratio"] is None:
            why = (
                "a grpokit run never reached it"
                if None in t["grpokit_minutes"].values()
                else "TRL's final accuracy is not above the base model's: no time to compare"
            )
            out.append(f"\nno ratio: {why}")
        out.append(
            f"\ngrpokit / TRL time to accuracy: **{fmt(t['ratio'], '.2f')}** (goal <= {t['goal']}: {verdict}); "
            f"against TRL's full training time: {fmt(t['ratio_vs_trl_total'], '.2f')}"
        )
    for name, val in summary.get("checks", {}).items():
        out.append(f"- check {name}: {val}")
    return "\n".join(out)


# -- reading runs --------------------------------------------------------------------------------


def _point(res: dict, step: int, minutes: float) -> dict:
    from grpokit.eval.stats import wilson_interval

    lo, hi = wilson_interval(res["correct"], res["total"])
    return {
        "step": step,
        "minutes": minutes,
        "acc": res["accuracy"],
        "lo": lo,
        "hi": hi,
        "correct": res["correct"],
        "total": res["total"],
    }


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _with_base(run: dict, run_dir: Path) -> dict:
    """``run`` with the base model's evaluation (``eval_before.json``) as its minute-0 point."""
    before = _read(run_dir / "eval_before.json")
    if before:
        run["points"].append(_point(before, 0, 0.0))
        run["before_outcomes"] = before["outcomes"]
    return run


def read_grpokit_run(run_dir: Path) -> dict:
    """Points (base model, then each periodic evaluation from ``metrics.jsonl``), per-step lr, and the
    outcomes of the base and final evaluations."""
    from grpokit.metrics import read_metrics

    run = _with_base({"dir": str(run_dir), "points": [], "lr": []}, run_dir)
    lines = read_metrics(run_dir / "metrics.jsonl")
    for m in lines:
        run["lr"].append(m.get("lr"))
        if m.get("eval/greedy") is not None:
            res = _read(run_dir / f"eval_step{m['step']}.json") or {}
            run["points"].append(
                {
                    "step": m["step"],
                    "minutes": m["train_minutes"],
                    "acc": m["eval/greedy"],
                    "lo": m["eval/greedy_lo"],
                    "hi": m["eval/greedy_hi"],
                    "correct": res.get("correct"),
                    "total": res.get("total"),
                }
            )
    run["questions"] = {}  # step -> the question of every sampled completion, in order (samples.jsonl)
    if (run_dir / "samples.jsonl").exists():
        for line in (run_dir / "samples.jsonl").read_text().splitlines():
            d = json.loads(line)
            run["questions"].setdefault(d["step"], []).append(d["prompt"])
    after = _read(run_dir / "eval_after.json")
    if after and lines and (not run["points"] or run["points"][-1]["step"] != lines[-1]["step"]):
        run["points"].append(_point(after, lines[-1]["step"], lines[-1]["train_minutes"]))
    if after:
        run["final_outcomes"] = after["outcomes"]
    return run


def read_trl_run(run_dir: Path) -> dict:
    """Points (base model, then each checkpoint's evaluation at its training minutes), per-step lr,
    and the outcomes of the base and final evaluations."""
    result = _read(run_dir / "trl_run.json") or {"checkpoints": [], "steps": []}
    run = {
        "dir": str(run_dir),
        "points": [],
        "lr": [s.get("learning_rate") for s in result["steps"]],
        "notes": result.get("notes", {}),
        "questions": dict(enumerate(result.get("questions", []), 1)),
    }
    run = _with_base(run, run_dir)
    for c in sorted(result["checkpoints"], key=lambda c: c["step"]):
        res = _read(run_dir / f"eval_step{c['step']}.json")
        if res:
            run["points"].append(_point(res, c["step"], c["train_minutes"]))
            run["final_outcomes"] = res["outcomes"]
    return run


def build_summary(runs: list[dict], goal: float = GOAL_RATIO) -> dict:
    """Equal-steps rows, equal-wall-clock rows, time to accuracy and checks from the runs (each
    ``{"peer", "seed", "points", "before_outcomes", "final_outcomes", "lr"}``)."""
    by = {(r["peer"], r["seed"]): r for r in runs if len(r.get("points", [])) > 1}
    seeds = sorted({r["seed"] for r in runs})
    rows, wall, checks = [], [], {}
    for r in runs:
        if r.get("status", "ok") != "ok":
            checks[f"{r['peer']} seed {r['seed']} run"] = f"{r['status']} (log {r.get('log')})"
    for s in seeds:
        g, t = by.get(("grpokit", s)), by.get(("trl", s))
        peers = [x for x in (g, t) if x]
        if not peers:
            continue
        base = peers[0]
        row = {
            "seed": s,
            "step": peers[0]["points"][-1]["step"],
            "n": base["points"][-1]["total"],
            "base": base["points"][0],
        }
        for name, x in (("grpokit", g), ("trl", t)):
            if x:
                row[name] = x["points"][-1]
                row[f"{name}_gain"] = paired(x["before_outcomes"], x["final_outcomes"])
        if g and t:
            if g["points"][-1]["step"] != t["points"][-1]["step"]:
                checks[f"seed {s} final steps"] = (
                    f"differ: grpokit {g['points'][-1]['step']}, TRL {t['points'][-1]['step']}"
                )
            row["diff"] = paired(t["final_outcomes"], g["final_outcomes"])
            checks[f"seed {s} base model scored identically by both pipelines"] = (
                "yes" if g["before_outcomes"] == t["before_outcomes"] else "NO"
            )
            lr_ok = len(g["lr"]) == len(t["lr"]) and all(
                a is not None and b is not None and abs(a - b) <= 1e-9 * max(abs(a), 1e-12)
                for a, b in zip(g["lr"], t["lr"])
            )
            checks[f"seed {s} learning rate identical at every step"] = (
                "yes" if lr_ok else f"NO ({g['lr']} vs {t['lr']})"
            )
            steps = sorted(set(g.get("questions", {})) & set(t.get("questions", {})))
            same = all(g["questions"][k] == t["questions"][k] for k in steps)
            checks[f"seed {s} same training questions in the same order (steps {steps})"] = (
                "—" if not steps else "yes" if same else "NO"
            )
            curve = lambda x: [(p["minutes"], p["acc"]) for p in x["points"]]  # noqa: E731
            m = min(g["points"][-1]["minutes"], t["points"][-1]["minutes"])
            wall.append({"seed": s, "minutes": m, "grpokit": accuracy_at(curve(g), m), "trl": accuracy_at(curve(t), m)})
        rows.append(row)
    curves = {
        peer: {s: [(p["minutes"], p["acc"]) for p in r["points"]] for (pp, s), r in by.items() if pp == peer}
        for peer in ("grpokit", "trl")
    }
    tta = time_to_accuracy_summary(curves["grpokit"], curves["trl"], goal)
    return {
        "equal_steps": rows,
        "equal_wallclock": wall,
        "time_to_accuracy": tta,
        "checks": checks,
        "runs": [{k: v for k, v in r.items() if not k.endswith(("outcomes", "questions"))} for r in runs],
    }


# -- running -------------------------------------------------------------------------------------


def run_logged(cmd: list[str], log_path: Path, env: dict, time_cap: float) -> dict:
    """Run ``cmd`` (its own process group), output to ``log_path``, progress lines echoed; killed
    after ``time_cap`` seconds."""
    t0 = time.perf_counter()
    print("   $", " ".join(cmd), flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        timer = threading.Timer(time_cap, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
        try:
            for line in proc.stdout:
                log.write(line)
                if ECHO.search(line):
                    print("   ", line.rstrip()[:200], flush=True)
        finally:
            timer.cancel()
        rc = proc.wait()
    wall = time.perf_counter() - t0
    status = "ok" if rc == 0 else (f"timeout (> {time_cap:.0f} s)" if wall >= time_cap else f"failed (exit {rc})")
    print(f"   -> {status}, {wall:.0f} s wall; log {log_path}", flush=True)
    return {"status": status, "wall_s": wall, "log": str(log_path)}


def remove_checkpoints(run_dir: Path) -> None:
    for c in run_dir.glob("checkpoint-*"):
        if re.fullmatch(r"checkpoint-\d+", c.name) and c.is_dir():
            shutil.rmtree(c)


def plot(summary: dict, path: Path) -> None:
    """Accuracy (95 % interval bars) vs training minutes, one line per peer × seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in (r for r in summary["runs"] if r.get("points")):
        pts = run["points"]
        x, y = [p["minutes"] for p in pts], [p["acc"] for p in pts]
        err = [[p["acc"] - p["lo"] for p in pts], [p["hi"] - p["acc"] for p in pts]]
        ax.errorbar(
            x,
            y,
            yerr=err,
            color="C0" if run["peer"] == "grpokit" else "C1",
            marker="o",
            ms=4,
            linestyle=["-", "--", ":", "-."][run["seed"] % 4],
            capsize=2,
            label=f"{run['peer']} seed {run['seed']}",
        )
    for seed, target in (summary["time_to_accuracy"].get("target") or {}).items():
        ax.axhline(
            target, color="grey", lw=0.8, ls=["-", "--", ":", "-."][int(seed) % 4], label=f"TRL final, seed {seed}"
        )
    ax.set_xlabel("training minutes (evaluation and checkpointing excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("overrides", nargs="*", help="section.key=value recipe overrides for both peers")
    ap.add_argument("--recipe", default="recipes/arith.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument(
        "--steps",
        type=int,
        default=40,
        help="training steps per run, replacing the recipe's "
        "train.max_steps (docs/efficacy.md measured 40; --quick and overrides come after it)",
    )
    ap.add_argument("--out", default="runs/efficacy_vs_trl")
    ap.add_argument(
        "--quick", action="store_true", help="tiny run (one seed, 2 steps, 40 eval rows): checks the script"
    )
    ap.add_argument("--only", choices=["grpokit", "trl"], help="run one peer only (the other's folder is still read)")
    ap.add_argument("--report-only", action="store_true", help="no training: rebuild the report from the run folders")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep checkpoints after they have been evaluated")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every child (default: inherited)")
    ap.add_argument("--time-cap", type=float, default=4 * 3600, help="seconds per training run before it is killed")
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    a = ap.parse_args()
    t_start = time.perf_counter()
    from grpokit.config import RecipeError, load_recipe

    common = [f"train.max_steps={a.steps}"] + (QUICK_OVERRIDES if a.quick else []) + list(a.overrides)
    seeds = a.seeds[:1] if a.quick else a.seeds
    try:
        recipe = load_recipe(a.recipe, common)
    except RecipeError as e:
        sys.exit(f"efficacy_vs_trl: recipe error: {e}")
    every = recipe.eval.every_steps
    if not recipe.eval.dataset or not every:
        sys.exit("efficacy_vs_trl: the recipe must evaluate periodically (eval.dataset and eval.every_steps > 0)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.report_only and a.only != "grpokit" and not Path(a.trl_python).exists():
        sys.exit(
            f"TRL's interpreter {a.trl_python} is missing: run `make .venv-bench/.installed`, "
            "or pass --trl-python / --only grpokit"
        )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    if a.threads:
        env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    runs, info = [], {}
    for i, seed in enumerate(seeds):
        dirs = {p: out / f"{p}-seed{seed}" for p in ("grpokit", "trl")}
        ov = {p: common + [f"train.seed={seed}", f"train.output_dir={dirs[p]}"] for p in dirs}
        order = ("grpokit", "trl") if i % 2 == 0 else ("trl", "grpokit")
        for peer in order if not a.report_only else ():
            if a.only not in (None, peer):
                continue
            print(f"\n## seed {seed}: {peer} (load average {[round(x, 2) for x in os.getloadavg()]})", flush=True)
            shutil.rmtree(dirs[peer], ignore_errors=True)  # no file of an earlier run is read as this one's
            dirs[peer].mkdir(parents=True)
            cmd = (
                [
                    sys.executable,
                    "-m",
                    "grpokit",
                    "train",
                    a.recipe,
                    *ov[peer],
                    f"train.save_steps={every}",
                    "train.resume=none",
                    "--no-progress",
                ]
                if peer == "grpokit"
                else [
                    a.trl_python,
                    str(HERE / "run_trl_efficacy.py"),
                    "--recipe",
                    a.recipe,
                    "--result",
                    str(dirs[peer] / "trl_run.json"),
                    *ov[peer],
                ]
            )
            info[(peer, seed)] = run_logged(cmd, out / f"{peer}-seed{seed}.log", env, a.time_cap)
            info[(peer, seed)]["load_after"] = [round(x, 2) for x in os.getloadavg()]
            if peer == "trl" and info[(peer, seed)]["status"] == "ok":  # grpokit's evaluation, in this venv
                print(f"   scoring TRL's checkpoints with grpokit's evaluation ({dirs[peer]})", flush=True)
                info[(peer, seed)]["eval"] = run_logged(
                    [
                        sys.executable,
                        str(HERE / "run_trl_efficacy.py"),
                        "--recipe",
                        a.recipe,
                        "--evaluate",
                        "--result",
                        str(dirs[peer] / "trl_run.json"),
                        *ov[peer],
                    ],
                    out / f"trl-seed{seed}-eval.log",
                    env,
                    a.time_cap,
                )
            if not a.keep_checkpoints:
                remove_checkpoints(dirs[peer])
        for peer in ("grpokit", "trl"):
            if (dirs[peer] / ("metrics.jsonl" if peer == "grpokit" else "trl_run.json")).exists():
                run = (read_grpokit_run if peer == "grpokit" else read_trl_run)(dirs[peer])
                runs.append({"peer": peer, "seed": seed, **info.get((peer, seed), {}), **run})
            elif (peer, seed) in info:  # it ran and left nothing to read: the report says so
                runs.append({"peer": peer, "seed": seed, **info[(peer, seed)], "points": []})
    summary = {"recipe": a.recipe, "overrides": common, "seeds": seeds, **build_summary(runs)}
    report = render_report(summary)
    summary["report_markdown"] = report
    (out / "efficacy_vs_trl.json").write_text(json.dumps(summary, indent=1, default=str))
    if any(r.get("points") for r in summary["runs"]):
        plot(summary, out / "efficacy_vs_trl.png")
    print("\n" + report)
    print(
        f"\nresults: {out}/efficacy_vs_trl.json, {out}/efficacy_vs_trl.png; "
        f"{(time.perf_counter() - t_start) / 60:.1f} minutes in all",
        flush=True,
    )


if __name__ == "__main__":
    main()
