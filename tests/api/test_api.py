"""The library API (grpokit.Trainer): Python rows, reward callables of every kind, environments and
tools as objects, callbacks, the CLI and the API giving the same metrics, evaluate()."""

from __future__ import annotations

import asyncio
import functools
import json
import math
from pathlib import Path

import pytest
import torch

import grpokit
from grpokit.api.recipe import importable_spec, rows_of
from grpokit.config import RecipeError
from grpokit.metrics import read_metrics
from grpokit.utils.given import given_object
from support.helpers import tiny_recipe_dict, write_recipe

ROWS = [{"question": f"What is {a} plus {b}?", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]
TIMING = {"step_s", "gen_s", "reward_s", "train_s", "ref_s", "tokens_per_s", "train_minutes"}


def _samples(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def _tiny(tiny_model_dir, out, **sections) -> dict:
    raw = tiny_recipe_dict(tiny_model_dir, out, **sections)
    raw["rewards"].pop("functions")
    return raw


# the reward callables of every kind, each a different function of the completion's length
def chars(prompts, completions, **_):
    return [len(c) / 100.0 for c in completions]


def _scaled(prompts, completions, *, k, **_):
    return [k * len(c) / 100.0 for c in completions]


class Judge:
    def __init__(self, k):
        self.k = k

    def score(self, completions, **kwargs):  # TRL's form, as a bound method
        return [self.k * len(c) / 100.0 for c in completions]

    def __call__(self, prompts, completions, **_):
        return [self.k * len(c) / 100.0 + 1.0 for c in completions]


async def async_chars(prompts, completions, **_):
    await asyncio.sleep(0)
    return [2.0 * len(c) / 100.0 for c in completions]


@pytest.mark.slow
def test_rows_and_every_kind_of_reward_callable(tiny_model_dir, tmp_path):
    """A list of dicts as data; a plain function, a partial, a bound method, an object with __call__,
    an async function, a lambda and a closure as rewards: each is called (its per-function mean in
    metrics.jsonl is its value recomputed over the step's logged completions) and the combined
    reward of each completion is the weighted sum."""
    offset = 0.5
    closure = lambda prompts, completions, **_: [offset + len(c) / 100.0 for c in completions]  # noqa: E731
    judge = Judge(3.0)
    funcs = [chars, functools.partial(_scaled, k=4.0), judge.score, Judge(1.0), async_chars, closure]
    weights = [1.0, 0.5, 0.25, 1.0, 2.0, 1.0]
    trainer = grpokit.Trainer(
        _tiny(tiny_model_dir, tmp_path),
        rows=ROWS,
        rewards=funcs,
        reward_weights=weights,
        overrides={"train.max_steps": 1},
        progress=False,
    )
    names = trainer.recipe.rewards.functions
    assert names[0] == "test_api:chars"  # importable: recorded as module:function
    assert names[1:] == ["obj:scaled", "obj:score", "obj:Judge", "test_api:async_chars", "obj:lambda"]
    assert trainer.recipe.data.dataset.startswith("obj:data-rows-")
    summary = trainer.train()
    samples = _samples(tmp_path)
    per = {
        names[0]: lambda n: n / 100,
        names[1]: lambda n: 4 * n / 100,
        names[2]: lambda n: 3 * n / 100,
        names[3]: lambda n: n / 100 + 1,
        names[4]: lambda n: 2 * n / 100,
        names[5]: lambda n: 0.5 + n / 100,
    }
    assert len(samples) == 4  # B=2 prompts x G=2
    assert {s["prompt"] for s in samples} <= {r["question"] for r in ROWS}
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    labels = ["chars", "scaled", "score", "Judge", "async_chars", "lambda"]  # each function's own name, as TRL
    assert {k for k in m if k.startswith("rewards/")} == {f"rewards/{x}" for x in labels}
    for (name, f), label in zip(per.items(), labels):
        want = sum(f(len(s["completion"])) for s in samples) / len(samples)
        assert m[f"rewards/{label}"] == pytest.approx(want), name
    for s in samples:
        n = len(s["completion"])
        assert s["reward"] == pytest.approx(sum(w * per[k](n) for k, w in zip(names, weights)))
    assert summary["last_metrics"]["step"] == 1


def test_datasets_dataset_and_iterables_as_rows(tiny_model_dir, tmp_path):
    """A datasets.Dataset, a generator and a DataFrame give the same rows; eval_rows fills eval.dataset."""
    datasets = pytest.importorskip("datasets")
    from grpokit.data.rows import section_rows

    ds = datasets.Dataset.from_list(ROWS)
    for rows in (ds, (dict(r) for r in ROWS)):
        recipe = grpokit.make_recipe(_tiny(tiny_model_dir, tmp_path), rows=rows, rewards=[chars], eval_rows=ROWS[:2])
        got = section_rows(recipe, "data")
        assert [(r["prompt"], r["answer"]) for r in got] == [(r["question"], r["answer"]) for r in ROWS]
        assert [r["prompt"] for r in section_rows(recipe, "eval")] == [r["question"] for r in ROWS[:2]]
    pd = pytest.importorskip("pandas")
    assert rows_of(pd.DataFrame(ROWS)) == ROWS


def test_peft_config_becomes_model_lora(tiny_model_dir, tmp_path):
    """TRL's peft_config=LoraConfig(...) is taken: its four fields map to model.lora's keys, peft's
    own defaults (r 8, alpha 8) when left, anything grpokit's LoRA lacks refused by name."""
    peft = pytest.importorskip("peft")
    raw = _tiny(tiny_model_dir, tmp_path)
    cfg = peft.LoraConfig(
        r=4, lora_alpha=12, target_modules={"v_proj", "q_proj"}, lora_dropout=0.05, task_type="CAUSAL_LM"
    )
    lora = grpokit.Trainer(raw, rows=ROWS, rewards=[chars], peft_config=cfg).recipe.model.lora
    assert lora == {"r": 4, "alpha": 12, "target_modules": ["q_proj", "v_proj"], "dropout": 0.05}
    as_strings = grpokit.Trainer(raw, rows=ROWS, rewards=[chars], overrides=["train.max_steps=3"], peft_config=cfg)
    assert as_strings.recipe.model.lora == lora and as_strings.recipe.train.max_steps == 3
    left = grpokit.Trainer(raw, rows=ROWS, rewards=[chars], peft_config=peft.LoraConfig()).recipe.model.lora
    assert left == {"r": 8, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0}
    mapped = grpokit.Trainer(raw, rows=ROWS, rewards=[chars], peft_config={"r": 2, "target_modules": "q_proj"})
    assert mapped.recipe.model.lora["r"] == 2 and mapped.recipe.model.lora["target_modules"] == ["q_proj"]
    with pytest.raises(
        ValueError, match=r"peft_config.use_dora=True: grpokit's LoRA \(model.lora\) takes r, lora_alpha"
    ):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], peft_config=peft.LoraConfig(use_dora=True))
    with pytest.raises(ValueError, match=r"peft_config.bias='all'"):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], peft_config={"r": 2, "bias": "all"})
    with pytest.raises(TypeError, match=r"peft_config: expected a peft.LoraConfig or a mapping of its fields, got int"):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], peft_config=3)


