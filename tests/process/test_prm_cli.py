"""``grpokit prm label`` / ``grpokit prm train`` on a tiny random model, and a GRPO step whose
process rewards come from the trained PRM (``algo.process_reward: prm:FOLDER``)."""

from __future__ import annotations

import json

import pytest

from grpokit.cli.main import main
from grpokit.data.rows import section_rows
from grpokit.metrics import read_metrics
from grpokit.process.labels import StepLabels, append_labels, read_labels
from grpokit.trainer.build import build_run
from grpokit.trainer.loop import train
from grpokit.trainer.prm import problem_runs
from support.helpers import tiny_recipe, tiny_recipe_dict, write_recipe


def test_problem_runs_cut_todo_into_consecutive_runs():
    assert problem_runs([], 3) == []
    assert problem_runs([0, 1, 2, 3, 4], 2) == [(0, 2), (2, 4), (4, 5)]
    assert problem_runs([1, 3, 4], 4) == [(1, 2), (3, 5)]


def _recipe(tiny_model_dir, tmp_path, **prm):
    settings = {
        "labels": str(tmp_path / "labels.jsonl"),
        "output_dir": str(tmp_path / "prm"),
        "judge": "support.fake_rewards:length_reward",
        "threshold": 0.3,
        "problems": 3,
        "samples_per_problem": 2,
        "rollouts_per_step": 2,
        "problems_per_call": 2,
        **prm,
    }
    raw = tiny_recipe_dict(
        tiny_model_dir,
        tmp_path / "run",
        algo={"step_rule": "regex:\\s"},
        rollout={"max_new_tokens": 6},
        prm=settings,
    )
    return write_recipe(tmp_path / "r.yaml", raw), raw


@pytest.mark.slow
def test_label_resumes_and_refuses_other_settings(tiny_model_dir, tmp_path, capsys):
    path, raw = _recipe(tiny_model_dir, tmp_path)
    assert main(["prm", "label", str(path)]) == 0
    assert "3 problems labelled, 0 done before; 6 solutions" in capsys.readouterr().out
    labels = tmp_path / "labels.jsonl"
    first = read_labels(labels)
    assert first.complete == {0, 1, 2} and len(first.records) == 6
    rows = section_rows(tiny_recipe(tiny_model_dir, tmp_path / "run"), "data")
    for r in first.records:
        assert r.question == rows[r.problem]["prompt"] and r.answer == rows[r.problem]["answer"]
        assert len(r.steps) == len(r.hard) == len(r.soft)
        assert (r.seed, r.step_rule, r.rollouts_per_step, r.threshold) == (0, "regex:\\s", 2, 0.3)
        assert r.policy == tiny_model_dir
        assert all(h == (s > 0) for h, s in zip(r.hard[:-1], r.soft[:-1]))
    before = labels.read_bytes()
    assert main(["prm", "label", str(path)]) == 0  # complete: nothing sampled, nothing written
    out = capsys.readouterr().out
    assert "0 problems labelled, 3 done before" in out and "; 0 tokens generated," in out
    assert labels.read_bytes() == before
    assert main(["prm", "label", str(path), "prm.problems=4"]) == 0
    assert read_labels(labels).complete == {0, 1, 2, 3} and labels.read_bytes().startswith(before)
    assert main(["prm", "label", str(path), "prm.seed=1"]) == 1
    err = capsys.readouterr().err
    assert "prm.labels" in err and "other settings" in err and "'seed': (0, 1)" in err


def test_label_leaves_out_the_held_out_problems(tiny_model_dir, tmp_path, capsys):
    rows = section_rows(tiny_recipe(tiny_model_dir, tmp_path / "run"), "data")
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"question": rows[1]["prompt"].upper(), "answer": "1"}) + "\n")
    path, _ = _recipe(tiny_model_dir, tmp_path, problems=2, samples_per_problem=1)
    args = ["prm", "label", str(path), f"eval.dataset={held}", "eval.split=test", "eval.limit=1"]
    assert main(args) == 0
    questions = [r.question for r in read_labels(tmp_path / "labels.jsonl").records]
    assert questions == [rows[0]["prompt"], rows[2]["prompt"]]


@pytest.mark.slow
def test_train_writes_a_prm_that_a_grpo_step_scores_with(tiny_model_dir, tmp_path, capsys, monkeypatch):
    path, raw = _recipe(tiny_model_dir, tmp_path, problems=4)
    assert main(["prm", "label", str(path)]) == 0
    assert main(["prm", "train", str(path), "prm.max_steps=2", "prm.eval_fraction=0.25", "prm.batch_size=2"]) == 0
    printed = capsys.readouterr().out
    assert f"-> {tmp_path / 'prm'} (6 solutions, 2 steps" in printed
    info = json.loads((tmp_path / "prm" / "prm_info.json").read_text())
    assert info["problems_train"] == 3 and info["problems_eval"] == 1 and info["steps"] == 2
    assert info["model"] == tiny_model_dir and info["labelled_with"]["step_rule"] == "regex:\\s"
    assert info["eval_before"]["steps"] > 0 and info["eval_after"]["steps"] == info["eval_before"]["steps"]
    assert main(["prm", "train", str(path), "prm.max_steps=2"]) == 1  # the folder is not empty now
    assert "prm.output_dir" in capsys.readouterr().err

    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path / "run",
        algo={"supervision": "process", "process_reward": f"prm:{tmp_path / 'prm'}", "step_rule": "regex:\\s"},
        train={"max_steps": 1},
    )
    parts = build_run(recipe)
    train(recipe, progress=False, run=parts)
    m = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert m["steps_scored_frac"] == 1.0 and m["step_count_mean"] >= 1
    assert 0.0 <= m["step_reward_mean"] <= 1.0  # P(good) of the PRM


@pytest.mark.parametrize(
    "args, message",
    [
        (["label", "prm.labels=null"], "prm.labels: not set"),
        (["label", "prm.judge=no_such_reward"], "prm.judge"),
        (["train", "prm.output_dir=null"], "prm.output_dir: not set"),
        (["train"], "holds no records; run `grpokit prm label` first"),
        (["train", "prm.good_token=ки"], "prm.good_token 'ки' must be a single token"),
        (["label", "prm.samples_per_problem=0"], "prm.samples_per_problem: must be > 0"),
    ],
)
def test_bad_input_is_named(tiny_model_dir, tmp_path, capsys, args, message):
    path, _ = _recipe(tiny_model_dir, tmp_path)
    action, *overrides = args
    if "good_token" in message:  # a token the tokenizer cannot give as one: named before the model loads
        record = StepLabels(0, 0, "q", "q", "1", ["a "], [1], [1.0], False, 2, 2, 0, "regex:\\s", 0.3)
        append_labels(tmp_path / "labels.jsonl", [record])
    assert main(["prm", action, str(path), *overrides]) == 1
    assert message in capsys.readouterr().err
