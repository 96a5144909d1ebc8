"""PPO's pieces (grpokit.algo.ppo and gae_advantages): hand vectors from the PPO baseline issue."""

from __future__ import annotations

import pytest
import torch

from grpokit import algo
from grpokit.algo.ppo import masked_whiten, token_rewards, value_loss

f64 = torch.float64


def test_gae_gamma_lambda_one_is_return_minus_value():
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 0.0, 2.0]], dtype=f64)
    v = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.4, -0.5, 0.6, 0.7]], dtype=f64)
    m = torch.tensor([[True, True, True, False], [True, True, True, True]])
    adv, ret = algo.gae_advantages(r, v, m, gamma=1.0, lam=1.0)
    # R_t = reward-to-go: row 0 -> 1, 1, 1; row 1 -> 2.5, 2, 2, 2
    want = torch.tensor([[1 - 0.1, 1 - 0.2, 1 - 0.3, 0.0], [2.5 - 0.4, 2 + 0.5, 2 - 0.6, 2 - 0.7]], dtype=f64)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.5, 2.0, 2.0, 2.0]], dtype=f64))


def test_gae_lambda_zero_is_the_td_error():
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=f64)
    v = torch.tensor([[0.5, 0.25, 1.0]], dtype=f64)
    m = torch.ones(1, 3, dtype=torch.bool)
    adv, _ = algo.gae_advantages(r, v, m, gamma=0.9, lam=0.0)
    # δ_t = r_t + γ V_{t+1} − V_t; V after the last token = 0
    want = [[1.0 + 0.9 * 0.25 - 0.5, 2.0 + 0.9 * 1.0 - 0.25, 3.0 - 1.0]]
    torch.testing.assert_close(adv, torch.tensor(want, dtype=f64))


def test_gae_skips_masked_tokens_inside_a_row():
    """A masked token in the middle is skipped: the same as the row without it."""
    r = torch.tensor([[0.0, 7.0, 0.0, 1.0]], dtype=f64)
    v = torch.tensor([[0.2, 5.0, 0.3, 0.4]], dtype=f64)
    m = torch.tensor([[True, False, True, True]])
    adv, ret = algo.gae_advantages(r, v, m, gamma=0.9, lam=0.8)
    keep = [0, 2, 3]
    a2, r2 = algo.gae_advantages(r[:, keep], v[:, keep], m[:, keep], gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv[:, keep], a2)
    torch.testing.assert_close(ret[:, keep], r2)
    assert adv[0, 1] == 0 and ret[0, 1] == 0


def test_ppo_advantages_with_the_group_mean_as_value_equal_unscaled_group_advantages():
    """Outcome reward on the last token, γ = λ = 1, V = the group's mean reward at every token:
    A_t = r − mean(group) = group_advantages(scale="none") (before whitening)."""
    g = 4
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.25, 0.0, 1.0], dtype=f64)
    lengths = torch.tensor([3, 5, 1, 4, 2, 5, 3, 4])
    mask = torch.arange(5)[None, :] < lengths[:, None]
    per_token = token_rewards(rewards, mask)
    values = rewards.view(-1, g).mean(-1).repeat_interleave(g)[:, None].expand(-1, 5).clone()
    adv, _ = algo.gae_advantages(per_token, values, mask, gamma=1.0, lam=1.0)
    want = algo.group_advantages(rewards, g, scale="none")
    torch.testing.assert_close(adv, want[:, None] * mask)


