"""The policy-loss variants of ``grpokit.algo.policy_loss`` (issue 35; docs/loss_variants.md): GSPO and
GSPO-token (``importance_level``), CISPO (``surrogate``), dual clip and TRL's δ, masked importance
sampling (``is_correction``) and the entropy bonus. Hand-computed vectors (the arithmetic in a comment,
each with a group where the variant and plain GRPO differ), the loops of tests/support/reference.py on random
inputs, gradients, masked-token and A = 0 robustness, and the recipe keys through the algorithm seam.
"""

from __future__ import annotations

import math

import pytest
import torch
from flat_loss import flat_policy_loss

from grpokit import algo
from grpokit.algo.surrogates import IMPORTANCE_LEVELS, IS_CORRECTIONS, SURROGATES
from grpokit.config import AlgoConfig, RecipeError, choices_of, recipe_from_dict
from grpokit.config.loading import help_text
from grpokit.estimators.base import GRPO
from grpokit.experience import Experience
from support import reference as ref

f64 = torch.float64
NAN, INF = float("nan"), float("inf")
LN2 = math.log(2.0)


def _loss_grad(logp, old, adv, mask, **kw):
    x = logp.clone().requires_grad_()
    loss, st = flat_policy_loss(x, old, adv, mask, **kw)
    loss.backward()
    return loss.detach(), {k: v.detach() for k, v in st.items()}, x.grad


# -- GSPO (importance_level=sequence) ----------------------------------------------------------------


