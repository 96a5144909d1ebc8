"""Sampling replay: with top_k / top_p / min_p the hf engine records the set each token was drawn
from (``Experience.sampler_support``) and the sampler's own log-prob of it (``sampler_logprobs``);
the trainer renormalizes π_old, π_θ and π_ref over that same set (docs/design.md, "Temperature").

Hand-built warper cases (the set worked out in each comment), then the tiny model: the sampler's
log-probs equal the trainer's replayed ones for every warper and combination, on both backends,
single- and multi-turn."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import grpokit.rollout.sampling as sampling
from grpokit.algo import support as sup
from grpokit.algo import token_logprobs
from grpokit.backends import install_backend
from grpokit.models.logprobs import LogprobScorer, completion_logprobs
from grpokit.rollout import SamplingParams, generate_rollouts
from grpokit.rollout.multiturn import generate_multiturn
from grpokit.rollout.sampling import InverseCDFSampler
from support.fake_envs import StopAtE


def _draw(logits: list[float], u: float, temperature: float = 1.0, **warpers) -> tuple[list[int], int, float]:
    """One draw of a recording sampler from a 1-row ``logits``: ``(kept ids, token, its log-prob)``."""
    proc = InverseCDFSampler(
        temperature=temperature, uniforms=torch.tensor([[u]], dtype=torch.float64), record=True, **warpers
    )
    token = int(proc(None, torch.tensor([logits])).argmax())
    support, logp = proc.recorded()  # (1, 1, W), (1, 1)
    kept = sup.to_mask(support[0], 0, len(logits))[0].nonzero().flatten().tolist()
    # the trainer's replay of the same draw gives the sampler's log-prob
    replayed = token_logprobs(
        torch.tensor([[logits]]), torch.tensor([[token]]), temperature=temperature, support=support
    )
    torch.testing.assert_close(replayed, logp, rtol=0, atol=1e-6)
    return kept, token, float(logp)


L = [math.log(p) for p in (0.4, 0.3, 0.2, 0.1)]  # softmax: (0.4, 0.3, 0.2, 0.1)


def test_top_k_keeps_every_token_tied_with_the_kth():
    # logits (3, 1, 1, 0), top_k = 2: transformers keeps every score >= the 2nd largest (1), so
    # both tied 1s: {0, 1, 2}, three tokens. u = 0.999 draws the last of them, 2:
    # log π_S(2) = 1 − log(e³ + 2e).
    kept, token, logp = _draw([3.0, 1.0, 1.0, 0.0], 0.999, top_k=2)
    assert kept == [0, 1, 2] and token == 2
    assert logp == pytest.approx(1 - math.log(math.exp(3) + 2 * math.e), abs=1e-6)


def test_top_p_keeps_the_fewest_tokens_whose_mass_reaches_it():
    # probs (0.5, 0.25, 0.125, 0.125), top_p = 0.75: a token is dropped when the tokens above it
    # already hold >= 0.75. Token 2 has 0.75 above it: dropped (the boundary is inclusive), and
    # its tie 3 too. Kept {0, 1}, mass exactly 0.75; u = 0.999 draws 1: log(0.25 / 0.75) = −log 3.
    kept, token, logp = _draw([math.log(p) for p in (0.5, 0.25, 0.125, 0.125)], 0.999, top_p=0.75)
    assert kept == [0, 1] and token == 1
    assert logp == pytest.approx(-math.log(3), abs=1e-6)


def test_top_p_breaks_a_tie_at_the_boundary_as_torch_sort_does_and_the_record_says_which():
    # probs (0.4, 0.2, 0.2, 0.2), top_p = 0.5: ascending, the three 0.2s come first (in sort's
    # order), cumulative 0.2, 0.4, 0.6, 1.0; those at <= 1 − 0.5 are dropped: two of the three tied
    # tokens. Kept: 0 and ONE of 1, 2, 3 -- no threshold on the logits describes that set, which is
    # why the engine records the set itself. Each kept token's log-prob is over mass 0.6.
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = [math.log(p) for p in (0.4, 0.2, 0.2, 0.2)]
    kept, token, logp = _draw(logits, 0.999, top_p=0.5)
    want = torch.isfinite(TopPLogitsWarper(0.5)(None, torch.tensor([logits])))[0].nonzero().flatten().tolist()
    assert kept == want and len(kept) == 2 and kept[0] == 0
    assert token == kept[1] and logp == pytest.approx(math.log(0.2 / 0.6), abs=1e-6)


def test_min_p_is_taken_after_the_temperature():
    # logits (0, −2 ln 2, −4 ln 2, −6 ln 2) at τ = 2: z = (0, −ln 2, −2 ln 2, −3 ln 2), p ∝ (1, 1/2,
    # 1/4, 1/8). min_p = 0.3 keeps p >= 0.3 · p_max: {0, 1} (at τ = 1 the ratios would be 1, 1/4, …:
    # {0} alone). u = 0.999 draws 1: log((1/2) / (3/2)) = −log 3.
    logits = [-k * 2 * math.log(2) for k in range(4)]
    kept, token, logp = _draw(logits, 0.999, temperature=2.0, min_p=0.3)
    assert kept == [0, 1] and token == 1
    assert logp == pytest.approx(-math.log(3), abs=1e-6)
    assert _draw(logits, 0.999, temperature=1.0, min_p=0.3)[0] == [0]


def test_top_p_applies_to_the_top_k_sets_renormalized_mass():
    # probs (0.4, 0.3, 0.2, 0.1), top_k = 2 then top_p = 0.5: top-k keeps {0, 1}, renormalized
    # (4/7, 3/7); 4/7 >= 0.5 already, so top-p keeps {0}: log-prob 0. (top-p first, on the full
    # distribution, would keep {0, 1}: 0.4 < 0.5 <= 0.7.)
    kept, token, logp = _draw(L, 0.999, top_k=2, top_p=0.5)
    assert kept == [0] and token == 0 and logp == pytest.approx(0.0, abs=1e-6)


def test_all_three_in_transformers_order():
    # probs (0.4, 0.3, 0.2, 0.1): top_k = 3 -> {0, 1, 2}, renormalized (4/9, 3/9, 2/9); top_p = 0.8:
    # above token 2 lie 7/9 = 0.78 < 0.8, so all three stay; min_p = 0.6 drops p < 0.6 · 0.4 = 0.24:
    # token 2 (0.2). Kept {0, 1}; u = 0.999 draws 1: log(0.3 / 0.7).
    kept, token, logp = _draw(L, 0.999, top_k=3, top_p=0.8, min_p=0.6)
    assert kept == [0, 1] and token == 1
    assert logp == pytest.approx(math.log(0.3 / 0.7), abs=1e-6)


# -- the tiny model -------------------------------------------------------------------------------

WARPERS = [
    {"top_k": 2},
    {"top_p": 0.9},
    {"min_p": 0.9},
    {"top_k": 50, "top_p": 0.5},
    {"top_k": 100, "top_p": 0.9, "min_p": 0.95},
]
#: EOS ids: the model's two and the ids below 20000 (40 % of the near-uniform vocabulary), so rows
#: end at different lengths and the positions after an EOS are seen to be emptied
MANY_EOS = [2, 0, *range(3, 20000)]


def _spied_rollout(model, tokenizer, prompts, params, monkeypatch, **kw):
    """Sample with a spy on the sampler: per decode step the warped scores' kept sets and the drawn
    tokens' log-probs under them (its own distribution), ``(N, T, V)`` bool and ``(N, T)``."""
    kept, logps = [], []
    real = sampling.sample_inverse_cdf

    def spy(scores, generator=None, u=None):
        tokens = real(scores, generator, u)
        kept.append(torch.isfinite(scores))
        logps.append(torch.log_softmax(scores.float(), -1).gather(1, tokens[:, None]).squeeze(1))
        return tokens

    monkeypatch.setattr(sampling, "sample_inverse_cdf", spy)
    r = generate_rollouts(model, tokenizer, prompts, 3, params, eos_token_ids=MANY_EOS, seed=3, **kw)
    monkeypatch.setattr(sampling, "sample_inverse_cdf", real)
    return r, torch.stack(kept, 1), torch.stack(logps, 1)


