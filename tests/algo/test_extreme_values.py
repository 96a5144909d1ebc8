"""A token that counts for nothing changes nothing (issue 29, items 1-2).

Masked tokens (padding, or rows left out by ``algo.overlong_filter``) and tokens with advantage
exactly 0 may carry extreme values: a log-prob gap of 149 nats to the reference (k3's ``exp(d)``
overflows float32), a log-ratio of 200, NaN or ±inf. Loss, logged statistics and gradient must be
those of the clean batch. Plus the precision audit: k3 near 0, log-probs and entropies of peaked
distributions against float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from flat_loss import flat_policy_loss

from grpokit import algo
from grpokit.algo.ppo import masked_whiten, token_rewards, value_loss

f64 = torch.float64
NAN, INF = float("nan"), float("inf")
MASK = torch.tensor([[True, False, True, True], [True, True, True, False]])


def _loss_and_grad(logp, old, adv, mask, **kw):
    logp = logp.clone().requires_grad_()
    loss, stats = flat_policy_loss(logp, old, adv, mask, **kw)
    loss.backward()
    return loss.detach(), {k: v.detach() for k, v in stats.items()}, logp.grad


def _clean_batch():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 4, generator=gen) * 3  # float32, as the trainer's log-probs
    old = logp + 0.1 * torch.randn(2, 4, generator=gen)  # mu > 1: ratio != 1
    ref = logp + 0.3 * torch.randn(2, 4, generator=gen)
    sampler = old + 0.05 * torch.randn(2, 4, generator=gen)
    adv = torch.tensor([[1.5, -0.5, 0.7, -1.0], [-0.3, 0.9, 1.1, 0.4]])
    return logp, old, ref, sampler, adv


# -- item 1: masked tokens -----------------------------------------------------------------------


def test_aggregate_loss_ignores_nan_and_inf_at_masked_positions():
    losses = torch.tensor([[1.0, NAN, 3.0], [2.0, 4.0, NAN]], requires_grad=True)
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]], dtype=torch.bool)
    # token_mean: (1 + 3 + 2 + 4) / 4 = 2.5; seq_mean_token_mean: ((1+3)/2 + (2+4)/2) / 2 = 2.5;
    # seq_mean_token_sum_norm: (4 + 6) / (2 sequences · max length 3) = 5/3
    want = {"token_mean": 2.5, "seq_mean_token_mean": 2.5, "seq_mean_token_sum_norm": 5 / 3}
    for agg, value in want.items():
        for poison in (NAN, INF, -INF):
            with torch.no_grad():
                losses[0, 1], losses[1, 2] = poison, poison
            losses.grad = None
            loss = algo.aggregate_loss(losses, mask, agg, max_completion_length=3)
            loss.backward()
            assert loss.item() == pytest.approx(value, rel=1e-6), (agg, poison)
            assert (losses.grad[~mask] == 0).all() and torch.isfinite(losses.grad).all()


@pytest.mark.parametrize("aggregation", algo.AGGREGATIONS)
@pytest.mark.parametrize("kl_estimator", algo.KL_ESTIMATORS)
def test_masked_token_with_a_149_nat_reference_gap_changes_nothing(aggregation, kl_estimator):
    logp, old, ref, _, adv = _clean_batch()
    kw = dict(beta=0.04, kl_estimator=kl_estimator, aggregation=aggregation, max_completion_length=4)
    clean = _loss_and_grad(logp, old, adv, MASK, ref_logp=ref, **kw)
    far = ref.clone()
    far[~MASK] = logp[~MASK] + 149.0  # d = ref - logp = 149: exp(d) = inf in float32
    got = _loss_and_grad(logp, old, adv, MASK, ref_logp=far, **kw)
    torch.testing.assert_close(got[0], clean[0])
    torch.testing.assert_close(got[1], clean[1])  # kl, ratio_mean, clip fractions, num_tokens
    torch.testing.assert_close(got[2], clean[2])
    assert (got[2][~MASK] == 0).all()


@pytest.mark.parametrize("aggregation", algo.AGGREGATIONS)
@pytest.mark.parametrize("poison", [NAN, INF, -INF, 149.0, -1e30])
def test_any_value_at_masked_positions_of_any_input_changes_nothing(aggregation, poison):
    """logp, old_logp, ref_logp, sampler_logp and (N, T) advantages all poisoned where masked
    (input k gets ``(k + 1) · poison``: gaps of 149 nats and more between them)."""
    logp, old, ref, sampler, adv = _clean_batch()
    kw = dict(beta=0.04, aggregation=aggregation, max_completion_length=4, tis_cap=2.0)
    clean = _loss_and_grad(logp, old, adv, MASK, ref_logp=ref, sampler_logp=sampler, **kw)
    bad = [t.clone() for t in (logp, old, ref, sampler, adv)]
    for k, t in enumerate(bad):
        t[~MASK] = (k + 1) * poison
    got = _loss_and_grad(bad[0], bad[1], bad[4], MASK, ref_logp=bad[2], sampler_logp=bad[3], **kw)
    torch.testing.assert_close(got[0], clean[0])
    torch.testing.assert_close(got[1], clean[1])
    torch.testing.assert_close(got[2], clean[2])
    assert (got[2][~MASK] == 0).all()


def test_kl_penalty_k3_keeps_its_precision_near_zero():
    # k3 = exp(d) - d - 1 = d²/2 + d³/6 + ...; in float32 exp(d) - 1 rounds at 1 (~6e-8 absolute,
    # more than the value itself at |d| = 1e-4)
    d = torch.tensor([1e-4, -1e-4, 3e-3, -2e-5, 0.0, 0.0999, -0.0999, 0.1, 0.5, -2.0, 30.0])
    lp = torch.zeros_like(d, requires_grad=True)
    got = algo.kl_penalty(lp, d, "k3")
    got.sum().backward()
    d64 = d.double()
    torch.testing.assert_close(got.double(), torch.expm1(d64) - d64, rtol=3e-6, atol=0)
    torch.testing.assert_close(lp.grad.double(), -torch.expm1(d64), rtol=1e-6, atol=1e-9)  # 1 - π_ref/π_θ


# -- item 2: tokens with advantage 0 -------------------------------------------------------------


@pytest.mark.parametrize("aggregation", algo.AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_zero_advantage_token_with_an_overflowing_ratio_adds_exactly_nothing(aggregation, beta):
    logp, old, ref, _, adv = _clean_batch()
    adv[0, 2] = 0.0
    adv[1] = 0.0  # a whole row with A = 0 too (a constant group), as (N, T)
    kw = dict(ref_logp=ref, beta=beta, aggregation=aggregation, max_completion_length=4)
    at_one = old.clone()
    at_one[0, 2], at_one[1] = logp[0, 2], logp[1]  # the clean batch: those tokens' ratio is 1
    clean = _loss_and_grad(logp, at_one, adv, MASK, **kw)
    far = old.clone()
    far[0, 2], far[1] = logp[0, 2] - 200.0, logp[1] - 200.0  # log-ratio 200: exp = inf in float32
    got = _loss_and_grad(logp, far, adv, MASK, **kw)
    torch.testing.assert_close(got[0], clean[0])
    torch.testing.assert_close(got[2], clean[2])
    assert torch.isfinite(got[2]).all()
    if beta == 0:  # no KL term: the token's gradient is exactly 0
        assert got[2][0, 2] == 0 and (got[2][1] == 0).all()
    for k, v in got[1].items():
        assert torch.isfinite(v), k
    # ratio_mean reads the log-ratio clamped at 20 nats: the 4 far tokens log e^20 each
    live = MASK.clone()
    live[0, 2], live[1] = False, False
    r = torch.exp(logp - old)[live].sum() + 4 * math.exp(algo.loss.LOG_RATIO_STATS_CLAMP)
    assert got[1]["ratio_mean"].item() == pytest.approx(r.item() / 6, rel=1e-5)  # 6 counted tokens
    for k in ("clip_frac_low", "clip_frac_high", "kl"):
        torch.testing.assert_close(got[1][k], clean[1][k])


def test_zero_advantage_row_as_n_vector_with_overflowing_ratio():
    logp, old, _, _, _ = _clean_batch()
    adv = torch.tensor([1.0, 0.0])
    far = old.clone()
    far[1] = logp[1] - 200.0
    at_one = old.clone()
    at_one[1] = logp[1]
    got, clean = _loss_and_grad(logp, far, adv, MASK), _loss_and_grad(logp, at_one, adv, MASK)
    torch.testing.assert_close(got[0], clean[0])
    torch.testing.assert_close(got[2], clean[2])
    assert (got[2][1] == 0).all() and torch.isfinite(got[1]["ratio_mean"])


def test_positive_advantage_with_an_overflowing_ratio_is_clipped_with_zero_gradient():
    # A = 2 > 0, log-ratio 200: min(r·A, 1.2·A) = 2.4, no gradient; the other token: ratio 1, A = 1
    logp = torch.zeros(1, 2)
    old = torch.tensor([[-200.0, 0.0]])
    loss, st, grad = _loss_and_grad(
        logp, old, torch.tensor([[2.0, 1.0]]), torch.ones(1, 2, dtype=torch.bool), aggregation="token_mean"
    )
    assert loss.item() == pytest.approx(-(2.4 + 1.0) / 2)
    assert grad[0, 0] == 0 and grad[0, 1].item() == pytest.approx(-0.5)
    assert st["clip_frac_high"].item() == 0.5 and math.isfinite(st["ratio_mean"].item())


# -- PPO: value loss, whitening, per-token rewards, GAE -----------------------------------------


@pytest.mark.parametrize("poison", [NAN, INF, -INF, 1e30])
def test_value_loss_ignores_masked_values_and_returns(poison):
    gen = torch.Generator().manual_seed(3)
    v, old, ret = (torch.randn(2, 4, generator=gen) for _ in range(3))

    def run(v, old, ret):
        v = v.clone().requires_grad_()
        loss, frac = value_loss(v, old, ret, MASK, clip_eps=0.2)
        loss.backward()
        return loss.detach(), frac, v.grad

    clean = run(v, old, ret)
    bad = [t.clone() for t in (v, old, ret)]
    for k, t in enumerate(bad):
        t[~MASK] = (k + 1) * poison  # V − R = −2·poison: squares overflow
    got = run(*bad)
    for a, b in zip(got, clean):
        torch.testing.assert_close(a, b)
    assert (got[2][~MASK] == 0).all()


@pytest.mark.parametrize("poison", [NAN, INF, 1e300])
def test_masked_whiten_ignores_masked_entries(poison):
    x = torch.tensor([[1.0, 5.0, 2.0, 3.0], [4.0, 0.5, -1.0, 7.0]], dtype=f64)
    bad = x.clone()
    bad[~MASK] = poison
    for shift in (True, False):
        torch.testing.assert_close(masked_whiten(bad, MASK, shift_mean=shift), masked_whiten(x, MASK, shift_mean=shift))


def test_masked_whiten_of_a_constant_batch_with_eps_zero_is_zero_not_nan():
    x = torch.full((2, 4), 3.0, dtype=f64)
    assert masked_whiten(x, MASK, eps=0.0).tolist() == [[0.0] * 4] * 2
    # shift_mean=False adds the mean back: 3 at counted tokens, 0 elsewhere
    assert masked_whiten(x, MASK, eps=0.0, shift_mean=False).tolist() == [[3.0, 0.0, 3.0, 3.0], [3.0, 3.0, 3.0, 0.0]]


def test_token_rewards_ignore_masked_kl_and_treat_inf_rewards_as_unscorable():
    kl = torch.tensor([[0.5, INF, 0.25, 1.0], [NAN, 0.0, 2.0, -INF]], dtype=f64)
    got = token_rewards(torch.tensor([INF, 2.0], dtype=f64), MASK, kl=kl, kl_coef=0.1)
    # row 0: reward +inf is unscorable (0, as in group_advantages); -0.1·kl on counted tokens
    # row 1: NaN kl at a counted token stays NaN (a real fault); masked -inf kl is not read
    want = torch.tensor([[-0.05, 0.0, -0.025, -0.1], [NAN, 0.0, 2.0 - 0.2, 0.0]], dtype=f64)
    torch.testing.assert_close(got, want, equal_nan=True)
    # kl_coef 0: an infinite kl adds nothing (not 0·inf)
    got0 = token_rewards(torch.tensor([1.0, 2.0], dtype=f64), MASK, kl=kl.nan_to_num(nan=INF), kl_coef=0.0)
    assert torch.isfinite(got0).all()


def test_gae_ignores_masked_values_and_rewards():
    gen = torch.Generator().manual_seed(4)
    r, v = torch.randn(2, 4, generator=gen, dtype=f64), torch.randn(2, 4, generator=gen, dtype=f64)
    clean = algo.gae_advantages(r, v, MASK, gamma=0.9, lam=0.8)
    for poison in (NAN, INF, -INF):
        rb, vb = r.clone(), v.clone()
        rb[~MASK], vb[~MASK] = poison, poison
        got = algo.gae_advantages(rb, vb, MASK, gamma=0.9, lam=0.8)
        torch.testing.assert_close(got, clean)


# -- precision: log-probs and entropies of peaked distributions ----------------------------------


def peaked_logits(seed: int = 0, rows: int = 10, v: int = 300) -> torch.Tensor:
    """``(rows, 6, v)`` float32 logits of magnitude 20-45 whose top logit stands 8-16 above the rest
    (entropy ~1e-5..1e-1, the chosen token's log-prob ~-1e-1..-1e-5)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, 6, v, generator=gen) + 20 + 10 * torch.rand(rows, 6, 1, generator=gen)
    top = torch.randint(0, v, (rows, 6), generator=gen)
    z.scatter_add_(-1, top[..., None], 8 + 8 * torch.rand(rows, 6, 1, generator=gen))
    return z


def float64_entropy(z: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(z.double(), -1)
    return -torch.where(lp > -INF, lp.exp() * lp, 0.0).sum(-1)


def test_token_entropy_of_peaked_logits_matches_float64():
    z = peaked_logits()
    got = algo.token_entropy(z).double()
    # logsumexp(z) - Σ p·z at |z| ~ 40 was off by ~2e-5 (float32 cancellation)
    torch.testing.assert_close(got, float64_entropy(z), rtol=0, atol=1e-6)
    z7 = z * 0.7  # rounded in float32: the reference divides this input by 0.7 in float64
    got_t = algo.token_entropy(z7, temperature=0.7).double()
    torch.testing.assert_close(got_t, float64_entropy(z7.double() / 0.7), rtol=0, atol=1e-6)


def test_token_entropy_with_minus_inf_logits_is_finite():
    z = peaked_logits(rows=2)
    z[..., :50] = -INF  # a masked-out part of the vocabulary
    got = algo.token_entropy(z)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), float64_entropy(z), rtol=0, atol=1e-6)