def _gspo_case():
    # one group of two rows; row 0 counts 2 tokens, row 1 counts 3 (its 4th is masked)
    log_ratio = torch.tensor([[LN2, 0.0, 0.0, 0.0], [0.3, -0.3, 0.15, 9.0]], dtype=f64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    return log_ratio, torch.zeros(2, 4, dtype=f64), mask


def test_gspo_hand_computed():
    lr, old, mask = _gspo_case()
    adv = torch.tensor([1.0, -1.0], dtype=f64)
    loss, st, grad = _loss_grad(lr, old, adv, mask, importance_level="sequence")
    # s_0 = exp((ln 2 + 0) / 2) = √2 = 1.414214 > 1.2, A = +1: min(1.414214, 1.2) = 1.2 -> l_0 = -1.2 (clipped)
    # s_1 = exp((0.3 - 0.3 + 0.15) / 3) = exp(0.05) = 1.051271 in [0.8, 1.2], A = -1 -> l_1 = 1.051271
    # seq_mean_token_mean: (-1.2 + 1.051271) / 2 = -0.0743645
    assert loss.item() == pytest.approx((-1.2 + math.exp(0.05)) / 2, abs=1e-12)
    # gradient: row 0 clipped -> 0; row 1: d l_1 / d logp_1t = -A·s_1 / |o_1| = 1.051271 / 3 at each
    # counted token, times 1/N = 1/2: 0.175212 (the masked 4th token: 0)
    want = torch.tensor([[0.0] * 4, [math.exp(0.05) / 6] * 3 + [0.0]], dtype=f64)
    torch.testing.assert_close(grad, want)
    # clip fractions count sequences: row 0 of the 2 clipped high
    assert st["clip_frac_high"].item() == pytest.approx(0.5) and st["clip_frac_low"].item() == 0.0
    assert st["seq_ratio_mean"].item() == pytest.approx((math.sqrt(2) + math.exp(0.05)) / 2)
    # plain GRPO on the same group differs: row 0 r = [2, 1] -> [-1.2, -1], mean -1.1; row 1
    # r = [1.349859, 0.740818, 1.161834], A = -1 -> l = max(r, clip(r)) = [1.349859, 0.8, 1.161834],
    # mean 1.103898; loss (-1.1 + 1.103898) / 2 = 0.001949
    plain, _, plain_grad = _loss_grad(lr, old, adv, mask)
    assert plain.item() == pytest.approx((-1.1 + (math.exp(0.3) + 0.8 + math.exp(0.15)) / 3) / 2, abs=1e-12)
    assert plain_grad[0, 1].item() != 0  # r = 1 in row 0 is not clipped per token


def test_gspo_gradient_is_one_value_per_sequence_up_to_its_length():
    gen = torch.Generator().manual_seed(3)
    n, t = 6, 7
    logp = -torch.rand(n, t, generator=gen, dtype=f64)
    old = logp + 0.05 * torch.randn(n, t, generator=gen, dtype=f64)
    mask = torch.arange(t)[None] < torch.tensor([7, 3, 5, 1, 6, 2])[:, None]
    adv = torch.randn(n, generator=gen, dtype=f64)
    _, _, grad = _loss_grad(logp, old, adv, mask, importance_level="sequence", clip_eps_low=0.5, clip_eps_high=0.5)
    lengths = mask.sum(1)
    s = torch.exp(torch.where(mask, logp - old, 0.0).sum(1) / lengths)
    for i in range(n):
        row = grad[i][mask[i]]
        assert torch.allclose(row, row[0].expand_as(row), rtol=0, atol=1e-15)  # the same for every token
        # unclipped (eps 0.5): d loss / d logp_it = -A_i·s_i / (N·|o_i|)
        assert row[0].item() == pytest.approx(-adv[i].item() * s[i].item() / (n * lengths[i].item()), rel=1e-12)
        assert (grad[i][~mask[i]] == 0).all()


def test_sequence_level_refuses_per_token_advantages():
    lr, old, mask = _gspo_case()
    with pytest.raises(ValueError, match="importance_level 'sequence' needs one advantage per sequence"):
        flat_policy_loss(lr, old, torch.ones(2, 4, dtype=f64), mask, importance_level="sequence")


# -- GSPO-token (importance_level=sequence_token) -----------------------------------------------------


def test_gspo_token_hand_computed_with_token_advantages():
    lr, old, mask = _gspo_case()
    adv = torch.tensor([[1.0, 1.0, 0.0, 0.0], [-1.0, -2.0, 0.0, 5.0]], dtype=f64)  # row 1's 3rd: A = 0
    loss, _, grad = _loss_grad(lr, old, adv, mask, importance_level="sequence_token")
    # s_it = sg(s_i)·π/sg(π): value s_i. Row 0: s = 1.414214 > 1.2 with A = 1: -1.2 per token, no gradient.
    # Row 1: s = 1.051271, l = -s·A = [1.051271, 2.102542, 0]: mean 1.051271; the masked A = 5 is out.
    # Loss (-1.2 + 1.051271) / 2 = -0.0743645
    assert loss.item() == pytest.approx((-1.2 + math.exp(0.05)) / 2, abs=1e-12)
    # d l / d logp_1t = -s_1·A_1t / (N·|o_1|) = [1.051271, 2.102542, 0] / 6: scales with each token's A
    want = torch.tensor([[0.0] * 4, [math.exp(0.05) / 6, 2 * math.exp(0.05) / 6, 0.0, 0.0]], dtype=f64)
    torch.testing.assert_close(grad, want)
    # per token (plain GRPO) the same advantages give row 1 l = [1.349859, 2·0.8, 0]: another loss
    plain, _, _ = _loss_grad(lr, old, adv, mask)
    assert plain.item() == pytest.approx((-1.1 + (math.exp(0.3) + 1.6) / 3) / 2, abs=1e-12)


@pytest.mark.parametrize("aggregation", algo.AGGREGATIONS)
def test_gspo_token_equals_gspo_in_value_and_gradient_for_sequence_advantages(aggregation):
    gen = torch.Generator().manual_seed(5)
    logp = -torch.rand(6, 5, generator=gen, dtype=f64)
    old = logp + 0.2 * torch.randn(6, 5, generator=gen, dtype=f64)  # some sequences clipped
    mask = torch.arange(5)[None] < torch.tensor([5, 2, 4, 1, 3, 5])[:, None]
    adv = torch.randn(6, generator=gen, dtype=f64)
    kw = dict(aggregation=aggregation, max_completion_length=5, clip_eps_low=0.05, clip_eps_high=0.05)
    seq = _loss_grad(logp, old, adv, mask, importance_level="sequence", **kw)
    tok = _loss_grad(logp, old, adv[:, None].expand(6, 5), mask, importance_level="sequence_token", **kw)
    torch.testing.assert_close(tok[0], seq[0], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(tok[1], seq[1])
    # the gradients agree for seq_mean_token_mean (the paper's aggregation), where every token of a row
    # has the weight 1/|o_i| that s_i's mean gives; otherwise the sequence level's gradient is the row's
    # mean of GSPO-token's
    if aggregation == "seq_mean_token_mean":
        torch.testing.assert_close(tok[2], seq[2], rtol=1e-12, atol=1e-15)
    for i in range(6):
        m = mask[i]
        torch.testing.assert_close(seq[2][i][m], tok[2][i][m].mean().expand(int(m.sum())), rtol=1e-12, atol=1e-15)


# -- CISPO (surrogate=cispo) --------------------------------------------------------------------------


def test_cispo_hand_computed_and_clipped_tokens_keep_their_gradient():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]], dtype=f64))  # old = 0: r = 1.5, 0.5, 1.1
    old, adv, mask = torch.zeros(1, 3, dtype=f64), torch.tensor([[1.0, -1.0, 1.0]], dtype=f64), torch.ones(1, 3).bool()
    loss, st, grad = _loss_grad(logp, old, adv, mask, surrogate="cispo")
    # w = sg(clip(r, 0.8, 1.2)) = [1.2, 0.8, 1.1]; l = -w·A·logp = [-1.2·0.405465, -0.8·(-1)·(-0.693147),
    # -1.1·0.095310] = [-0.486558, -0.554518, -0.104841]; mean -0.381972
    want = (-1.2 * math.log(1.5) + 0.8 * math.log(0.5) - 1.1 * math.log(1.1)) / 3
    assert loss.item() == pytest.approx(want, abs=1e-12)
    # d l / d logp = -w·A / 3 = [-0.4, 0.266667, -0.366667]: every token, the clipped ones too
    torch.testing.assert_close(grad, torch.tensor([[-1.2, 0.8, -1.1]], dtype=f64) / 3)
    assert st["clip_frac_high"].item() == pytest.approx(1 / 3) and st["clip_frac_low"].item() == pytest.approx(1 / 3)
    # plain clipping: the clipped tokens 0 and 1 get no gradient at all
    _, _, plain = _loss_grad(logp, old, adv, mask)
    assert plain[0, 0] == 0 and plain[0, 1] == 0 and plain[0, 2].item() == pytest.approx(-1.1 / 3)
    # MiniMax's practice, no lower bound (clip_eps_low >= 1): token 1's weight is its ratio 0.5
    _, _, no_low = _loss_grad(logp, old, adv, mask, surrogate="cispo", clip_eps_low=1.0)
    torch.testing.assert_close(no_low, torch.tensor([[-1.2, 0.5, -1.1]], dtype=f64) / 3)