@pytest.mark.parametrize("backend", ["plain", "cpu"])
@pytest.mark.parametrize("warpers", WARPERS, ids=lambda w: "+".join(w))
def test_trainer_replays_the_samplers_log_probs(
    tiny_model, smollm2_tokenizer, smollm2_prompts, monkeypatch, backend, warpers
):
    install_backend(tiny_model, backend, announce=False)
    params = SamplingParams(temperature=0.7, max_new_tokens=6, **warpers)
    r, kept, spied = _spied_rollout(tiny_model, smollm2_tokenizer, smollm2_prompts, params, monkeypatch)
    m, s = r.completion_mask, r.sampler_support
    assert s is not None and r.sampler_logprobs is not None
    assert bool((~m).any()) and bool(m[:, 1:].any())  # some rows ended early, some went on
    # the record is the sampler's set on counted tokens, empty after the end
    assert torch.equal(sup.restricted(s), m)
    assert torch.equal(sup.to_mask(s, 0, kept.shape[-1])[m], kept[m])
    assert bool(sup.contains(s, r.completion_ids).all())  # the drawn token is always inside
    # the engine's own log-probs are the sampler's (0 off the counted tokens)
    assert torch.equal(r.sampler_logprobs[m], spied[m]) and not bool(r.sampler_logprobs[~m].any())
    ref = copy.deepcopy(tiny_model)  # π_ref: the same weights, so the same replayed log-probs
    scorer = LogprobScorer(tiny_model, ref, temperature=0.7, micro_batch_size=4)
    old = scorer.policy(r)  # π_old
    torch.testing.assert_close(old[m], spied[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(scorer.reference(r)[m], old[m], rtol=0, atol=1e-6)
    for sl, mb in r.micro_batches(4):  # π_θ with gradient, before any update: π_old
        logp, _ = scorer.micro_batch(mb)
        assert logp.requires_grad
        torch.testing.assert_close(
            logp.detach()[mb.completion_mask], old[sl, : logp.shape[1]][mb.completion_mask], rtol=0, atol=1e-6
        )
    # without the replay the trainer would score another distribution (the bug replay fixes)
    with torch.no_grad():
        full, _ = completion_logprobs(tiny_model, r.replace(sampler_support=None), temperature=0.7)
    assert float((spied[m] - full[m]).mean()) > 0.05


@pytest.mark.parametrize("backend", ["plain", "cpu"])
def test_without_a_warper_nothing_is_recorded_and_log_probs_are_bit_for_bit(
    tiny_model, smollm2_tokenizer, smollm2_prompts, backend
):
    install_backend(tiny_model, backend, announce=False)
    params = SamplingParams(temperature=0.7, max_new_tokens=6)
    r = generate_rollouts(tiny_model, smollm2_tokenizer, smollm2_prompts, 3, params, eos_token_ids=MANY_EOS, seed=3)
    assert r.sampler_support is None and r.sampler_logprobs is None
    # an all-empty support (nothing truncated) goes through the replay path and changes nothing:
    # log-probs, entropies and every parameter's gradient, bit for bit
    empty = torch.full((*r.completion_ids.shape, 4), -1, dtype=torch.int32)

    def run(exp):
        tiny_model.zero_grad(set_to_none=True)
        logp, ent = completion_logprobs(tiny_model, exp, temperature=0.7, entropy_grad=True)
        ((logp * exp.completion_mask).sum() + ent.sum()).backward()
        return logp.detach(), ent.detach(), [p.grad.clone() for p in tiny_model.parameters()]

    a, b = run(r), run(r.replace(sampler_support=empty))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(x, y) for x, y in zip(a[2], b[2]))


@pytest.mark.parametrize("backend", ["plain", "cpu"])
def test_gradients_flow_through_the_renormalization_only(tiny_model, smollm2_tokenizer, smollm2_prompts, backend):
    """The loss's gradient w.r.t. the logits is 0 outside each token's set (checked on the plain
    path's logits), and the cpu backend's fused head gives the plain path's parameter gradients."""
    params = SamplingParams(temperature=0.7, max_new_tokens=5, top_k=3)
    r = generate_rollouts(tiny_model, smollm2_tokenizer, smollm2_prompts, 2, params, eos_token_ids=[2, 0], seed=5)
    from grpokit.backends.base import plain_forward

    logits = plain_forward(tiny_model, tiny_model, r, False).detach().requires_grad_()
    logp = token_logprobs(logits, r.completion_ids, temperature=0.7, support=r.sampler_support)
    (logp * r.completion_mask).sum().backward()
    inside = sup.to_mask(r.sampler_support, 0, logits.shape[-1])
    assert bool((logits.grad[~inside] == 0).all()) and bool((logits.grad[inside] != 0).any())
    grads = {}
    for name in ("plain", backend):
        install_backend(tiny_model, name, announce=False)
        tiny_model.zero_grad(set_to_none=True)
        lp, ent = completion_logprobs(tiny_model, r, temperature=0.7, entropy_grad=True)
        ((lp * r.completion_mask).sum() + 0.1 * (ent * r.completion_mask).sum()).backward()
        grads[name] = [p.grad.clone() for p in tiny_model.parameters()]
    for a, b in zip(grads["plain"], grads[backend]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("turn_batching", ["lockstep", "continuous"])
@pytest.mark.parametrize("warpers", [{"top_k": 3}, {"top_p": 0.9}], ids=lambda w: "+".join(w))
def test_multi_turn_rows_replay_the_model_tokens_sets(tiny_model, smollm2_tokenizer, turn_batching, warpers):
    install_backend(tiny_model, "cpu", announce=False)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, **warpers)
    prompts = ["The cat sat on", "A dog ran to"]
    exp = generate_multiturn(
        tiny_model,
        smollm2_tokenizer,
        prompts,
        2,
        params,
        env=StopAtE(),
        rows=[{"question": p} for p in prompts],
        eos_token_ids=[2, 0],
        max_turns=3,
        seed=11,
        turn_batching=turn_batching,
    )
    m, s = exp.completion_mask, exp.sampler_support
    assert s is not None and bool((exp.completion_attention & ~m).any())  # environment tokens are there
    assert torch.equal(sup.restricted(s), m)  # their sets are empty; every model token has one
    assert bool(sup.contains(s, exp.completion_ids).all())
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny_model, exp, temperature=1.0)
    torch.testing.assert_close(logp[m], exp.sampler_logprobs[m], rtol=0, atol=1e-5)
    assert not bool(exp.sampler_logprobs[~m].any())
