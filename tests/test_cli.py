"""grpokit.cli: ``grpokit train`` end to end on the tiny model, errors, and ``--help``."""

from __future__ import annotations

import pytest
from helpers import tiny_recipe_dict, write_recipe

import grpokit.models
from grpokit.cli import main
from grpokit.metrics import read_metrics


def test_train_writes_outputs(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tiny_model_dir, out))
    rc = main(["train", str(recipe), "train.max_steps=1", "algo.beta=0", "--no-progress"])
    assert rc == 0
    assert f"output: {out}" in capsys.readouterr().out
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl")] == [1]
    assert (out / "checkpoint-1" / "model.safetensors").is_file()
    assert (out / "curves.png").is_file() and (out / "summary.json").is_file()


def test_unknown_key_returns_2_before_loading(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(grpokit.models, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tiny_model_dir, tmp_path))
    assert main(["train", str(recipe), "train.max_stepz=1"]) == 2
    err = capsys.readouterr().err
    assert "train.max_stepz" in err and "max_steps" in err


def test_train_help_lists_keys(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for key in ("rollout.group_size", "algo.beta", "train.max_steps", "rewards.on_error",
                "train.max_consecutive_skips", "model.trust_remote_code"):
        assert key in out


def test_top_level_usage_and_unknown_command(capsys):
    assert main([]) == 0
    assert "train" in capsys.readouterr().out
    assert main(["fly"]) == 2
    assert "fly" in capsys.readouterr().err


def test_two_recipe_files_is_an_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["train", "a.yaml", "b.yaml"])
    assert e.value.code == 2
