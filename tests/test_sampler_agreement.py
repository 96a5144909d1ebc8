"""The trainer scores the distribution the sampler drew from (issue: with top_k=2 every sampled
token lay in the top 2, but π_old/π_θ/π_ref were scored with a full-vocabulary softmax: −0.68 per
token at the sampler, −10.37 in the loss). grpokit's decision: temperature is applied on both sides;
the truncating warpers (top_k, top_p, min_p) are refused in training recipes."""

from __future__ import annotations

import pytest
import torch

import grpokit.rollout.sampling as sampling
from grpokit.backends import install_backend
from grpokit.config import RecipeError, recipe_from_dict
from grpokit.models.logprobs import completion_logprobs
from grpokit.rollout import SamplingParams, generate_rollouts
from helpers import tiny_recipe_dict


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
def test_truncating_warpers_would_score_another_distribution(
    tiny_model, smollm2_tokenizer, smollm2_prompts, monkeypatch, warper
):
    # why they are refused: the sampler's log-probs (truncated support) are not the trainer's
    params = SamplingParams(temperature=1.0, max_new_tokens=6, **warper)
    r, sampler_logp = _sampler_logprobs(tiny_model, smollm2_tokenizer, smollm2_prompts, params, monkeypatch)
    logp = _trainer_logprobs(tiny_model, r, 1.0)
    m = r.completion_mask
    assert (sampler_logp[m] - logp[m]).mean() > 0.5  # nats per token (top_p=0.5 of a near-uniform π: ln 2)


@pytest.mark.parametrize("key, value", [("top_k", 2), ("top_p", 0.9), ("min_p", 0.05)])
def test_recipe_refuses_truncated_sampling(key, value):
    raw = tiny_recipe_dict("m", "out", rollout={key: value})
    with pytest.raises(RecipeError, match=rf"rollout.{key}={value}: truncated sampling is refused in training"):
        recipe_from_dict(raw)


def test_recipe_accepts_the_off_values_and_a_temperature():
    r = recipe_from_dict(
        tiny_recipe_dict("m", "out", rollout={"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 0.7})
    )
    assert (r.rollout.top_k, r.rollout.top_p, r.rollout.min_p, r.rollout.temperature) == (0, 1.0, 0.0, 0.7)