def test_token_logprobs_of_peaked_logits_match_float64():
    z = peaked_logits(seed=1)
    ids = z.argmax(-1)  # the sampled token of a peaked distribution: log-prob near 0
    want = torch.log_softmax(z.double(), -1).gather(-1, ids[..., None]).squeeze(-1)
    got = algo.token_logprobs(z, ids)
    # z_id - logsumexp(z) rounds the log-sum-exp at ~40: up to ~2e-6 absolute
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-7)
    # the gradient (onehot − softmax) / τ, in the same form: 1 − p of the chosen token was off by
    # the same ~2e-6 through exp(z − logsumexp(z))
    for tau in (1.0, 0.7):
        zz = z[:3].clone().requires_grad_()
        algo.token_logprobs(zz, ids[:3], temperature=tau).sum().backward()
        p = torch.softmax(z[:3].double() / tau, -1)
        g = (torch.nn.functional.one_hot(ids[:3], z.shape[-1]).double() - p) / tau
        torch.testing.assert_close(zz.grad.double(), g, rtol=0, atol=3e-7)


def test_token_logprobs_keep_minus_inf_for_a_minus_inf_logit():
    z = torch.tensor([[[0.0, -INF, 1.0]]])
    got = algo.token_logprobs(z, torch.tensor([[1]]))
    assert got.item() == -INF