def test_cispo_on_policy_has_grpos_gradient():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=gen, dtype=f64)
    mask, adv = torch.rand(4, 5, generator=gen) < 0.8, torch.randn(4, generator=gen, dtype=f64)
    a = _loss_grad(logp, logp, adv, mask, surrogate="cispo")
    b = _loss_grad(logp, logp, adv, mask)
    torch.testing.assert_close(a[2], b[2])  # w = 1: -A·∇logp, as GRPO's (the values differ: A·logp vs A)


def test_cispo_overflowing_ratio_weighs_one_plus_eps_high():
    logp, old = torch.tensor([[0.0, 0.0]]), torch.tensor([[-200.0, 200.0]])  # r = e^200 (inf), e^-200
    loss, _, grad = _loss_grad(logp - 1.0, old, torch.tensor([1.0]), torch.ones(1, 2).bool(), surrogate="cispo")
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(grad, torch.tensor([[-1.2, -0.8]]) / 2)


# -- dual clip and TRL's delta -----------------------------------------------------------------------


@pytest.mark.parametrize("bound", ["dual_clip_c", "delta"])
def test_dual_clip_and_delta_hand_computed(bound):
    logp = torch.log(torch.tensor([[5.0, 5.0, 0.5, 2.0]], dtype=f64))
    old, adv, mask = (
        torch.zeros(1, 4, dtype=f64),
        torch.tensor([[-1.0, 1.0, -1.0, -1.0]], dtype=f64),
        torch.ones(1, 4).bool(),
    )
    loss, st, grad = _loss_grad(logp, old, adv, mask, **{bound: 3.0})
    # r = 5, A = -1: dual max(min(-5, -1.2), -3) = -3 / δ min(min(5, 3)·-1, 1.2·-1) = -3 -> l = 3, no gradient
    # r = 5, A = +1: min(5, 1.2) = 1.2 -> l = -1.2 (clipped as plain); r = 0.5, A = -1: min(-0.5, -0.8) -> l = 0.8
    # r = 2, A = -1: min(-2, -1.2) = -2 above -3 -> l = 2, d l / d logp = -A·r = 2
    # mean (3 - 1.2 + 0.8 + 2) / 4 = 1.15 (plain GRPO: (5 - 1.2 + 0.8 + 2) / 4 = 1.65)
    assert loss.item() == pytest.approx(1.15, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, 0.0, 0.5]], dtype=f64))
    key = "clip_frac_dual" if bound == "dual_clip_c" else "clip_frac_delta"
    assert st[key].item() == pytest.approx(0.25)
    plain, plain_st, plain_grad = _loss_grad(logp, old, adv, mask)
    assert plain.item() == pytest.approx(1.65, abs=1e-12) and plain_grad[0, 0].item() == pytest.approx(5 / 4)
    assert key not in plain_st


@pytest.mark.parametrize("level", IMPORTANCE_LEVELS)
@pytest.mark.parametrize("bound", ["dual_clip_c", "delta"])
def test_a_negative_token_whose_ratio_overflows_is_bounded(level, bound):
    logp = torch.zeros(2, 2)
    old = torch.tensor([[-200.0, -200.0], [0.0, 0.0]])  # row 0: r = e^200 (inf in float32), A < 0
    adv = torch.tensor([-1.0, 1.0])
    loss, _, grad = _loss_grad(logp, old, adv, torch.ones(2, 2).bool(), importance_level=level, **{bound: 3.0})
    # row 0 held at -c·A = 3, no gradient; row 1 at r = 1: -1. Loss (3 - 1) / 2 = 1
    assert loss.item() == pytest.approx(1.0) and torch.isfinite(grad).all() and (grad[0] == 0).all()
    plain, _, _ = _loss_grad(logp, old, adv, torch.ones(2, 2).bool(), importance_level=level)
    assert plain.item() == INF  # unbounded without them (the trainer skips such an update)


# -- masked importance sampling (is_correction=mis_*) ---------------------------------------------------


