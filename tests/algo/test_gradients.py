"""Gradients of the loss: k3, clipping, masking, and micro-batch accumulation == full batch."""

import pytest
import torch

from grpokit.algo import LossConfig, kl_penalty, policy_loss, token_logprobs

f64 = torch.float64


def test_k3_gradient_is_one_minus_ratio():
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(20, generator=gen, dtype=f64) * 4).requires_grad_()
    ref = -torch.rand(20, generator=gen, dtype=f64) * 4
    kl_penalty(logp, ref, "k3").sum().backward()
    torch.testing.assert_close(logp.grad, 1 - torch.exp(ref - logp.detach()))


def test_on_policy_gradient_is_minus_advantage_over_length():
    # mu = 1: old_logp = logp.detach(); ratio 1; d loss / d logp_it = -A_i / |o_i| / N
    logp = torch.zeros(2, 3, dtype=f64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([2.0, -1.0], dtype=f64), mask)
    loss.backward()
    want = torch.tensor([[-2 / 2 / 2, -2 / 2 / 2, 0.0], [1 / 3 / 2] * 3], dtype=f64)
    torch.testing.assert_close(logp.grad, want)


def test_clipped_side_has_zero_gradient_and_is_counted():
    # ratio 1.5 > 1.2 with A>0 (clipped high) and 0.5 < 0.8 with A<0 (clipped low); 1.1 unclipped.
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]], dtype=f64)).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 1.0]], dtype=f64)
    loss, st = policy_loss(logp, torch.zeros(1, 3, dtype=f64), adv, torch.ones(1, 3, dtype=torch.bool))
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == 0
    assert logp.grad[0, 2].item() == pytest.approx(-1.1 / 3)
    assert st.clip_frac_high.item() == pytest.approx(1 / 3)
    assert st.clip_frac_low.item() == pytest.approx(1 / 3)


def test_a_token_with_zero_advantage_is_never_counted_as_clipped():
    # ratios 0.5 and 1.5 are outside [0.8, 1.2] but A = 0 there: no objective to clip, so neither
    # clip fraction counts them; the token with A < 0 and ratio 0.5 is 1 of the 4 counted tokens.
    logp = torch.log(torch.tensor([[0.5, 1.5, 0.5, 1.0]], dtype=f64))
    adv = torch.tensor([[0.0, 0.0, -1.0, 1.0]], dtype=f64)
    _, st = policy_loss(logp, torch.zeros(1, 4, dtype=f64), adv, torch.ones(1, 4, dtype=torch.bool))
    assert st.clip_frac_low.item() == pytest.approx(1 / 4)
    assert st.clip_frac_high.item() == 0.0


def test_masked_tokens_get_zero_gradient_and_no_nan():
    logp = torch.full((3, 4), -1.0, dtype=f64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    ref = torch.full((3, 4), -2.0, dtype=f64)
    for agg in ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"):
        logp.grad = None
        loss, st = policy_loss(
            logp,
            logp.detach() + 0.1,
            torch.tensor([1.0, 5.0, -1.0], dtype=f64),
            mask,
            LossConfig(beta=0.1, aggregation=agg, max_completion_length=4),
            ref_logp=ref,
        )
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
        assert (logp.grad[~mask] == 0).all()
        assert (logp.grad[mask] != 0).all()


def test_all_empty_batch_is_finite_zero():
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, st = policy_loss(logp, logp.detach(), torch.ones(2), torch.zeros(2, 3, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(torch.stack(list(st.as_dict().values()))).all()


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("splits", [[6], [3, 3], [1, 2, 3], [4, 2]])
def test_micro_batches_sum_to_full_batch(aggregation, splits):
    """Loss and gradient through a tiny linear 'model': micro-batch sum == one big batch."""
    gen = torch.Generator().manual_seed(0)
    n, t, v, d = 6, 5, 11, 4
    x = torch.randn(n, t, d, generator=gen, dtype=f64)
    ids = torch.randint(0, v, (n, t), generator=gen)
    mask = torch.arange(t)[None, :] < torch.tensor([5, 0, 2, 3, 5, 1])[:, None]
    adv = torch.randn(n, generator=gen, dtype=f64)
    w0 = torch.randn(d, v, generator=gen, dtype=f64)
    old = token_logprobs(x @ w0, ids).double() + 0.05 * torch.randn(n, t, generator=gen, dtype=f64)
    ref = old - 0.1
    config = LossConfig(beta=0.04, aggregation=aggregation, max_completion_length=t)

    def run(chunks):
        w = w0.clone().requires_grad_()
        total = 0.0
        for sl in chunks:
            logp = token_logprobs(x[sl] @ w, ids[sl]).double()
            loss, _ = policy_loss(
                logp, old[sl], adv[sl], mask[sl], config, ref_logp=ref[sl], num_sequences=n, num_tokens=int(mask.sum())
            )
            loss.backward()
            total += loss.item()
        return total, w.grad

    bounds = torch.tensor([0] + splits).cumsum(0).tolist()
    micro = run([slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])])
    full = run([slice(0, n)])
    assert micro[0] == pytest.approx(full[0], rel=1e-6)
    torch.testing.assert_close(micro[1], full[1], rtol=1e-5, atol=1e-7)
