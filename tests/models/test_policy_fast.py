"""The cpu backend's fast paths of ``grpokit.models.logprobs`` / ``grpokit.rollout.hf`` equal the plain ones.

Each optimized path is run next to the plain one on a tiny random Llama (CPU, float32) on the same
batch: log-probs, entropies, the GRPO loss and every parameter gradient must agree
(``torch.testing.assert_close`` with its float32 defaults unless a tolerance is written down).
The shared-prompt forward is tested here alone (:func:`_shared_prompt_only`: the cpu backend
without its fused ops); ``tests/backends/cpu/test_fused.py`` tests the whole backend.
"""

from __future__ import annotations

import copy

import pytest
import torch

from grpokit import algo
from grpokit.backends import backend_of, install_backend
from grpokit.experience import Experience
from grpokit.models.logprobs import batch_logprobs, completion_logprobs, distinct_rows

V = 64  # tiny_model_v64: bos 1, eos 2, pad 0


def _grouped_batch(G: int = 3, T: int = 7, seed: int = 0) -> tuple[Experience, torch.Tensor]:
    """Two prompts of different lengths (left-padded), G rows each; completions with EOS at
    different places (one row truncated), so padding sits on both sides of the sequence."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, V, (5,), generator=gen), torch.randint(3, V, (9,), generator=gen)]
    P = max(len(p) for p in prompts)
    pid = torch.zeros(len(prompts), P, dtype=torch.long)
    pm = torch.zeros(len(prompts), P, dtype=torch.bool)
    for i, p in enumerate(prompts):
        pid[i, P - len(p) :], pm[i, P - len(p) :] = p, True
    N = len(prompts) * G
    cid = torch.randint(3, V, (N, T), generator=gen)
    ends = torch.randint(0, T, (N,), generator=gen)
    ends[1] = T  # no EOS: truncated row
    cm = torch.zeros(N, T, dtype=torch.bool)
    for i, e in enumerate(ends.tolist()):
        if e < T:
            cid[i, e] = 2
        cm[i, : min(e + 1, T)] = True
    adv = torch.randn(N, generator=gen)
    batch = Experience.grouped(pid.repeat_interleave(G, 0), pm.repeat_interleave(G, 0), cid, cm, G)
    return batch, adv


def _shared_prompt_only(model):
    """A copy of ``model`` under the cpu backend with its fused ops taken out again: its log-probs
    take the cpu backend's shared-prompt forward on the model's own modules and logits."""
    from grpokit.backends.cpu.fused import remove_fused_ops

    model = copy.deepcopy(model)
    install_backend(model, "cpu", announce=False)
    remove_fused_ops(model)
    assert backend_of(model) == "cpu"
    return model


def _cpu_copy(model):
    model = copy.deepcopy(model)
    install_backend(model, "cpu", announce=False)
    return model


def _loss_and_grads(model, batch, adv, ref_logp, **kw):
    model.zero_grad(set_to_none=True)
    logp, ent = completion_logprobs(model, batch, temperature=0.7, with_entropy=True, **kw)
    loss, _ = algo.policy_loss(
        logp,
        logp.detach(),
        adv,
        batch.completion_mask,
        algo.LossConfig(beta=0.04),
        ref_logp=ref_logp,
        num_sequences=len(batch),
        num_tokens=int(batch.completion_mask.sum()),
    )
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent, loss.detach(), grads


@pytest.mark.parametrize("G", [2, 4])
def test_shared_prompt_equals_plain_logprobs_loss_and_grads(make_tiny_model, G):
    model = make_tiny_model(vocab_size=V, pad_token_id=0)
    ref = make_tiny_model(vocab_size=V, pad_token_id=0, seed=1).requires_grad_(False)
    batch, adv = _grouped_batch(G=G)
    # the reference pass (no grad, micro-batches that split the groups) agrees too
    ref_plain = batch_logprobs(ref, batch, temperature=0.7, micro_batch_size=3)
    ref_fast = batch_logprobs(_shared_prompt_only(ref), batch, temperature=0.7, micro_batch_size=3)
    torch.testing.assert_close(ref_fast, ref_plain)

    plain = _loss_and_grads(model, batch, adv, ref_plain)
    fast_model = _shared_prompt_only(model)
    fast = _loss_and_grads(fast_model, batch, adv, ref_plain, share_prompt=True)
    for a, b in zip(fast[:3], plain[:3]):
        torch.testing.assert_close(a, b)
    assert plain[3].keys() == fast[3].keys() and len(plain[3]) == len(list(model.parameters()))
    assert all(p.grad is not None for p in fast_model.parameters())  # the aliases added into .grad
    for name in plain[3]:
        torch.testing.assert_close(fast[3][name], plain[3][name], msg=name)


def test_shared_prompt_matches_plain_in_micro_batches_of_the_trainer(make_tiny_model):
    # The trainer's micro-batches are Experience.rows(slice): padding columns cut, groups split anywhere.
    model = make_tiny_model(vocab_size=V, pad_token_id=0)
    fast_model = _shared_prompt_only(model)
    batch, _ = _grouped_batch(G=3, seed=3)
    for sl in (slice(0, 2), slice(1, 5), slice(3, 6)):
        sub = batch.rows(sl)
        with torch.no_grad():
            a, _ = completion_logprobs(fast_model, sub, temperature=1.0, share_prompt=True)
            b, _ = completion_logprobs(model, sub, temperature=1.0)
        torch.testing.assert_close(a, b)


def test_shared_prompt_falls_back_when_no_prompt_repeats(make_tiny_model, monkeypatch):
    import grpokit.backends.cpu.shared_prompt as shared

    model = _shared_prompt_only(make_tiny_model(vocab_size=V, pad_token_id=0))
    batch, _ = _grouped_batch(G=1)
    called = []
    monkeypatch.setattr(shared, "dynamic_prefix_cache", lambda m: called.append(m))
    with torch.no_grad():
        a, _ = completion_logprobs(model, batch, temperature=1.0)
    assert called == []  # decided before any cache is built
    with torch.no_grad():
        b, _ = completion_logprobs(model, batch, temperature=1.0, share_prompt=False)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    batch, _ = _grouped_batch(G=2)  # and with repeated prompts the shared path is taken
    with torch.no_grad():
        completion_logprobs(model, batch, temperature=1.0)
    assert called == [model]


def test_distinct_rows_ignores_padding_and_keeps_first_appearance_order():
    ids = torch.tensor([[0, 7, 8], [0, 5, 6], [9, 7, 8], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1]]).bool()
    first, inverse = distinct_rows(ids, mask)
    assert first.tolist() == [0, 1]  # row 2 equals row 0 under its padding
    assert inverse.tolist() == [0, 1, 0, 1]


# -- generation: prefill once per distinct prompt -------------------------------------------------

MANY_EOS = list(range(0, 49152, 5))  # ~20% of sampled ids end a completion (tiny model is ~uniform)


#: the cpu backend's generation switches (packed weights on by default in each)
FAST_GENERATION = [
    dict(share_prompt=True, static_cache=False),
    dict(share_prompt=False, static_cache=True),
    dict(share_prompt=True, static_cache=True),
]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_generation_samples_the_same_tokens(tiny_model, smollm2_tokenizer, smollm2_prompts, seed):
    from grpokit.rollout import SamplingParams, generate_rollouts

    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=10)
    prompts = smollm2_prompts + ["The cat sat on"]  # three lengths: left padding differs by row
    cpu_model = _cpu_copy(tiny_model)
    for chunk in (None, 4):  # chunk 4 splits a group across generate calls
        plain = generate_rollouts(
            tiny_model, smollm2_tokenizer, prompts, 3, params, eos_token_ids=MANY_EOS, seed=seed, chunk_size=chunk
        )
        assert plain.completion_mask.sum(1).min() < plain.completion_ids.shape[1]  # some rows stopped early
        for kw in FAST_GENERATION:
            fast = generate_rollouts(
                cpu_model,
                smollm2_tokenizer,
                prompts,
                3,
                params,
                eos_token_ids=MANY_EOS,
                seed=seed,
                chunk_size=chunk,
                **kw,
            )
            assert torch.equal(fast.completion_ids, plain.completion_ids), kw
            assert fast.completions == plain.completions and torch.equal(fast.completion_mask, plain.completion_mask)


def test_fast_generation_greedy_equals_plain(tiny_model, smollm2_tokenizer, smollm2_prompts):
    from grpokit.rollout import SamplingParams, generate_rollouts

    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    plain = generate_rollouts(tiny_model, smollm2_tokenizer, smollm2_prompts, 2, params, eos_token_ids=[2, 0])
    cpu_model = _cpu_copy(tiny_model)
    for kw in FAST_GENERATION:
        fast = generate_rollouts(cpu_model, smollm2_tokenizer, smollm2_prompts, 2, params, eos_token_ids=[2, 0], **kw)
        assert torch.equal(fast.completion_ids, plain.completion_ids), kw


def test_fast_paths_are_taken(tiny_model, smollm2_tokenizer, smollm2_prompts, monkeypatch):
    """Under the cpu backend generation really hands generate a prefilled StaticCache and runs the
    packed weights (no silent fallback); under plain (none installed) neither happens."""
    from transformers import StaticCache

    import grpokit.backends.cpu.generation as generation
    import grpokit.backends.cpu.packed as packed
    import grpokit.rollout.hf as hf

    seen, packs = [], []
    orig, orig_pack = generation.prefix_cache, packed.packed_linear_weights

    def spy(*a, **kw):
        cache = orig(*a, **kw)
        seen.append((type(cache).__name__, int(cache.get_seq_length()) if cache is not None else None))
        return cache

    monkeypatch.setattr(generation, "prefix_cache", spy)
    monkeypatch.setattr(packed, "packed_linear_weights", lambda *a: packs.append(1) or orig_pack(*a))
    params = hf.SamplingParams(temperature=1.0, max_new_tokens=4)
    hf.generate_rollouts(tiny_model, smollm2_tokenizer, smollm2_prompts, 3, params, eos_token_ids=[2, 0], seed=0)
    assert seen == [] and packs == []  # plain: generate as it comes
    r = hf.generate_rollouts(
        _cpu_copy(tiny_model), smollm2_tokenizer, smollm2_prompts, 3, params, eos_token_ids=[2, 0], seed=0
    )
    P = r.prompt_ids.shape[1]
    assert seen == [(StaticCache.__name__, P - 1)]  # prefix of every row already in, written once per prompt
    assert packs == [1]


def test_bf16_sampler_follows_the_models_weights(tiny_model, smollm2_tokenizer, smollm2_prompts):
    """sampler_dtype=bf16 samples from a bf16 copy that is refreshed from the current weights."""
    from grpokit.rollout import SamplingParams, generate_rollouts
    from grpokit.rollout.sampler_copy import sampler_copy

    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    run = lambda **kw: generate_rollouts(
        tiny_model,
        smollm2_tokenizer,
        smollm2_prompts,
        2,
        params,  # noqa: E731
        eos_token_ids=[2, 0],
        **kw,
    )
    a = run(sampler_dtype=torch.bfloat16)
    copy = sampler_copy(tiny_model, torch.bfloat16)
    assert copy is not tiny_model and all(p.dtype == torch.bfloat16 for p in copy.parameters())
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())  # the policy is untouched
    with torch.no_grad():  # a large change of the policy must reach the sampler
        tiny_model.lm_head.weight.mul_(-1.0)
    b = run(sampler_dtype=torch.bfloat16)
    c = run()
    assert sampler_copy(tiny_model, torch.bfloat16) is copy  # made once, refreshed in place
    torch.testing.assert_close(copy.lm_head.weight.float(), tiny_model.lm_head.weight, atol=0, rtol=2**-8)
    assert not torch.equal(a.completion_ids, b.completion_ids)
    assert (b.completion_ids == c.completion_ids).float().mean() > 0.5  # bf16 rounding may flip near-ties


def test_gradient_checkpointing_recomputes_and_keeps_loss_and_grads(make_tiny_model, monkeypatch):
    """model.gradient_checkpointing: the layers are checkpointed although the model stays in eval()
    (transformers only checkpoints layers in training mode), the shared-prompt path steps aside,
    and log-probs, loss and gradients equal the plain path's."""
    import torch.utils.checkpoint as cp

    from grpokit.models.logprobs import checkpointing_active, enable_gradient_checkpointing

    plain_model = make_tiny_model(vocab_size=V, pad_token_id=0)
    model = _shared_prompt_only(plain_model)
    batch, adv = _grouped_batch(G=3)
    ref_logp = torch.zeros(batch.completion_ids.shape)
    plain = _loss_and_grads(plain_model, batch, adv, ref_logp)
    n_layers = model.config.num_hidden_layers
    assert enable_gradient_checkpointing(model) == n_layers
    assert not model.training and not any(
        m.training for m in model.model.layers[0].modules() if m is not model.model.layers[0]
    )
    assert checkpointing_active(model)
    with torch.no_grad():
        assert not checkpointing_active(model)
    calls = []
    real = cp.checkpoint

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    for layer in model.model.layers:
        monkeypatch.setattr(layer, "_gradient_checkpointing_func", lambda *a, **kw: spy(*a, use_reentrant=False, **kw))
    ckpt = _loss_and_grads(model, batch, adv, ref_logp, share_prompt=True)
    assert len(calls) == n_layers  # one checkpointed call per layer (one plain forward)
    for a, b in zip(ckpt[:3], plain[:3]):
        torch.testing.assert_close(a, b)
    for name in plain[3]:
        torch.testing.assert_close(ckpt[3][name], plain[3][name], msg=name)