def test_mis_hand_computed():
    logp, mask = torch.zeros(2, 3, dtype=f64), torch.ones(2, 3).bool()
    # w = π_old/π_sampler = exp(0 - sampler): row 0 [4, 1, 0.5] (Π = 2), row 1 [4, 1, 1] (Π = 4)
    sampler = -torch.log(torch.tensor([[4.0, 1.0, 0.5], [4.0, 1.0, 1.0]], dtype=f64))
    adv = torch.tensor([1.0, 1.0], dtype=f64)
    kw = dict(sampler_logp=sampler, tis_cap=3.0)
    # on-policy r = 1, l = -w·A. TIS min(w, 3): row 0 [-3, -1, -0.5] (mean -1.5), row 1 [-3, -1, -1] (-5/3)
    tis = _loss_grad(logp, logp, adv, mask, **kw)
    assert tis[0].item() == pytest.approx((-1.5 - 5 / 3) / 2, abs=1e-12)
    # mis_token: w = 4 > 3 dropped: row 0 [0, -1, -0.5] (mean -0.5), row 1 [0, -1, -1] (-2/3)
    mis, st, grad = _loss_grad(logp, logp, adv, mask, is_correction="mis_token", **kw)
    assert mis.item() == pytest.approx((-0.5 - 2 / 3) / 2, abs=1e-12)
    assert grad[0, 0] == 0 and grad[0, 2].item() == pytest.approx(-0.5 / 3 / 2)
    assert st["mis_dropped_frac"].item() == pytest.approx(2 / 6) and "tis_capped_frac" not in st
    assert st["mis_weight_mean"].item() == pytest.approx((0 + 1 + 0.5 + 0 + 1 + 1) / 6)
    # mis_sequence: ρ_0 = 2 in [1/3, 3]: every token weighted 2, l = -2; ρ_1 = 4: the whole row dropped
    seq, st, grad = _loss_grad(logp, logp, adv, mask, is_correction="mis_sequence", **kw)
    assert seq.item() == pytest.approx((-2.0 + 0.0) / 2, abs=1e-12)
    assert (grad[1] == 0).all() and st["mis_dropped_frac"].item() == pytest.approx(0.5)


def test_mis_drops_an_infinite_term_and_an_overflowing_weight():
    logp, mask = torch.zeros(1, 2), torch.ones(1, 2).bool()
    old = torch.tensor([[-200.0, 0.0]])  # token 0: r = e^200 with A < 0: an infinite term
    sampler = torch.tensor([[-300.0, 0.0]])  # its w = e^100: outside [1/C, C], dropped
    loss, st, grad = _loss_grad(
        logp, old, torch.tensor([-1.0]), mask, sampler_logp=sampler, tis_cap=2.0, is_correction="mis_token"
    )
    assert loss.item() == pytest.approx(0.5) and torch.isfinite(grad).all() and grad[0, 0] == 0  # token 1: l = 1, /2
    assert st["mis_dropped_frac"].item() == 0.5


# -- entropy bonus --------------------------------------------------------------------------------------


def test_entropy_bonus_hand_computed_and_micro_batched():
    logp, mask = torch.zeros(2, 3, dtype=f64), torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=f64)
    h = torch.tensor([[1.0, 3.0, NAN], [2.0, 0.5, 0.5]], dtype=f64, requires_grad=True)
    loss, _ = flat_policy_loss(logp, logp, adv, mask, entropy=h, entropy_coef=0.1)
    # surrogate on-policy: (-1 + 1) / 2 = 0; H = (1 + 3 + 2 + 0.5 + 0.5) / 5 = 1.4; loss 0 - 0.1·1.4 = -0.14
    assert loss.item() == pytest.approx(-0.14, abs=1e-12)
    loss.backward()
    # d loss / d H_t = -0.1 / 5 at each counted token, 0 at the masked one (where H is NaN)
    torch.testing.assert_close(h.grad, torch.where(mask, -0.02, 0.0).to(f64))
    # micro-batches normalized by the whole batch's token count sum to the same loss
    parts = [
        flat_policy_loss(
            logp[sl], logp[sl], adv[sl], mask[sl], entropy=h[sl], entropy_coef=0.1, num_sequences=2, num_tokens=5
        )[0]
        for sl in (slice(0, 1), slice(1, 2))
    ]
    assert sum(p.item() for p in parts) == pytest.approx(-0.14, abs=1e-12)
    with pytest.raises(ValueError, match="entropy_coef=0.1 > 0 needs entropy"):
        flat_policy_loss(logp, logp, adv, mask, entropy_coef=0.1)


def test_differentiable_entropy_equals_the_logged_one_and_its_gradient_is_exact():
    gen = torch.Generator().manual_seed(1)
    logits = (4 * torch.randn(3, 5, 11, generator=gen)).requires_grad_()
    logits.data[0, 0, 3] = -INF  # a vocabulary entry the temperature cannot reach: adds 0, no NaN
    for tau in (1.0, 0.7):
        logits.grad = None
        h = algo.token_entropy(logits, temperature=tau, differentiable=True)
        assert torch.equal(h.detach(), algo.token_entropy(logits.detach(), temperature=tau))
        g = torch.randn(3, 5, generator=gen)
        (h * g).sum().backward()
        x = logits.detach().double().requires_grad_()
        p, log_p = torch.softmax(x / tau, -1), torch.log_softmax(x / tau, -1)
        exact = -(p * torch.where(p > 0, log_p, 0.0)).sum(-1)  # -Σ p·log p, 0·(-inf) taken as 0
        (exact * g.double()).sum().backward()
        assert torch.isfinite(logits.grad).all()
        torch.testing.assert_close(logits.grad.double(), x.grad, rtol=1e-4, atol=1e-6)


