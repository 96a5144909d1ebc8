"""File modes of what grpokit writes (``grpokit.utils.filemodes``): the umask's, also for files written
through a temporary file (safetensors makes its weight files 0o600) or folder (mkdtemp: 0o700).

The LoRA checkpoint and both exports are checked in ``tests/models/test_lora.py``; a full checkpoint, the
``grpokit sft`` folder and the packaged model's cache folder here. Each test runs under umask 0o027
(files 0o640, folders 0o750), which a hard-coded 0o644 would not meet either."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from grpokit.utils.filemodes import current_umask, default_mode, honour_umask


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): oct(p.lstat().st_mode & 0o777) for p in folder.rglob("*")}


def test_honour_umask_gives_what_open_and_mkdir_give(tmp_path):
    with umask(0o027):
        assert current_umask() == 0o027 and default_mode() == 0o640 and default_mode(is_dir=True) == 0o750
        (tmp_path / "d").mkdir(mode=0o700)
        (tmp_path / "d" / "w").write_bytes(b"x")
        os.chmod(tmp_path / "d" / "w", 0o600)  # as mkstemp leaves it
        (tmp_path / "d" / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(tmp_path / "d" / "run.sh", 0o700)
        os.symlink("/nonexistent", tmp_path / "d" / "link")  # left alone (not followed)
        honour_umask(tmp_path / "d")
    got = modes(tmp_path)
    assert {k: got[k] for k in ("d", "d/w", "d/run.sh")} == {"d": "0o750", "d/w": "0o640", "d/run.sh": "0o750"}
    assert os.readlink(tmp_path / "d" / "link") == "/nonexistent"


def test_a_full_checkpoint_has_the_umasks_modes(tiny_model, smollm2_tokenizer, tmp_path):
    from grpokit.trainer.checkpoint import save_checkpoint

    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with umask(0o027):
        ckpt = save_checkpoint(
            tmp_path,
            1,
            model=tiny_model,
            tokenizer=smollm2_tokenizer,
            optimizer=opt,
            scheduler=sched,
            trainer_state={},
            recipe={"model": {"name_or_path": "m"}},
            keep=2,
        )
    got = modes(ckpt)
    assert "model.safetensors" in got and set(got.values()) == {"0o640"}, got
    assert oct(ckpt.stat().st_mode & 0o777) == "0o750"


def test_the_sft_folder_has_the_umasks_modes(tiny_model_dir, smollm2_tokenizer, tmp_path):
    from grpokit.models.loading import load_model
    from grpokit.trainer.sft import completion_rows, encode_rows, run_sft

    rows = [{"prompt": "What is 1 + 1?", "answer": "2", "equation": "1 + 1"}] * 2
    enc = encode_rows(smollm2_tokenizer, completion_rows(rows, "{equation}")[0], prompt_template="{question}")
    with umask(0o027):
        run_sft(
            load_model(tiny_model_dir).train(),
            smollm2_tokenizer,
            enc,
            tmp_path / "sft",
            max_steps=1,
            batch_size=2,
            warmup_steps=0,
        )
    got = modes(tmp_path / "sft")
    assert "model.safetensors" in got and set(got.values()) == {"0o640"}, got
    assert oct((tmp_path / "sft").stat().st_mode & 0o777) == "0o750"  # mkdtemp made it 0o700


def test_the_packaged_models_cache_folder_has_the_umasks_modes(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    import grpokit.models.loading

    def build(out):  # what _build_smollm2 writes, in brief: safetensors weights (0o600) and plain files
        save_file({"w": torch.zeros(2)}, str(out / "model.safetensors"))
        (out / "config.json").write_text("{}")
        (out / grpokit.models.loading._MARKER).write_text("{}")

    monkeypatch.setattr(grpokit.models.loading, "_build_smollm2", build)
    with umask(0o027):
        target = grpokit.models.loading._ensure_smollm2(tmp_path / "models" / "m")
    assert modes(target) == {
        "model.safetensors": "0o640",
        "config.json": "0o640",
        grpokit.models.loading._MARKER: "0o640",
    }
    assert oct(target.stat().st_mode & 0o777) == "0o750"


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_default_mode_follows_the_umask(mask):
    with umask(mask):
        assert default_mode() == 0o666 & ~mask and default_mode(is_dir=True) == 0o777 & ~mask
