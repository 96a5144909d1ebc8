"""``grpokit.backends.cpu.ops``: the memory-lean autograd functions equal the plain PyTorch expressions.

Gradients are checked with ``torch.autograd.gradcheck`` in float64 (finite differences, so a wrong
backward formula fails whatever the forward does), values against the plain expression, and the
bytes each keeps for the backward against plain autograd's (the point of the functions).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import grpokit.backends.cpu.ops as ops
from grpokit.algo import token_entropy, token_logprobs
from grpokit.backends.cpu.ops import embedding, linear_token_logprobs, rms_norm, swiglu_mlp
from support.helpers import saved_bytes


def _rand(*shape, dtype=torch.float64, seed=0, grad=True):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return t.requires_grad_(grad)


def _plain_rms_norm(x, w, eps):  # transformers' LlamaRMSNorm.forward
    h = x.to(torch.float32) if x.dtype != torch.float64 else x
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _plain_mlp(x, wg, wu, wd):  # transformers' LlamaMLP.forward
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def test_rms_norm_gradcheck_and_values():
    x, w = _rand(2, 3, 8), _rand(8, seed=1)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, 1e-6), (x, w))
    torch.testing.assert_close(rms_norm(x, w, 1e-6), _plain_rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("recompute", [True, False])
def test_swiglu_mlp_gradcheck_and_values(recompute):
    x = _rand(2, 3, 8)
    wg, wu, wd = _rand(5, 8, seed=1), _rand(5, 8, seed=2), _rand(8, 5, seed=3)
    assert torch.autograd.gradcheck(lambda *a: swiglu_mlp(*a, recompute=recompute), (x, wg, wu, wd))
    torch.testing.assert_close(swiglu_mlp(x, wg, wu, wd, recompute=recompute), _plain_mlp(x, wg, wu, wd))


def test_swiglu_mlp_keeping_gate_and_up_gives_the_recomputed_gradients_bit_for_bit():
    """recompute=False runs the same backward ops on the kept tensors (bf16: no tolerance)."""
    x = _rand(4, 16, 64, dtype=torch.bfloat16)
    wg, wu = ((0.1 * _rand(96, 64, seed=s, grad=False)).bfloat16().requires_grad_() for s in (1, 2))
    wd = (0.1 * _rand(64, 96, seed=3, grad=False)).bfloat16().requires_grad_()
    gout = _rand(4, 16, 64, seed=4, dtype=torch.bfloat16, grad=False)
    got = {}
    for recompute in (True, False):
        for t in (x, wg, wu, wd):
            t.grad = None
        y = swiglu_mlp(x, wg, wu, wd, recompute=recompute)
        y.backward(gout)
        got[recompute] = [y.detach()] + [t.grad for t in (x, wg, wu, wd)]
    for a, b in zip(got[True], got[False]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_sparse_gradient_equals_the_dense_one(padding_idx):
    """Duplicate ids sum into one row; the padding row gets nothing; the dense gradient F.embedding
    computes is the reference (float64, so summation order cannot matter)."""
    w = _rand(10, 6)
    ids = torch.tensor([[1, 3, 3, 7], [7, 7, 0, 3]])
    gout = _rand(2, 4, 6, seed=1, grad=False)
    out = embedding(ids, w, padding_idx)
    torch.testing.assert_close(out, F.embedding(ids, w, padding_idx), rtol=0, atol=0)
    out.backward(gout)
    sparse = w.grad
    w.grad = None
    F.embedding(ids, w, padding_idx).backward(gout)
    assert sparse.layout == torch.sparse_coo
    rows = sparse._indices()[0].tolist()  # one row per distinct id, the padding id left out
    assert sorted(rows) == sorted({0, 1, 3, 7} - {padding_idx})
    torch.testing.assert_close(sparse.to_dense(), w.grad)


def test_embedding_sums_repeated_bf16_rows_in_float32():
    """A token seen 300 times: its row's gradient is the float32 sum rounded once to bf16, closer
    to the exact sum than bf16 accumulation (F.embedding's dense backward)."""
    w = _rand(5, 64, dtype=torch.bfloat16)
    ids = torch.full((300,), 2)
    gout = _rand(300, 64, seed=1, dtype=torch.bfloat16, grad=False)
    embedding(ids, w).backward(gout)
    exact = gout.double().sum(0)
    got = w.grad.to_dense()[2]
    torch.testing.assert_close(got, exact.bfloat16(), rtol=0, atol=0)
    w.grad = None
    F.embedding(ids, w).backward(gout)
    assert (got.double() - exact).abs().max() <= (w.grad[2].double() - exact).abs().max()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_linear_token_logprobs_gradcheck_over_several_vocab_blocks(monkeypatch, temperature):
    monkeypatch.setattr(ops, "_MIN_BLOCK", 1)
    monkeypatch.setattr(ops, "_CHUNK_ELEMENTS", 24)  # 6 positions: blocks of 4, 4 and 3 of the 11 columns
    h, w = _rand(2, 3, 8), _rand(11, 8, seed=1)
    ids = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(2))
    assert torch.autograd.gradcheck(lambda h, w: linear_token_logprobs(h, w, ids, temperature=temperature)[0], (h, w))
    logp, ent = linear_token_logprobs(h, w, ids, temperature=temperature, with_entropy=True)
    logits = h @ w.t()
    # grpokit.algo's versions compute in float32
    torch.testing.assert_close(logp.float(), token_logprobs(logits, ids, temperature=temperature))
    torch.testing.assert_close(ent.float(), token_entropy(logits, temperature=temperature))
    assert logp.requires_grad and not ent.requires_grad


