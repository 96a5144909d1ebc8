"""Iterative RL (grpokit.trainer.prm_refresh): the PRM retrained on the policy's new labels with a
replay, π_ref set to the policy, and an exact resume that cuts the label file back."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
from safetensors.torch import load_file

from grpokit.metrics import read_metrics
from grpokit.process.labels import read_labels
from grpokit.process.prm_train import PRM_INFO, PRMSpec
from grpokit.trainer.build import build_run
from grpokit.trainer.loop import train
from grpokit.trainer.prm_refresh import LABELS_FILE, _keep_lines
from support.helpers import tiny_recipe


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory, smollm2_tokenizer):
    """A tiny random causal LM saved as a PRM folder (the layout's spec in prm_info.json)."""
    from conftest import _make_tiny_model

    path = tmp_path_factory.mktemp("prm")
    _make_tiny_model(seed=5).save_pretrained(path, safe_serialization=True)
    smollm2_tokenizer.save_pretrained(path)
    (path / PRM_INFO).write_text(json.dumps({"spec": asdict(PRMSpec())}))
    return path


def _recipe(model_dir, prm_dir, out, **train):
    return tiny_recipe(
        model_dir,
        out,
        algo={"supervision": "process", "process_reward": f"prm:{prm_dir}", "step_rule": "regex:\\s"},
        prm={
            "refresh_steps": 1,
            "refresh_problems": 2,
            "samples_per_problem": 2,
            "rollouts_per_step": 2,
            "judge": "support.fake_rewards:length_reward",
            "threshold": 0.2,
            "batch_size": 2,
            "learning_rate": 1e-3,
            "replay_fraction": 0.5,
        },
        rollout={"max_new_tokens": 6},
        train={"save_steps": 1, **train},
    )


def _run(recipe):
    parts = build_run(recipe)
    train(recipe, progress=False, run=parts)
    return parts


@pytest.mark.slow
def test_refresh_retrains_the_prm_replays_and_sets_the_reference(tiny_model_dir, prm_dir, tmp_path):
    out = tmp_path / "run"
    parts = _run(_recipe(tiny_model_dir, prm_dir, out, max_steps=3))
    metrics = read_metrics(out / "metrics.jsonl")
    assert "prm_round" not in metrics[0]  # the first refresh comes after step 1
    assert [m["prm_round"] for m in metrics[1:]] == [1, 2]
    assert [m["prm_labels"] for m in metrics[1:]] == [4, 4]  # 2 problems x 2 solutions
    assert all(m["prm_label_tokens"] >= 4 for m in metrics[1:])  # at least one token per solution
    records = read_labels(out / LABELS_FILE).records
    assert [r.policy for r in records] == ["step 1"] * 4 + ["step 2"] * 4
    assert sorted({r.problem for r in records}) == [0, 1, 2, 3]  # the next problems each round
    with_steps = [sum(1 for r in records[:4] if r.steps), sum(1 for r in records[4:] if r.steps)]
    assert metrics[1]["prm_replay"] == 0  # nothing earlier to replay
    assert metrics[2]["prm_replay"] == min(with_steps[0], with_steps[1])  # f = 0.5: as many as the new
    # the PRM moved from its folder; π_ref is the policy as it was after step 2 (the last refresh)
    folder = load_file(prm_dir / "model.safetensors")
    prm_now = parts.prm_refresh.prm.model.state_dict()
    assert any(not torch.equal(folder[k], prm_now[k].cpu()) for k in folder)
    after_2 = load_file(out / "checkpoint-2" / "model.safetensors")
    ref = parts.ref_model.state_dict()
    assert all(torch.equal(after_2[k], ref[k]) for k in after_2)
    policy = parts.model.state_dict()
    assert any(not torch.equal(policy[k], ref[k]) for k in after_2)  # step 3 moved the policy on


@pytest.mark.slow
def test_resume_repeats_the_refresh_exactly(tiny_model_dir, prm_dir, tmp_path):
    whole = tmp_path / "whole"
    a = _run(_recipe(tiny_model_dir, prm_dir, whole, max_steps=3))
    cut = tmp_path / "cut"
    _run(_recipe(tiny_model_dir, prm_dir, cut, max_steps=2))
    with open(cut / LABELS_FILE, "a") as f:  # a refresh after the last checkpoint, then a crash
        f.write('{"problem": 99}\n')
    b = _run(_recipe(tiny_model_dir, prm_dir, cut, max_steps=3))
    assert (cut / LABELS_FILE).read_bytes() == (whole / LABELS_FILE).read_bytes()
    for x, y in [(a.model, b.model), (a.ref_model, b.ref_model), (a.prm_refresh.prm.model, b.prm_refresh.prm.model)]:
        sx, sy = x.state_dict(), y.state_dict()
        assert all(torch.equal(sx[k], sy[k]) for k in sx)
    assert read_metrics(cut / "metrics.jsonl")[-1]["prm_loss"] == read_metrics(whole / "metrics.jsonl")[-1]["prm_loss"]


def test_keep_lines(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text("a\nb\nc")
    _keep_lines(path, 2)
    assert path.read_text() == "a\nb\n"
    _keep_lines(path, 0)
    assert path.read_text() == ""
    with pytest.raises(ValueError, match="fewer than 1 label lines"):
        _keep_lines(path, 1)
    _keep_lines(tmp_path / "absent.jsonl", 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, message",
    [
        ({"algo": {"supervision": "outcome"}}, "needs algo.supervision=process"),
        ({"rollout": {"env": "tools"}}, "rollout.env must be null"),
        ({"prm": {"refresh_steps": 1, "judge": "no_such_reward"}}, "prm.judge"),
    ],
)
def test_refused_before_any_model_loads(tiny_model_dir, prm_dir, tmp_path, change, message):
    recipe = _recipe(tiny_model_dir, prm_dir, tmp_path / "run", max_steps=1)
    raw = recipe.to_dict()
    for sec, values in change.items():
        raw[sec].update(values)
    from grpokit.config import recipe_from_dict

    with pytest.raises(ValueError, match=message):
        build_run(recipe_from_dict(raw))
