"""rm: reward models and http:// reward servers as entries of rewards.functions: resolved by the
reward pipeline, and a 2-step tiny-model training run mixing them with a rule-based reward."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_remote import Server, length_scores
from test_rm import make_rm

import grpokit.trainer.build
from grpokit.config import RecipeError
from grpokit.metrics import read_metrics
from grpokit.rewards.pipeline import RewardPipeline
from grpokit.rewards.remote import RemoteReward
from grpokit.rewards.rm import RewardModel
from grpokit.trainer.loop import train
from support.helpers import tiny_recipe

RULE = "support.fake_rewards:length_reward"


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, smollm2_tokenizer):
    path = tmp_path_factory.mktemp("tiny_rm")
    make_rm(seed=3).save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def server():
    s = Server([(200, length_scores, 0)])
    yield s
    s.close()


def test_pipeline_resolves_rm_and_server_entries(tiny_model_dir, tmp_path, rm_dir, server):
    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        rewards={
            "functions": [f"rm:{rm_dir}", server.url, RULE],
            "rm_batch_size": 3,
            "rm_normalize": True,
            "remote_retries": 1,
            "remote_backoff_s": 0.0,
            "timeout_s": 7,
        },
    )
    pipe = RewardPipeline.from_config(recipe.rewards, device="cpu")
    rm, remote, rule = (pipe.funcs[n] for n in recipe.rewards.functions)
    assert isinstance(rm.fn, RewardModel) and rm.isolation == "thread" and rm.find_row
    assert rm.fn.base.batch_size == 3 and rm.fn.normalize and rm.fn.base.device == torch.device("cpu")
    assert isinstance(remote.fn, RemoteReward) and remote.isolation == "thread" and not remote.find_row
    assert (remote.fn.timeout_s, remote.fn.retries, remote.fn.backoff_s) == (7, 1, 0.0)
    assert rule.isolation == "process" and rule.find_row
    pipe.close()


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("rm_batch_size", 0, "rewards.rm_batch_size: must be >= 1"),
        ("remote_retries", -1, "rewards.remote_retries: must be >= 0"),
        ("rm_dtype", "int8", "rewards.rm_dtype"),
    ],
)
def test_bad_rm_and_remote_keys_name_the_key(tiny_model_dir, tmp_path, key, value, message):
    with pytest.raises(RecipeError, match=message):
        tiny_recipe(tiny_model_dir, tmp_path, rewards={"functions": [RULE], key: value})


def test_an_unloadable_rm_names_the_key(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, rewards={"functions": ["rm:/no/such/rm"]})
    with pytest.raises(ValueError, match="rewards.functions: reward model 'rm:/no/such/rm'"):
        grpokit.trainer.build.build_rewards(recipe)


@pytest.mark.slow
def test_two_steps_with_an_rm_a_server_and_a_rule(tiny_model_dir, tmp_path, rm_dir, server, smollm2_tokenizer):
    """Every logged reward is the weighted sum of the three functions' values for that completion,
    recomputed here from the samples: the RM independently (one unpadded row through the model),
    the server's rule (completion length, null for an empty one) and the rule reward."""
    weights = [2.0, 0.5, 1.0]
    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        rewards={"functions": [f"rm:{rm_dir}", server.url, RULE], "weights": weights, "on_error": "none"},
    )
    summary = train(recipe, progress=False, run=grpokit.trainer.build.build_run(recipe))
    assert summary["last_metrics"]["step"] == 2
    model = make_rm(seed=3)
    rm = RewardModel(model, smollm2_tokenizer)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8
    from support.fake_rewards import length_reward

    for s in samples:
        ids = rm.text_ids(s["prompt"], s["completion"])
        with torch.no_grad():
            rm_score = float(model(input_ids=torch.tensor([ids])).logits[0, 0])
        server_score = len(s["completion"]) or None
        rule = length_reward([s["prompt"]], [s["completion"]])[0]
        if server_score is None:
            assert s["reward"] is None or math.isnan(s["reward"])
        else:
            assert s["reward"] == pytest.approx(2.0 * rm_score + 0.5 * server_score + rule, abs=1e-4)
    for m in read_metrics(tmp_path / "metrics.jsonl"):
        assert math.isfinite(m[f"rewards/rm:{rm_dir}"]) and m["reward_failures"] == 0
    assert len(server.requests) == 2  # one POST per step