@pytest.mark.parametrize("form", ["ids", "bits"])
def test_linear_token_logprobs_replays_a_support_over_several_vocab_blocks(monkeypatch, form):
    """Sampling replay in the fused head: each vocabulary block's logits outside a row's kept set
    are -inf in the forward and the backward. Row 0 keeps ids in the last block only (the first
    blocks hold nothing of its set: its running maximum stays -inf until then), row 1 one id, row
    2 is empty (not truncated: the full vocabulary). Values, entropy and gradients (gradcheck in
    float64, entropy with its gradient too) against grpokit.algo's on the full logits."""
    from grpokit.algo import support as sup

    monkeypatch.setattr(ops, "_MIN_BLOCK", 1)
    monkeypatch.setattr(ops, "_CHUNK_ELEMENTS", 24)  # 6 positions: blocks of 4, 4 and 3 of the 11 columns
    h, w = _rand(2, 3, 8), _rand(11, 8, seed=1)
    kept = torch.zeros(2, 3, 11, dtype=torch.bool)
    kept[0, 0, [8, 10]] = True  # the last block (8, 9, 10) alone
    kept[0, 1, [3]] = True
    kept[1, 0, [0, 5, 9]] = True
    kept[1, 1, :] = True
    kept[1, 2, [1, 2, 4, 6, 7]] = True  # position (0, 2) stays empty
    ids = torch.tensor([[10, 3, 6], [5, 7, 4]])
    support = sup.pack_ids(kept) if form == "ids" else sup.pack_bits(kept)

    def fused(h, w):
        logp, ent = linear_token_logprobs(
            h, w, ids, temperature=0.7, with_entropy=True, entropy_grad=True, support=support
        )
        return logp, ent

    assert torch.autograd.gradcheck(fused, (h, w))
    logp, ent = fused(h, w)
    logits = h @ w.t()
    torch.testing.assert_close(logp.float(), token_logprobs(logits, ids, temperature=0.7, support=support))
    torch.testing.assert_close(ent.float(), token_entropy(logits, temperature=0.7, support=support))
    assert logp[0, 1].item() == 0.0  # a set of one token: log-prob 0
    # and not the full vocabulary's, which the empty position (0, 2) alone keeps
    full = token_logprobs(logits, ids, temperature=0.7)
    assert torch.equal((logp.float() - full).abs() > 1e-3, kept.any(-1) & ~kept.all(-1))
    with pytest.raises(ValueError, match="outside the support"):
        linear_token_logprobs(h, w, torch.tensor([[9, 3, 6], [5, 7, 4]]), support=support)