def test_bad_objects_are_refused_naming_the_argument(tiny_model_dir, tmp_path):
    raw = _tiny(tiny_model_dir, tmp_path)
    with pytest.raises(TypeError, match=r"data.dataset: row 1 is a str"):
        grpokit.Trainer(raw, rows=[ROWS[0], "2+2"], rewards=[chars])
    with pytest.raises(TypeError, match=r"a mapping \(train\).*pick a split"):
        grpokit.Trainer(raw, rows={"train": ROWS}, rewards=[chars])
    with pytest.raises(TypeError, match=r"rewards.functions\[1\]: expected a name or a callable, got int"):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars, 3])
    with pytest.raises(TypeError, match=r"callback 5: neither callable nor an object with any of on_train_begin"):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], callbacks=[5])
    with pytest.raises(RecipeError, match="unknown recipe key train.max_step"):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], overrides={"train.max_step": 2})
    with pytest.raises(RecipeError, match=r"num_generations is TRL's name; grpokit: rollout.group_size=4"):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], overrides={"num_generations": 4})
    with pytest.raises(RecipeError, match=r"use train.max_steps=2"):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], overrides={"max_steps": 2})
    with pytest.raises(
        RecipeError, match=r"rewards.functions\[1\]: unknown reward 'math_corect'; did you mean 'math_c"
    ):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars, "math_corect"])  # when built, not when trained
    transformers = pytest.importorskip("transformers")
    with pytest.raises(
        TypeError, match=r"callback TrainerCallback: a transformers.TrainerCallback; .*grpokit.Callback"
    ):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], callbacks=[transformers.TrainerCallback()])
    from grpokit.data.rows import section_rows

    no_answer = grpokit.make_recipe(raw, rows=[{"question": "1+1?", "id": 3}], rewards=[chars])
    with pytest.raises(
        ValueError,
        match=r"^rows=: row 0 has no answer column .* fields present: \['id', 'question'\]; "
        r"give the rows an 'answer' column \(''",
    ):
        section_rows(no_answer, "data")
    with pytest.raises(
        TypeError,
        match=r"reward_funcs= is TRL's; grpokit: rewards=\[...\]; train_dataset= is TRL's; "
        r"grpokit: rows=; unexpected keyword argument\(s\) 'foo'",
    ):
        grpokit.Trainer(raw, reward_funcs=[chars], train_dataset=ROWS, foo=1)
    with pytest.raises(TypeError, match=r"model=: a path or a hub name, got a dict"):
        grpokit.Trainer(raw, model={"x": 1}, rows=ROWS, rewards=[chars])
    assert grpokit.make_recipe(raw, model=tmp_path / "m", rows=ROWS, rewards=[chars]).model.name_or_path == str(
        tmp_path / "m"
    )
    nested = grpokit.make_recipe(raw, rows=ROWS, rewards=[chars], overrides={"train": {"max_steps": 7}})
    assert nested.train.max_steps == 7
    # a name of the table that this process was not given (an API run's folder resumed elsewhere)
    with pytest.raises(ValueError, match=r"reward 'obj:nowhere': a Python object given to grpokit's API"):
        given_object("obj:nowhere", what="reward")


