"""grpokit.algo.support: the kept sets of a truncating sampler, in ids or bits form, and the
log-probs and entropies renormalized over them (sampling replay)."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.algo import support as sup
from grpokit.algo import token_entropy, token_logprobs


def _random_kept(shape, vocab, sizes, seed=0) -> torch.Tensor:
    """``(*shape, vocab)`` bool with ``sizes`` (one per position, flattened) kept ids chosen at random."""
    gen = torch.Generator().manual_seed(seed)
    kept = torch.zeros(math.prod(shape), vocab, dtype=torch.bool)
    for i, k in enumerate(sizes):
        kept[i, torch.randperm(vocab, generator=gen)[:k]] = True
    return kept.view(*shape, vocab)


@pytest.mark.parametrize("vocab", [64, 100, 1000])
@pytest.mark.parametrize("sizes", [[1, 2, 0, 3, 1, 2], [1, 40, 0, 3, 60, 2], [64, 64, 1, 1, 0, 9]])
def test_either_form_gives_back_the_mask(vocab, sizes):
    kept = _random_kept((2, 3), vocab, [min(k, vocab) for k in sizes])
    s = sup.from_mask(kept)
    k_max = max(min(k, vocab) for k in sizes)
    # the smaller form: ids while 4 bytes each are fewer than the ceil(V / 8) bytes of bits
    assert sup.is_ids(s) == (4 * k_max < -(-vocab // 8))
    assert s.shape[:2] == (2, 3)
    empty = ~kept.any(-1)
    want = kept | empty.unsqueeze(-1)  # an empty position is not truncated: every token
    assert torch.equal(sup.to_mask(s, 0, vocab), want)
    assert torch.equal(sup.to_mask(s, 7, 51), want[..., 7:51])  # a block of the vocabulary
    assert torch.equal(sup.restricted(s), ~empty)
    assert sup.sizes(s).tolist() == kept.sum(-1).tolist()
    bits = sup.to_bits(s, -(-vocab // 8))
    assert not sup.is_ids(bits) and torch.equal(sup.to_mask(bits, 0, vocab), want)
    ids = torch.randint(0, vocab, (2, 3))
    assert torch.equal(sup.contains(s, ids), want.gather(-1, ids.unsqueeze(-1)).squeeze(-1))
    assert torch.equal(sup.contains(bits, ids), sup.contains(s, ids))


def test_bits_are_little_endian_within_a_byte():
    # token v is bit v % 8 of byte v // 8: {0, 3} -> 1 + 8 = 9; {9} -> 2 in byte 1; V = 10 -> 2 bytes
    kept = torch.zeros(1, 10, dtype=torch.bool)
    kept[0, [0, 3, 9]] = True
    assert sup.pack_bits(kept).tolist() == [[9, 2]]


def test_unify_pads_ids_or_turns_every_part_into_bits():
    a = torch.tensor([[3, -1]], dtype=torch.int32)  # {3}
    b = torch.tensor([[1, 2, 5]], dtype=torch.int32)  # {1, 2, 5}
    ua, ub = sup.unify([a, b])
    assert ua.tolist() == [[3, -1, -1]] and ub.tolist() == [[1, 2, 5]]
    bits = sup.pack_bits(torch.tensor([[False, True] + [False] * 14]))  # {1}, V = 16: 2 bytes
    empty = torch.tensor([[-1, -1]], dtype=torch.int32)
    u = sup.unify([a, bits, empty])
    assert all(p.dtype == torch.uint8 and p.shape == (1, 2) for p in u)
    assert [sup.to_mask(p, 0, 16)[0].nonzero().flatten().tolist() for p in u[:2]] == [[3], [1]]
    assert not bool(sup.restricted(u[2]).any())  # an empty position stays empty as bits
    with pytest.raises(ValueError, match="widths"):
        sup.unify([bits, torch.zeros(1, 3, dtype=torch.uint8)])
    with pytest.raises(ValueError, match="does not fit"):
        sup.to_bits(torch.tensor([[16]], dtype=torch.int32), 2)


def test_pad_and_clear_make_empty_positions():
    s = torch.tensor([[[4, -1], [2, 3]]], dtype=torch.int32)  # (1, 2, 2)
    padded = sup.pad_positions(s, 4)
    assert padded.shape == (1, 4, 2) and sup.restricted(padded).tolist() == [[True, True, False, False]]
    cleared = sup.cleared(s, torch.tensor([[False, True]]))
    assert cleared.tolist() == [[[4, -1], [-1, -1]]] and s.tolist() == [[[4, -1], [2, 3]]]
    with pytest.raises(ValueError, match="int32 \\(ids\\) or uint8 \\(bits\\)"):
        sup.restricted(s.long())


def test_replayed_logprob_by_hand():
    # logits [ln 4, ln 2, ln 1, ln 1] at τ = 1: softmax (4, 2, 1, 1)/8. Kept set {0, 1}:
    # log π_S(1) = ln(2 / (4 + 2)) = −ln 3; over the full vocabulary it is ln(2 / 8) = −ln 4.
    logits = torch.tensor([[[math.log(4), math.log(2), 0.0, 0.0]]])
    ids = torch.tensor([[1]])
    support = torch.tensor([[[0, 1]]], dtype=torch.int32)
    got = token_logprobs(logits, ids, support=support)
    torch.testing.assert_close(got, torch.tensor([[-math.log(3)]]), rtol=0, atol=1e-6)
    full = token_logprobs(logits, ids)
    torch.testing.assert_close(full, torch.tensor([[-math.log(4)]]), rtol=0, atol=1e-6)
    # τ = 2: z = logits / 2 -> weights (2, √2, 1, 1): log π_S(1) = ln(√2 / (2 + √2))
    got2 = token_logprobs(logits, ids, temperature=2.0, support=support)
    torch.testing.assert_close(got2, torch.tensor([[math.log(math.sqrt(2) / (2 + math.sqrt(2)))]]), rtol=0, atol=1e-6)
    # the entropy of π_S = (2/3, 1/3): −(2/3 ln 2/3 + 1/3 ln 1/3)
    h = token_entropy(logits, support=support)
    want_h = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    torch.testing.assert_close(h, torch.tensor([[want_h]]), rtol=0, atol=1e-6)


def test_an_empty_support_leaves_log_probs_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 7, 300, generator=gen) * 5  # more rows than one chunk of token_logprobs
    ids = torch.randint(0, 300, (10, 7), generator=gen)
    empty = torch.full((10, 7, 3), -1, dtype=torch.int32)
    for temperature in (1.0, 0.7):
        assert torch.equal(
            token_logprobs(logits, ids, temperature=temperature, support=empty),
            token_logprobs(logits, ids, temperature=temperature),
        )
        assert torch.equal(
            token_entropy(logits, temperature=temperature, support=empty),
            token_entropy(logits, temperature=temperature),
        )


@pytest.mark.parametrize("form", ["ids", "bits"])
def test_gradient_is_zero_outside_the_support_and_the_softmax_over_it_inside(form):
    gen = torch.Generator().manual_seed(1)
    n, t, v, tau = 3, 4, 2000, 0.7
    logits = (torch.randn(n, t, v, generator=gen) * 3).requires_grad_()
    kept = _random_kept((n, t), v, [1, 5, 17, 40] * 3, seed=2)
    ids = torch.multinomial(kept.view(-1, v).float(), 1, generator=gen).view(n, t)  # a kept token each
    s = sup.pack_ids(kept) if form == "ids" else sup.pack_bits(kept)
    g = torch.randn(n, t, generator=gen)
    (token_logprobs(logits, ids, temperature=tau, support=s) * g).sum().backward()
    grad = logits.grad
    assert grad is not None
    assert bool((grad[~kept] == 0).all())  # exactly 0 outside the kept set
    z = (logits.detach() / tau).masked_fill(~kept, float("-inf"))
    p = torch.softmax(z, -1)  # π renormalized over the set
    want = (torch.nn.functional.one_hot(ids, v) - p) * g.unsqueeze(-1) / tau
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)
    # the entropy's gradient: also exactly 0 outside the set
    logits.grad = None
    (token_entropy(logits, temperature=tau, differentiable=True, support=s) * g).sum().backward()
    assert bool((logits.grad[~kept] == 0).all()) and bool(torch.isfinite(logits.grad).all())


def test_a_token_outside_its_support_is_refused():
    support = torch.tensor([[[0, 1]]], dtype=torch.int32)
    with pytest.raises(ValueError, match="token 2 at row 0, position 0 is outside the support"):
        token_logprobs(torch.zeros(1, 1, 4), torch.tensor([[2]]), support=support)
    with pytest.raises(ValueError, match="support \\(N, T, W\\)"):
        token_logprobs(torch.zeros(1, 1, 4), torch.tensor([[0]]), support=support[0])
