"""Training with a multi-turn environment (``rollout.env``): the loop runs, logs the episodes'
counts, writes the turns to samples.jsonl, resumes exactly, and refuses what it does not run with yet."""

from __future__ import annotations

import json
import math

import pytest
import torch

import grpokit.trainer.build
import grpokit.trainer.loop
from grpokit.config import RecipeError
from grpokit.envs.base import Observation
from grpokit.metrics import env_metrics, read_metrics, transcript_turns
from grpokit.trainer.loop import train
from support.fake_envs import OBS
from support.helpers import tiny_recipe

ENV = {"env": "support.fake_envs:StopAtE", "max_turns": 3, "max_new_tokens": 6}


@pytest.mark.slow
def test_a_run_with_an_environment_logs_turns_and_writes_them(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    train(tiny_recipe(tiny_model_dir, out, rollout=ENV), progress=False)
    lines = read_metrics(out / "metrics.jsonl")
    assert len(lines) == 2
    for m in lines:
        assert 1 < m["env/turns"] <= 3 and m["env/tool_calls"] == pytest.approx(m["env/turns"] - 1, abs=1)
        assert m["env/env_tokens"] > 0 and 0 <= m["env/budget_cut"] <= 1
        assert torch.isfinite(torch.tensor(m["loss"]))
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    turns = [s["turns"] for s in samples]
    assert all(t[0]["by"] == "model" for t in turns)
    env_turns = [x["text"] for t in turns for x in t if x["by"] == "env"]
    assert env_turns and all(x == OBS.strip() or OBS.strip() in x for x in env_turns)


@pytest.mark.slow
def test_a_run_with_an_environment_resumes_exactly(tiny_model_dir, tmp_path):
    full, split = tmp_path / "full", tmp_path / "split"
    train(tiny_recipe(tiny_model_dir, full, rollout=ENV, train={"max_steps": 2}), progress=False)
    train(tiny_recipe(tiny_model_dir, split, rollout=ENV, train={"max_steps": 1, "save_steps": 1}), progress=False)
    train(tiny_recipe(tiny_model_dir, split, rollout=ENV, train={"max_steps": 2}), progress=False)
    keys = ("loss", "kl", "reward_mean", "env/turns", "env/env_tokens")
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(split / "metrics.jsonl")
    assert [[m[k] for k in keys] for m in a] == [[m[k] for k in keys] for m in b]


def test_env_metrics_and_turns_of_a_hand_built_row(smollm2_tokenizer):
    from grpokit.experience import Experience

    tok = smollm2_tokenizer
    model_a, env_ids, model_b = tok("Hi there").input_ids, tok(" <r>7</r>").input_ids, tok(" done").input_ids + [2]
    ids = model_a + env_ids + model_b
    mask = [True] * len(model_a) + [False] * len(env_ids) + [True] * len(model_b)
    exp = Experience.grouped(
        torch.tensor([[5], [5]]),
        torch.ones(2, 1, dtype=torch.bool),
        torch.tensor([ids, ids]),
        torch.tensor([mask, [True] * len(model_a) + [False] * (len(ids) - len(model_a))]),
        2,
        attention_mask=torch.tensor([[True] * len(ids), [True] * len(model_a) + [False] * (len(ids) - len(model_a))]),
        env_counts={"turns": torch.tensor([2, 1]), "budget_cut": torch.tensor([0, 1])},
    )
    assert env_metrics(exp) == {"env/budget_cut": 0.5, "env/turns": 1.5}
    assert [t["by"] for t in transcript_turns(exp, 0, tok)] == ["model", "env", "model"]
    assert transcript_turns(exp, 0, tok)[1]["text"] == " <r>7</r>"
    assert transcript_turns(exp, 1, tok) == [{"by": "model", "text": "Hi there"}]


@pytest.mark.parametrize(
    "rollout, algo, msg",
    [
        ({"env": None}, {"step_rule": "turns"}, "algo.step_rule=turns: steps are the model turns"),
        ({"max_turns": 0}, {}, "rollout.max_turns: must be >= 1"),
        ({"max_total_tokens": 0}, {}, "rollout.max_total_tokens: must be > 0"),
        ({"env": " "}, {}, "rollout.env: empty"),
        (
            {"env": None, "env_options": {"tools": ["calculator"]}},
            {},
            "rollout.env_options: set, but rollout.env is not",
        ),
    ],
)
def test_the_recipe_refuses_what_multi_turn_does_not_run_with(tiny_model_dir, tmp_path, rollout, algo, msg):
    with pytest.raises(RecipeError, match=msg):
        tiny_recipe(tiny_model_dir, tmp_path, rollout={**ENV, **rollout}, algo=algo)


@pytest.mark.slow
def test_the_run_builds_the_environments_engine_for_training_and_evaluation(tiny_model_dir, tmp_path):
    from grpokit.rollout.multiturn import MultiTurnEngine

    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        rollout={"env": "tools", "env_options": {"tools": ["calculator"]}, "max_turns": 2},
        eval={"dataset": "mawps", "split": "singleop", "limit": 2, "before": False, "after": False},
        data={"skip": 2},
    )
    run = grpokit.trainer.build.build_run(recipe)
    assert isinstance(run.engine, MultiTurnEngine) and isinstance(run.eval_engine, MultiTurnEngine)
    assert run.engine.env.stop_strings == ["</calc>"] and run.engine.max_turns == 2
    with pytest.raises(ValueError, match="unknown tool 'abacus'"):
        grpokit.trainer.build.build_run(
            tiny_recipe(tiny_model_dir, tmp_path / "b", rollout={"env": "tools", "env_options": {"tools": ["abacus"]}})
        )


