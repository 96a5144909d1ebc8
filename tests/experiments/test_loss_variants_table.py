"""experiments/scripts/loss_variants.py: the variants' commands and the table from saved run folders."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("loss_variants", ROOT / "experiments" / "scripts" / "loss_variants.py")
lv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lv)


def test_every_variant_is_a_valid_recipe():
    """Each variant's keys load on recipes/arith.yaml (the recipe checks pass) and set what they say."""
    from grpokit.config import load_recipe

    for name, (keys, _) in lv.VARIANTS.items():
        r = load_recipe(ROOT / lv.RECIPE, [*lv.SHARED, *keys])
        assert r.train.max_steps == 30 and r.train.seed == 0, name
    assert load_recipe(ROOT / lv.RECIPE, lv.VARIANTS["gspo"][0]).algo.importance_level == "sequence"


def _run(out: Path, name: str, outcomes: list[bool], entropy: list[float], before: list[bool] | None = None):
    d = out / name
    d.mkdir(parents=True)
    (d / "eval_after.json").write_text(json.dumps({"outcomes": outcomes}))
    if before is not None:
        (d / "eval_before.json").write_text(json.dumps({"outcomes": before}))
    lines = [
        {"step": i + 1, "step_s": 10.0 + i, "entropy": e, "completion_len_mean": 5.0 + i} for i, e in enumerate(entropy)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_table_pairs_each_variant_with_plain(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lv, "OUT", tmp_path)
    # plain right on problems 0-3 of 10; rloo right on 0-5 and 9, wrong on 3: 3 gained, 1 lost
    plain = [True] * 4 + [False] * 6
    rloo = [True, True, True, False, True, True, False, False, False, True]
    _run(tmp_path, "plain", plain, [1.0, 0.8, 0.6], before=[False] * 10)
    _run(tmp_path, "rloo", rloo, [1.0, 0.9, 0.5, 0.4, 0.3, 0.2])
    for step, mu in ((2, 1), (10, 2)):  # the newest checkpoint's recipe says which μ the run had
        ckpt = tmp_path / "rloo" / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "recipe.json").write_text(json.dumps({"train": {"num_iterations": mu}}))
    rep = lv.table(str(tmp_path / "t.json"), None)
    assert rep["rows"]["rloo"]["num_iterations"] == 2 and rep["rows"]["plain"]["num_iterations"] is None
    row = rep["rows"]["rloo"]
    assert row["accuracy"] == pytest.approx(0.6)
    pc = row["paired_vs_plain"]
    assert (pc["diff"], pc["b_only"], pc["a_only"]) == (pytest.approx(0.2), 3, 1)
    assert pc["p_value"] == pytest.approx(0.625)  # exact McNemar: 2 * P(X <= 1), X ~ Bin(4, 1/2) = 2 * 5/16
    assert row["step_s_median"] == pytest.approx(12.5)  # median of 10..15
    assert row["entropy_last5"] == pytest.approx((0.9 + 0.5 + 0.4 + 0.3 + 0.2) / 5)
    assert row["length_last5"] == pytest.approx((6 + 7 + 8 + 9 + 10) / 5)
    out = capsys.readouterr().out
    assert "before training: 0.000" in out and "| rloo |" in out and "+20.0 [" in out
    saved = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert saved["plain"]["accuracy"] == pytest.approx(0.4)
    assert saved["rloo"]["outcomes"] == "1110110001" and saved["plain"]["outcomes"] == "1111000000"


def test_out_folder_keeps_the_mu2_runs_apart(tmp_path, monkeypatch):
    """``run --out DIR --shared K=V``: the runs go to DIR (a finished μ = 1 run elsewhere is not taken),
    every command carries the shared key; ``table --out DIR`` reads DIR."""
    monkeypatch.setattr(lv, "OUT", tmp_path / "variants")
    _run(tmp_path / "variants", "plain", [True] * 4, [1.0])  # the μ = 1 run
    calls = []
    monkeypatch.setattr(lv.subprocess, "run", lambda cmd, **k: calls.append(cmd))
    mu2 = tmp_path / "variants_mu2"
    lv.main(["run", "--only", "plain", "cispo", "--shared", "train.num_iterations=2", "--out", str(mu2)])
    assert [c[-1] for c in calls] == [f"train.output_dir={mu2 / 'plain'}", f"train.output_dir={mu2 / 'cispo'}"]
    assert all("train.num_iterations=2" in c for c in calls)
    _run(mu2, "plain", [True, False], [1.0], before=[False, False])
    _run(mu2, "cispo", [True, True], [1.0])
    lv.main(["table", "--out", str(mu2), "--json", str(tmp_path / "t.json")])
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert rows["cispo"]["paired_vs_plain"]["b_only"] == 1 and rows["plain"]["accuracy"] == 0.5
