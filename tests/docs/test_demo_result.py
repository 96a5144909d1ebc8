"""``experiments/results/demo_metrics.jsonl`` is what ``make demo`` gives on this code.

The docs call the demo reproducible (two runs of the same code give the same rewards step for step)
and quote the committed file. A change that moves the demo's numbers (sampling, rewards, the loss,
the update) without re-measuring it fails here: the demo's first two steps, run at the thread count
the file records, must give the file's steps 1 and 2 — their rewards exactly (they count correct
completions) and loss, KL, gradient norm and entropy within 2e-5 (float rounding; the file of
2026-12-01, which had drifted from step 4 on, was off by 1.9e-4 in step 2's loss and 7.6e-5 in its
KL: step 2 is the first that samples from an updated policy). Two steps, not eight, to keep the
suite short.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import grpokit
from grpokit.config import load_recipe
from grpokit.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "experiments/results/demo_metrics.jsonl"


def test_the_committed_demo_metrics_are_a_whole_demo_run():
    rows = [json.loads(line) for line in COMMITTED.read_text().splitlines()]
    recipe = load_recipe(ROOT / "recipes/demo.yaml")
    assert [r["step"] for r in rows] == list(range(1, recipe.train.max_steps + 1))
    assert all(isinstance(r.get("threads"), int) for r in rows)  # the count it was measured at


@pytest.mark.e2e
@pytest.mark.serial  # 2 threads (the committed numbers'): beside a worker 341 s, alone 52 s (docs/contributing.md)
def test_the_demos_first_two_steps_give_the_committed_numbers(tmp_path):
    want = [json.loads(line) for line in COMMITTED.read_text().splitlines()[:2]]
    before = torch.get_num_threads()
    torch.set_num_threads(want[0]["threads"])
    try:
        trainer = grpokit.Trainer(
            "demo", overrides={"train.max_steps": 2, "train.output_dir": str(tmp_path / "demo")}, progress=False
        )
        trainer.train()
    finally:
        torch.set_num_threads(before)
    got = read_metrics(tmp_path / "demo" / "metrics.jsonl")
    assert [g["step"] for g in got] == [1, 2]
    for g, w in zip(got, want):
        exact = [k for k in w if k.startswith("rewards/")]
        exact += ["reward_mean", "reward_std", "frac_zero_std", "completion_len_mean", "truncated_frac"]
        assert {k: g[k] for k in exact} == {k: w[k] for k in exact}, w["step"]
        for k in ("grad_norm", "entropy"):
            assert g[k] == pytest.approx(w[k], rel=2e-5, abs=1e-12), (w["step"], k)
        # loss and kl are near-cancelling float32 sums (ratio 1, advantages summing to 0; the KL of
        # weights one 5e-6 step apart): their last bits follow the CPU's kernels. Seen between two
        # machines of this project, same thread count: 3.7e-9 on a loss of 1.9e-5, 4.1e-8 on a kl of
        # 4.5e-4 (rel 1.9e-4, 9e-5). Bounded absolutely, far below a change of the step (kl ~ 1e-4).
        for k in ("loss", "kl"):
            assert g[k] == pytest.approx(w[k], rel=2e-5, abs=2e-7), (w["step"], k)
