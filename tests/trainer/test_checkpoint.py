"""grpokit.trainer.checkpoint: atomic, pruned, NaN-free, safetensors-only checkpoints; safe loading."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from grpokit.trainer.checkpoint import (
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
    return save_checkpoint(
        out,
        step,
        trainer_state={"epoch": 0, "position": step, **state},
        recipe={"train": {"seed": 0}},
        keep=keep,
        **parts,
    )


def test_checkpoint_contents_and_round_trip(tmp_path, parts):
    path = save(tmp_path, 3, parts)
    assert path == tmp_path / "checkpoint-3"
    names = {p.name for p in path.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "training_state.pt",
        "trainer_state.json",
        "recipe.json",
        "tokenizer.json",
    } <= names
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
    torch.save(
        blob if blob is not None else {"optimizer": {}, "scheduler": {}, "rng": {}}, folder / "training_state.pt"
    )
    return folder


@pytest.mark.parametrize(
    "content, expect",
    [
        # '{"step": 3, "epoch": 0, "position": 6, "extra": {"note": "caf' is 61 bytes
        (
            b'{"step": 3, "epoch": 0, "position": 6, "extra": {"note": "caf\xe9"}}',
            r"trainer_state.json: line 1: not valid UTF-8 \(byte 0xe9 at offset 61 of the file\); resume",
        ),
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


# -- resuming with a changed recipe (docs/resume.md) ----------------------------------------------


def _spy_on_updates(opt) -> list[tuple[float, float, tuple]]:
    """``(lr, weight_decay, betas)`` of param group 0 at each ``opt.step()``: what each update ran with."""
    seen, real = [], opt.step

    def step(*a, **k):
        g = opt.param_groups[0]
        seen.append((g["lr"], g["weight_decay"], tuple(g["betas"])))
        return real(*a, **k)

    opt.step = step
    return seen


@pytest.mark.slow
def test_resume_with_changed_optimizer_keys_runs_at_the_recipes_values(tiny_model_dir, tmp_path, capsys):
    """Step 1 at lr 0.01 (linear schedule over 1 step: the checkpoint's lr is 0.01·0 = 0), then a
    resume with lr 1e-3, weight decay 0.1, betas (0.8, 0.95) and max_steps 2: step 2 must run at
    1e-3 · (1 - 1/2) = 5e-4 (the recipe's rate and schedule at optimizer step 1), not the
    checkpoint's 0 or 0.01·0.5, with the recipe's weight decay and betas; the record says so."""
    import grpokit.trainer.build
    from grpokit.metrics import read_metrics
    from grpokit.trainer.loop import train
    from support.helpers import tiny_recipe

    first = {"max_steps": 1, "save_steps": 1, "learning_rate": 0.01, "lr_scheduler": "linear", "weight_decay": 0.0}
    train(tiny_recipe(tiny_model_dir, tmp_path, algo={"beta": 0.0}, train=first), progress=False)
    assert load_training_state(tmp_path / "checkpoint-1")[1]["optimizer"]["param_groups"][0]["lr"] == 0.0
    changed = first | {"max_steps": 2, "learning_rate": 1e-3, "weight_decay": 0.1, "adam_betas": [0.8, 0.95]}
    recipe = tiny_recipe(tiny_model_dir, tmp_path, algo={"beta": 0.0}, train=changed)
    run = grpokit.trainer.build.build_run(recipe)
    seen = _spy_on_updates(run.optimizer)
    try:
        train(recipe, progress=False, run=run)
    finally:
        run.rewards.close()
    assert seen == [(pytest.approx(5e-4, rel=1e-12), 0.1, (0.8, 0.95))]
    assert run.scheduler.base_lrs == [1e-3] and run.optimizer.param_groups[0]["initial_lr"] == 1e-3
    assert [m["lr"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [0.01, pytest.approx(5e-4, rel=1e-12)]
    out = capsys.readouterr().out
    assert "changed keys" in out and "train.learning_rate 0.01 -> 0.001" in out
    # checkpoint-2 records what ran: the recipe's values, and when they changed
    ckpt = tmp_path / "checkpoint-2"
    saved = json.loads((ckpt / "recipe.json").read_text())["train"]
    assert (saved["learning_rate"], saved["weight_decay"], saved["adam_betas"]) == (1e-3, 0.1, [0.8, 0.95])
    changes = json.loads((ckpt / "trainer_state.json").read_text())["extra"]["recipe_changes"]
    assert [(c["step"], c["key"], c["old"], c["new"]) for c in changes] == [  # in the schema's order
        (1, "train.max_steps", 1, 2),
        (1, "train.learning_rate", 0.01, 1e-3),
        (1, "train.weight_decay", 0.0, 0.1),
        (1, "train.adam_betas", [0.9, 0.99], [0.8, 0.95]),
    ]
    group = load_training_state(ckpt)[1]["optimizer"]["param_groups"][0]
    assert (group["weight_decay"], group["betas"]) == (0.1, (0.8, 0.95))


def test_resume_with_the_same_recipe_keeps_the_rate_bit_for_bit(parts):
    """The schedule's position from the checkpoint, the rate recomputed: the same value ``LambdaLR``
    would have set (so an unchanged resume stays exact)."""
    from grpokit.trainer.optim import hyperparameters, keep_hyperparameters, load_schedule_state

    opt, sched = parts["optimizer"], parts["scheduler"]
    sched.step()  # last_epoch 2: lr = 0.01 / 3
    want = opt.param_groups[0]["lr"]
    opt2 = torch.optim.AdamW(parts["model"].parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda i: 1.0 / (i + 1))
    kept = hyperparameters(opt2)
    opt2.load_state_dict(opt.state_dict())
    keep_hyperparameters(opt2, kept)
    load_schedule_state(sched2, sched.state_dict())
    assert opt2.param_groups[0]["lr"] == want and sched2.get_last_lr() == [want] and sched2.last_epoch == 2


@pytest.mark.slow
def test_resume_refuses_changed_keys_by_name_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    import grpokit.trainer.loop
    from grpokit.config import RecipeError
    from grpokit.trainer.loop import train
    from support.helpers import tiny_recipe

    train(
        tiny_recipe(tiny_model_dir, tmp_path, algo={"beta": 0.0}, train={"max_steps": 1, "save_steps": 1}),
        progress=False,
    )
    monkeypatch.setattr(grpokit.trainer.loop, "build_run", lambda r: pytest.fail("a model was loaded"))
    changed = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        algo={"beta": 0.0},
        data={"limit": 6},
        train={"max_steps": 2, "seed": 1, "learning_rate": 1e-3},
    )
    with pytest.raises(RecipeError) as e:
        train(changed, progress=False)
    message = str(e.value)
    assert "\n" not in message and str(tmp_path / "checkpoint-1") in message
    assert "train.seed: 0 -> 1 (" in message and "data.limit: 8 -> 6 (" in message
    assert "learning_rate" not in message  # that one may change
    assert "train.resume=none" in message


@pytest.mark.parametrize(
    "key, old, new",
    [
        ("model.dtype", "float32", "bfloat16"),
        ("model.lora", None, {"r": 4}),
        ("data.dataset", "mawps", "gsm8k"),
        ("data.prompt_template", "{question}", "Q: {question}"),
        ("train.optimizer", "adamw", "adamw_8bit"),
        ("train.num_iterations", 1, 2),
        ("model.name_or_path", "a", "b"),
    ],
)
def test_each_refused_key_is_named_with_old_and_new(key, old, new):
    from grpokit.config import Recipe, RecipeError
    from grpokit.config.resume import check_resume

    sec, name = key.split(".")
    saved = Recipe().to_dict()
    saved[sec][name] = old
    recipe = Recipe()
    setattr(getattr(recipe, sec), name, new)
    with pytest.raises(RecipeError, match=rf"{key}: {re.escape(repr(old))} -> {re.escape(repr(new))} \("):
        check_resume(saved, recipe, "ckpt")


def test_keys_that_may_change_on_resume_are_returned_not_refused():
    from grpokit.config import Recipe
    from grpokit.config.resume import check_resume

    saved = Recipe().to_dict()
    saved["train"].update(learning_rate=0.01, max_steps=3, resume="none")  # train.resume is never compared
    saved["rollout"]["group_size"] = 4
    del saved["eval"]  # a key the checkpoint does not hold is not compared
    recipe = Recipe()
    recipe.eval.limit = 5
    assert check_resume(saved, recipe, "ckpt") == [
        ("rollout.group_size", 4, 8),
        ("train.max_steps", 3, 20),
        ("train.learning_rate", 0.01, 1e-6),
    ]


def test_a_damaged_recipe_json_is_a_one_line_value_error(tmp_path):
    from grpokit.config import Recipe
    from grpokit.trainer.resume import check_resume_recipe

    assert check_resume_recipe(tmp_path, Recipe()) == []  # no recipe.json: nothing to compare
    (tmp_path / "recipe.json").write_text('{"train": ')
    with pytest.raises(ValueError, match=r"recipe.json: not valid JSON .*train.resume=none"):
        check_resume_recipe(tmp_path, Recipe())


class _AlgorithmWithOptimizer:
    """An algorithm holding an optimizer of its own (as PPO holds its value model's)."""

    def __init__(self, opt):
        self.critic_optimizer = opt

    def state_dict(self):
        return {"critic_optimizer": self.critic_optimizer.state_dict()}

    def load_state_dict(self, state):
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])


def test_resume_keeps_the_settings_of_every_optimizer_and_loads_their_moments(tmp_path, parts, make_tiny_model):
    """Written at lr 1e-2 (policy and the algorithm's own optimizer); the optimizers built from the
    new recipe say lr 1e-3 / weight decay 0.05 and lr 1e-4: those stay, the moments come back."""
    from types import SimpleNamespace

    from grpokit.trainer.resume import resume
    from grpokit.utils.distributed import SINGLE

    critic = torch.nn.Linear(2, 1)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    critic(torch.ones(1, 2)).sum().backward()
    critic_opt.step()
    ckpt = save_checkpoint(
        tmp_path,
        3,
        trainer_state={"epoch": 0, "position": 6},
        recipe={"train": {"seed": 0}},
        keep=1,
        algorithm_state=_AlgorithmWithOptimizer(critic_opt).state_dict(),
        **parts,
    )
    model = make_tiny_model(vocab_size=64, pad_token_id=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    critic_opt2 = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=1e-4)
    run = SimpleNamespace(
        model=model,
        optimizer=opt,
        engine=SimpleNamespace(sync_weights=lambda: None),
        scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (i + 1)),
        algorithm=_AlgorithmWithOptimizer(critic_opt2),
        ranks=SINGLE,
        state=None,
        prm_refresh=None,
    )
    resume(run, ckpt)
    g = opt.param_groups[0]
    assert (g["lr"], g["initial_lr"], g["weight_decay"]) == (1e-3 / 2, 1e-3, 0.05)  # schedule at step 1: 1/(1+1)
    assert critic_opt2.param_groups[0]["lr"] == 1e-4
    want = parts["optimizer"].state_dict()["state"]
    for i, s in opt.state_dict()["state"].items():
        torch.testing.assert_close(s["exp_avg"], want[i]["exp_avg"], rtol=0, atol=0)
    torch.testing.assert_close(
        critic_opt2.state_dict()["state"][0]["exp_avg"], critic_opt.state_dict()["state"][0]["exp_avg"], rtol=0, atol=0
    )
    assert (run.state.step, run.state.position) == (3, 6)


