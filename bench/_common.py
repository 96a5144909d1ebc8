"""What both benchmark children share: the workload (model, prompts in order, settings) and the
result record. Imported by ``run_grpokit.py`` (main ``.venv``) and ``run_trl.py`` (``.venv-bench``),
so it needs only grpokit, torch and the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODEL_ALIAS = "smollm2-135m-instruct"
DATASET, SPLIT = "gsm8k", "train"
MAX_PROMPT_TOKENS = 256  # grpokit's data.max_prompt_tokens default; GSM8K prompts all fit


@dataclass
class Workload:
    """The work both peers do: B prompts × G completions per step, same prompts in the same order."""

    G: int = 8
    B: int = 4
    max_new_tokens: int = 64
    steps: int = 4  # optimizer steps run; the first is discarded (warm-up)
    seed: int = 0
    temperature: float = 1.0
    beta: float = 0.04
    learning_rate: float = 1e-6
    micro_batch_size: int = 8  # sequences per forward/backward, both peers
    precision: str = "fp32"  # fp32 | bf16_autocast | bf16 (parameters in bf16)

    @property
    def N(self) -> int:
        return self.B * self.G


@dataclass
class StepRecord:
    step: int
    step_s: float
    gen_s: float
    logp_ref_s: float  # no-grad log-prob passes: π_ref (and π_old if computed)
    train_s: float  # policy forward with grad + backward + optimizer step
    completion_tokens: int  # generated tokens that count (completion mask), all N rows
    completion_len_mean: float
    train_tokens: int  # non-padding tokens the policy forward/backward processed
    train_tokens_padded: int  # including padding columns
    sequence_tokens: int  # Σ over rows of real prompt + completion tokens (work if nothing is shared)
    reward_mean: float | None = None
    loss: float | None = None


def workload_parser(description: str, precision_help: str | None = None) -> argparse.ArgumentParser:
    """The arguments both benchmark children share (``--out`` and the :class:`Workload` fields)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16_autocast", "bf16"], help=precision_help)
    return ap


def workload_from_args(a: argparse.Namespace) -> Workload:
    return Workload(
        G=a.G,
        B=a.B,
        max_new_tokens=a.max_new_tokens,
        steps=a.steps,
        micro_batch_size=a.micro_batch_size,
        precision=a.precision,
    )


@dataclass
class Result:
    peer: str  # grpokit | trl
    setting: str  # e.g. fp32, bf16_autocast
    workload: dict
    steps: list = field(default_factory=list)
    n_params: int = 0
    peak_rss_gb: float = 0.0
    load_avg_before: list = field(default_factory=list)
    load_avg_after: list = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    status: str = "ok"

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1))


def model_path() -> str:
    from grpokit.models.loading import resolve_model_path

    return resolve_model_path(MODEL_ALIAS)


def ordered_rows(tokenizer, w: Workload) -> list[dict]:
    """The rows grpokit's trainer takes, in its order (``next_prompt_indices`` over the rows that
    ``grpokit.data.rows.load_prompts`` keeps), each with its chat prompt under ``"prompt_text"``."""
    from grpokit.data import build_chat_prompt, filter_by_prompt_length, load_rows
    from grpokit.trainer.state import TrainState, next_prompt_indices

    rows = load_rows(DATASET, SPLIT, seed=w.seed)
    prompts = [build_chat_prompt(tokenizer, r["prompt"]) for r in rows]
    keep, _ = filter_by_prompt_length(prompts, tokenizer, MAX_PROMPT_TOKENS)
    rows, prompts = [rows[i] for i in keep], [prompts[i] for i in keep]
    state, out = TrainState(), []
    for _ in range(w.steps):
        for i in next_prompt_indices(state, len(rows), w.B, w.seed):
            out.append({**rows[i], "prompt_text": prompts[i]})
    return out


def peak_rss_gb() -> float:
    """Peak resident set size of this process (Linux ``ru_maxrss`` is in KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * (1024 if sys.platform != "darwin" else 1) / 1024**3


def versions() -> dict:
    import torch
    import transformers

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
    }
    try:
        import trl

        out["trl"] = trl.__version__
    except ImportError:
        pass
    return out


def load_avg() -> list:
    return [round(x, 2) for x in os.getloadavg()]


class Clock:
    """Accumulates wall seconds by phase name."""

    def __init__(self):
        self.t: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.t[name] = self.t.get(name, 0.0) + seconds

    def timed(self, name: str):
        clock = self

        class _Ctx:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                clock.add(name, time.perf_counter() - self.t0)
                return False

        return _Ctx()

    def pop(self) -> dict[str, float]:
        out, self.t = self.t, {}
        return out
