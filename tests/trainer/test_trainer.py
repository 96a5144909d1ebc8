"""The GRPO loop end to end on a tiny random Llama (``tiny_model_dir``) with a length reward.

Each run takes a few seconds on one CPU thread: G=2, B=2, 8 new tokens, 8 MAWPS rows.
"""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpokit.trainer.build
import grpokit.trainer.loop
from grpokit import algo
from grpokit.metrics import METRIC_KEYS, read_metrics
from grpokit.trainer.loop import train
from support.helpers import tiny_recipe

REWARD = "support.fake_rewards:length_reward"


def run(recipe, monkeypatch):
    """``train(recipe)`` on parts built here, returning ``(summary, parts)``: the parts hold the
    trained model."""
    parts = grpokit.trainer.build.build_run(recipe)
    return train(recipe, progress=False, run=parts), parts


def _initial_state(model_dir):
    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}


@pytest.mark.curves
@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.04, 0.0])
def test_two_steps_train_log_and_checkpoint(tiny_model_dir, tmp_path, monkeypatch, beta):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, algo={"beta": beta})
    summary, s = run(recipe, monkeypatch)

    # β > 0 loads a frozen reference model; β = 0 loads none.
    if beta > 0:
        assert s.ref_model is not None and not any(p.requires_grad for p in s.ref_model.parameters())
    else:
        assert s.ref_model is None

    # Metrics: one line per step, every contract key plus the per-function reward mean.
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        missing = (set(METRIC_KEYS) | {"rewards/length_reward"}) - set(m)
        assert not missing, missing
        assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
        assert m["skipped_updates"] == 0 and m["reward_failures"] == 0
        if beta == 0:
            assert m["kl"] == 0.0
    assert summary["last_metrics"]["step"] == 2

    # The weights moved (lr 1e-2, length rewards differ within each group).
    init = _initial_state(tiny_model_dir)
    trained = s.model.state_dict()
    changed = [k for k in init if not torch.equal(init[k], trained[k])]
    assert len(changed) >= len(init) // 2, changed
    for k, v in trained.items():
        assert torch.isfinite(v).all(), k

    # Outputs: samples, curves, TensorBoard events, summary.
    samples = [json.loads(l) for l in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in samples} == {1, 2}  # sample_every=1
    assert len(samples) == 2 * 2 * 2  # 2 steps x B=2 x G=2
    assert {"prompt", "answer", "completion", "reward"} <= set(samples[0])
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "summary.json").read_text())["output_dir"] == str(tmp_path)

    # The final checkpoint reloads with plain transformers and equals the trained weights.
    ckpt = tmp_path / "checkpoint-2"
    assert (ckpt / "trainer_state.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt).state_dict()
    assert reloaded.keys() == trained.keys()
    for k in trained:
        torch.testing.assert_close(reloaded[k], trained[k], rtol=0, atol=0)


@pytest.mark.slow
def test_num_iterations_two_uses_old_logprobs(tiny_model_dir, tmp_path, monkeypatch):
    """μ = 2: π_old log-probs computed once before the first update; the first pass's ratio is 1
    (π_θ = π_old there), the second pass's is not (the first update moved π_θ)."""
    calls = []
    real = algo.policy_loss

    def spy(logp, old_logp, *a, **kw):
        calls.append(
            {"old_is_detached_logp": old_logp.data_ptr() == logp.data_ptr(), "requires_grad": old_logp.requires_grad}
        )
        out = real(logp, old_logp, *a, **kw)
        st = out.stats
        calls[-1].update(ratio=st.ratio_mean.item(), low=st.clip_frac_low.item(), high=st.clip_frac_high.item())
        return out

    monkeypatch.setattr(algo, "policy_loss", spy)
    recipe = tiny_recipe(tiny_model_dir, tmp_path, train={"num_iterations": 2, "max_steps": 1, "micro_batch_size": 2})
    summary, _ = run(recipe, monkeypatch)
    # N = 4 rows, micro-batches of 2 -> 2 calls per pass, 2 passes.
    assert len(calls) == 4
    assert all(not c["requires_grad"] and not c["old_is_detached_logp"] for c in calls)
    first, second = calls[:2], calls[2:]
    for c in first:
        assert c["ratio"] == pytest.approx(1.0, abs=1e-5)
        assert c["low"] == 0.0 and c["high"] == 0.0
    assert any(abs(c["ratio"] - 1.0) > 1e-4 for c in second)
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert {"ratio_mean", "clip_frac_low", "clip_frac_high"} <= set(m)
    assert math.isfinite(m["loss"]) and m["skipped_updates"] == 0


@pytest.mark.slow
def test_process_supervision_one_step(tiny_model_dir, tmp_path, monkeypatch):
    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        algo={
            "supervision": "process",
            "process_reward": "support.fake_rewards:process_length_reward",
            "step_rule": "regex:\\s",
        },
        train={"max_steps": 1},
    )
    summary, s = run(recipe, monkeypatch)
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    for key in ("step_count_mean", "step_reward_mean", "step_reward_std", "steps_scored_frac"):
        assert key in m, key
    assert m["step_count_mean"] >= 1
    assert m["steps_scored_frac"] == 1.0
    assert set(METRIC_KEYS) <= set(m)
    assert math.isfinite(m["loss"])
    init = _initial_state(tiny_model_dir)
    assert any(not torch.equal(init[k], v) for k, v in s.model.state_dict().items())


