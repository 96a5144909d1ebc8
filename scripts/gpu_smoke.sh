#!/usr/bin/env bash
# GPU smoke check, for a machine with a CUDA GPU and a Python environment whose torch is a CUDA
# build (on this project's CPU machines there is none: unit tests never need it).
#
#   PY=/path/to/cuda-venv/bin/python scripts/gpu_smoke.sh        # default PY: .venv/bin/python
#
# Runs 3 steps of the demo recipe (beta > 0, so the reference model runs too) on cuda in bf16
# weights with the stochastic-rounding AdamW, and one with bf16 autocast over fp32 weights, each
# with a held-out evaluation before and after; then checks that the run picked the plain backend
# (the CPU speed backend steps aside on CUDA), that every step's loss is finite, and prints the
# step times. Exit status 0 = all fine; 2 = no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu_smoke}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"

"$PY" -c 'import sys, torch; ok = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if ok else "(no device)"); sys.exit(0 if ok else 2)'

common=(recipes/demo.yaml model.device=cuda train.max_steps=3 train.sample_every=1 train.resume=none
        eval.dataset=mawps eval.split=singleop eval.limit=32 eval.max_new_tokens=64 eval.batch_size=32 --no-progress)
"$PY" -m grpokit.cli train "${common[@]}" model.dtype=bfloat16 train.optimizer=adamw_bf16_sr \
    train.output_dir="$OUT/bf16" 2>&1 | tee "$OUT.bf16.log"
"$PY" -m grpokit.cli train "${common[@]}" model.autocast_bf16=true train.output_dir="$OUT/autocast" 2>&1 \
    | tee "$OUT.autocast.log"

"$PY" - "$OUT" <<'PY'
import json, math, sys
from pathlib import Path

out = Path(sys.argv[1])
bad = []
for run in ("bf16", "autocast"):
    lines = [json.loads(l) for l in (out / run / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in lines]
    finite = all(m["loss"] is not None and math.isfinite(m["loss"]) for m in lines)
    print(f"{run}: steps {steps}, loss {[round(m['loss'], 4) for m in lines if m['loss'] is not None]}, "
          f"step_s {[round(m['step_s'], 2) for m in lines]}, reward_mean {[m['reward_mean'] for m in lines]}")
    if steps != [1, 2, 3] or not finite:
        bad.append(run)
    log = (out.parent / f"{out.name}.{run}.log").read_text()
    if "backend plain" not in log:
        bad.append(f"{run}: the log does not say the plain backend was chosen on cuda")
sys.exit(f"gpu smoke FAILED: {bad}" if bad else 0)
PY
echo "gpu smoke: ok"
