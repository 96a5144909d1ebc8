"""grpokit.checkpoint: atomic, pruned, NaN-free, safetensors-only checkpoints; safe loading."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from grpokit.checkpoint import (
    find_resume_checkpoint,
    list_checkpoints,
    load_training_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


@pytest.fixture
def parts(make_tiny_model, smollm2_tokenizer):
    """A tiny model with one optimizer step taken (so the optimizer has state)."""
    model = make_tiny_model(vocab_size=64, pad_token_id=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (i + 1))
    model(input_ids=torch.tensor([[1, 5, 7]])).logits.sum().backward()
    opt.step()
    sched.step()
    return {"model": model, "tokenizer": smollm2_tokenizer, "optimizer": opt, "scheduler": sched}


def save(out, step, parts, keep=5, **state):
    return save_checkpoint(out, step, trainer_state={"epoch": 0, "position": step, **state},
                           recipe={"train": {"seed": 0}}, keep=keep, **parts)


def test_checkpoint_contents_and_round_trip(tmp_path, parts):
    path = save(tmp_path, 3, parts)
    assert path == tmp_path / "checkpoint-3"
    names = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "training_state.pt",
            "trainer_state.json", "recipe.json", "tokenizer.json"} <= names
    assert not [n for n in names if n.endswith((".bin", ".pkl", ".pickle"))]  # safetensors only
    assert json.loads((path / "trainer_state.json").read_text()) == {"step": 3, "epoch": 0, "position": 3}
    reloaded = AutoModelForCausalLM.from_pretrained(path)
    for (k, a), (_, b) in zip(parts["model"].state_dict().items(), reloaded.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    state, blob = load_training_state(path)
    assert state["step"] == 3
    opt2 = torch.optim.AdamW(reloaded.parameters(), lr=1e-2)
    opt2.load_state_dict(blob["optimizer"])
    exp_avg = [s["exp_avg"] for s in opt2.state_dict()["state"].values()]
    want = [s["exp_avg"] for s in parts["optimizer"].state_dict()["state"].values()]
    for a, b in zip(exp_avg, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert blob["scheduler"]["last_epoch"] == 1


def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, parts, monkeypatch):
    save(tmp_path, 1, parts)
    before = (tmp_path / "checkpoint-1" / "model.safetensors").read_bytes()
    model = parts["model"]
    real = type(model).save_pretrained

    def half_then_crash(self, path, **kw):
        real(self, path, **kw)  # the weights are on disk, the rest never comes
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(type(model), "save_pretrained", half_then_crash)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, 2, parts)
    assert not (tmp_path / "checkpoint-2").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-1"]  # no temp folder left either
    assert (tmp_path / "checkpoint-1" / "model.safetensors").read_bytes() == before
    assert list_checkpoints(tmp_path) == [tmp_path / "checkpoint-1"]
    assert find_resume_checkpoint(tmp_path, "auto") == tmp_path / "checkpoint-1"


def test_crash_while_writing_training_state(tmp_path, parts, monkeypatch):
    save(tmp_path, 1, parts)

    def boom(*a, **k):
        raise KeyboardInterrupt  # e.g. a second Ctrl-C during torch.save

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2, parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]


def test_find_resume_ignores_temp_and_incomplete_folders(tmp_path, parts):
    assert find_resume_checkpoint(tmp_path / "nothing-here", "auto") is None
    save(tmp_path, 2, parts)
    save(tmp_path, 10, parts)
    # a killed writer's temp folder, an incomplete checkpoint, unrelated names
    (tmp_path / ".tmp-checkpoint-11-1234").mkdir()
    (tmp_path / ".tmp-checkpoint-11-1234" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-12").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-13.bak").mkdir()
    assert list_checkpoints(tmp_path) == [tmp_path / "checkpoint-2", tmp_path / "checkpoint-10"]
    assert find_resume_checkpoint(tmp_path, "auto") == tmp_path / "checkpoint-10"  # numeric order
    assert find_resume_checkpoint(tmp_path, "none") is None
    assert find_resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-2")) == tmp_path / "checkpoint-2"
    with pytest.raises(ValueError, match="train.resume.*checkpoint-12"):
        find_resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-12"))


def test_save_total_limit_prunes_oldest(tmp_path, parts):
    for step in (1, 2, 3, 4):
        save(tmp_path, step, parts, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-3", "checkpoint-4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3", "checkpoint-4"]


def test_saving_the_same_step_twice_replaces_it(tmp_path, parts):
    save(tmp_path, 1, parts, position=5)
    save(tmp_path, 1, parts, position=6)
    assert json.loads((tmp_path / "checkpoint-1" / "trainer_state.json").read_text())["position"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_refuse_to_save(tmp_path, parts, bad):
    save(tmp_path, 1, parts)
    with torch.no_grad():
        parts["model"].model.layers[1].mlp.down_proj.weight[0, 0] = bad
    with pytest.raises(ValueError, match="layers.1.mlp.down_proj.weight.*non-finite"):
        save(tmp_path, 2, parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]


def test_rng_state_round_trip():
    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_training_state_is_loaded_with_weights_only(tmp_path, parts):
    """A pickled object in training_state.pt is refused, not executed."""
    path = save(tmp_path, 1, parts)
    torch.save({"optimizer": {}, "evil": _Evil()}, path / "training_state.pt")
    with pytest.raises(Exception, match="(?i)weights_only|Unsupported global"):
        load_training_state(path)
    assert not _Evil.ran


class _Evil:
    ran = False

    def __reduce__(self):
        return (_Evil._run, ())

    @staticmethod
    def _run():
        _Evil.ran = True
        return _Evil()


def test_leftovers_of_a_killed_writer_are_removed_by_the_next_save(tmp_path, parts):
    for name in (".tmp-checkpoint-3-4242", ".old-checkpoint-2-4242"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".tmp-notes").mkdir()  # not ours: left alone
    save(tmp_path, 3, parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-notes", "checkpoint-3"]


def _fake_checkpoint(folder, state_bytes, blob=None):
    """A checkpoint folder holding only the two files ``load_training_state`` reads."""
    folder.mkdir()
    (folder / "trainer_state.json").write_bytes(state_bytes)
    torch.save(blob if blob is not None else {"optimizer": {}, "scheduler": {}, "rng": {}},
               folder / "training_state.pt")
    return folder


@pytest.mark.parametrize(
    "content, expect",
    [
        # '{"step": 3, "epoch": 0, "position": 6, "extra": {"note": "caf' is 61 bytes
        (b'{"step": 3, "epoch": 0, "position": 6, "extra": {"note": "caf\xe9"}}',
         r"trainer_state.json: line 1: not valid UTF-8 \(byte 0xe9 at offset 61 of the file\); resume"),
        (b'{"step": 3, "epo', r"trainer_state.json: not valid JSON \(.*\); resume from an earlier"),
        (b'{"step": 3}', r"trainer_state.json: expected an object with integer step, epoch and position"),
        (b"[1, 2]", r"trainer_state.json: expected an object with integer step"),
    ],
)
def test_damaged_trainer_state_is_a_value_error_naming_it(tmp_path, content, expect):
    ckpt = _fake_checkpoint(tmp_path / "checkpoint-3", content)
    with pytest.raises(ValueError, match=expect) as e:
        load_training_state(ckpt)
    assert "\n" not in str(e.value) and str(ckpt) in str(e.value)


def test_damaged_training_state_pt_is_a_one_line_value_error(tmp_path):
    good = b'{"step": 3, "epoch": 0, "position": 6}'
    ckpt = _fake_checkpoint(tmp_path / "checkpoint-3", good)
    assert load_training_state(ckpt)[0] == {"step": 3, "epoch": 0, "position": 6}
    (ckpt / "training_state.pt").write_bytes((ckpt / "training_state.pt").read_bytes()[:100])  # torn
    with pytest.raises(ValueError, match=r"training_state.pt: cannot load \(") as e:
        load_training_state(ckpt)
    assert "\n" not in str(e.value)
    torch.save({"optimizer": {}}, ckpt / "training_state.pt")
    with pytest.raises(ValueError, match=r"training_state.pt: expected optimizer, scheduler and rng"):
        load_training_state(ckpt)