# -- against the loops of tests/support/reference.py -------------------------------------------------------------

VARIANTS = [
    dict(importance_level="sequence"),
    dict(importance_level="sequence_token"),
    dict(importance_level="sequence", dual_clip_c=1.15),
    dict(importance_level="sequence_token", delta=1.3),
    dict(surrogate="cispo"),
    dict(surrogate="cispo", clip_eps_low=1.0),
    dict(dual_clip_c=1.5),
    dict(delta=1.5),
    dict(is_correction="mis_token", tis_cap=1.3),
    dict(is_correction="mis_sequence", tis_cap=2.0, importance_level="sequence_token"),
    dict(is_correction="tis", tis_cap=1.1, surrogate="cispo"),
    dict(entropy_coef=0.05, dual_clip_c=2.0),
]


def _random_case(seed, b, g, t, token_adv):
    gen = torch.Generator().manual_seed(seed)
    n = b * g
    logp = -torch.rand(n, t, generator=gen, dtype=f64) * 2
    old = logp + 0.25 * torch.randn(n, t, generator=gen, dtype=f64)  # ratios on both sides of the clip range
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = torch.arange(t)[None] < lengths[:, None]
    adv = torch.randn(n, t, generator=gen, dtype=f64) if token_adv else torch.randn(n, generator=gen, dtype=f64)
    adv[0] = 0.0  # a row with A = 0
    extra = dict(
        ref_logp=logp + 0.3 * torch.randn(n, t, generator=gen, dtype=f64),
        sampler_logp=old + 0.15 * torch.randn(n, t, generator=gen, dtype=f64),
        entropy=torch.rand(n, t, generator=gen, dtype=f64) * 3,
    )
    return logp, old, adv, mask, extra


def _reference_kw(kw, extra, aggregation, t, beta):
    return dict(
        level=kw.get("importance_level", "token"),
        surrogate=kw.get("surrogate", "clip"),
        eps_low=kw.get("clip_eps_low", 0.1),
        eps_high=kw.get("clip_eps_high", 0.1),
        dual_clip_c=kw.get("dual_clip_c", 0.0),
        delta=kw.get("delta", 0.0),
        aggregation=aggregation,
        max_len=t,
        ref_logp=extra["ref_logp"].tolist(),
        beta=beta,
        sampler_logp=extra["sampler_logp"].tolist(),
        cap=kw.get("tis_cap", 0.0),
        is_correction=kw.get("is_correction", "tis"),
        entropy=extra["entropy"].tolist(),
        entropy_coef=kw.get("entropy_coef", 0.0),
    )


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("aggregation", algo.AGGREGATIONS)
@pytest.mark.parametrize("seed,b,g", [(0, 1, 2), (1, 3, 4), (2, 2, 7)])
def test_variants_equal_the_reference_loops(kw, aggregation, seed, b, g):
    t = 6
    token_adv = kw.get("importance_level") != "sequence" and seed % 2 == 1  # (N, T) advantages where allowed
    logp, old, adv, mask, extra = _random_case(seed, b, g, t, token_adv)
    kw = {"clip_eps_low": 0.1, "clip_eps_high": 0.1, **kw}
    beta = 0.04 if seed != 1 else 0.0
    loss, _, grad = _loss_grad(
        logp,
        old,
        adv,
        mask,
        aggregation=aggregation,
        max_completion_length=t,
        ref_logp=extra["ref_logp"],
        beta=beta,
        sampler_logp=extra["sampler_logp"] if kw.get("tis_cap") else None,
        entropy=extra["entropy"] if kw.get("entropy_coef") else None,
        **kw,
    )
    adv_list = adv.tolist()
    want, want_grad = ref.policy_loss_variant(
        logp.tolist(), old.tolist(), adv_list, mask.tolist(), **_reference_kw(kw, extra, aggregation, t, beta)
    )
    assert loss.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    if beta == 0:  # the reference gradient leaves the KL's out (tested in test_gradients.py)
        torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=f64), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sequence_clip_fractions_equal_the_reference_and_sum_over_micro_batches(level, seed):
    """The stats count sequences, and the trainer's token-weighted sum of micro-batch stats
    (w = micro-batch tokens / batch tokens) gives the whole batch's share."""
    t, n = 5, 8
    logp, old, adv, mask, _ = _random_case(seed, 2, 4, t, token_adv=level == "sequence_token")
    old = logp + 0.6 * torch.randn(n, t, generator=torch.Generator().manual_seed(seed), dtype=f64)
    kw = dict(importance_level=level, clip_eps_low=0.1, clip_eps_high=0.1)
    _, full, _ = _loss_grad(logp, old, adv, mask, **kw)
    for side in ("low", "high"):
        want = ref.sequence_clip_fraction(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.1, 0.1, side)
        assert full[f"clip_frac_{side}"].item() == pytest.approx(want, abs=1e-12)
    n_tok = int(mask.sum())
    summed: dict[str, float] = {}
    for sl in (slice(0, 3), slice(3, 4), slice(4, 8)):
        _, st, _ = _loss_grad(logp[sl], old[sl], adv[sl], mask[sl], num_sequences=n, num_tokens=n_tok, **kw)
        w = st["num_tokens"].item() / n_tok
        for k, v in st.items():
            summed[k] = summed.get(k, 0.0) + w * v.item()
    for k in ("clip_frac_low", "clip_frac_high", "seq_ratio_mean", "ratio_mean", "kl"):
        assert summed[k] == pytest.approx(full[k].item(), abs=1e-12), k


