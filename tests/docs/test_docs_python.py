"""docs/python.md's code blocks run, in order, in one namespace (as a notebook would), on the packaged
model: the page shows what works."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_page_has_its_blocks():
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 3
    assert any("grpokit.Callback" in b for b in blocks) and any("Dataset.from_list" in b for b in blocks)


def _drop_weights(runs: Path) -> None:
    """Delete the finished blocks' weights and optimizer states (1.6 GB a run of the packaged model; no
    later block reads them), keeping every folder and small file the assertions below check."""
    for name in ("model.safetensors", "training_state.pt"):
        for path in runs.glob(f"*/checkpoint-*/{name}"):
            path.unlink()


@pytest.mark.e2e
def test_python_page_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    for i, block in enumerate(python_blocks(PAGE.read_text())):
        exec(compile(block, f"docs/python.md block {i + 1}", "exec"), namespace)
        _drop_weights(tmp_path / "runs")
    out = capsys.readouterr().out
    assert "StopWhenRewarded.on_step_end" in out
    assert (tmp_path / "runs" / "python-demo" / "checkpoint-2").is_dir()
    assert (tmp_path / "runs" / "python-dataset" / "eval_after.json").exists()
    assert (tmp_path / "runs" / "python-chat" / "checkpoint-1").is_dir()  # TRL's conversational form trained
    assert list((tmp_path / "runs" / "python-wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
