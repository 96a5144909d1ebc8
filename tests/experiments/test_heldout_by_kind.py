"""experiments/scripts/heldout_by_kind.py: held-out accuracy split by a row column."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "experiments" / "scripts"
_spec = importlib.util.spec_from_file_location("heldout_by_kind", SCRIPTS / "heldout_by_kind.py")
hbk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hbk)


def test_by_kind_counts_each_kind():
    rows = [{"type": "a"}, {"type": "b"}, {"type": "a"}, {"type": "a"}]
    assert hbk.by_kind(rows, [True, False, False, True], "type") == {"a": (2, 3), "b": (0, 1)}


def test_by_kind_errors_name_the_fault():
    with pytest.raises(ValueError, match=r"run/eval_after: 1 outcomes for 2 held-out rows"):
        hbk.by_kind([{"type": "a"}, {"type": "b"}], [True], "type", "run/eval_after")
    with pytest.raises(ValueError, match=r"held-out row 1 has no column 'type'"):
        hbk.by_kind([{"type": "a"}, {"kind": "b"}], [True, True], "type")


def test_outcomes_of_reads_run_and_eval_cli_files(tmp_path):
    (tmp_path / "run").mkdir()
    run = tmp_path / "run" / "eval_after.json"
    run.write_text(json.dumps({"accuracy": 0.5, "outcomes": [True, False]}))
    cli = tmp_path / "pair.json"
    cli.write_text(json.dumps({"models": {"base": {"outcomes": [False]}, "ckpt": {"outcomes": [True]}}}))
    assert hbk.outcomes_of(run) == {"run/eval_after": [True, False]}
    assert hbk.outcomes_of(cli) == {f"{tmp_path.name}/pair:base": [False], f"{tmp_path.name}/pair:ckpt": [True]}
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not an evaluation JSON"):
        hbk.outcomes_of(bad)


def test_long_recipe_heldout_rows_have_a_kind_each(tmp_path, capsys):
    rows = hbk.heldout_rows(str(ROOT / "recipes" / "long.yaml"))
    kinds = {r["type"] for r in rows}
    assert kinds == {"addsub", "multiarith", "singleeq", "singleop"}
    (tmp_path / "r").mkdir()
    f = tmp_path / "r" / "eval_after.json"
    f.write_text(json.dumps({"outcomes": [r["type"] == "singleop" for r in rows]}))
    assert hbk.main([str(ROOT / "recipes" / "long.yaml"), str(f)]) == 0
    line = capsys.readouterr().out.splitlines()[-1].split(" | ")
    n_single = sum(r["type"] == "singleop" for r in rows)
    assert line[1:] == ["0.000", "0.000", "0.000", "1.000", f"{n_single / len(rows):.3f} |"]
