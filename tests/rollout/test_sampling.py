"""grpokit.rollout.sampling: inverse-CDF draws follow the warped softmax exactly (frequencies
within 5 standard errors of hand-computed probabilities), and generate uses the sampler."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.rollout import SamplingParams, build_generation_config, generate_rollouts
from grpokit.rollout.hf import sampling_processors
from grpokit.rollout.sampling import InverseCDFSampler, sample_inverse_cdf

NEG = float("-inf")


def _assert_frequencies(tokens: torch.Tensor, probs: list[float]) -> None:
    """Empirical frequencies of ``tokens`` equal ``probs`` within 5 binomial standard errors;
    zero-probability ids never appear."""
    n = tokens.numel()
    counts = torch.bincount(tokens, minlength=len(probs)).double() / n
    for j, p in enumerate(probs):
        if p == 0:
            assert counts[j] == 0, f"id {j} has probability 0 but was drawn"
        else:
            se = math.sqrt(p * (1 - p) / n)
            assert abs(counts[j] - p) < 5 * se, (j, float(counts[j]), p)


def test_inverse_cdf_matches_softmax():
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, NEG, 0.5])
    z = [math.exp(x) if x != NEG else 0.0 for x in logits.tolist()]
    probs = [v / sum(z) for v in z]  # hand softmax; the -inf id has probability 0
    tokens = sample_inverse_cdf(logits.repeat(200_000, 1))
    assert tokens.shape == (200_000,) and tokens.dtype == torch.long
    _assert_frequencies(tokens, probs)


def test_two_level_search_draws_what_the_full_cdf_draws(monkeypatch):
    """Large vocabularies search blocks of entries, then one block: the same token as one
    cumulative sum over the whole row for the same uniform numbers (random logits, a third of the
    entries -inf, one block entirely -inf), and never a zero-probability entry."""
    import grpokit.rollout.sampling as sampling

    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(64, 5000, generator=gen)
    logits[torch.rand(64, 5000, generator=gen) < 0.3] = NEG
    logits[:, 256:512] = NEG
    torch.manual_seed(3)
    two_level = sample_inverse_cdf(logits)
    monkeypatch.setattr(sampling, "_BLOCK", 10_000)  # one level
    torch.manual_seed(3)
    one_level = sample_inverse_cdf(logits)
    assert torch.equal(two_level, one_level)
    assert torch.isfinite(logits.gather(1, two_level[:, None])).all()


def test_two_level_frequencies_match_softmax():
    torch.manual_seed(4)
    logits = torch.full((600,), NEG)  # blocks 0-255, 256-511, 512-599 (padded)
    ids = [3, 255, 256, 511, 512, 599]
    logits[ids] = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5, 1.5])
    z = torch.softmax(logits.double(), 0)
    tokens = sample_inverse_cdf(logits.repeat(40_000, 1))
    _assert_frequencies(tokens, z.tolist())


def test_sampler_applies_temperature_and_top_k_like_generate():
    torch.manual_seed(1)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(200_000, 1)
    proc = InverseCDFSampler(temperature=0.5, top_k=3)
    out = proc(torch.zeros(200_000, 1, dtype=torch.long), logits)
    # the output is a one-hot "score" row: argmax (generate's greedy step) recovers the draw
    assert torch.isinf(out).sum(1).eq(4).all() and out.max(1).values.eq(0).all()
    tokens = out.argmax(1)
    kept = [2.0 / 0.5, 1.0 / 0.5, 0.5 / 0.5]  # top-3 ids 0, 1, 4 after temperature 0.5
    z = sum(math.exp(v) for v in kept)
    probs = [math.exp(kept[0]) / z, math.exp(kept[1]) / z, 0.0, 0.0, math.exp(kept[2]) / z]
    _assert_frequencies(tokens, probs)


def test_sampler_top_p_keeps_the_smallest_nucleus():
    torch.manual_seed(2)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    proc = InverseCDFSampler(temperature=1.0, top_p=0.7)  # 0.5 < 0.7 <= 0.5 + 0.3: keep ids 0, 1
    tokens = proc(torch.zeros(100_000, 1, dtype=torch.long), p.log().repeat(100_000, 1)).argmax(1)
    _assert_frequencies(tokens, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])


def test_given_uniforms_draw_what_the_generator_draws():
    """``u`` ``(N,)`` or ``(N, 1)`` replaces the N uniform numbers the sampler would draw (one and two
    levels of the search)."""
    for v in (300, 5000):
        logits = 3 * torch.randn(64, v, generator=torch.Generator().manual_seed(v))
        drawn = sample_inverse_cdf(logits, generator=torch.Generator().manual_seed(7))
        u = torch.rand(64, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
        assert torch.equal(sample_inverse_cdf(logits, u=u), drawn)
        assert torch.equal(sample_inverse_cdf(logits, u=u.squeeze(1)), drawn)
    with pytest.raises(ValueError, match=r"u must be \(2,\) or \(2, 1\) for 2 rows of scores, got shape \(3,\)"):
        sample_inverse_cdf(torch.zeros(2, 4), u=torch.rand(3))


def test_sample_inverse_cdf_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"scores must be \(N, V\)"):
        sample_inverse_cdf(torch.zeros(3))
    with pytest.raises(ValueError, match="row 1 of scores has no finite entry"):
        sample_inverse_cdf(torch.tensor([[0.0, 1.0], [NEG, NEG]]))
    with pytest.raises(ValueError, match="row 0 of scores has no finite entry, a NaN or a"):
        sample_inverse_cdf(torch.tensor([[0.0, float("nan")], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="row 1 of scores has no finite entry, a NaN or a"):
        sample_inverse_cdf(torch.tensor([[0.0, 1.0], [0.0, float("inf")]]))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        InverseCDFSampler(temperature=0.0)
    with pytest.raises(ValueError, match="SamplingParams.sampler"):
        SamplingParams(sampler="gumbel")


@pytest.mark.slow
def test_generate_samples_the_models_next_token_distribution(tiny_model, smollm2_tokenizer):
    """3000 one-token completions of one prompt: the 5 likeliest first tokens come up as often as
    softmax(model logits / T) says, for both samplers."""
    prompt = "The cat sat on"
    ids = smollm2_tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(tiny_model(input_ids=ids).logits[0, -1].double() / 0.05, -1)
    top = probs.topk(5).indices.tolist()
    for sampler in ("inverse_cdf", "multinomial"):
        params = SamplingParams(temperature=0.05, max_new_tokens=1, sampler=sampler)
        r = generate_rollouts(tiny_model, smollm2_tokenizer, [prompt], 3000, params, eos_token_ids=[49151], seed=0)
        first = r.completion_ids[:, 0]
        remap = torch.full((probs.numel(),), 5)
        remap[top] = torch.arange(5)
        _assert_frequencies(remap[first], [float(probs[j]) for j in top] + [1 - float(probs[top].sum())])


def test_inverse_cdf_config_is_greedy_plus_the_sampler():
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=7, min_p=0.1)
    g = build_generation_config(params, eos_token_ids=[2], pad_token_id=0)
    assert g.do_sample is False and g.temperature is None and g.top_k is None
    (proc,) = sampling_processors(params)
    names = [type(w).__name__ for w in proc.warpers]
    assert names == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper"]
    assert sampling_processors(SamplingParams(temperature=0.0)) == []
    assert sampling_processors(SamplingParams(temperature=1.0, sampler="multinomial")) == []
    assert [type(w).__name__ for w in sampling_processors(SamplingParams(temperature=1.0))[0].warpers] == []
