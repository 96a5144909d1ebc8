"""The trainer scores the distribution the sampler drew from (issue: with top_k=2 every sampled
token lay in the top 2, but π_old/π_θ/π_ref were scored with a full-vocabulary softmax: −0.68 per
token at the sampler, −10.37 in the loss). grpokit's decision: temperature is applied on both sides,
and the truncating warpers (top_k, top_p, min_p) are replayed: the hf engine records the set each
token was drawn from and every policy is renormalized over it (tests/rollout/test_sampling_replay.py
holds the detailed checks); where the set cannot be recorded (vllm, the multinomial sampler) the
recipe refuses them."""

from __future__ import annotations

import math

import pytest
import torch

import grpokit.rollout.sampling as sampling
from grpokit.backends import install_backend
from grpokit.config import RecipeError, recipe_from_dict
from grpokit.metrics import read_metrics
from grpokit.models.logprobs import completion_logprobs
from grpokit.rollout import SamplingParams, generate_rollouts
from grpokit.trainer.loop import train
from support.helpers import tiny_recipe, tiny_recipe_dict


def _sampler_logprobs(model, tokenizer, prompts, params, monkeypatch):
    """Sample, recording each drawn token's log-prob under the distribution the sampler drew from
    (its warped scores, log-softmax); returns the rollout and those log-probs ``(N, T)``."""
    steps = []
    real = sampling.sample_inverse_cdf

    def spy(scores, generator=None, u=None):
        tokens = real(scores, generator, u)
        steps.append(torch.log_softmax(scores.float(), -1).gather(1, tokens[:, None]).squeeze(1))
        return tokens

    monkeypatch.setattr(sampling, "sample_inverse_cdf", spy)
    r = generate_rollouts(model, tokenizer, prompts, 4, params, eos_token_ids=[2, 0], seed=3, packed_weights=False)
    return r, torch.stack(steps, 1)  # (N, T)


def _trainer_logprobs(model, r, temperature):
    with torch.no_grad():
        logp, _ = completion_logprobs(model, r, temperature=temperature)
    return logp


@pytest.mark.parametrize("temperature,backend", [(1.0, "plain"), (0.7, "plain"), (1.3, "plain"), (0.7, "cpu")])
def test_trainer_logprobs_equal_the_samplers_for_temperature(
    tiny_model, smollm2_tokenizer, smollm2_prompts, monkeypatch, temperature, backend
):
    install_backend(tiny_model, backend, announce=False)  # cpu: decode attention, fused head, shared prompt
    params = SamplingParams(temperature=temperature, max_new_tokens=6)
    r, sampler_logp = _sampler_logprobs(tiny_model, smollm2_tokenizer, smollm2_prompts, params, monkeypatch)
    logp = _trainer_logprobs(tiny_model, r, temperature)
    m = r.completion_mask
    torch.testing.assert_close(logp[m], sampler_logp[m], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("warper", [{"top_k": 2}, {"top_p": 0.5}, {"min_p": 0.9}])
def test_truncating_warpers_are_replayed(tiny_model, smollm2_tokenizer, smollm2_prompts, monkeypatch, warper):
    # the sampler's log-probs (truncated support) are the trainer's once it renormalizes over the
    # recorded sets; over the full vocabulary (what was refused before) they are not
    params = SamplingParams(temperature=1.0, max_new_tokens=6, **warper)
    r, sampler_logp = _sampler_logprobs(tiny_model, smollm2_tokenizer, smollm2_prompts, params, monkeypatch)
    assert r.sampler_support is not None
    m = r.completion_mask
    torch.testing.assert_close(_trainer_logprobs(tiny_model, r, 1.0)[m], sampler_logp[m], rtol=0, atol=1e-5)
    full = _trainer_logprobs(tiny_model, r.replace(sampler_support=None), 1.0)
    assert (sampler_logp[m] - full[m]).mean() > 0.5  # nats per token (top_p=0.5 of a near-uniform π: ln 2)


@pytest.mark.parametrize("key, value", [("top_k", 2), ("top_p", 0.9), ("min_p", 0.05)])
def test_recipe_accepts_truncated_sampling_on_the_hf_engine(key, value):
    r = recipe_from_dict(tiny_recipe_dict("m", "out", rollout={key: value}))
    assert getattr(r.rollout, key) == value


@pytest.mark.parametrize("key, value", [("top_k", 2), ("top_p", 0.9), ("min_p", 0.05)])
@pytest.mark.parametrize(
    "rollout, reason",
    [
        ({"engine": "vllm"}, "with rollout.engine=vllm: .*vLLM does not report that set"),
        ({"sampler": "multinomial"}, "with rollout.sampler=multinomial: .*only the inverse_cdf sampler records"),
    ],
)
def test_recipe_refuses_truncated_sampling_where_it_cannot_be_replayed(key, value, rollout, reason):
    raw = tiny_recipe_dict("m", "out", rollout={key: value, **rollout})
    with pytest.raises(RecipeError, match=rf"rollout.{key}={value} {reason}"):
        recipe_from_dict(raw)


def test_recipe_accepts_the_off_values_and_a_temperature():
    r = recipe_from_dict(
        tiny_recipe_dict("m", "out", rollout={"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 0.7})
    )
    assert (r.rollout.top_k, r.rollout.top_p, r.rollout.min_p, r.rollout.temperature) == (0, 1.0, 0.0, 0.7)


@pytest.mark.slow
@pytest.mark.parametrize(
    "rollout",
    [
        {"top_p": 0.9},
        {
            "top_k": 5,
            "top_p": 0.9,
            "min_p": 0.5,
            "env": "support.fake_envs:StopAtE",
            "max_turns": 2,
            "max_new_tokens": 6,
        },
    ],
    ids=["top_p", "all-three-multi-turn"],
)
def test_a_training_step_with_truncated_sampling(tiny_model_dir, tmp_path, rollout):
    """One step, μ = 2 (π_old scored before the update) and β > 0 (π_ref), single- and multi-turn:
    the metrics are finite and the sampler's log-probs equal π_old's replayed ones
    (``logprob_gap_max``; over the full vocabulary they would differ by nats)."""
    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        rollout={"temperature": 0.8, **rollout},
        algo={"beta": 0.04},
        train={"max_steps": 1, "num_iterations": 2, "micro_batch_size": 2},
    )
    summary = train(recipe, progress=False)
    (m,) = read_metrics(tmp_path / "metrics.jsonl")
    for k in ("loss", "kl", "grad_norm", "entropy", "ratio_mean", "logprob_gap_mean", "logprob_gap_max"):
        assert math.isfinite(m[k]), k
    assert m["logprob_gap_max"] < 1e-4 and m["skipped_updates"] == 0 and m["policy_updated"] == 1
    assert summary["last_metrics"]["step"] == 1


def test_an_engine_that_records_no_support_stops_the_step(tiny_model_dir, tmp_path):
    # the recipe checks refuse the engines and samplers that record none; one that slips past is
    # stopped before the loss could score another distribution than the one sampled
    import grpokit.trainer.build

    recipe = tiny_recipe(tiny_model_dir, tmp_path, rollout={"top_p": 0.9}, train={"max_steps": 1})
    run = grpokit.trainer.build.build_run(recipe)
    real = run.engine.generate
    run.engine.generate = lambda *a, **kw: real(*a, **kw).replace(sampler_support=None)
    try:
        with pytest.raises(RuntimeError, match="returned no sampler_support"):
            train(recipe, progress=False, run=run)
    finally:
        run.rewards.close()
