"""How reward functions are called (issue #29, items 8 and 14): async functions awaited under both
isolations with the guard's limits and fault policy; TRL's keyword form; signatures checked before
any model loads, with a message that shows the expected form (and never advises on_error=none)."""

from __future__ import annotations

import time

import pytest

from grpokit.cli.main import main
from grpokit.process.wiring import resolve_process_reward
from grpokit.rewards import compute_rewards, get_reward_function
from grpokit.rewards.calling import RewardSignatureError, call_form, check_signature
from grpokit.rewards.guard import GuardedReward, RewardError
from grpokit.rewards.pipeline import RewardPipeline
from support import fake_rewards as fr
from support.helpers import tiny_recipe, tiny_recipe_dict, write_recipe

ISOLATIONS = ["process", "thread"]
EXPECTED = "expected def f(prompts, completions, **columns)"


def _guarded(fn, isolation, **kw):
    kw.setdefault("timeout_s", 5)
    return GuardedReward("r", fn, isolation=isolation, **kw)


# -- item 8: async rewards ---------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("fn", [fr.async_length_reward, fr.AsyncLengthReward()], ids=["async_def", "async_call"])
def test_an_async_reward_is_awaited(isolation, fn):
    guard = _guarded(fn, isolation)
    try:  # lengths 2 and 4, / 100
        assert guard(["q", "q"], ["ab", "abcd"], answer=["1", "2"]) == [0.02, 0.04]
        assert guard.failures == 0
    finally:
        guard.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_an_async_reward_follows_on_error(isolation):
    texts = [f"async-{isolation}-{i}" for i in range(3)]  # fresh texts: the bad row is remembered by text
    guard = _guarded(fr.async_raising_reward, isolation, on_error="none")
    try:
        assert guard(["q"] * 3, texts) == [len(texts[0]) / 100, None, len(texts[2]) / 100]
        assert guard.failures == 1
    finally:
        guard.close()
    texts = [f"async-raise-{isolation}-{i}" for i in range(3)]
    guard = _guarded(fr.async_raising_reward, isolation, on_error="raise")
    try:
        with pytest.raises(RewardError, match=r"'r' failed on row 1 .*ZeroDivisionError"):
            guard(["q"] * 3, texts)
    finally:
        guard.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_an_async_reward_is_cut_at_the_time_limit(isolation):
    texts = [f"hang-{isolation}-{i}" for i in range(3)]
    guard = _guarded(fr.async_hanging_reward, isolation, timeout_s=0.4, on_error="none")
    t0 = time.monotonic()
    try:
        assert guard(["q"] * 3, texts) == [len(texts[0]) / 100, None, len(texts[2]) / 100]
        assert guard.failures == 1
    finally:
        guard.close()
    assert time.monotonic() - t0 < 2 * fr.HANG_S  # batch cut at 0.4 s, rows (at once) cut at 0.4 s


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_an_async_rewards_rows_are_searched_at_once(isolation):
    n = 6
    texts = [f"slow-{isolation}-{i}" for i in range(n)]
    guard = _guarded(fr.async_slow_rows_reward, isolation, on_error="none")
    t0 = time.monotonic()
    try:
        out = guard(["q"] * n, texts)
    finally:
        guard.close()
    dt = time.monotonic() - t0
    assert out == [None if i == fr.BAD_ROW else len(t) / 100 for i, t in enumerate(texts)]
    assert dt < n * fr.ROW_SLEEP_S / 2, dt  # one row after another: 6 * 0.4 = 2.4 s; at once: ~0.4 s


def test_compute_rewards_awaits_an_unguarded_async_function():
    total, parts = compute_rewards(
        {"a": fr.async_length_reward, "t": fr.trl_answer_reward},
        {},
        ["q", "q"],
        ["is 12", "is 3"],
        {"answer": ["12", "4"]},
    )
    assert parts == {"a": [0.05, 0.04], "t": [1.0, 0.0]}
    assert total == [1.05, 0.04]


def test_an_async_process_reward_gets_its_steps(tmp_path):
    recipe = tiny_recipe(
        "unused-model",
        tmp_path,
        algo={"supervision": "process", "process_reward": "support.fake_rewards:async_process_length_reward"},
    )
    guard = resolve_process_reward(recipe)
    try:
        assert guard(["q"], ["ab\ncde"], steps=[["ab", "cde"]], answer=["1"]) == [[0.2, 0.3]]
    finally:
        guard.close()


# -- item 14: TRL's keyword form and signature checks -----------------------------------------


def test_call_forms_are_read_from_the_signature():
    assert call_form(fr.trl_length_reward) == "keyword"
    assert call_form(fr.trl_answer_reward) == "keyword"
    assert call_form(fr.length_reward) == "keyword"  # (prompts, completions, **_) binds the same both ways
    assert call_form(lambda p, c, **_: []) == "positional"
    assert call_form(lambda prompts, completions, /, **_: []) == "positional"
    assert call_form(len) == "positional"  # no readable signature: grpokit's form, unchecked


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_trl_keyword_form_rewards_get_prompts_completions_and_columns_as_keywords(isolation):
    guards = [_guarded(fr.trl_length_reward, isolation), _guarded(fr.trl_answer_reward, isolation)]
    try:
        assert guards[0](["q1", "q2"], ["ab", "abcd"], answer=["1", "2"]) == [0.02, 0.04]
        assert guards[1](["q1", "q2"], ["so 12", "so 5"], answer=["12", 4]) == [1.0, 0.0]
    finally:
        for g in guards:
            g.close()


