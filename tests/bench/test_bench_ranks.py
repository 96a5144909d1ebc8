"""bench/ranks.py: the medians and completion tokens per CPU second from a run's metrics.jsonl."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_ranks", ROOT / "bench" / "ranks.py")
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)


def test_medians_leave_out_step_1_and_tokens_per_cpu_second(tmp_path):
    rows = [  # step 1 (warm-up) left out; steps 2-4: 100, 60, 90 tokens in 10, 6, 9 s
        {"step": 1, "step_s": 50.0, "gen_s": 40.0, "train_s": 10.0, "tokens_per_s": 1.0},
        {"step": 2, "step_s": 10.0, "gen_s": 7.0, "train_s": 3.0, "tokens_per_s": 10.0},
        {"step": 3, "step_s": 6.0, "gen_s": 4.0, "train_s": 2.0, "tokens_per_s": 10.0},
        {"step": 4, "step_s": 9.0, "gen_s": 5.0, "train_s": 4.0, "tokens_per_s": 10.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = br._medians(tmp_path)
    assert (m["step_s"], m["gen_s"], m["train_s"]) == (9.0, 5.0, 3.0)
    assert m["completion_tokens"] == pytest.approx(250.0) and m["step_s_total"] == 25.0
    assert br.tokens_per_cpu_s(m, 2) == pytest.approx(250 / (25 * 2))  # 5 tokens per CPU second
