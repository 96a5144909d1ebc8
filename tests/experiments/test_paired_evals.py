"""experiments/scripts/paired_evals.py: accuracies and paired comparisons from saved evaluations."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("paired_evals", ROOT / "experiments" / "scripts" / "paired_evals.py")
pe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pe)


def test_a_run_eval_and_a_grpokit_eval_file_are_paired(tmp_path, capsys):
    run_eval = tmp_path / "eval_after.json"  # a run's: one model's outcomes
    run_eval.write_text(json.dumps({"accuracy": 0.75, "outcomes": [True, True, True, False]}))
    cli_eval = tmp_path / "cli.json"  # grpokit eval --output: per model
    cli_eval.write_text(
        json.dumps({"models": {"m": {"outcomes": [True, False, False, False]}, "n": {"outcomes": [1, 1, 0, 1]}}})
    )
    rep = pe.main(
        [
            f"after={run_eval}",
            f"base={cli_eval}",
            f"other={cli_eval}#n",
            "--pair",
            "after:base",
            "--json",
            str(tmp_path / "o.json"),
        ]
    )
    assert rep["accuracy"]["after"]["correct"] == 3 and rep["accuracy"]["base"]["value"] == 0.25
    assert rep["accuracy"]["other"]["correct"] == 3
    pair = rep["pairs"]["after:base"]
    assert (pair["diff"], pair["b_only"], pair["a_only"]) == (0.5, 2, 0)  # after − base: 2 only after, 0 only base
    assert json.loads((tmp_path / "o.json").read_text())["pairs"]["after:base"]["p_value"] == 0.5
    assert "| after − base | +50.0 [" in capsys.readouterr().out
    bad = tmp_path / "short.json"
    bad.write_text(json.dumps({"outcomes": [True]}))
    with pytest.raises(SystemExit, match="1 and 4 problems"):
        pe.main([f"a={bad}", f"b={run_eval}", "--pair", "a:b"])
