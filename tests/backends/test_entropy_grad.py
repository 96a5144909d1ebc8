"""The entropy bonus's gradient (``algo.entropy_coef``, issue 35) through both backends: the fused LM
head of the cpu backend (``linear_token_logprobs(entropy_grad=True)``) against finite differences
and :func:`grpokit.algo.token_entropy` (``differentiable=True``), and a whole tiny model's loss with
the bonus, plain against cpu: every parameter gradient. Without ``entropy_grad`` nothing changes: the
entropy has no gradient and costs no backward."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.models.test_policy_fast import V, _grouped_batch

import grpokit.backends.cpu.ops as ops
from grpokit import algo
from grpokit.backends import install_backend
from grpokit.backends.cpu.ops import linear_token_logprobs
from grpokit.models.logprobs import completion_logprobs


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_head_entropy_gradient_over_several_vocab_blocks(monkeypatch, temperature):
    monkeypatch.setattr(ops, "_MIN_BLOCK", 1)
    monkeypatch.setattr(ops, "_CHUNK_ELEMENTS", 24)  # 6 positions: blocks of 4, 4 and 3 of the 11 columns
    h, w = _rand(2, 3, 8, seed=0), _rand(11, 8, seed=1)
    ids = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(2))

    def both(h, w):
        return linear_token_logprobs(h, w, ids, temperature=temperature, with_entropy=True, entropy_grad=True)

    assert torch.autograd.gradcheck(both, (h, w))  # log-probs and entropy, each output's gradient
    logp, ent = both(h, w)
    assert ent.requires_grad
    logits = (h @ w.t()).detach().float().requires_grad_()
    plain = algo.token_entropy(logits, temperature=temperature, differentiable=True)
    torch.testing.assert_close(ent.detach().float(), plain.detach())
    g = torch.linspace(-1, 1, 6).view(2, 3)
    (plain * g).sum().backward()
    h.grad = w.grad = None
    (ent * g.double()).sum().backward()
    torch.testing.assert_close(w.grad.float(), logits.grad.view(-1, 11).t() @ h.detach().view(-1, 8).float())
    _, no_grad = linear_token_logprobs(h, w, ids, temperature=temperature, with_entropy=True)
    assert not no_grad.requires_grad  # as before: the logged entropy has none


def test_plain_and_cpu_backends_give_the_same_loss_and_gradients_with_the_bonus(make_tiny_model):
    model = make_tiny_model(vocab_size=V, pad_token_id=0)
    fast = copy.deepcopy(model)
    install_backend(fast, "cpu", announce=False)
    batch, adv = _grouped_batch(G=3)

    def loss_and_grads(m):
        m.zero_grad(set_to_none=True)
        logp, ent = completion_logprobs(m, batch, temperature=0.7, entropy_grad=True)
        assert ent is not None and ent.requires_grad
        loss, _ = algo.policy_loss(
            logp, logp.detach(), adv, batch.completion_mask, algo.LossConfig(entropy_coef=0.5), entropy=ent
        )
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    (plain_loss, plain), (fast_loss, fused) = loss_and_grads(model), loss_and_grads(fast)
    torch.testing.assert_close(fast_loss, plain_loss)
    assert plain.keys() == fused.keys() and len(plain) == len(list(model.parameters()))
    for name in plain:
        torch.testing.assert_close(fused[name], plain[name], msg=name)
    # the bonus is in those gradients: without it the head's gradient differs
    model.zero_grad(set_to_none=True)
    logp, _ = completion_logprobs(model, batch, temperature=0.7)
    algo.policy_loss(logp, logp.detach(), adv, batch.completion_mask)[0].backward()
    head = next(n for n in plain if "lm_head" in n or "embed_tokens" in n)
    assert not torch.allclose(dict(model.named_parameters())[head].grad, plain[head])
