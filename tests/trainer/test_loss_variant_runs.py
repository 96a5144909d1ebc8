"""The loss variants (docs/loss_variants.md) in the training loop on a tiny random Llama: the loop knows
none of them by name (the recipe keys reach ``grpokit.algo.policy_loss`` through the algorithm seam),
runs finite, logs their statistics, and checkpoints the adaptive entropy coefficient."""

from __future__ import annotations

import math

import pytest
import torch

import grpokit.trainer.build
from grpokit import algo
from grpokit.metrics import read_metrics
from grpokit.trainer.loop import train
from support.helpers import tiny_recipe


@pytest.mark.slow
def test_gspo_token_with_the_adaptive_entropy_bonus_trains_logs_and_checkpoints(tiny_model_dir, tmp_path, monkeypatch):
    seen = []
    real = algo.policy_loss

    def spy(logp, old_logp, adv, mask, config, **kw):
        seen.append({k: getattr(config, k) for k in ("importance_level", "surrogate", "entropy_coef")})
        seen[-1]["entropy_grad"] = kw["entropy"] is not None and kw["entropy"].requires_grad
        return real(logp, old_logp, adv, mask, config, **kw)

    monkeypatch.setattr(algo, "policy_loss", spy)
    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        algo={
            "importance_level": "sequence_token",
            "clip_eps_low": 3e-4,
            "clip_eps_high": 4e-4,
            "entropy_coef": 0.01,
            "entropy_target": 100.0,  # far above any entropy: the coefficient grows every step
            "entropy_coef_lr": 0.001,
        },
        train={"num_iterations": 2, "save_steps": 2},
    )
    parts = grpokit.trainer.build.build_run(recipe)
    train(recipe, progress=False, run=parts)
    assert {s["importance_level"] for s in seen} == {"sequence_token"} and all(s["entropy_grad"] for s in seen)
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert math.isfinite(m["loss"]) and m["skipped_updates"] == 0
        assert math.isfinite(m["seq_ratio_mean"]) and 0 <= m["clip_frac_high"] <= 1
    # step 1 trains with 0.01; then coef += 0.001·(100 − H) with H the step's mean entropy (> 0)
    h1 = lines[0]["entropy"]
    assert lines[0]["entropy_coef"] == pytest.approx(0.01)
    assert lines[1]["entropy_coef"] == pytest.approx(0.01 + 0.001 * (100 - h1), rel=0.05)
    state = torch.load(tmp_path / "checkpoint-2" / "training_state.pt", weights_only=False)
    assert state["algorithm"]["entropy_coef"] == pytest.approx(parts.algorithm.entropy_coef)
    assert parts.algorithm.entropy_coef > lines[1]["entropy_coef"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "keys,forwarded",
    [
        ({"policy_loss": "cispo", "clip_eps_low": 1.0, "clip_eps_high": 4.0}, {"surrogate": "cispo"}),
        ({"dual_clip_c": 3.0}, {"dual_clip_c": 3.0}),
    ],
)
def test_other_variants_reach_the_loss_and_train_finite(tiny_model_dir, tmp_path, monkeypatch, keys, forwarded):
    seen = []
    real = algo.policy_loss

    def spy(logp, old_logp, adv, mask, config, **kw):
        seen.append({k: getattr(config, k) for k in forwarded})
        return real(logp, old_logp, adv, mask, config, **kw)

    monkeypatch.setattr(algo, "policy_loss", spy)
    recipe = tiny_recipe(tiny_model_dir, tmp_path, algo=keys, train={"num_iterations": 2, "max_steps": 1})
    train(recipe, progress=False, run=grpokit.trainer.build.build_run(recipe))
    assert seen and all(s == forwarded for s in seen)
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert math.isfinite(m["loss"]) and m["skipped_updates"] == 0 and "entropy_coef" not in m
    assert ("clip_frac_dual" in m) == ("dual_clip_c" in keys)
