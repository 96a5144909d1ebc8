"""The fused head (:func:`grpokit.backends.cpu.ops.linear_token_logprobs`) keeps the precision of
the plain path (issue 29, item 2): log-probs and entropies of sharply peaked distributions (logits
of 20-45, the top one 8-16 above the rest) within ~1e-6 of float64, over several vocabulary blocks whose running
maximum moves, and equal to :func:`grpokit.algo.token_logprobs` / :func:`grpokit.algo.token_entropy`.
"""

from __future__ import annotations

import pytest
import torch

import grpokit.backends.cpu.ops as ops
from grpokit.algo import token_entropy, token_logprobs
from grpokit.backends.cpu.ops import linear_token_logprobs


def _peaked(seed: int = 0, rows: int = 4, t: int = 6, v: int = 96) -> torch.Tensor:
    """Logits of magnitude 20-45 whose top logit stands 8-16 above the rest (entropy ~1e-5..1e-1)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, t, v, generator=gen) + 20 + 10 * torch.rand(rows, t, 1, generator=gen)
    top = torch.randint(0, v, (rows, t), generator=gen)
    z.scatter_add_(-1, top[..., None], 8 + 8 * torch.rand(rows, t, 1, generator=gen))
    return z


def _float64_entropy(z: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(z.double(), -1)
    return -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_logprobs_and_entropy_of_peaked_logits_match_float64_and_the_plain_path(monkeypatch, temperature):
    monkeypatch.setattr(ops, "_MIN_BLOCK", 1)
    monkeypatch.setattr(ops, "_CHUNK_ELEMENTS", 24 * 10)  # 24 positions: blocks of 10 of the 96 columns
    z = _peaked() * temperature  # the distribution at τ is that of _peaked()
    v = z.shape[-1]
    weight = torch.eye(v)  # hidden @ I = hidden exactly: the logits are z
    ids = z.argmax(-1)  # a peaked distribution's sampled token: log-prob near 0
    ids[:, 0] = 0  # and some unlikely ones
    hidden = z.clone().requires_grad_()
    logp, ent = linear_token_logprobs(hidden, weight, ids, temperature=temperature, with_entropy=True)
    logp.sum().backward()
    z64 = z.double() / temperature
    want_lp = torch.log_softmax(z64, -1).gather(-1, ids[..., None]).squeeze(-1)
    # the old online form, lse = max + log Σ, then lse − Σ p·z: ~2e-6 (log-prob), ~2e-5 (entropy) off
    torch.testing.assert_close(logp.detach().double(), want_lp, rtol=1e-7, atol=2e-7)
    torch.testing.assert_close(ent.double(), _float64_entropy(z64), rtol=0, atol=1e-6)
    torch.testing.assert_close(logp.detach(), token_logprobs(z, ids, temperature=temperature), rtol=1e-7, atol=2e-7)
    torch.testing.assert_close(ent, token_entropy(z, temperature=temperature), rtol=0, atol=1e-6)
    # the backward's softmax in the same form: d logp / d z = (onehot − p) / τ (hidden @ I = z)
    want_grad = (torch.nn.functional.one_hot(ids, v).double() - torch.softmax(z64, -1)) / temperature
    torch.testing.assert_close(hidden.grad.double(), want_grad, rtol=0, atol=3e-7)


def test_fused_entropy_with_ties_at_the_maximum_across_blocks(monkeypatch):
    monkeypatch.setattr(ops, "_MIN_BLOCK", 1)
    monkeypatch.setattr(ops, "_CHUNK_ELEMENTS", 4)  # 1 position: blocks of 4 columns
    z = torch.full((1, 1, 12), -30.0)
    z[0, 0, [1, 6, 11]] = 10.0  # three equal maxima in three blocks: entropy log 3 (+ a tiny tail)
    logp, ent = linear_token_logprobs(z, torch.eye(12), torch.tensor([[6]]), with_entropy=True)
    torch.testing.assert_close(ent.double(), _float64_entropy(z), rtol=0, atol=1e-6)
    want = torch.log_softmax(z.double(), -1)[0, 0, 6]
    torch.testing.assert_close(logp.double()[0, 0], want, rtol=0, atol=2e-7)