def test_ppo_advantages_ignore_values_and_log_probs_at_masked_tokens(monkeypatch):
    """grpokit.estimators.ppo.PPO.advantages: the value model's output and π_old/π_ref log-probs at masked
    tokens (NaN/inf there) change neither the per-token KL reward, the GAE nor the whitening."""
    from types import SimpleNamespace

    import grpokit.estimators.ppo as ppo_mod
    from grpokit.config import AlgoConfig

    gen = torch.Generator().manual_seed(5)
    clean = {
        "old": -torch.rand(2, 4, generator=gen),
        "ref": -torch.rand(2, 4, generator=gen),
        "v": torch.randn(2, 4, generator=gen),
    }

    def advantages(poison):
        t = {k: x.clone() for k, x in clean.items()}
        for k, x in enumerate(t.values()):
            x[~MASK] = (k + 1) * poison
        cfg = AlgoConfig(beta=0.1, kl_in_reward=True, gamma=1.0, lam=0.95, whiten_advantages=True)
        p = ppo_mod.PPO(cfg, max_completion_length=4)
        p.logprobs = SimpleNamespace(policy=lambda exp: t["old"], reference=lambda exp: t["ref"])
        p.micro_batch_size, p.autocast_bf16 = 2, False
        p.critic = SimpleNamespace(values=lambda mb, autocast_bf16: t["v"][mb])
        exp = SimpleNamespace(
            completion_mask=MASK,
            device="cpu",
            rewards=torch.tensor([1.0, 0.0], dtype=f64),
            step_rewards=None,
            step_ends=None,
            ref_logprobs=None,
            old_logprobs=None,
            micro_batches=lambda n: [(slice(0, 2), slice(0, 2))],
        )
        return p.advantages(exp), exp

    want, want_exp = advantages(0.0)
    want_exp_values = want_exp.old_values.clone()
    for poison in (NAN, INF, -INF):
        got, exp = advantages(poison)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(exp.old_values, want_exp_values)
        torch.testing.assert_close(exp.returns, want_exp.returns)