@pytest.mark.parametrize(
    "spec, why",
    [
        ("support.fake_rewards:one_argument_reward", "too many positional arguments"),
        ("support.fake_rewards:HANG_S", None),  # not callable: the import's own error
    ],
)
def test_a_signature_of_neither_form_fails_when_resolved(spec, why):
    if why is None:
        with pytest.raises(ValueError, match="not callable"):
            get_reward_function(spec)
        return
    with pytest.raises(RewardSignatureError) as e:
        get_reward_function(spec)
    msg = str(e.value)
    assert msg.startswith(
        "reward 'support.fake_rewards:one_argument_reward': its signature f(texts) cannot take the call "
        "f(prompts, completions): too many positional arguments; " + EXPECTED
    ), msg
    assert "TRL's def f(completions, **kwargs)" in msg and "on_error" not in msg and "\n" not in msg


def test_check_signature_with_the_runs_columns():
    check_signature(fr.trl_answer_reward, "r", columns=["answer", "idx"])
    check_signature(fr.no_columns_reward, "r")  # columns not known yet: passes
    check_signature(fr.no_columns_reward, "r", columns=[])
    with pytest.raises(
        RewardSignatureError,
        match=r"f\(prompts, completions\) cannot take the call "
        r"f\(prompts=, completions=, answer=\): got an unexpected "
        r"keyword argument 'answer'",
    ):
        check_signature(fr.no_columns_reward, "r", columns=["answer"])
    with pytest.raises(RewardSignatureError, match=r"missing a required argument: 'answer'"):
        check_signature(fr.trl_answer_reward, "r", columns=["idx"])
    with pytest.raises(RewardSignatureError, match=r"f\(prompts=, completions=, steps=\)"):
        check_signature(lambda prompts, completions: [], "r", extra=("steps",))


def test_pipeline_checks_signatures_against_the_columns(tmp_path):
    recipe = tiny_recipe(
        "unused-model",
        tmp_path,
        rewards={
            "functions": ["support.fake_rewards:trl_answer_reward", "support.fake_rewards:no_columns_reward"],
            "isolation": "thread",
        },
    )
    pipe = RewardPipeline.from_config(recipe.rewards)
    with pytest.raises(
        RewardSignatureError,
        match=r"'support.fake_rewards:trl_answer_reward'.*missing a required "
        r"argument: 'answer'",
    ):
        pipe.check_columns([])
    with pytest.raises(
        RewardSignatureError,
        match=r"^rewards.functions: reward function "
        r"'support.fake_rewards:no_columns_reward': .*'answer'",
    ):
        pipe.check_columns(["answer"])


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_call_that_does_not_bind_raises_whatever_on_error(isolation):
    guard = _guarded(fr.no_columns_reward, isolation, on_error="none")
    try:
        with pytest.raises(RewardSignatureError) as e:
            guard(["q", "q"], ["a", "b"], answer=["1", "2"])
        assert guard.failures == 0  # not scored as unscorable rows
        assert EXPECTED in str(e.value) and "on_error" not in str(e.value)
    finally:
        guard.close()


@pytest.mark.parametrize(
    "reward, shown",
    [
        ("support.fake_rewards:one_argument_reward", "f(texts) cannot take the call f(prompts, completions)"),
        ("support.fake_rewards:no_columns_reward", "got an unexpected keyword argument 'answer'"),
    ],
)
def test_train_refuses_a_wrong_signature_before_any_model_loads(
    tiny_model_dir, tmp_path, capsys, no_model_load, reward, shown
):
    raw = tiny_recipe_dict(tiny_model_dir, tmp_path / "out", rewards={"functions": [reward]})
    assert main(["train", str(write_recipe(tmp_path / "r.yaml", raw)), "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("grpokit train: error: rewards.functions:"), err
    assert shown in err and EXPECTED in err and "on_error" not in err, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_one_step_with_an_async_reward_and_a_trl_reward_from_a_file(tiny_model_dir, tmp_path, monkeypatch):
    """Both kinds end to end (in reward workers), the TRL one named by its path in the working
    directory: every sample's reward is length / 100 (async) + 0.5 (TRL, given prompts= and answer=)."""
    import json

    import grpokit.trainer.build
    from grpokit.trainer.loop import train

    (tmp_path / "trl_style.py").write_text(
        "def half(completions, **kwargs):\n"
        "    assert len(kwargs['prompts']) == len(kwargs['answer']) == len(completions)\n"
        "    return [0.5] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path / "out",
        train={"max_steps": 1},
        rewards={"functions": ["support.fake_rewards:async_length_reward", "./trl_style.py:half"]},
    )
    summary = train(recipe, progress=False, run=grpokit.trainer.build.build_run(recipe))
    assert summary["last_metrics"]["step"] == 1 and summary["last_metrics"]["reward_failures"] == 0
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4  # 2 prompts x G = 2
    for s in samples:
        assert s["reward"] == pytest.approx(len(s["completion"]) / 100 + 0.5)
