"""The demo on a shared machine (issue #58): ``grpokit train`` of ``recipes/demo.yaml`` for
``--steps`` steps alone, then beside one busy process, with grpokit's thread choice
(``GRPOKIT_THREADS=auto``: the cores other work leaves free, OpenMP threads that sleep while they
wait) and with torch's own (``GRPOKIT_THREADS=off``: one spinning thread per core, what grpokit did
before), all measured in the same run. Prints each run's seconds per step and the ratios beside /
alone; the target: at most about 2× with grpokit's choice.

The busy process is a second torch program doing matrix products without pause, with
torch's default OpenMP wait policy, on ``--busy one``: one thread (a test suite: grpokit's runs torch
at one thread), or ``all``: torch's default threads, one per core (another training run).

    .venv/bin/python bench/shared_machine.py [--steps 3] [--busy one all] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY = (
    "import sys, torch\n"
    "if sys.argv[1] == 'one':\n    torch.set_num_threads(1)\n"
    "a = torch.randn(384, 384)\nwhile True:\n    a = torch.tanh(a @ a)\n"
)
MODES = {"grpokit": "auto", "torch default": "off"}


def demo(steps: int, mode: str, out: Path) -> dict:
    """One ``grpokit train`` of the demo; its mean seconds per step (steps after the first) and
    its threads line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")} | {
        "GRPOKIT_THREADS": mode,
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [sys.executable, "-m", "grpokit", "train", str(ROOT / "recipes/demo.yaml"), "--no-progress"]
    cmd += [f"train.max_steps={steps}", f"train.output_dir={out}", "train.resume=none"]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"demo failed ({mode}):\n{run.stdout}\n{run.stderr}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    per_step = [r["step_s"] for r in rows[1:]] or [rows[0]["step_s"]]
    said = next((ln for ln in run.stdout.splitlines() if "threads:" in ln), "")
    return {
        "step_s": statistics.mean(per_step),
        "wall_s": wall,
        "threads": rows[-1].get("threads"),
        "line": said,
        "rewards": [r["reward_mean"] for r in rows],
    }


def beside_busy(steps: int, mode: str, out: Path, kind: str) -> dict:
    """:func:`demo` while one busy process of ``kind`` (``one``/``all``) runs; stopped after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GRPOKIT_"))}
    busy = subprocess.Popen([sys.executable, "-c", BUSY, kind], env=env)
    try:
        time.sleep(3)  # its threads are running when grpokit measures the machine
        return demo(steps, mode, out)
    finally:
        busy.kill()
        busy.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--busy", nargs="+", choices=["one", "all"], default=["one", "all"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="grpokit-shared-") as tmp:
        for name, mode in MODES.items():
            results[name] = {"alone": demo(a.steps, mode, Path(tmp) / f"{mode}-alone")}
            for kind in a.busy:
                results[name][f"beside {kind}"] = beside_busy(a.steps, mode, Path(tmp) / f"{mode}-{kind}", kind)
    first = 2 if a.steps > 1 else 1
    print(f"demo, {a.steps} steps (s/step: mean of steps {first}..{a.steps}); {os.cpu_count()} CPUs")
    print(f"{'threads':14} {'busy process':14} {'s/step':>7} {'÷ alone':>8}  threads")
    for name, r in results.items():
        for key, run in r.items():
            run["ratio"] = run["step_s"] / r["alone"]["step_s"]
            print(f"{name:14} {key:14} {run['step_s']:7.1f} {run['ratio']:8.2f}  {run['threads']}")
    for name, r in results.items():
        for key, run in r.items():
            print(f"{name}, {key}: {run['line']}")
    if a.json:
        record = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "steps": a.steps, "results": results}
        Path(a.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
