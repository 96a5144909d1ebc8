"""Part ``ranks`` of experiments/scripts/vllm_check.py: the vllm engine on 2 torchrun ranks (one vLLM-CPU engine
per rank: external launcher, data parallel size 2), under ddp and under fsdp2 (the weights pushed
from the shards a layer at a time), against one process with the vllm engine; and LoRA under fsdp2
(the adapters folded into the weights from the shards) against one process with LoRA.

A 3-step GRPO run of the check's tiny random Llama (temperature 1, G = 2, 4 prompts a step, lr 1e-2 so
the weights pushed to vLLM before steps 2 and 3 differ visibly), each process at one thread: the
completions of every step (so also after each weight push), the metrics and the weights after the
last step (LoRA: the adapter's) must be the one process's. Timed: each run's wall seconds and median step seconds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

LORA = "model.lora={r: 4, alpha: 8}"
TIMINGS = {"step_s", "gen_s", "reward_s", "train_s", "tokens_per_s", "train_minutes", "ref_s"}


def _recipe(folder: str, out: Path) -> dict:
    return {
        "model": {"name_or_path": folder, "backend": "plain"},
        "data": {"dataset": "mawps", "split": "singleop", "limit": 8},
        "rollout": {"engine": "vllm", "group_size": 2, "max_new_tokens": 8, "temperature": 1.0},
        "rewards": {"functions": ["number_at_end"]},
        "algo": {"beta": 0.04},
        "train": {
            "prompts_per_step": 4,
            "max_steps": 3,
            "micro_batch_size": 4,
            "learning_rate": 1e-2,
            "sample_every": 1,
            "save_steps": 3,
            "seed": 0,
            "output_dir": str(out),
        },
        "eval": {"dataset": None},
    }


def _run(cmd: list[str]) -> tuple[float, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd[:5])} ... failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return time.perf_counter() - t0, p.stdout + p.stderr


def ranks(out: dict, tiny_folder) -> bool:
    """Run the check (module docstring) into ``out``; True when both runs sampled the same completions at
    every step and ended with the same weights."""
    from safetensors.torch import load_file

    from grpokit.models.loading import load_tokenizer

    folder = tiny_folder(load_tokenizer("smollm2-135m-instruct"))
    tmp = Path(tempfile.mkdtemp(prefix="grpokit-vllm-ranks-"))
    recipe = tmp / "r.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(folder, tmp / "unused")))
    train = ["-m", "grpokit", "train", str(recipe), "--no-progress"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533"]

    def lines(run: Path, name: str) -> list[dict]:
        return [json.loads(x) for x in (run / name).read_text().splitlines()]

    ok, baselines = True, {}
    # (name, parallel, extra keys, weights file): LoRA under fsdp2 pushes the adapters folded in from the shards
    for name, parallel, extra, weights in (
        ("ddp", "ddp", [], "model"),
        ("fsdp2", "fsdp2", [], "model"),
        ("fsdp2_lora", "fsdp2", [LORA], "adapter_model"),
    ):
        one = tmp / ("one_lora" if extra else "one")
        if one not in baselines:
            wall_one, _ = _run([sys.executable, *train, f"train.output_dir={one}", *extra])
            baselines[one] = wall_one
            m = lines(one, "metrics.jsonl")
            out["one_process_lora" if extra else "one_process"] = {
                "wall_s": wall_one,
                "median_step_s": statistics.median(x["step_s"] for x in m),
            }
        m1, w1 = lines(one, "metrics.jsonl"), load_file(one / "checkpoint-3" / f"{weights}.safetensors")
        two = tmp / name
        wall_two, log = _run([*launch, *train, f"train.output_dir={two}", f"train.parallel={parallel}", *extra])
        m2 = lines(two, "metrics.jsonl")
        same_samples = lines(one, "samples.jsonl") == lines(two, "samples.jsonl")
        differing = sorted({k for a, b in zip(m1, m2) for k in a if k not in TIMINGS and a.get(k) != b.get(k)})
        w2 = load_file(two / "checkpoint-3" / f"{weights}.safetensors")
        max_weight_diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
        per_rank = "[grpokit] vllm: one engine per rank (2 ranks" in log
        out[name] = {
            "engine_per_rank": per_rank,
            "same_samples_every_step": same_samples,
            "metrics_that_differ": differing,
            "max_weight_diff": max_weight_diff,
            "wall_s": wall_two,
            "median_step_s": statistics.median(m["step_s"] for m in m2),
            "logprob_gap_max": max(m.get("logprob_gap_max", 0) for m in m2),
        }
        ok = ok and same_samples and max_weight_diff == 0.0 and per_rank
    return ok
