"""Step time of a recipe on 2 torchrun ranks against one process, measured in the same run.

    python bench/ranks.py                     # the demo recipe with DAPO's dynamic sampling, ddp
    python bench/ranks.py --steps 4 --parallel ddp -- algo.dynamic_sampling=false
    .venv-vllm/bin/python bench/ranks.py -- rollout.engine=vllm    # the demo with the vLLM engine

One process runs with as many threads as the ranks have together (2 here), each rank with one, so
both use the same cores. Each run's steps after the first (warm-up) give a median ``step_s`` and
``gen_s``, and completion tokens per CPU second (the completion tokens of those steps over their
summed ``step_s`` times the cores both runs use); the script prints the 2-rank / 1-process ratios,
whether both sampled the same completions (``samples.jsonl``), and writes the record to ``--json``.
The runs use the interpreter that runs the script (``.venv-vllm/bin/python`` for the vLLM engine).
On one 2-core machine more ranks bring no speed (they share the cores): the ratio measures what the
collectives and the uneven refill shares cost.
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
DYNAMIC = ["algo.dynamic_sampling=true", "algo.max_sampling_rounds=2"]


def _run(cmd: list[str], threads: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"bench/ranks.py: {' '.join(cmd[:6])} ... failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return time.perf_counter() - t0


def _medians(out: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]  # step 1: warm-up
    out = {k: statistics.median(r[k] for r in rows) for k in ("step_s", "gen_s", "train_s")}
    out["completion_tokens"] = sum(r["tokens_per_s"] * r["step_s"] for r in rows)  # tokens_per_s = tokens / step_s
    out["step_s_total"] = sum(r["step_s"] for r in rows)
    return out


def tokens_per_cpu_s(medians: dict[str, float], cores: int) -> float:
    """Completion tokens per CPU second: the steps' tokens over their time times the cores used."""
    return medians["completion_tokens"] / (medians["step_s_total"] * cores)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="demo")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first is left out as warm-up")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp2"])
    ap.add_argument("--json", type=Path, default=None, help="write the record here")
    ap.add_argument("overrides", nargs="*", help="recipe overrides (default: dynamic sampling on)")
    a = ap.parse_args()
    overrides = a.overrides or DYNAMIC
    with tempfile.TemporaryDirectory() as tmp:
        one, many = Path(tmp) / "one", Path(tmp) / "ranks"
        common = [a.recipe, f"train.max_steps={a.steps}", "train.save_steps=0", "train.sample_every=1"]
        common += ["train.resume=none", *overrides]
        cli = [sys.executable, "-m", "grpokit", "train", "--no-progress", *common]
        wall_one = _run([*cli, f"train.output_dir={one}"], a.ranks)
        run = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(a.ranks),
            "--master-port",
            "29517",
        ]
        wall_many = _run(
            [
                *run,
                "-m",
                "grpokit",
                "train",
                "--no-progress",
                *common,
                f"train.output_dir={many}",
                f"train.parallel={a.parallel}",
            ],
            1,
        )
        m1, mr = _medians(one), _medians(many)
        same = (one / "samples.jsonl").read_text() == (many / "samples.jsonl").read_text()
    record = {
        "recipe": a.recipe,
        "overrides": overrides,
        "steps": a.steps,
        "ranks": a.ranks,
        "parallel": a.parallel,
        "one_process": m1,
        "ranks_run": mr,
        "ratio_step_s": mr["step_s"] / m1["step_s"],
        "tokens_per_cpu_s": {"one": tokens_per_cpu_s(m1, a.ranks), "ranks": tokens_per_cpu_s(mr, a.ranks)},
        "same_samples": same,
        "wall_s": {"one": wall_one, "ranks": wall_many},
        "cpus": os.cpu_count(),
    }
    print(
        f"{a.ranks} {a.parallel} ranks / 1 process, median step_s (steps 2-{a.steps}): "
        f"{mr['step_s']:.1f} / {m1['step_s']:.1f} s = {record['ratio_step_s']:.2f}; "
        f"gen_s {mr['gen_s']:.1f} / {m1['gen_s']:.1f}; completion tokens per CPU second "
        f"{record['tokens_per_cpu_s']['ranks']:.2f} / {record['tokens_per_cpu_s']['one']:.2f}; same samples: {same}"
    )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
