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


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".json"])
def test_non_utf8_data_file_exits_1_with_one_line(tmp_path, capsys, monkeypatch, suffix):
    """Data errors come before any model or tokenizer loads: the model folder need not exist."""
    monkeypatch.setattr(grpokit.models, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.setattr(grpokit.models, "load_tokenizer", lambda *a, **k: pytest.fail("tokenizer loaded"))
    head = {".jsonl": b'{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n{"prompt": "caf',
            ".csv": b"prompt,answer\na,1\ncaf",
            ".json": b'[{"prompt": "a", "answer": "1"},\n{"prompt": "b", "answer": "2"},\n{"prompt": "caf'}[suffix]
    tail = {".jsonl": b'", "answer": "3"}\n', ".csv": b",3\n", ".json": b'", "answer": "3"}]'}[suffix]
    data = tmp_path / f"data{suffix}"
    data.write_bytes(head + b"\xe9" + tail)
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tmp_path / "no-model", tmp_path / "out",
                                                                data={"dataset": str(data)}))
    assert main(["train", str(recipe), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.endswith(f"{data}: line 3: not valid UTF-8 (byte 0xe9 at offset {len(head)} of the file)\n")
    assert err.count("\n") == 1 and err.startswith("grpokit train: error: data.dataset=")


def test_non_utf8_recipe_exits_2_with_one_line(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(b"data:\n  system_prompt: caf\xe9\n")
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err == f"grpokit train: recipe error: recipe {recipe}: line 2: not valid UTF-8 (byte 0xe9 at offset 26 of the file)\n"


@pytest.mark.parametrize("error", [
    lambda: b"caf\xe9".decode("utf-8"),  # UnicodeDecodeError: a constructor of 5 arguments
    lambda: open("/nonexistent/grpokit-data.jsonl"),  # FileNotFoundError: kept as such
])
def test_any_data_error_is_rewrapped_without_failing(tmp_path, capsys, monkeypatch, error):
    """``section_rows`` adds the recipe keys to whatever a loader (HF, reasoning_gym, ...) raises."""
    import grpokit.rows

    monkeypatch.setattr(grpokit.rows, "load_data_rows", lambda *a, **k: error())
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tmp_path / "no-model", tmp_path / "out"))
    assert main(["train", str(recipe), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("grpokit train: error: data.dataset='mawps' data.split='singleop': ")
    assert err.count("\n") == 1 and ("0xe9" in err or "grpokit-data.jsonl" in err)
