"""The typed results that cross the seams: :class:`grpokit.trainer.summary.RunSummary` (what
``train()`` returns, ``summary.json``), :class:`grpokit.trainer.state.TrainState`'s declared
``train_s``/``recipe_changes`` (``trainer_state.json``) and :class:`grpokit.eval.evaluate.EvalResult`
(``eval_<when>.json``).

The files a tiny run writes are pinned to the keys, in the order, that the code wrote before these
results were typed (recorded from that code on 2026-12-07: the literals below), and to its JSON
layout (``indent=1``); the dicts the results were are still readable as mappings."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import pytest

from grpokit.eval.evaluate import EvalResult, save_eval
from grpokit.metrics.step import StepMetrics
from grpokit.trainer.callbacks import Callbacks
from grpokit.trainer.state import TrainState
from grpokit.trainer.summary import RunSummary, StopReason
from support.helpers import tiny_recipe

#: metrics.jsonl's keys of the tiny run below (length reward, β = 0.04, an evaluation every step,
#: 2 samples per problem), in order
METRICS_KEYS = [
    "step",
    "rewards/length_reward",
    "unscorable_frac",
    "frac_zero_std",
    "reward_mean",
    "reward_std",
    "reward_failures",
    "loss",
    "clip_frac_high",
    "clip_frac_low",
    "kl",
    "ratio_mean",
    "entropy",
    "grad_norm",
    "lr",
    "skipped_updates",
    "zero_grad_updates",
    "ref_s",
    "policy_updated",
    "completion_len_mean",
    "truncated_frac",
    "step_s",
    "gen_s",
    "reward_s",
    "train_s",
    "tokens_per_s",
    "threads",
    "train_minutes",
]
EVAL_METRICS_KEYS = [
    f"eval/{m}{end}" for m in ("greedy", "mean@2", "pass@1", "pass@2", "maj@2") for end in ("", "_lo", "_hi")
]
#: a held-out evaluation's JSON with 2 samples: its keys, in order, and those of its parts
EVAL_KEYS = [
    "accuracy",
    "correct",
    "total",
    "unscorable",
    "truncated_frac",
    "seconds",
    "examples",
    "outcomes",
    "metrics",
    "settings",
    "sampled_correct",
    "maj_outcomes",
    "dataset",
    "split",
    "when",
    "scorer",
    "held_out",
]
EXAMPLE_KEYS = ["question", "prompt", "answer", "completion", "correct", "truncated"]
SUMMARY_OF_METRICS_KEYS = ["n_problems", "k", "confidence", "metrics"]
INTERVAL_NAMES = ["greedy", "mean@2", "pass@1", "pass@2", "maj@2"]
INTERVAL_KEYS = ["value", "lo", "hi", "interval"]
SETTINGS_KEYS = [
    "max_new_tokens",
    "greedy",
    "num_samples",
    "temperature",
    "seed",
    "scorer",
    "scorer_timeout_s",
    "prompt_template",
    "system_prompt",
    "chat_template",
    "max_prompt_tokens",
    "prompts_too_long",
    "batch_size",
]
LEAD = ["output_dir", "rank", "world_size", "parallel"]


def _eval_structure(e: dict) -> None:
    assert list(e) == EVAL_KEYS
    assert all(list(x) == EXAMPLE_KEYS for x in e["examples"]) and e["examples"]
    assert list(e["metrics"]) == SUMMARY_OF_METRICS_KEYS
    assert list(e["metrics"]["metrics"]) == INTERVAL_NAMES
    assert all(list(m) == INTERVAL_KEYS for m in e["metrics"]["metrics"].values())
    assert list(e["settings"]) == SETTINGS_KEYS


def _read_json(path, **dump) -> dict:
    """The JSON object in ``path``, checked to be laid out as ``json.dumps(..., indent=1)`` writes it."""
    text = path.read_text()
    value = json.loads(text)
    assert text == json.dumps(value, indent=1, **dump)
    return value


@pytest.mark.slow
def test_a_tiny_runs_files_keep_their_keys_and_order(tiny_model_dir, tmp_path):
    from grpokit.trainer.loop import train

    ev = {"dataset": "mawps", "split": "singleop", "limit": 2, "max_new_tokens": 2, "every_steps": 1, "num_samples": 2}
    recipe = tiny_recipe(tiny_model_dir, tmp_path, eval=ev, data={"skip": 2})
    seen: list = []
    summary = train(recipe, progress=False, callbacks=Callbacks([lambda step, m: seen.append(m)]))
    assert summary.stop_reason is StopReason.COMPLETED

    keys = [*LEAD, "eval_before", "last_metrics", "eval_after", "checkpoint"]
    written = _read_json(tmp_path / "summary.json", default=str)
    assert list(written) == keys and list(summary) == keys
    assert written == json.loads(json.dumps(summary.to_dict(), default=str))
    assert list(written["last_metrics"]) == METRICS_KEYS + EVAL_METRICS_KEYS
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [list(m) for m in lines] == [METRICS_KEYS + EVAL_METRICS_KEYS] * 2
    # what the callbacks got: each line, typed (StepMetrics), its views reading the line's values
    assert [type(m) for m in seen] == [StepMetrics] * 2 and seen == json.loads(json.dumps(lines))
    for m, line in zip(seen, lines, strict=True):
        assert (m.step, m.loss, m.kl, m.grad_norm, m.reward_mean) == (
            line["step"],
            line["loss"],
            line["kl"],
            line["grad_norm"],
            line["reward_mean"],
        )
        assert m.rewards == {k.split("/", 1)[1]: v for k, v in line.items() if k.startswith("rewards/")} != {}
        assert m.evaluation == {k.split("/", 1)[1]: v for k, v in line.items() if k.startswith("eval/")} != {}
    for when in ("before", "step1", "step2", "after"):
        e = _read_json(tmp_path / f"eval_{when}.json")
        _eval_structure(e)
        assert e["when"] == when
    assert written["eval_before"] == json.loads((tmp_path / "eval_before.json").read_text())
    assert written["eval_after"] == json.loads((tmp_path / "eval_after.json").read_text())
    # the summary's parts, typed, read as the dicts they were
    assert isinstance(summary.eval_after, EvalResult) and summary.eval_after["when"] == "after"
    assert summary["eval_after"].metric_intervals == written["eval_after"]["metrics"]["metrics"]
    assert summary.last_metrics == summary["last_metrics"] and summary.checkpoint == str(tmp_path / "checkpoint-2")
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert list(state) == ["step", "epoch", "position", "consecutive_skips", "extra", "world_size"]
    assert list(state["extra"]) == ["train_s"]

    again = train(recipe, progress=False)  # already at train.max_steps
    assert again.stop_reason is StopReason.NOTHING_TO_DO
    assert list(again) == [*keys, "nothing_to_do", "step", "resumed_from", "recipe_changes"]
    assert again.eval_after == written["eval_after"] and again.step == 2 and again.recipe_changes == []


@pytest.mark.slow
def test_the_summaries_of_stopped_runs_keep_their_keys(tiny_model_dir, tmp_path):
    from grpokit.trainer.callbacks import CallbackError
    from grpokit.trainer.loop import train

    def kill(step, metrics):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    out = tmp_path / "signal"
    s = train(tiny_recipe(tiny_model_dir, out), progress=False, callbacks=Callbacks([kill]))
    assert s.stop_reason is StopReason.SIGNAL and (s.stopped_at, s.stop_signal) == (1, signal.SIGTERM)
    keys = [*LEAD, "stopped_at", "stop_signal", "last_metrics", "checkpoint"]
    assert list(s) == keys and list(_read_json(out / "summary.json", default=str)) == keys

    s = train(tiny_recipe(tiny_model_dir, out, train={"learning_rate": 2e-2}), progress=False)
    assert s.stop_reason is StopReason.COMPLETED and s.resumed_from == str(out / "checkpoint-1")
    assert list(s) == [*LEAD, "resumed_from", "last_metrics", "checkpoint"]
    extra = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["extra"]
    assert list(extra) == ["train_s", "recipe_changes"]
    assert extra["recipe_changes"] == [{"step": 1, "key": "train.learning_rate", "old": 0.01, "new": 0.02}]

    out = tmp_path / "early"
    s = train(tiny_recipe(tiny_model_dir, out), progress=False, callbacks=Callbacks([lambda step, m: step == 1]))
    assert s.stop_reason is StopReason.EARLY_STOP and s.early_stopped_at == 1
    assert s.stopped_by is not None and s.stopped_by.endswith(".<lambda>.on_step_end")
    keys = [*LEAD, "early_stopped_at", "stopped_by", "last_metrics", "checkpoint"]
    assert list(s) == keys and list(_read_json(out / "summary.json", default=str)) == keys

    ended = []

    class Bad:
        def on_step_end(self, step, metrics):
            raise KeyError("x")

        def on_train_end(self, summary):
            ended.append(summary)

    out = tmp_path / "raise"
    with pytest.raises(CallbackError):
        train(tiny_recipe(tiny_model_dir, out), progress=False, callbacks=Callbacks([Bad()]))
    keys = [*LEAD, "last_metrics", "callback_error", "checkpoint"]
    assert list(_read_json(out / "summary.json", default=str)) == keys
    assert [list(s) for s in ended] == [keys] and ended[0].stop_reason is StopReason.ERROR


def test_stop_reason_of_each_end():
    assert RunSummary("out", 0).stop_reason is StopReason.COMPLETED
    assert RunSummary("out", 0, stopped_at=0, stop_signal=15).stop_reason is StopReason.SIGNAL
    assert RunSummary("out", 0, early_stopped_at=2, stopped_by="cb.on_step_end").stop_reason is StopReason.EARLY_STOP
    assert RunSummary("out", 0, callback_error="callback cb raised").stop_reason is StopReason.ERROR
    # an error beside a signal: the error (train() raises)
    assert RunSummary("out", 0, stopped_at=1, callback_error="x").stop_reason is StopReason.ERROR
    # nothing to do repeats the earlier run's summary, whatever ended it
    done = RunSummary.from_dict({"output_dir": "out", "rank": 0, "stopped_at": 3, "callback_error": "x"})
    done.nothing_to_do = True
    assert done.stop_reason is StopReason.NOTHING_TO_DO


def test_a_summary_reads_as_the_dict_it_was():
    s = RunSummary("out", 1, world_size=2)
    s.parallel = "ddp"
    s.stopped_at, s.stop_signal = 3, 2
    s.last_metrics = {"step": 3}
    s.eval_after = None  # present, None (a rank that did not evaluate)
    s.world_size = 4  # keeps its place
    expected = {
        "output_dir": "out",
        "rank": 1,
        "world_size": 4,
        "parallel": "ddp",
        "stopped_at": 3,
        "stop_signal": 2,
        "last_metrics": {"step": 3},
        "eval_after": None,
    }
    assert list(s.to_dict().items()) == list(expected.items())
    assert dict(s) == expected and s == expected and len(s) == 8
    assert "eval_after" in s and "eval_before" not in s and "checkpoint" not in s
    assert s["stopped_at"] == 3 and s.get("resumed_from") is None and s.get("checkpoint", "-") == "-"
    with pytest.raises(KeyError):
        s["checkpoint"]
    with pytest.raises(KeyError):
        s["other"]  # a field of the object, not a key


def test_a_summary_from_a_file_keeps_its_keys_in_their_order():
    old = {"rank": 0, "output_dir": "o", "from_a_later_version": [1], "last_metrics": {}, "checkpoint": "c"}
    s = RunSummary.from_dict(old)
    assert s.to_dict() == old and list(s.to_dict()) == list(old) and s.other == {"from_a_later_version": [1]}
    s.output_dir, s.nothing_to_do, s.checkpoint, s.recipe_changes = "p", True, "d", []
    assert list(s) == ["rank", "output_dir", "from_a_later_version", "last_metrics", "checkpoint"] + [
        "nothing_to_do",
        "recipe_changes",
    ]
    assert s["output_dir"] == "p" and s["checkpoint"] == "d"


def _eval_result(**kw) -> EvalResult:
    base = dict(
        accuracy=0.5,
        correct=1,
        total=2,
        unscorable=0,
        truncated_frac=1.0,
        seconds=0.25,
        examples=[],
        outcomes=[True, False],
        metrics={"n_problems": 2, "k": 0, "confidence": 0.95, "metrics": {"greedy": {"value": 0.5}}},
        settings={"max_new_tokens": 2},
    )
    return EvalResult(**{**base, **kw})


def test_eval_result_keys_in_order(tmp_path):
    greedy = _eval_result()
    assert list(greedy) == EVAL_KEYS[:10] and greedy.to_dict() == dict(greedy)
    assert greedy["accuracy"] == 0.5 and "maj_outcomes" not in greedy and greedy.get("when") is None
    assert greedy.metric_intervals == {"greedy": {"value": 0.5}} and _eval_result(metrics=None).metric_intervals == {}
    with pytest.raises(KeyError):
        greedy["model"]
    sampled = _eval_result(sampled_correct=[1, 0], maj_outcomes=[True, False])
    assert list(sampled) == EVAL_KEYS[:12]
    held = dataclasses.replace(sampled, dataset="mawps", split=None, when="step2", scorer="math_correct", held_out="2")
    assert list(held) == EVAL_KEYS and held["split"] is None
    after = dataclasses.replace(held, when="after")
    assert list(after) == EVAL_KEYS and after.settings is held.settings  # as dict(res, when="after")
    after.model = "m"
    assert list(after) == [*EVAL_KEYS, "model"]
    assert save_eval(tmp_path, held, "step2") is held
    text = (tmp_path / "eval_step2.json").read_text()
    assert text == json.dumps(dict(held), indent=1)


def test_train_state_reads_an_old_checkpoints_extra():
    """trainer_state.json as the code before the declared fields wrote it: train_s and
    recipe_changes in ``extra``, beside a value grpokit does not know."""
    old = {
        "step": 2,
        "epoch": 1,
        "position": 4,
        "consecutive_skips": 1,
        "extra": {
            "train_s": 1.5,
            "recipe_changes": [{"step": 1, "key": "train.learning_rate", "old": 0.01, "new": 0.02}],
            "theirs": 7,
        },
        "world_size": 1,
    }
    st = TrainState.from_checkpoint(old)
    assert (st.step, st.epoch, st.position, st.consecutive_skips, st.train_s) == (2, 1, 4, 1, 1.5)
    assert st.recipe_changes == old["extra"]["recipe_changes"] and st.extra == {"theirs": 7}
    assert {"step": 2, **st.to_checkpoint(), "world_size": 1} == old  # written back as it was read
    oldest = TrainState.from_checkpoint({"step": 3, "epoch": 0, "position": 6})  # no extra, no skips
    assert (oldest.train_s, oldest.recipe_changes, oldest.extra, oldest.consecutive_skips) == (0.0, [], {}, 0)
    assert oldest.to_checkpoint() == {"epoch": 0, "position": 6, "consecutive_skips": 0, "extra": {"train_s": 0.0}}


@pytest.mark.slow
def test_a_run_resumes_from_an_old_checkpoint(tiny_model_dir, tmp_path):
    """A checkpoint whose trainer_state.json the old code wrote resumes: its seconds count on, its
    recipe changes are kept and the new ones appended."""
    from grpokit.trainer.loop import train

    train(tiny_recipe(tiny_model_dir, tmp_path, train={"max_steps": 1}), progress=False)
    path = tmp_path / "checkpoint-1" / "trainer_state.json"
    changes = [{"step": 0, "key": "train.learning_rate", "old": 0.02, "new": 0.01}]
    old = {"step": 1, "epoch": 0, "position": 2, "consecutive_skips": 0, "extra": {"train_s": 100.0}}
    path.write_text(json.dumps({**old, "extra": {**old["extra"], "recipe_changes": changes}, "world_size": 1}))
    s = train(tiny_recipe(tiny_model_dir, tmp_path, train={"max_steps": 2, "learning_rate": 3e-2}), progress=False)
    assert s.resumed_from == str(tmp_path / "checkpoint-1") and s.stop_reason is StopReason.COMPLETED
    assert s.last_metrics is not None and s.last_metrics["train_minutes"] > 100.0 / 60
    extra = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())["extra"]
    assert extra["train_s"] > 100.0
    assert extra["recipe_changes"] == [
        *changes,
        {"step": 1, "key": "train.max_steps", "old": 1, "new": 2},
        {"step": 1, "key": "train.learning_rate", "old": 0.01, "new": 0.03},
    ]