@pytest.mark.slow
def test_sampling_params_reach_generate(tiny_model_dir, tmp_path, monkeypatch):
    """The recipe's rollout section is what ``model.generate`` samples with: temperature only here
    (the truncating warpers are replayed: tests/rollout/test_sampling_replay.py)."""
    from transformers import GenerationConfig, LlamaForCausalLM

    import grpokit.rollout.hf as hf

    seen = {"params": [], "configs": []}
    real_rollouts, real_generate = hf.generate_rollouts, LlamaForCausalLM.generate

    def spy_rollouts(*a, **kw):
        bound = inspect.signature(real_rollouts).bind(*a, **kw)
        seen["params"].append(bound.arguments)
        return real_rollouts(*a, **kw)

    def spy_generate(self, *a, **kw):
        seen["configs"] += [x for x in (*a, *kw.values()) if isinstance(x, GenerationConfig)]
        seen["processors"] = list(kw.get("logits_processor") or [])
        return real_generate(self, *a, **kw)

    monkeypatch.setattr(hf, "generate_rollouts", spy_rollouts)
    monkeypatch.setattr(LlamaForCausalLM, "generate", spy_generate)
    rollout = {"group_size": 3, "temperature": 0.7, "max_new_tokens": 5}
    recipe = tiny_recipe(tiny_model_dir, tmp_path, rollout=rollout, train={"max_steps": 1})
    run(recipe, monkeypatch)
    (call,) = seen["params"]
    params = call["params"]
    assert call["group_size"] == 3
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.max_new_tokens) == (
        0.7,
        1.0,
        0,
        0.0,
        5,
    )
    assert list(call["eos_token_ids"])[:2] == [2, 0]
    assert call["seed"] is not None
    assert params.sampler == "inverse_cdf"  # the default: generate runs greedily over our sampler
    cfg = seen["configs"][0]
    assert not cfg.do_sample and cfg.max_new_tokens == 5
    (sampler,) = seen["processors"]
    (temp,) = sampler.warpers
    assert temp.temperature == 0.7
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert m["completion_len_mean"] <= 5


@pytest.mark.slow
def test_keeping_mlp_activations_trains_the_same_weights(tiny_model_dir, tmp_path, monkeypatch):
    """``model.recompute_mlp=false`` keeps gate(x), up(x) instead of recomputing them: the same
    backward ops on the same values, so one step gives the default's weights bit for bit."""
    trained = {}
    for recompute in (True, False):
        recipe = tiny_recipe(
            tiny_model_dir, tmp_path / str(recompute), model={"recompute_mlp": recompute}, train={"max_steps": 1}
        )
        _, s = run(recipe, monkeypatch)
        flags = {m._grpokit_recompute_mlp for m in s.model.modules() if "_grpokit_recompute_mlp" in vars(m)}
        assert flags == {recompute}
        trained[recompute] = s.model.state_dict()
    init = _initial_state(tiny_model_dir)
    assert any(not torch.equal(init[k], trained[True][k]) for k in init)
    for k in trained[True]:
        torch.testing.assert_close(trained[False][k], trained[True][k], rtol=0, atol=0, msg=k)
