"""bench/ppo_vs_grpo.py's report logic on hand-built run folders."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("ppo_vs_grpo", Path(__file__).parents[2] / "bench" / "ppo_vs_grpo.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def fake_run(root: Path, name: str, before: list[bool], after: list[bool], step_s: list[float], rss: float) -> Path:
    d = root / name
    d.mkdir()
    for when, outcomes in (("before", before), ("step2", after)):
        (d / f"eval_{when}.json").write_text(
            json.dumps(
                {
                    "when": when,
                    "correct": sum(outcomes),
                    "total": len(outcomes),
                    "accuracy": sum(outcomes) / len(outcomes),
                    "outcomes": outcomes,
                }
            )
        )
    (d / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps({"step": i + 1, "step_s": s, "gen_s": s / 2, "train_s": s / 2, "train_minutes": (i + 1) / 10})
            for i, s in enumerate(step_s)
        )
    )
    (root / f"{name}.rss.json").write_text(json.dumps({"rc": 0, "peak_rss_gb": rss}))
    return d


def test_report_pairs_each_run_with_its_base_and_ppo_with_grpo(tmp_path):
    base = [False] * 8 + [True] * 2
    grpo = [True] * 6 + [False] * 2 + [True] * 2  # 6 more right than the base
    ppo = [True] * 3 + [False] * 5 + [True, False]  # 3 more, 1 fewer
    runs = {
        ("grpo", 0): bench.read_run(fake_run(tmp_path, "grpo-seed0", base, grpo, [99.0, 10.0, 12.0], 2.0)),
        ("ppo", 0): bench.read_run(fake_run(tmp_path, "ppo-seed0", base, ppo, [99.0, 20.0, 22.0], 3.5)),
    }
    assert runs[("grpo", 0)]["step_s"] == 11.0  # median without the first step
    assert runs[("ppo", 0)]["peak_rss_gb"] == 3.5
    assert [e["step"] for e in runs[("grpo", 0)]["evals"]] == [0, 2]
    row = bench.compare(runs)["rows"][0]
    assert row["grpo"]["gain"]["diff"] == pytest.approx(0.6) and row["grpo"]["gain"]["b_only"] == 6
    assert row["ppo"]["gain"]["diff"] == pytest.approx(0.2)
    assert (row["ppo"]["gain"]["b_only"], row["ppo"]["gain"]["a_only"]) == (3, 1)
    d = row["ppo_minus_grpo"]
    assert d["diff"] == pytest.approx(-0.4) and (d["b_only"], d["a_only"]) == (0, 4)
    text = bench.render(runs, {"rows": [row]})
    assert "| 0 | PPO | 2 | 0.400" in text and "3.50 |" in text and "PPO − GRPO" in text
