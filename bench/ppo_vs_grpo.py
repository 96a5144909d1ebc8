"""GRPO vs PPO on the same work: held-out accuracy, step time and peak memory, side by side.

    python bench/ppo_vs_grpo.py                    # recipes/arith.yaml vs recipes/ppo.yaml, seed 0
    python bench/ppo_vs_grpo.py --seeds 0 1 --threads 1
    python bench/ppo_vs_grpo.py --report-only      # rebuild the report from the run folders
    python bench/ppo_vs_grpo.py --quick            # 2 steps, 40 held-out rows: checks the script

``recipes/ppo.yaml`` is ``recipes/arith.yaml`` with ``algo.estimator=ppo`` (same data, prompt, G,
B, temperature, new tokens, reward, learning-rate schedule and held-out evaluation). Per seed each
recipe runs as ``grpokit train`` in its own process (one after the other; the order alternates
between seeds); its peak resident memory is read from ``getrusage(RUSAGE_CHILDREN)`` of a wrapper
process that ran only it. Held-out accuracy comes from each run's own evaluations (greedy,
``eval_before.json``, ``eval_step<N>.json``), so both are scored on the same problems.

Report (``<out>/ppo_vs_grpo.json``, markdown on stdout, ``<out>/ppo_vs_grpo.png``): per seed and
estimator the held-out accuracy at every evaluation (Wilson 95 %), the final gain over the base model
(paired on the same problems: Newcombe interval, exact McNemar p), PPO − GRPO at the end (paired),
the median step / generation / training seconds (first step left out) and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECIPES = {"grpo": "recipes/arith.yaml", "ppo": "recipes/ppo.yaml"}
QUICK = [
    "train.max_steps=2",
    "eval.every_steps=1",
    "eval.limit=40",
    "rollout.max_new_tokens=16",
    "eval.max_new_tokens=16",
    "rollout.group_size=4",
    "train.prompts_per_step=4",
]
WRAPPER = (
    "import json, resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
    "open(sys.argv[1], 'w').write(json.dumps({'rc': rc, 'peak_rss_gb': "
    "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 ** 2})); sys.exit(rc)"
)


def read_run(run_dir: Path) -> dict:
    """Evaluations, timings and peak memory of one finished run folder."""
    from grpokit.eval.stats import wilson_interval

    evals = []
    for path in sorted(run_dir.glob("eval_*.json")):
        res = json.loads(path.read_text())
        when = res.get("when", path.stem[5:])
        step = 0 if when == "before" else int(when[4:]) if when.startswith("step") else None
        if step is None:
            continue
        lo, hi = wilson_interval(res["correct"], res["total"])
        evals.append({"step": step, "acc": res["accuracy"], "lo": lo, "hi": hi, "outcomes": res["outcomes"]})
    evals.sort(key=lambda e: e["step"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    timed = lines[1:] or lines

    def median(key):
        vals = [m[key] for m in timed if isinstance(m.get(key), (int, float))]
        return statistics.median(vals) if vals else None

    minutes = {m["step"]: m.get("train_minutes") for m in lines}
    for e in evals:
        e["minutes"] = 0.0 if e["step"] == 0 else minutes.get(e["step"])
    rss = run_dir.parent / f"{run_dir.name}.rss.json"
    return {
        "evals": evals,
        "steps": len(lines),
        "step_s": median("step_s"),
        "gen_s": median("gen_s"),
        "train_s": median("train_s"),
        "peak_rss_gb": json.loads(rss.read_text())["peak_rss_gb"] if rss.exists() else None,
        "value_loss": [m.get("value_loss") for m in lines],
    }


def compare(runs: dict) -> dict:
    """``runs[(estimator, seed)]`` -> per-seed rows: gains over the base and PPO − GRPO (paired)."""
    from grpokit.eval.stats import paired_comparison

    rows = []
    for seed in sorted({s for _, s in runs}):
        g, p = runs.get(("grpo", seed)), runs.get(("ppo", seed))
        row = {"seed": seed}
        for name, r in (("grpo", g), ("ppo", p)):
            if r and len(r["evals"]) > 1:
                base, last = r["evals"][0], r["evals"][-1]
                row[name] = {
                    "step": last["step"],
                    "acc": last["acc"],
                    "lo": last["lo"],
                    "hi": last["hi"],
                    "base": base["acc"],
                    "gain": paired_comparison(base["outcomes"], last["outcomes"]),
                }
        if "grpo" in row and "ppo" in row:
            row["ppo_minus_grpo"] = paired_comparison(g["evals"][-1]["outcomes"], p["evals"][-1]["outcomes"])
        rows.append(row)
    return {"rows": rows}


def _d(c: dict) -> str:
    return f"{c['diff']:+.3f} [{c['diff_lo']:+.3f}, {c['diff_hi']:+.3f}] (p={c['p_value']:.2g})"


def render(runs: dict, summary: dict) -> str:
    out = [
        "| seed | estimator | step | held-out greedy [95 %] | gain over base (paired) | median s/step "
        "(gen / train) | peak RSS GB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        for name in ("grpo", "ppo"):
            if name not in row:
                continue
            r, e = runs[(name, row["seed"])], row[name]
            rss = f"{r['peak_rss_gb']:.2f}" if r["peak_rss_gb"] else "—"
            out.append(
                f"| {row['seed']} | {name.upper()} | {e['step']} | {e['acc']:.3f} [{e['lo']:.3f}, {e['hi']:.3f}] | "
                f"{_d(e['gain'])} | {r['step_s']:.1f} ({r['gen_s']:.1f} / {r['train_s']:.1f}) | {rss} |"
            )
        if "ppo_minus_grpo" in row:
            out.append(f"| {row['seed']} | PPO − GRPO | | {_d(row['ppo_minus_grpo'])} | | | |")
    out += [
        "",
        "| seed | estimator | " + " | ".join(f"step {e['step']}" for e in next(iter(runs.values()))["evals"]) + " |",
    ]
    out.append("|---|---|" + "---|" * len(next(iter(runs.values()))["evals"]))
    for (name, seed), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        out.append(f"| {seed} | {name.upper()} | " + " | ".join(f"{e['acc']:.3f}" for e in r["evals"]) + " |")
    return "\n".join(out)


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (name, seed), r in sorted(runs.items()):
        ev = [e for e in r["evals"] if e["minutes"] is not None]
        for ax, x in ((axes[0], [e["step"] for e in ev]), (axes[1], [e["minutes"] for e in ev])):
            ax.errorbar(
                x,
                [e["acc"] for e in ev],
                yerr=[[e["acc"] - e["lo"] for e in ev], [e["hi"] - e["acc"] for e in ev]],
                marker="o",
                capsize=2,
                linestyle="-" if name == "grpo" else "--",
                label=f"{name.upper()} seed {seed}",
            )
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("training minutes")
    for ax in axes:
        ax.set_ylabel("held-out greedy accuracy (95 % Wilson)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("GRPO vs PPO (value model + GAE) on the arithmetic recipe")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", default="runs/ppo_vs_grpo")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if a.threads:
        env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    runs = {}
    for i, seed in enumerate(a.seeds):
        for name in ("grpo", "ppo") if i % 2 == 0 else ("ppo", "grpo"):
            run_dir = out / f"{name}-seed{seed}"
            if not a.report_only:
                cmd = [
                    sys.executable,
                    "-c",
                    WRAPPER,
                    str(out / f"{name}-seed{seed}.rss.json"),
                    sys.executable,
                    "-m",
                    "grpokit",
                    "train",
                    RECIPES[name],
                    f"train.seed={seed}",
                    f"train.output_dir={run_dir}",
                    "train.resume=none",
                    "--no-progress",
                    *(QUICK if a.quick else []),
                ]
                print(f"## {name} seed {seed}: {' '.join(cmd[3:])}", flush=True)
                with open(out / f"{name}-seed{seed}.log", "w") as log:
                    rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
                if rc:
                    sys.exit(f"{name} seed {seed} failed (rc {rc}): see {out / f'{name}-seed{seed}.log'}")
            if (run_dir / "metrics.jsonl").exists():
                runs[(name, seed)] = read_run(run_dir)
    summary = compare(runs)
    text = render(runs, summary)
    print(text)
    (out / "ppo_vs_grpo.json").write_text(
        json.dumps(
            {"runs": {f"{k[0]}-seed{k[1]}": {kk: vv for kk, vv in v.items()} for k, v in runs.items()}, **summary},
            indent=1,
        )
    )
    plot(runs, out / "ppo_vs_grpo.png")
    print(f"\nresults: {out / 'ppo_vs_grpo.json'}, {out / 'ppo_vs_grpo.png'}")


if __name__ == "__main__":
    main()