def test_grpokit_eval_uses_the_recipes_environment(tiny_model_dir, tmp_path, capsys):
    from grpokit.cli.main import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "data: {dataset: mawps, split: singleop, skip: 4}\neval: {dataset: mawps, split: singleop, limit: 4, "
        "max_new_tokens: 6}\nrollout: {env: support.fake_envs:StopAtE, max_turns: 3}\n"
    )
    out = tmp_path / "e.json"
    assert main(["eval", tiny_model_dir, "--heldout-of", str(recipe), "--output", str(out)]) == 0
    examples = json.loads(out.read_text())["models"][tiny_model_dir]["examples"]
    assert any(OBS.strip() in e["completion"] for e in examples)  # the transcripts hold the observations
    bad = ["eval", tiny_model_dir, "--heldout-of", str(recipe), "rollout.env_options={text: 1, x: 2}"]
    assert main([*bad, "--output", str(out)]) == 2 and "rollout.env_options do not fit" in capsys.readouterr().err


@pytest.mark.slow
def test_process_supervision_with_turns_as_steps(tiny_model, smollm2_tokenizer, tiny_model_dir, tmp_path):
    """``algo.step_rule=turns``: each model turn is a step ending on its last token, the step reward
    sees the turns' texts, and a run with it trains."""
    from grpokit.process.scorer import turn_steps
    from grpokit.rollout import SamplingParams
    from grpokit.rollout.multiturn import generate_multiturn
    from support.fake_envs import StopAtE

    prompts = ["The cat sat on", "A dog ran to"]
    exp = generate_multiturn(
        tiny_model,
        smollm2_tokenizer,
        prompts,
        2,
        SamplingParams(max_new_tokens=6),
        env=StopAtE(),
        rows=[{}, {}],
        eos_token_ids=[2, 0],
        max_turns=3,
        seed=5,
    )
    ends, steps = turn_steps(exp, smollm2_tokenizer)
    for r in range(len(exp)):
        model = exp.completion_mask[r].tolist()
        last = [i for i, on in enumerate(model) if on and (i + 1 == len(model) or not model[i + 1])]
        assert ends[r].nonzero().flatten().tolist() == last
        assert len(steps[r]) == len(last) == int(exp.env_counts["turns"][r])
    assert max(len(s) for s in steps) > 1
    out = tmp_path / "run"
    recipe = tiny_recipe(
        tiny_model_dir,
        out,
        rollout=ENV,
        algo={
            "supervision": "process",
            "step_rule": "turns",
            "process_reward": "support.fake_rewards:process_length_reward",
        },
    )
    train(recipe, progress=False)
    for m in read_metrics(out / "metrics.jsonl"):
        assert m["step_count_mean"] == pytest.approx(m["env/turns"]) and math.isfinite(m["loss"])


@pytest.mark.slow
def test_dynamic_sampling_refills_groups_with_multi_turn_rows(tiny_model_dir, tmp_path, monkeypatch):
    """DAPO's refill rounds sample multi-turn rows too, and the rows trained on keep their
    attention masks (environment tokens attended to, out of completion_mask)."""
    seen = []
    real = grpokit.trainer.loop.optimize

    def spy(run, exp, **kw):
        seen.append(exp)
        return real(run, exp, **kw)

    monkeypatch.setattr(grpokit.trainer.loop, "optimize", spy)
    out = tmp_path / "run"
    recipe = tiny_recipe(
        tiny_model_dir,
        out,
        rollout=ENV,
        algo={"dynamic_sampling": True, "max_sampling_rounds": 1},
        train={"max_steps": 1},
    )
    train(recipe, progress=False)
    (m,) = read_metrics(out / "metrics.jsonl")
    assert m["dynamic/rounds"] in (0, 1) and m["env/turns"] > 1
    (exp,) = seen
    assert exp.attention_mask is not None and exp.env_counts is not None
    env_tok = exp.attention_mask & ~exp.completion_mask
    assert int(env_tok.sum()) == int(exp.env_counts["env_tokens"].sum()) > 0


def test_held_out_evaluation_starts_each_episode_from_its_row(tiny_model, smollm2_tokenizer):
    """evaluate() hands a multi-turn engine the problems' rows (greedy and sampled), so an
    environment that reads them (feedback's judge reads the answer) sees each problem's own."""
    from grpokit.eval.evaluate import evaluate
    from grpokit.rollout.multiturn import MultiTurnEngine

    seen = []

    class Recording:
        stop_strings = ()

        def start(self, row):
            seen.append(dict(row))

            class Ep:
                def step(self, turn, *, ended_by_eos):
                    return Observation(done=True)

            return Ep()

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(3)]
    engine = MultiTurnEngine(tiny_model, smollm2_tokenizer, env=Recording(), eos_token_ids=[2], max_turns=2)
    evaluate(
        engine, ["The cat", "A dog", "My hat"], rows, max_new_tokens=3, batch_size=2, num_samples=2, temperature=1.0
    )
    assert [r["answer"] for r in seen] == ["0", "1", "2"] + ["0"] * 2 + ["1"] * 2 + ["2"] * 2
