"""Per-row seeds of the hf engine's inverse-CDF sampler: row ``(b, g)`` of a call draws its uniform
numbers from ``request_seed(seed, first_prompt + b, g)`` alone, so a batch split across calls
(chunks, or the ranks of a data-parallel run) samples the rows of one call over the whole batch.
Tiny random Llama + the real SmolLM2 tokenizer, on the ``plain`` and ``cpu`` backends."""

from __future__ import annotations

import copy

import pytest
import torch

from grpokit.backends import install_backend
from grpokit.rollout import SamplingParams, generate_rollouts
from grpokit.rollout.engine import request_seed
from grpokit.rollout.hf_engine import HFRolloutEngine
from grpokit.rollout.sampling import InverseCDFSampler, request_uniforms

# Four plain prompts of 4 tokens each: a split batch is left-padded exactly as the whole one.
PROMPTS = ["The cat sat on", "A dog ran to", "My hat is on", "One two three four"]
MANY_EOS = list(range(0, 49152, 5))  # ~20% of sampled ids end a completion (tiny model is ~uniform)
G = 3


def _model(tiny_model, backend):
    model = copy.deepcopy(tiny_model)
    install_backend(model, backend, announce=False)
    return model


def _padded(ids: torch.Tensor, T: int, pad: int) -> torch.Tensor:
    return torch.nn.functional.pad(ids, (0, T - ids.shape[1]), value=pad)


def _assert_same_rows(parts, whole, pad):
    """``parts`` (experiences of consecutive slices of the batch), concatenated, are ``whole``'s rows."""
    T = whole.completion_ids.shape[1]
    ids = torch.cat([_padded(p.completion_ids, T, pad) for p in parts])
    assert torch.equal(ids, whole.completion_ids)
    assert torch.equal(torch.cat([p.truncated for p in parts]), whole.truncated)
    assert [c for p in parts for c in p.completions] == whole.completions
    assert torch.equal(torch.cat([p.prompt_ids for p in parts]), whole.prompt_ids)


def test_prompts_have_one_length(smollm2_tokenizer):
    from grpokit.models.loading import encode_prompts

    assert len({len(x) for x in encode_prompts(smollm2_tokenizer, PROMPTS)}) == 1


@pytest.mark.parametrize("backend", ["plain", "cpu"])
@pytest.mark.parametrize("chunk_size", [None, 2])  # 2: chunks cut through groups (G = 3)
def test_split_batch_samples_the_rows_of_one_call(tiny_model, smollm2_tokenizer, backend, chunk_size):
    model = _model(tiny_model, backend)
    engine = HFRolloutEngine(model, smollm2_tokenizer, eos_token_ids=MANY_EOS, chunk_size=chunk_size)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    whole = engine.generate(PROMPTS, G, params, 5)
    assert whole.completion_mask.sum(1).min() < whole.completion_ids.shape[1]  # some rows stopped early
    assert len({tuple(r) for r in whole.completion_ids.tolist()}) == len(whole)  # every row its own draws
    head = engine.generate(PROMPTS[:2], G, params, 5, first_prompt=0)
    tail = engine.generate(PROMPTS[2:], G, params, 5, first_prompt=2)
    _assert_same_rows([head, tail], whole, smollm2_tokenizer.pad_token_id)
    three = [engine.generate(PROMPTS[i : i + k], G, params, 5, first_prompt=i) for i, k in ((0, 1), (1, 2), (3, 1))]
    _assert_same_rows(three, whole, smollm2_tokenizer.pad_token_id)
    # without its offset the tail is sampled as prompts 0, 1: other draws
    unshifted, pad = engine.generate(PROMPTS[2:], G, params, 5), smollm2_tokenizer.pad_token_id
    assert not torch.equal(_padded(unshifted.completion_ids, 8, pad), _padded(tail.completion_ids, 8, pad))


@pytest.mark.parametrize("backend", ["plain", "cpu"])
def test_chunk_size_does_not_change_the_rows(tiny_model, smollm2_tokenizer, backend):
    model = _model(tiny_model, backend)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    run = lambda chunk: generate_rollouts(
        model,
        smollm2_tokenizer,
        PROMPTS,
        G,
        params,  # noqa: E731
        eos_token_ids=MANY_EOS,
        seed=9,
        first_prompt=4,
        chunk_size=chunk,
    )
    whole = run(None)
    for chunk in (G, 2, 5):
        r = run(chunk)
        assert torch.equal(r.completion_ids, whole.completion_ids), chunk
        assert r.completions == whole.completions


# -- the table of uniform numbers: a hand check --------------------------------------------------

K0, K = 1000, 1024  # live ids K0 … K0+K-1, equally likely: token = K0 + floor(K·u), exactly (K a power of 2)