def test_demo_recipe_with_own_rows_and_rewards_starts_those_sections_fresh():
    recipe = grpokit.make_recipe(rows=ROWS, rewards=[chars])
    assert recipe.data.skip == 0 and recipe.data.dataset.startswith("obj:")  # the demo's skip=100 not kept
    assert recipe.rewards.functions == ["test_api:chars"] and recipe.rewards.weights is None
    assert recipe.model.name_or_path == grpokit.make_recipe().model.name_or_path  # the demo's model


def test_rows_and_rewards_replace_what_belongs_to_the_recipes_own():
    """A named recipe's split, skip, limit and weights belong to its dataset and functions: dropped with them."""
    recipe = grpokit.make_recipe("long", rows=ROWS, rewards=[chars], eval_rows=ROWS[:2])
    long = grpokit.make_recipe("long")
    assert (long.data.skip, long.eval.limit) != (0, None)  # what is dropped was set
    assert (recipe.data.skip, recipe.data.limit, recipe.data.split) == (0, None, "singleop")
    assert recipe.data.prompt_template == long.data.prompt_template  # the recipe's own choice stays
    assert recipe.eval.limit is None and recipe.rewards.weights is None
    over = grpokit.make_recipe("demo", rows=ROWS, rewards=[chars, "format"], overrides={"rewards.weights": [1, 2]})
    assert over.rewards.weights == [1.0, 2.0]  # overrides come last


def test_environment_and_tools_as_objects(tiny_model_dir, tmp_path):
    """An environment class, an instance and tool functions reach the recipe and are built from it."""
    from grpokit.rollout.multiturn import env_options
    from support.fake_envs import StopAtE

    raw = _tiny(tiny_model_dir, tmp_path)
    recipe = grpokit.make_recipe(raw, rows=ROWS, rewards=[chars], env=StopAtE, overrides={"rollout.max_turns": 2})
    assert recipe.rollout.env == "support.fake_envs:StopAtE"
    mine = StopAtE(text=" <r>mine</r> ")
    recipe = grpokit.make_recipe(raw, rows=ROWS, rewards=[chars], env=mine, overrides={"rollout.max_turns": 2})
    assert recipe.rollout.env == "obj:StopAtE" and env_options(recipe.rollout)["env"] is mine

    def shout(text: str) -> str:
        return text.upper()

    recipe = grpokit.make_recipe(raw, rows=ROWS, rewards=[chars], tools=[shout, "calculator"])
    assert recipe.rollout.env == "tools"
    assert recipe.rollout.env_options["tools"] == ["obj:shout", "calculator"]
    env = env_options(recipe.rollout)["env"]
    episode = env.start(ROWS[0])
    assert "SHOUT ME" in episode.step("<shout>shout me</shout>", ended_by_eos=False).text


