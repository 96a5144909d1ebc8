"""experiments/scripts/process_arms.py and experiments/scripts/step_signal.py (issue #33): the arms'
commands, the paired table from saved run folders, and the outcome/step statistics of hand-built groups."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pa = _load("process_arms")
ss = _load("step_signal")


def test_every_arm_is_a_valid_recipe_and_sets_what_it_says():
    from grpokit.config import load_recipe

    got = {name: load_recipe(ROOT / pa.RECIPE, [*keys, "train.seed=1"]) for name, (keys, _) in pa.ARMS.items()}
    assert got["outcome"].algo.supervision == "outcome"
    assert got["rule"].algo.process_reward == "arithmetic"
    assert got["prm"].algo.process_reward == f"prm:{pa.PRM}" and got["prm"].prm.refresh_steps == 0
    assert got["prm_iterative"].prm.refresh_steps == 10
    assert got["prm_outcome"].algo.process_last_step == "outcome" and got["prm"].algo.process_last_step == "scorer"
    assert got["prm_outcome"].algo.process_reward == f"prm:{pa.PRM}"
    for name in ("rule", "prm", "prm_outcome", "prm_iterative"):
        assert got[name].algo.supervision == "process" and got[name].algo.process_advantage == "diff", name
    assert got["rule_change"].algo.process_advantage == "change" and got["rule_change"].algo.supervision == "process"
    assert got["rule_change"].algo.process_reward == "arithmetic"
    assert {r.train.seed for r in got.values()} == {1}
    assert len({(r.train.max_steps, r.data.dataset, r.model.name_or_path) for r in got.values()}) == 1


def _run(out: Path, name: str, outcomes: list[bool], completions: list[tuple[int, str]], before=None):
    d = out / name
    d.mkdir(parents=True)
    (d / "eval_after.json").write_text(json.dumps({"outcomes": outcomes}))
    if before is not None:
        (d / "eval_before.json").write_text(json.dumps({"outcomes": before}))
    lines = [{"step": i + 1, "step_s": 60.0, "completion_len_mean": 10.0 + i} for i in range(6)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (d / "samples.jsonl").write_text("".join(json.dumps({"step": s, "completion": c}) + "\n" for s, c in completions))


def test_table_pairs_each_arm_with_the_outcome_arm_of_its_seed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pa, "OUT", tmp_path)
    outcome = [True] * 4 + [False] * 6
    rule = [True, True, True, False, True, True, False, False, False, True]  # 3 gained, 1 lost
    _run(tmp_path, "outcome_s0", outcome, [(5, "1 + 2 = 3\n3 * 2 = 6"), (5, "x")], before=[False] * 10)
    # the last sampled step (10) counts: 3 lines and 1 line -> 2.0; step 5's 9 lines do not
    _run(tmp_path, "rule_s0", rule, [(5, "a\n" * 9), (10, "a\nb\nc"), (10, "d")])
    rep = pa.table([0], str(tmp_path / "t.json"))
    row = rep["seeds"][0]["rule"]
    assert row["accuracy"] == pytest.approx(0.6)
    pc = row["paired_vs_outcome"]
    assert (pc["diff"], pc["b_only"], pc["a_only"]) == (pytest.approx(0.2), 3, 1)
    assert pc["p_value"] == pytest.approx(0.625)  # exact McNemar: 2 * P(X <= 1), X ~ Bin(4, 1/2)
    assert row["steps_last_sample"] == pytest.approx(2.0)
    assert row["length_last5"] == pytest.approx((11 + 12 + 13 + 14 + 15) / 5)
    assert row["train_minutes"] == pytest.approx(6.0) and row["outcomes"] == "1110110001"
    assert rep["seeds"][0]["outcome"]["steps_last_sample"] == pytest.approx(1.5)
    assert rep["seeds"][0]["warmup"]["accuracy"] == 0.0
    out = capsys.readouterr().out
    assert "| 0 | rule | 0.600 [" in out and "+20.0 [" in out and "| 3 / 1 |" in out


def test_table_pairs_the_iterative_arm_with_the_fixed_prm_arm_and_sums_its_refresh_cost(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pa, "OUT", tmp_path)
    _run(tmp_path, "outcome_s0", [False] * 6, [])
    _run(tmp_path, "prm_s0", [True, False, False, True, False, False], [])
    _run(tmp_path, "prm_iterative_s0", [True, True, True, False, False, False], [])  # 2 gained, 1 lost
    metrics = tmp_path / "prm_iterative_s0" / "metrics.jsonl"
    rows = [{"step": 1, "step_s": 60.0}, {"step": 11, "step_s": 90.0, "prm_refresh_s": 30.0, "prm_label_tokens": 500}]
    rows.append({"step": 21, "step_s": 120.0, "prm_refresh_s": 60.0, "prm_label_tokens": 700})
    metrics.write_text("".join(json.dumps(m) + "\n" for m in rows))
    rep = pa.table([0], None)
    row = rep["seeds"][0]["prm_iterative"]
    pc = row["paired_vs_prm"]
    assert (pc["diff"], pc["b_only"], pc["a_only"]) == (pytest.approx(1 / 6), 2, 1)
    assert row["prm_refresh_minutes"] == pytest.approx(1.5) and row["prm_label_tokens"] == 1200
    assert "prm_refresh_minutes" not in rep["seeds"][0]["prm"] and "paired_vs_prm" not in rep["seeds"][0]["prm"]
    out = capsys.readouterr().out
    assert "- seed 0: prm_iterative − prm: +16.7 points" in out and "2 / 1" in out and "1200 tokens" in out


def test_run_skips_finished_arms_and_builds_each_command(tmp_path, monkeypatch):
    monkeypatch.setattr(pa, "OUT", tmp_path)
    (tmp_path / "outcome_s0").mkdir()
    (tmp_path / "outcome_s0" / "eval_after.json").write_text("{}")
    calls = []
    monkeypatch.setattr(pa.subprocess, "run", lambda cmd, **k: calls.append(cmd))
    pa.run(["outcome", "prm"], [0], ["train.max_steps=2"])
    assert len(calls) == 1
    cmd = calls[0]
    assert cmd[1:4] == ["train", pa.RECIPE, "train.seed=0"] and "train.max_steps=2" in cmd
    assert f"algo.process_reward=prm:{pa.PRM}" in cmd and "eval.before=false" in cmd
    assert cmd[-1] == f"train.output_dir={tmp_path / 'prm_s0'}"


def _labels(problem: int, steps: list[list[str]], hard: list[list[int]]):
    from grpokit.process import StepLabels

    return [
        StepLabels(
            problem=problem, sample=g, question=f"q{problem}", prompt=f"q{problem}?", answer="6",
            steps=s, hard=h, soft=[float(x) for x in h], truncated=False, samples_per_problem=len(steps),
            rollouts_per_step=4, seed=0, step_rule="lines", threshold=1.0,
        )
        for g, (s, h) in enumerate(zip(steps, hard))
    ]  # fmt: skip


def test_step_signal_counts_groups_without_outcome_signal_and_right_steps():
    """Two groups of 2 from label records (the last step's label is the outcome):
    problem 0: both wrong; sample 0 "1 + 2 = 3" (right) then "3 * 2 = 7" (wrong), sample 1 "1 + 2 = 4"
    (wrong) then "4 * 2 = 8" (right claim after a wrong one) -> no outcome signal, a right checked step;
    problem 1: one right ("2 * 3 = 6"), one wrong ("2 * 3 = 5") -> outcome signal."""
    from grpokit.config import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "steps.yaml")
    recs0 = _labels(0, [["1 + 2 = 3\n", "3 * 2 = 7"], ["1 + 2 = 4\n", "4 * 2 = 8"]], [[1, 0], [0, 0]])
    recs1 = _labels(1, [["2 * 3 = 6"], ["2 * 3 = 5"]], [[1], [0]])
    groups = []
    for recs in (recs0, recs1):
        groups.append(
            {"prompt": recs[0].prompt, "row": {"answer": "6"}, "completions": ["".join(r.steps) for r in recs],
             "labels": recs}
        )  # fmt: skip
    out = ss.measure(recipe, groups)
    assert out["problems"] == 2 and out["completions"] == 4
    assert out["answer_accuracy"] == 0.25
    assert out["groups_without_outcome_signal"] == 0.5 and out["groups_all_wrong"] == 0.5
    assert out["of_those_with_a_right_checked_step"] == 1.0
    assert out["steps_per_completion"] == pytest.approx(6 / 4)
    assert out["checked_steps_right_frac"] == pytest.approx(3 / 6)  # 1+2=3, 4*2=8, 2*3=6
    # prefix-right share per completion: 1/2, 0/2, 1/1, 0/1
    assert out["prefix_right_share_mean"] == pytest.approx((0.5 + 0 + 1 + 0) / 4)
    # wrong answers: p0 s0 (first step right), p0 s1 (wrong), p1 s1 (wrong) -> 1/3
    assert out["wrong_answers_first_step_right_frac"] == pytest.approx(1 / 3)
    # non-last steps only: p0 s0 step 0 (verifier good, label 1), p0 s1 step 0 (bad, label 0): agree 2/2
    lv = out["labels_vs_verifier"]
    assert lv["steps"] == 2 and lv["hard_label_agreement"] == 1.0 and lv["auc_soft_label_for_verifier_good"] == 1.0
    # process signal in problem 0's group: verifier rewards [1, 0] and [0, 0] pooled vary
    assert out["of_those_with_process_signal"] == 1.0


def test_verifier_good_is_the_prefix_before_the_first_wrong_claim():
    assert ss._verifier_good(["1 + 1 = 2\n", "so\n", "2 * 3 = 7\n", "7 + 1 = 8"]) == [1, 1, 0, 0]
    assert ss._verifier_good(["no claim"]) == [1]