@pytest.mark.parametrize("kw", VARIANTS[:8], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_micro_batches_sum_to_the_full_batch(kw):
    logp, old, adv, mask, extra = _random_case(4, 2, 3, 5, token_adv=False)
    n, n_tok = 6, int(mask.sum())
    ent = extra["entropy"] if kw.get("entropy_coef") else None

    def run(chunks):
        x = logp.clone().requires_grad_()
        total = 0.0
        for sl in chunks:
            loss, _ = flat_policy_loss(
                x[sl],
                old[sl],
                adv[sl],
                mask[sl],
                num_sequences=n,
                num_tokens=n_tok,
                entropy=None if ent is None else ent[sl],
                **kw,
            )
            loss.backward()
            total += loss.item()
        return total, x.grad

    full, micro = run([slice(0, 6)]), run([slice(0, 2), slice(2, 3), slice(3, 6)])
    assert micro[0] == pytest.approx(full[0], rel=1e-12, abs=1e-14)
    torch.testing.assert_close(micro[1], full[1], rtol=1e-12, atol=1e-15)


# -- tokens that count for nothing change nothing ---------------------------------------------------------

ROBUST = [
    dict(importance_level="sequence"),
    dict(importance_level="sequence_token"),
    dict(surrogate="cispo"),
    dict(dual_clip_c=3.0),
    dict(delta=2.0, importance_level="sequence_token"),
    dict(is_correction="mis_token", tis_cap=2.0),
    dict(is_correction="mis_sequence", tis_cap=2.0),
    dict(entropy_coef=0.1),
]
MASK = torch.tensor([[True, False, True, True], [True, True, True, False]])


def _clean_batch():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 4, generator=gen) * 3  # float32, as the trainer's log-probs
    old = logp + 0.1 * torch.randn(2, 4, generator=gen)
    ref_lp = logp + 0.3 * torch.randn(2, 4, generator=gen)
    sampler = old + 0.05 * torch.randn(2, 4, generator=gen)
    ent = torch.rand(2, 4, generator=gen) * 2
    return logp, old, ref_lp, sampler, ent


@pytest.mark.parametrize("kw", ROBUST, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("poison", [NAN, INF, -INF, 149.0, -1e30])
def test_any_value_at_masked_positions_changes_nothing(kw, poison):
    """logp, old_logp, ref_logp, sampler_logp, entropy and (N, T) advantages (where the level takes
    them) poisoned where masked, input k with ``(k + 1) · poison``."""
    logp, old, ref_lp, sampler, ent = _clean_batch()
    seq = kw.get("importance_level") == "sequence"
    adv = torch.tensor([1.5, -0.5]) if seq else torch.tensor([[1.5, -0.5, 0.7, -1.0], [-0.3, 0.9, 1.1, 0.4]])
    base = dict(beta=0.04, **kw)

    def go(lp, o, r, s, e, a):
        return _loss_grad(lp, o, a, MASK, ref_logp=r, sampler_logp=s if kw.get("tis_cap") else None, entropy=e, **base)

    clean = go(logp, old, ref_lp, sampler, ent, adv)
    bad = [x.clone() for x in (logp, old, ref_lp, sampler, ent)] + [adv.clone()]
    for k, x in enumerate(bad):
        if x.dim() == 2:
            x[~MASK] = (k + 1) * poison
    got = go(*bad)
    torch.testing.assert_close(got[0], clean[0])
    assert got[1].keys() == clean[1].keys()
    for k in clean[1]:
        torch.testing.assert_close(got[1][k], clean[1][k], msg=k)
    torch.testing.assert_close(got[2], clean[2])
    assert (got[2][~MASK] == 0).all()


@pytest.mark.parametrize("kw", ROBUST, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_a_row_with_zero_advantages_and_an_overflowing_ratio_adds_exactly_nothing(kw):
    logp, old, ref_lp, sampler, ent = _clean_batch()
    adv = torch.tensor([0.0, 0.8])  # row 0: a constant group's row
    at_one, far = old.clone(), old.clone()
    at_one[0] = logp[0]  # the clean batch: row 0's ratio is 1
    far[0] = logp[0] - 200.0  # row 0: log-ratio 200 at every token (inf in float32 once exp'd)

    def go(o):
        s = torch.cat([o[:1], sampler[1:]]) if kw.get("tis_cap") else None  # row 0: w = π_old/π_sampler = 1
        return _loss_grad(logp, o, adv, MASK, ref_logp=ref_lp, beta=0.04, entropy=ent, sampler_logp=s, **kw)

    clean, got = go(at_one), go(far)
    torch.testing.assert_close(got[0], clean[0])
    torch.testing.assert_close(got[2], clean[2])
    assert torch.isfinite(got[2]).all()


# -- argument errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(importance_level="gspo"), "importance_level must be one of"),
        (dict(surrogate="sapo"), "surrogate must be one of"),
        (dict(is_correction="icepop"), "is_correction must be one of"),
        (dict(dual_clip_c=0.5), "dual_clip_c must be 0 \\(off\\) or > 1"),
        (dict(delta=1.1), "delta must be 0 \\(off\\) or > 1 \\+ clip_eps_high"),
        (dict(surrogate="cispo", importance_level="sequence"), "importance_level must be 'token'"),
        (dict(surrogate="cispo", dual_clip_c=3.0), "surrogate 'cispo' has none"),
        (dict(is_correction="mis_token", tis_cap=1.0), "tis_cap = C must be > 1"),
        (dict(entropy_coef=-0.1), "entropy_coef must be >= 0"),
    ],
)
def test_errors_name_the_argument(kw, match):
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=match):
        flat_policy_loss(lp, lp, torch.ones(1), torch.ones(1, 2).bool(), sampler_logp=lp, **kw)