@pytest.mark.slow
def test_env_instance_trains(tiny_model_dir, tmp_path):
    """A multi-turn run with an environment instance: its observation is in the transcripts."""
    from support.fake_envs import StopAtE

    trainer = grpokit.Trainer(
        _tiny(tiny_model_dir, tmp_path),
        rows=ROWS,
        rewards=[chars],
        env=StopAtE(text=" <r>mine</r> "),
        overrides={"train.max_steps": 1, "rollout.max_turns": 2, "rollout.max_new_tokens": 8},
        progress=False,
    )
    trainer.train()
    assert any("<r>mine</r>" in s["completion"] for s in _samples(tmp_path))


class Recorder(grpokit.Callback):
    def __init__(self, stop_at=None, raise_at=None):
        self.calls: list[tuple] = []
        self.stop_at, self.raise_at = stop_at, raise_at

    def on_train_begin(self, step, recipe):
        self.calls.append(("begin", step))

    def on_step_end(self, step, metrics):
        self.calls.append(("step", step, metrics))
        if step == self.raise_at:
            raise ValueError("boom")
        return step == self.stop_at

    def on_save(self, step, path):
        self.calls.append(("save", step, path))

    def on_train_end(self, summary):
        self.calls.append(("end", summary.get("early_stopped_at")))


@pytest.mark.slow
def test_callbacks_see_each_step_and_stop_early(tiny_model_dir, tmp_path):
    rec, seen = Recorder(stop_at=2), []
    trainer = grpokit.Trainer(
        _tiny(tiny_model_dir, tmp_path),
        rows=ROWS,
        rewards=[chars],
        callbacks=[rec, lambda step, metrics: seen.append(step)],
        overrides={"train.max_steps": 4, "train.save_steps": 1},
        progress=False,
    )
    summary = trainer.train()
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    assert summary["early_stopped_at"] == 2 and summary["stopped_by"] == "Recorder.on_step_end"
    assert "stopped_at" not in summary  # not a signal: `grpokit train` exits 0
    steps = [c for c in rec.calls if c[0] == "step"]
    assert [c[2] for c in steps] == lines  # the metrics line of each step, as written
    assert rec.calls[0] == ("begin", 0) and rec.calls[-1] == ("end", 2)
    saves = [c for c in rec.calls if c[0] == "save"]
    assert [(c[1], Path(c[2]).name) for c in saves] == [(1, "checkpoint-1"), (2, "checkpoint-2")]
    assert all(Path(c[2], "trainer_state.json").exists() for c in saves)
    assert seen == [1, 2]  # a plain function is an on_step_end


@pytest.mark.slow
def test_a_raising_callback_stops_with_a_checkpoint_and_the_run_resumes(tiny_model_dir, tmp_path):
    raw = _tiny(tiny_model_dir, tmp_path)
    over = {"train.max_steps": 3, "train.save_steps": 0}
    boom = r"callback Recorder.on_step_end raised at step 2: ValueError: boom"
    with pytest.raises(grpokit.CallbackError, match=boom):
        grpokit.Trainer(raw, rows=ROWS, rewards=[chars], callbacks=[Recorder(raise_at=2)], overrides=over).train()
    assert (tmp_path / "checkpoint-2" / "trainer_state.json").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["callback_error"].startswith("callback Recorder")
    summary = grpokit.Trainer(raw, rows=ROWS, rewards=[chars], overrides=over, progress=False).train()
    assert summary["resumed_from"].endswith("checkpoint-2") and summary["last_metrics"]["step"] == 3