def test_the_docs_table_covers_every_key_and_refuses_exactly_the_refused_ones():
    """docs/resume.md: one row per key or group; a backticked short name belongs to the section of
    the row's first dotted name; ``sec.*`` covers the section."""
    from pathlib import Path

    from grpokit.config import Recipe
    from grpokit.config.resume import REFUSED_ON_RESUME
    from grpokit.config.schema import walk_recipe

    text = (Path(__file__).resolve().parents[2] / "docs" / "resume.md").read_text()
    covered, refused = set(), set()
    for row in (l for l in text.splitlines() if l.startswith("| ") and "`" in l.split("|")[1]):
        names = re.findall(r"`([a-z0-9_.*]+)`", row.split("|")[1])
        section = names[0].split(".")[0]
        keys = {n if "." in n else f"{section}.{n}" for n in names}
        covered |= keys
        if row.split("|")[2].strip() == "refused":
            refused |= keys
    every = {k for k, _, _ in walk_recipe(Recipe())}
    missing = {k for k in every if k not in covered and f"{k.split('.')[0]}.*" not in covered}
    assert not missing
    sections = {k[:-1] for k in refused if k.endswith("*")}  # "data." as REFUSED_ON_RESUME writes it
    keys = {k for k in refused if not k.endswith("*") and f"{k.split('.')[0]}." not in sections}
    assert keys | sections == set(REFUSED_ON_RESUME)