# -- through the algorithm seam: the recipe keys reach policy_loss -----------------------------------------


def _micro_batch(n=4, t=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 2] = False
    mb = Experience.grouped(
        torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, 2, dtype=torch.bool),
        torch.ones(n, t, dtype=torch.long),
        mask,
        2,
        advantages=torch.randn(n, generator=gen),
        old_logprobs=-torch.rand(n, t, generator=gen) * 4,  # ratios up to e^4: every variant changes the loss
        sampler_logprobs=-torch.rand(n, t, generator=gen) * 4,
    )
    return mb, -torch.rand(n, t, generator=gen), torch.rand(n, t, generator=gen)


@pytest.mark.parametrize(
    "keys,args",
    [
        (
            {"importance_level": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4},
            {"importance_level": "sequence"},
        ),
        ({"importance_level": "sequence_token"}, {"importance_level": "sequence_token"}),
        ({"policy_loss": "cispo", "clip_eps_low": 1.0, "clip_eps_high": 4.0}, {"surrogate": "cispo"}),
        ({"dual_clip_c": 3.0}, {"dual_clip_c": 3.0}),
        ({"delta": 1.5}, {"delta": 1.5}),
        ({"is_correction": "mis_sequence", "tis_cap": 2.0}, {"is_correction": "mis_sequence"}),
        ({"entropy_coef": 0.01}, {"entropy_coef": 0.01}),
    ],
)
def test_grpo_loss_passes_the_recipe_keys_to_policy_loss(keys, args):
    a = AlgoConfig(beta=0.0, **keys)
    mb, logp, ent = _micro_batch()
    mask = mb.completion_mask
    grpo = GRPO(a, 3)
    assert grpo.needs_entropy == ("entropy_coef" in keys)
    got, stats = grpo.loss(logp, mb, mask, num_sequences=4, num_tokens=int(mask.sum()), entropy=ent)
    st = stats.as_dict()
    want, want_st = flat_policy_loss(
        logp,
        mb.old_logprobs,
        mb.advantages,
        mask,
        clip_eps_low=a.clip_eps_low,
        clip_eps_high=a.clip_eps_high,
        max_completion_length=3,
        num_sequences=4,
        num_tokens=int(mask.sum()),
        sampler_logp=mb.sampler_logprobs if a.tis_cap > 0 else None,
        tis_cap=a.tis_cap,
        entropy=ent,
        **args,
    )
    torch.testing.assert_close(got, want)
    plain, _ = flat_policy_loss(logp, mb.old_logprobs, mb.advantages, mask, max_completion_length=3)
    assert got.item() != pytest.approx(plain.item())  # the key changed the loss
    assert set(want_st) <= set(st)
    if grpo.needs_entropy:
        assert st["entropy_coef"].item() == pytest.approx(0.01)