def test_bf16_values_and_gradients_match_plain_autograd():
    """In bf16 the forward values are the plain ones bit for bit (same ops, same order); gradients
    agree to bf16 rounding (the backward's float32 intermediates round at other places)."""
    x = _rand(4, 16, 64, dtype=torch.bfloat16)
    w = (1 + 0.1 * _rand(64, seed=1, grad=False)).to(torch.bfloat16).requires_grad_()
    wg, wu = ((0.1 * _rand(96, 64, seed=s, grad=False)).bfloat16().requires_grad_() for s in (2, 3))
    wd = (0.1 * _rand(64, 96, seed=4, grad=False)).bfloat16().requires_grad_()
    head = (0.1 * _rand(50, 64, seed=5, grad=False)).bfloat16().requires_grad_()
    ids = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(6))
    gout = torch.linspace(-1, 1, 4 * 16).view(4, 16)

    def run(norm, mlp, logp_fn):
        for t in (x, w, wg, wu, wd, head):
            t.grad = None
        h = norm(x, w, 1e-5)
        h = h + mlp(h, wg, wu, wd)
        lp = logp_fn(h)
        (lp * gout).sum().backward()
        return lp.detach(), [t.grad.float() for t in (x, w, wg, wu, wd, head)]

    fast = run(rms_norm, swiglu_mlp, lambda h: linear_token_logprobs(h, head, ids, temperature=0.7)[0])
    plain = run(_plain_rms_norm, _plain_mlp, lambda h: token_logprobs(F.linear(h, head), ids, temperature=0.7))
    torch.testing.assert_close(fast[0], plain[0], rtol=0, atol=0)
    for name, a, b in zip(("x", "w", "w_gate", "w_up", "w_down", "head"), fast[1], plain[1]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2 * float(b.abs().max()), msg=name)


def test_saved_bytes_are_smaller_than_plain_autograd():
    x = _rand(4, 16, 64, dtype=torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16, requires_grad=True)
    wg, wu = (_rand(96, 64, seed=s, dtype=torch.bfloat16) for s in (1, 2))
    wd = _rand(64, 96, seed=3, dtype=torch.bfloat16)
    head = _rand(500, 64, seed=4, dtype=torch.bfloat16)
    ids = torch.zeros(4, 16, dtype=torch.long)
    n = 4 * 16
    # RMSNorm: x itself (an input: not counted) and a float32 rstd per position vs rstd, float32 x, bf16 x̂
    assert saved_bytes(lambda: rms_norm(x, w, 1e-6), x, w) == n * 4
    assert saved_bytes(lambda: _plain_rms_norm(x, w, 1e-6), x, w) == n * 4 + n * 64 * (4 + 2)
    # MLP: nothing but its inputs vs gate, silu(gate), up and the product (bf16)
    assert saved_bytes(lambda: swiglu_mlp(x, wg, wu, wd), x, wg, wu, wd) == 0
    assert saved_bytes(lambda: swiglu_mlp(x, wg, wu, wd, recompute=False), x, wg, wu, wd) == 2 * n * 96 * 2  # gate, up
    assert saved_bytes(lambda: _plain_mlp(x, wg, wu, wd), x, wg, wu, wd) == 4 * n * 96 * 2
    # head: the (n,) float32 maximum and log-normalizer (the max-subtracted softmax of the
    # backward) vs the (n, V) logits and their float32 copy
    assert saved_bytes(lambda: linear_token_logprobs(x, head, ids), x, head, ids) == n * 4 * 2
    assert saved_bytes(lambda: token_logprobs(F.linear(x, head), ids), x, head, ids) >= n * 500 * 4


def test_linear_token_logprobs_errors():
    h, w, ids = torch.zeros(2, 3, 4), torch.zeros(7, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="linear_token_logprobs: hidden"):
        linear_token_logprobs(h, w, ids[:, :2])
    with pytest.raises(ValueError, match="linear_token_logprobs: weight"):
        linear_token_logprobs(h, w.bfloat16(), ids)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        linear_token_logprobs(h, w, ids, temperature=0.0)