@pytest.mark.e2e
def test_cli_and_api_give_the_same_metrics(tiny_model_dir, tmp_path):
    from grpokit.cli.main import main

    raw = tiny_recipe_dict(tiny_model_dir, tmp_path / "cli")
    path = write_recipe(tmp_path / "r.yaml", raw)
    assert main(["train", str(path), "--no-progress"]) == 0
    grpokit.Trainer(str(path), overrides={"train.output_dir": str(tmp_path / "api")}, progress=False).train()
    cli, api = (read_metrics(tmp_path / d / "metrics.jsonl") for d in ("cli", "api"))
    assert len(cli) == len(api) == 2
    for a, b in zip(cli, api):
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}


@pytest.mark.slow
def test_evaluate_gives_what_grpokit_eval_prints(tiny_model_dir, tmp_path, capsys):
    """Trainer.evaluate() on the recipe's held-out rows: the same numbers as `grpokit eval --heldout-of`."""
    from grpokit.cli.main import main

    raw = tiny_recipe_dict(tiny_model_dir, tmp_path / "run")
    raw["eval"] = {"dataset": "mawps", "split": "singleop", "limit": 6, "max_new_tokens": 4}
    raw["data"]["skip"] = 6
    path = write_recipe(tmp_path / "r.yaml", raw)
    res = grpokit.Trainer(str(path), progress=False).evaluate()
    assert res["model"] == tiny_model_dir and res["total"] == 5  # one of the 6 is also a training question
    assert (tmp_path / "run" / "eval_api.json").exists()
    out = tmp_path / "cli.json"
    assert main(["eval", tiny_model_dir, "--heldout-of", str(path), "--output", str(out)]) == 0
    cli = json.loads(out.read_text())["models"][tiny_model_dir]
    assert (cli["correct"], cli["total"]) == (res["correct"], res["total"])
    assert cli["metrics"] == res["metrics"]


def test_importable_spec_only_for_objects_that_import_back():
    assert importable_spec(chars) == "test_api:chars"
    assert importable_spec(Judge(1.0)) is None and importable_spec(Judge) == "test_api:Judge"
    assert importable_spec(functools.partial(chars)) is None


def numpy_chars(completions, **_):  # a numpy array of values, as TRL takes it
    import numpy as np

    return np.array([len(c) / 100.0 for c in completions])


@pytest.mark.slow
def test_a_finished_run_says_so_and_starts_over_when_asked(tiny_model_dir, tmp_path, capsys):
    """Training a folder that holds a finished run trains nothing: a RunWarning (one plain line)
    says so and the summary is that run's (its last metrics, its checkpoint);
    ``train(resume_from_checkpoint=False)`` starts over in the folder."""
    raw = _tiny(tiny_model_dir, tmp_path)
    first = grpokit.Trainer(raw, rows=ROWS, rewards=[numpy_chars], overrides={"train.max_steps": 1}, progress=False)
    done = first.train()
    assert done["checkpoint"] == str(tmp_path / "checkpoint-1") and done["last_metrics"]["step"] == 1
    assert done["last_metrics"]["rewards/numpy_chars"] > 0  # the array's values, through the worker process
    capsys.readouterr()
    again = grpokit.Trainer(raw, rows=ROWS, rewards=[numpy_chars], overrides={"train.max_steps": 1}, progress=False)
    with pytest.warns(grpokit.RunWarning, match=r"already holds a run at step 1 .* nothing was trained"):
        summary = again.train()
    assert summary["nothing_to_do"] and summary["last_metrics"] == done["last_metrics"]
    assert summary["checkpoint"] == done["checkpoint"] and summary["recipe_changes"] == []
    assert summary.global_step == 1 and math.isnan(summary.training_loss)  # no step in this call
    with pytest.raises(AttributeError, match=r"loaded no model: its trained model is .*checkpoint-1"):
        _ = again.model
    changed = grpokit.Trainer(
        raw,
        rows=ROWS,
        rewards=[numpy_chars],
        overrides={"train.max_steps": 1, "rollout.max_new_tokens": 5},
        progress=False,
    )
    with pytest.warns(grpokit.RunWarning, match=r"differ from that run's were not used: rollout.max_new_tokens=5 \("):
        assert changed.train()["recipe_changes"] == [["rollout.max_new_tokens", 8, 5]]
    over = again.train(resume_from_checkpoint=False)
    assert "resumed_from" not in over and not over.get("nothing_to_do")
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1]  # the earlier run's line replaced, not appended
    assert over["last_metrics"] == lines[0]
    empty = grpokit.Trainer(raw, rows=ROWS, rewards=[numpy_chars], overrides={"train.output_dir": str(tmp_path / "e")})
    with pytest.raises(ValueError, match=r"resume_from_checkpoint=True: .*/e holds no checkpoint to resume from"):
        empty.train(resume_from_checkpoint=True)  # TRL raises too


