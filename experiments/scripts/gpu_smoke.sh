#!/usr/bin/env bash
# GPU smoke check, for a machine with a CUDA GPU and a Python environment whose torch is a CUDA
# build (on this project's CPU machines there is none: unit tests never need it).
#
#   PY=/path/to/cuda-venv/bin/python experiments/scripts/gpu_smoke.sh        # default PY: .venv/bin/python
#
# Runs 3 steps of the demo recipe (beta > 0, so the reference model runs too) on cuda in bf16
# weights with the stochastic-rounding AdamW, one with bf16 autocast over fp32 weights, then with
# torchrun over the GPUs (NCCL; 2 ranks with 2 GPUs, else 1) as DDP and as FSDP2, and, where vllm
# imports, with the vLLM engine (sleep mode, LoRA, truncated importance sampling); each with a
# held-out evaluation before and after; then checks that the run picked the plain backend (the CPU
# speed backend steps aside on CUDA), that every step's loss is finite, and prints the step times.
# Exit status 0 = all fine; 2 = no CUDA device. Not run yet: no GPU was lent to this project.
set -euo pipefail
cd "$(dirname "$0")/../.."
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

# Several processes (grpokit.distributed): NCCL DDP and FSDP2, one rank per GPU (2 when there are 2).
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
NP=$(( NGPU >= 2 ? 2 : 1 ))
runs="bf16 autocast ddp fsdp2"
for par in ddp fsdp2; do
    "$PY" -m torch.distributed.run --nproc-per-node "$NP" -m grpokit train "${common[@]}" train.parallel=$par \
        train.output_dir="$OUT/$par" 2>&1 | tee "$OUT.$par.log"
done
# vLLM colocated in the trainer's process with sleep mode, LoRA adapters pushed merged, truncated IS:
# only where vllm imports (pip install 'grpokit[vllm]').
if "$PY" -c 'import vllm' 2>/dev/null; then
    runs="$runs vllm"
    "$PY" -m grpokit.cli train "${common[@]}" rollout.engine=vllm \
        'rollout.vllm={gpu_memory_utilization: 0.3, enable_sleep_mode: true}' 'model.lora={r: 16}' algo.tis_cap=2.0 \
        train.output_dir="$OUT/vllm" 2>&1 | tee "$OUT.vllm.log"
fi

"$PY" - "$OUT" "$NP" $runs <<'PY'
import json, math, sys
from pathlib import Path

out, n_ranks, runs = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
bad = []
for run in runs:
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
    if run in ("ddp", "fsdp2") and f"on {n_ranks} ranks ({run})" not in log:
        bad.append(f"{run}: the log does not say it ran on {n_ranks} ranks")
    if run == "vllm" and not all("logprob_gap_max" in m and "tis_weight_mean" in m for m in lines):
        bad.append("vllm: no logprob_gap_max / tis_weight_mean in the metrics")
sys.exit(f"gpu smoke FAILED: {bad}" if bad else 0)
PY
echo "gpu smoke: ok"