def _uniform_over_k_ids(model):
    """Make the model's logits 0 on ids K0 … K0+K-1 and -inf elsewhere (a forward hook on the LM head)."""

    def hook(module, args, out):
        live = torch.full((out.shape[-1],), float("-inf"), dtype=out.dtype, device=out.device)
        live[K0 : K0 + K] = 0.0
        return live.expand_as(out).clone()

    return model.lm_head.register_forward_hook(hook)


@pytest.mark.parametrize("backend", ["plain", "cpu"])
def test_row_draws_its_uniforms_from_its_request_seed(tiny_model, smollm2_tokenizer, backend):
    model = _model(tiny_model, backend)
    _uniform_over_k_ids(model)
    steps, seed, first = 5, 21, 3
    params = SamplingParams(temperature=1.0, max_new_tokens=steps)
    for chunk in (None, 2):
        r = generate_rollouts(
            model,
            smollm2_tokenizer,
            PROMPTS[:2],
            G,
            params,
            eos_token_ids=[2],
            seed=seed,
            first_prompt=first,
            chunk_size=chunk,
        )
        assert r.completion_ids.shape == (2 * G, steps)
        for b in range(2):
            for g in range(G):
                gen = torch.Generator().manual_seed(request_seed(seed, first + b, g))
                u = torch.rand(steps, dtype=torch.float64, generator=gen)  # (steps,)
                row = r.completion_ids[b * G + g]
                assert int(row[0]) == K0 + int(u[0] * K), (b, g)  # the first drawn uniform
                assert row.tolist() == (K0 + (u * K).long()).tolist(), (b, g)  # step k: the k-th uniform


def test_request_uniforms_rows():
    t = request_uniforms(4, 2, 3, 2, 6)
    assert t.shape == (6, 6) and t.dtype == torch.float64
    for b in range(3):
        for g in range(2):
            gen = torch.Generator().manual_seed(request_seed(4, 2 + b, g))
            assert torch.equal(t[b * 2 + g], torch.rand(6, dtype=torch.float64, generator=gen))


# -- the sampler's call counter: one call per decode step, all rows of the chunk ------------------


@pytest.mark.parametrize("backend", ["plain", "cpu"])
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_sampler_is_called_once_per_decode_step_with_every_row(
    tiny_model, smollm2_tokenizer, monkeypatch, backend, chunk_size
):
    """The k-th call of a chunk's sampler is its k-th decode step (the counter picks column k of the
    table): one call per step with all rows of the chunk (finished rows included), input growing by
    one token per call, as many calls as the chunk's completion length."""
    calls: dict[InverseCDFSampler, list[tuple[int, int]]] = {}  # keyed by the sampler (kept alive)
    real = InverseCDFSampler.__call__

    def spy(self, input_ids, scores):
        calls.setdefault(self, []).append((scores.shape[0], input_ids.shape[1]))
        return real(self, input_ids, scores)

    monkeypatch.setattr(InverseCDFSampler, "__call__", spy)
    model = _model(tiny_model, backend)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    r = generate_rollouts(
        model, smollm2_tokenizer, PROMPTS, G, params, eos_token_ids=MANY_EOS, seed=2, chunk_size=chunk_size
    )
    N, P = r.prompt_ids.shape
    rows = N if chunk_size is None else chunk_size
    lengths = r.completion_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows finish at different steps
    per_sampler = list(calls.values())
    assert len(per_sampler) == -(-N // rows)  # one sampler per generate call
    for i, seen in enumerate(per_sampler):
        n = min(rows, N - i * rows)
        T = int(lengths[i * rows : i * rows + n].max())
        assert seen == [(n, P + k) for k in range(T)], i


def test_sampler_refuses_a_table_that_does_not_fit():
    proc = InverseCDFSampler(temperature=1.0, uniforms=torch.rand(3, 2, dtype=torch.float64))
    scores, ids = torch.zeros(3, 8), torch.zeros(3, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="called with 2 rows, but its uniforms table has 3"):
        proc(ids[:2], scores[:2])
    proc(ids, scores)
    proc(ids, scores)
    with pytest.raises(ValueError, match="call 3 but the uniforms table has 2 columns"):
        proc(ids, scores)
    with pytest.raises(ValueError, match=r"uniforms must be \(N, max_new_tokens\)"):
        InverseCDFSampler(temperature=1.0, uniforms=torch.rand(3))


# -- first_prompt is checked -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1.0, "2", True, None])
def test_bad_first_prompt_is_refused(tiny_model, smollm2_tokenizer, bad):
    params = SamplingParams(temperature=1.0, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"first_prompt must be an int >= 0, got "):
        generate_rollouts(
            tiny_model, smollm2_tokenizer, PROMPTS, 2, params, eos_token_ids=[2], seed=0, first_prompt=bad
        )
    engine = HFRolloutEngine(tiny_model, smollm2_tokenizer, eos_token_ids=[2])
    with pytest.raises(ValueError, match=r"first_prompt must be an int >= 0, got "):
        engine.generate(PROMPTS, 2, params, 0, first_prompt=bad)
