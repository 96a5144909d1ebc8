"""The pure logic of ``bench/efficacy_vs_trl.py`` (time to accuracy, interpolation, report) against
hand-computed values. Needs neither TRL nor a model: the bench module is imported by its path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "efficacy_vs_trl.py"
_spec = importlib.util.spec_from_file_location("efficacy_vs_trl", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

CURVE = [(0.0, 0.1), (2.0, 0.3), (4.0, 0.5)]


@pytest.mark.parametrize(
    "target, minutes",
    [
        (0.4, 3.0),  # halfway between (2, 0.3) and (4, 0.5)
        (0.35, 2.5),  # a quarter of the way
        (0.3, 2.0),  # exactly at an evaluation point
        (0.05, 0.0),  # the base model already has it
        (0.5, 4.0),  # reached at the last point
        (0.6, None),  # never reached
    ],
)
def test_time_to_accuracy(target, minutes):
    got = bench.time_to_accuracy(CURVE, target)
    assert got == (None if minutes is None else pytest.approx(minutes))


def test_time_to_accuracy_takes_the_first_crossing():
    # up to 0.5 at minute 1, down to 0.2, up to 0.6: 0.4 is first reached at 0 + (0.3 / 0.4) · 1
    assert bench.time_to_accuracy([(0.0, 0.1), (1.0, 0.5), (2.0, 0.2), (3.0, 0.6)], 0.4) == pytest.approx(0.75)


@pytest.mark.parametrize("minute, acc", [(0.0, 0.1), (1.0, 0.2), (3.0, 0.4), (4.0, 0.5), (5.0, None), (-1.0, None)])
def test_accuracy_at(minute, acc):
    got = bench.accuracy_at(CURVE, minute)
    assert got == (None if acc is None else pytest.approx(acc))


def test_time_to_accuracy_summary():
    """Each seed's target is TRL's final accuracy on that seed (its own held-out draw)."""
    grpokit = {0: [(0.0, 0.1), (1.0, 0.3), (2.0, 0.5)], 1: [(0.0, 0.1), (2.0, 0.5)]}
    trl = {0: [(0.0, 0.1), (5.0, 0.3), (10.0, 0.5)], 1: [(0.0, 0.1), (4.0, 0.3), (10.0, 0.3)]}
    s = bench.time_to_accuracy_summary(grpokit, trl)
    assert s["target"] == {0: pytest.approx(0.5), 1: pytest.approx(0.3)}
    assert s["grpokit_minutes"][0] == pytest.approx(2.0)
    assert s["grpokit_minutes"][1] == pytest.approx(1.0)  # 0 + (0.2 / 0.4) · 2
    assert s["trl_minutes"][0] == pytest.approx(10.0)
    assert s["trl_minutes"][1] == pytest.approx(4.0)  # reached before its end
    assert s["ratios"] == {0: pytest.approx(0.2), 1: pytest.approx(0.25)}
    assert s["ratio"] == pytest.approx(1.5 / 7.0)
    assert s["ratio_vs_trl_total"] == pytest.approx(0.15)
    assert s["met"] is True


def test_time_to_accuracy_summary_unreached_grpokit_gives_no_ratio():
    s = bench.time_to_accuracy_summary({0: [(0.0, 0.1), (1.0, 0.2)]}, {0: [(0.0, 0.1), (9.0, 0.5)]})
    assert s["grpokit_minutes"] == {0: None} and s["ratio"] is None and s["met"] is None


def _run(peer, minutes, accs, final, lr):
    pts = [
        {"step": 2 * i, "minutes": m, "acc": a, "lo": a - 0.1, "hi": a + 0.1, "correct": int(4 * a), "total": 4}
        for i, (m, a) in enumerate(zip(minutes, accs))
    ]
    return {
        "peer": peer,
        "seed": 0,
        "points": pts,
        "before_outcomes": [False] * 4,
        "final_outcomes": final,
        "lr": lr,
        "questions": {1: ["1+1"] * 2 + ["2+2"] * 2},
    }


def test_build_summary_and_report():
    g = _run("grpokit", [0.0, 1.0, 2.0], [0.0, 0.25, 0.5], [True, True, False, False], [1e-6, 2e-6])
    t = _run("trl", [0.0, 4.0, 8.0], [0.0, 0.25, 0.25], [True, False, False, False], [1e-6, 2e-6])
    s = bench.build_summary([g, t])
    row = s["equal_steps"][0]
    # grpokit right on problems 0 and 1, TRL on problem 0: diff = (1 - 0) / 4, exact McNemar p(1, 0) = 1
    assert row["diff"]["diff"] == pytest.approx(0.25) and row["diff"]["b_only"] == 1 and row["diff"]["a_only"] == 0
    assert row["diff"]["p_value"] == pytest.approx(1.0) and row["diff"]["agree"] is True
    assert row["grpokit_gain"]["diff"] == pytest.approx(0.5) and row["trl_gain"]["diff"] == pytest.approx(0.25)
    # equal wall-clock at grpokit's 2 minutes: TRL at 0 + (2 / 4) · 0.25
    assert s["equal_wallclock"] == [
        {"seed": 0, "minutes": 2.0, "grpokit": pytest.approx(0.5), "trl": pytest.approx(0.125)}
    ]
    # target 0.25: grpokit at minute 1, TRL at minute 4
    assert s["time_to_accuracy"]["ratio"] == pytest.approx(0.25)
    assert all(v == "yes" for v in s["checks"].values())
    report = bench.render_report(s)
    assert "+0.250 [" in report and "**0.25**" in report and "goal <= 0.35: met" in report
    assert "| grpokit | 0 | 4 | 2.00 | 0.500 [0.400, 0.600] |" in report
    assert all("outcomes" not in k for r in s["runs"] for k in r)


def test_build_summary_flags_different_lr_and_base():
    g = _run("grpokit", [0.0, 1.0], [0.0, 0.5], [True, True, False, False], [1e-6])
    t = _run("trl", [0.0, 3.0], [0.0, 0.25], [True, False, False, False], [0.0])
    t["before_outcomes"] = [True, False, False, False]
    t["questions"] = {1: ["2+2"] * 2 + ["1+1"] * 2}
    t["status"] = "failed (exit 1)"
    checks = bench.build_summary([g, t])["checks"]
    assert checks["seed 0 same training questions in the same order (steps [1])"] == "NO"
    assert checks["trl seed 0 run"].startswith("failed (exit 1)")
    assert checks["seed 0 base model scored identically by both pipelines"] == "NO"
    assert checks["seed 0 learning rate identical at every step"].startswith("NO")