def test_token_rewards_outcome_process_and_kl():
    mask = torch.tensor([[True, True, True, False], [True, False, False, False], [False] * 4])
    out = token_rewards(torch.tensor([2.0, float("nan"), 5.0]), mask)
    assert out.tolist() == [[0, 0, 2, 0], [0, 0, 0, 0], [0, 0, 0, 0]]  # NaN = 0; empty row gets nothing
    steps = torch.tensor([[0.5, 0.0, 1.0, 9.0], [float("nan"), 0, 0, 0], [3.0, 0, 0, 0]])
    ends = torch.tensor([[True, False, True, True], [True, False, False, False], [True, False, False, False]])
    out = token_rewards(torch.zeros(3), mask, step_rewards=steps, step_ends=ends)
    assert out.tolist() == [[0.5, 0, 1.0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]  # masked ends ignored
    kl = torch.full((3, 4), 0.5)
    out = token_rewards(torch.tensor([2.0, 1.0, 0.0]), mask, kl=kl, kl_coef=0.1)
    torch.testing.assert_close(out, torch.tensor([[-0.05, -0.05, 1.95, 0], [0.95, 0, 0, 0], [0, 0, 0, 0]], dtype=f64))
    with pytest.raises(ValueError, match="both step_rewards and step_ends"):
        token_rewards(torch.zeros(3), mask, step_rewards=steps)


@pytest.mark.parametrize("v, want, grad_zero", [(0.5, 0.32, True), (0.1, 0.405, False)])
def test_value_loss_hand_values(v, want, grad_zero):
    """V_old = 0, R = 1, ε_v = 0.2: V = 0.5 -> clipped branch 0.5·(0.2 − 1)² = 0.32 with zero
    gradient; V = 0.1 -> 0.5·(0.1 − 1)² = 0.405."""
    values = torch.tensor([[v]], dtype=f64, requires_grad=True)
    loss, frac = value_loss(
        values,
        torch.zeros(1, 1, dtype=f64),
        torch.ones(1, 1, dtype=f64),
        torch.ones(1, 1, dtype=torch.bool),
        clip_eps=0.2,
    )
    assert loss.item() == pytest.approx(want)
    loss.backward()
    assert (values.grad.item() == 0.0) == grad_zero
    assert frac.item() == (1.0 if grad_zero else 0.0)


def test_value_loss_averages_unmasked_tokens_and_global_counts():
    values = torch.tensor([[0.1, 0.1], [0.1, 5.0]], dtype=f64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, _ = value_loss(values, values.clone(), torch.ones(2, 2, dtype=f64), mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(0.405)  # the masked 5.0 is ignored
    loss6, _ = value_loss(values, values.clone(), torch.ones(2, 2, dtype=f64), mask, num_tokens=6)
    assert loss6.item() == pytest.approx(0.405 * 3 / 6)
    with pytest.raises(ValueError, match="clip_eps must be > 0"):
        value_loss(values, values, values, mask, clip_eps=0)


def test_whitening_over_unmasked_tokens():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -7.0]], dtype=f64)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    w = masked_whiten(x, mask)
    vals = w[mask]
    assert vals.mean().item() == pytest.approx(0.0, abs=1e-12)
    assert vals.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    assert w[0, 2] == 0 and w[1, 2] == 0
    kept = masked_whiten(x, mask, shift_mean=False)[mask]
    assert kept.mean().item() == pytest.approx(2.5) and kept.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    assert masked_whiten(x, torch.zeros_like(mask)).abs().sum() == 0


def test_whitening_across_ranks_equals_the_whole_batch():
    """Two "ranks" whose statistics the all_reduce hook sums (here: adds the other rank's, computed
    by hand in the order masked_whiten reduces them) whiten exactly as the whole batch does."""
    x = torch.tensor([[0.0, 1.0], [10.0, 11.0]], dtype=f64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    parts = [x[:1], x[1:]]
    s0, s1 = [torch.stack([p.sum(), torch.tensor(float(p.numel()), dtype=f64)]) for p in parts]
    mean = (s0[0] + s1[0]) / (s0[1] + s1[1])
    sq0, sq1 = [((p - mean) ** 2).sum().reshape(1) for p in parts]
    others = iter([s1, sq1, s0, sq0])  # rank 0 receives rank 1's sums, then rank 1 receives rank 0's
    out0 = masked_whiten(parts[0], mask[:1], all_reduce=lambda t: t + next(others))
    out1 = masked_whiten(parts[1], mask[1:], all_reduce=lambda t: t + next(others))
    torch.testing.assert_close(torch.cat([out0, out1]), masked_whiten(x, mask))
    assert not torch.allclose(out0, masked_whiten(parts[0], mask[:1]))  # not the per-rank statistics