def test_adaptive_entropy_coefficient_moves_toward_the_target_and_is_checkpointed():
    a = AlgoConfig(beta=0.0, entropy_coef=0.0, entropy_target=1.0, entropy_coef_lr=0.5)
    mb, logp, _ = _micro_batch()
    mask = mb.completion_mask
    grpo = GRPO(a, 3)
    assert grpo.needs_entropy and grpo.state_dict() == {}
    ent = torch.full(logp.shape, 0.6)
    ent[1, 2] = NAN  # masked: not part of H
    st = grpo.loss(logp, mb, mask, num_sequences=4, num_tokens=int(mask.sum()), entropy=ent).stats.as_dict()
    assert st["entropy_coef"].item() == 0.0
    grpo.update_auxiliary(mb, mask, None)
    # H = 0.6 below the target 1.0: coef = max(0, 0 + 0.5·(1.0 - 0.6)) = 0.2
    assert grpo.entropy_coef == pytest.approx(0.2) and grpo.state_dict() == {"entropy_coef": pytest.approx(0.2)}
    st = grpo.loss(
        logp, mb, mask, num_sequences=4, num_tokens=int(mask.sum()), entropy=torch.full(logp.shape, 2.0)
    ).stats.as_dict()
    assert st["entropy_coef"].item() == pytest.approx(0.2)
    grpo.update_auxiliary(mb, mask, None)
    # H = 2.0 above: 0.2 + 0.5·(1.0 - 2.0) = -0.3 -> max(0, ·) = 0
    assert grpo.entropy_coef == 0.0
    restored = GRPO(a, 3)
    restored.load_state_dict({"entropy_coef": 0.2})
    assert restored.entropy_coef == pytest.approx(0.2)
    fixed = GRPO(AlgoConfig(entropy_coef=0.05), 3)
    fixed.update_auxiliary(mb, mask, None)
    assert fixed.entropy_coef == 0.05 and fixed.state_dict() == {}


def test_defaults_leave_grpo_as_it_was():
    grpo = GRPO(AlgoConfig(), 3)
    mb, logp, _ = _micro_batch()
    assert not grpo.needs_entropy
    st = grpo.loss(
        logp, mb.replace(ref_logprobs=logp - 0.1), mb.completion_mask, num_sequences=4, num_tokens=11
    ).stats.as_dict()
    assert set(st) == {"clip_frac_low", "clip_frac_high", "kl", "ratio_mean", "num_tokens"}


# -- the recipe keys --------------------------------------------------------------------------------------


def test_keys_are_in_help_with_their_choices():
    text = help_text()
    for key in ("policy_loss", "importance_level", "dual_clip_c", "delta", "is_correction", "entropy_coef"):
        assert f"algo.{key} = " in text, key
    assert "algo.entropy_target = None" in text and "algo.entropy_coef_lr = " in text
    assert "[" + " | ".join(IMPORTANCE_LEVELS) + "]" in text
    assert "[" + " | ".join(SURROGATES) + "]" in text
    assert "[" + " | ".join(IS_CORRECTIONS) + "]" in text


@pytest.mark.parametrize(
    "algo_keys,match",
    [
        ({"importance_level": "gspo"}, "algo.importance_level: 'gspo' is not one of"),
        ({"policy_loss": "sapo"}, "algo.policy_loss: 'sapo' is not one of"),
        ({"dual_clip_c": 0.9}, "algo.dual_clip_c: must be 0 \\(off\\) or > 1"),
        ({"delta": 1.1}, "algo.delta: must be 0 \\(off\\) or > 1 \\+ algo.clip_eps_high"),
        ({"delta": 2.0, "dual_clip_c": 3.0}, "algo.delta: algo.dual_clip_c is set too"),
        ({"policy_loss": "cispo", "importance_level": "sequence"}, "algo.policy_loss: cispo .*importance_level=token"),
        ({"policy_loss": "cispo", "dual_clip_c": 3.0}, "algo.policy_loss: cispo's weight is already bounded"),
        (
            {"importance_level": "sequence", "supervision": "process"},
            "algo.importance_level: sequence .*sequence_token",
        ),
        ({"is_correction": "mis_token"}, "algo.is_correction: mis_token .* algo.tis_cap > 1"),
        ({"entropy_coef": -1.0}, "algo.entropy_coef: must be >= 0"),
        ({"entropy_coef_lr": -1.0}, "algo.entropy_coef_lr: must be >= 0"),
        ({"entropy_target": -0.5}, "algo.entropy_target: must be >= 0"),
        ({"estimator": "ppo", "importance_level": "sequence"}, "algo.importance_level: implemented in the grpo loss"),
        ({"clip_eps_low": 1.0}, "algo.clip_eps_low: must be < 1"),
    ],
)
def test_recipe_checks_name_the_key(algo_keys, match):
    with pytest.raises(RecipeError, match=match):
        recipe_from_dict({"algo": algo_keys})


def test_valid_variant_recipes_load():
    assert (
        recipe_from_dict({"algo": {"policy_loss": "cispo", "clip_eps_low": 1.0, "clip_eps_high": 4.0}}).algo.policy_loss
        == "cispo"
    )
    r = recipe_from_dict({"algo": {"is_correction": "mis_sequence", "tis_cap": 2.0}, "rollout": {"engine": "vllm"}})
    assert r.algo.is_correction == "mis_sequence"
    r = recipe_from_dict(
        {"algo": {"importance_level": "sequence_token", "supervision": "process"}, "rewards": {"functions": []}}
    )
    assert r.algo.importance_level == "sequence_token"
    assert recipe_from_dict({"algo": {"entropy_target": 0.5}}).algo.entropy_target == 0.5


def test_schema_choices_are_the_algo_names():
    fields = AlgoConfig.__dataclass_fields__
    assert choices_of(fields["importance_level"]) == IMPORTANCE_LEVELS
    assert choices_of(fields["policy_loss"]) == SURROGATES
    assert choices_of(fields["is_correction"]) == IS_CORRECTIONS