def test_run_warnings_are_one_plain_line():
    """Inside Trainer.train (and grpokit train) a RunWarning prints as ``[grpokit] warning: ...``, not
    Python's file, line and source line; other warnings keep Python's form."""
    import subprocess
    import sys

    code = (
        "import warnings, grpokit\n"
        "from grpokit.metrics import plain_warnings\n"
        "with plain_warnings():\n"
        "    warnings.warn('little was trained', grpokit.RunWarning)\n"
        "    warnings.warn('other', UserWarning)\n"
        "warnings.warn('after', grpokit.RunWarning)\n"
    )
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    lines = err.splitlines()
    assert lines[0] == "[grpokit] warning: little was trained"
    assert "UserWarning: other" in lines[1] and "RunWarning: after" in err  # outside: Python's form again


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and (sa[k] == sb[k]).all() for k in sa)


@pytest.mark.slow
def test_train_gives_trl_fields_and_save_model_writes_a_model_transformers_loads(tiny_model_dir, tmp_path):
    """TRL's habits: train()'s result has TrainOutput's global_step, training_loss (the mean of the
    steps' losses) and metrics (the last step's, with train_runtime), and still every summary key;
    trainer.model is the trained policy (an error saying what to call before training) and
    save_model(path) writes a folder plain transformers loads, with the same weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    trainer = grpokit.Trainer(
        _tiny(tiny_model_dir, run), rows=ROWS, rewards=[chars], overrides={"train.max_steps": 2}, progress=False
    )
    with pytest.raises(AttributeError, match=r"Trainer.model: .*call trainer.train\(\) first"):
        _ = trainer.model
    out = trainer.train()
    lines = read_metrics(run / "metrics.jsonl")
    assert out.global_step == 2 and [m["step"] for m in lines] == [1, 2]
    assert out.training_loss == pytest.approx((lines[0]["loss"] + lines[1]["loss"]) / 2)
    assert {k: out.metrics[k] for k in lines[1]} == lines[1]  # the last step's metrics
    assert out.metrics["train_runtime"] > 0 and out.metrics["train_loss"] == out.training_loss
    assert out["last_metrics"] == lines[1] and out["checkpoint"] == str(run / "checkpoint-2")  # the summary
    assert "last_metrics" in out and dict(out) == trainer.summary
    assert trainer.processing_class is trainer.tokenizer
    trainer.save_model(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert _same_weights(loaded, trainer.model)
    assert not _same_weights(loaded, AutoModelForCausalLM.from_pretrained(tiny_model_dir))  # the trained weights
    assert AutoTokenizer.from_pretrained(tmp_path / "saved").vocab == trainer.tokenizer.vocab
    trainer.save_model(tmp_path / "saved")  # a model folder is replaced as a whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "saved"]  # no temporary folder left
    with pytest.raises(FileExistsError, match=r"not empty"):
        trainer.save_model(run)  # the run folder is not a model folder: never replaced


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")  # peft's own question
def test_save_model_of_a_lora_run_writes_the_adapter_peft_loads(tiny_model_dir, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    trainer = grpokit.Trainer(
        _tiny(tiny_model_dir, tmp_path / "run"),
        rows=ROWS,
        rewards=[chars],
        peft_config=peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
        overrides={"train.max_steps": 1},
        progress=False,
    )
    trainer.train()
    trainer.save_model(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()  # the adapter alone
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "adapter")
    ours = {k: v for k, v in trainer.model.state_dict().items() if "lora_" in k}
    theirs = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert ours and ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert any(v.abs().sum() > 0 for k, v in ours.items() if "lora_B" in k)  # trained: B starts at 0
