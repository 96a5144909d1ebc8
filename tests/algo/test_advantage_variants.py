"""The advantage and reward variants other trainers ship (issue #35): the RLOO and REINFORCE++
baselines (``algo.advantage_baseline``), per-function reward normalization (``rewards.normalize_each``,
GDPO) and DAPO's soft overlong penalty (``algo.overlong_buffer``). Hand-computed vectors with the
arithmetic in a comment, the slow loops of ``tests/support/reference.py`` on random inputs, edge cases
(constant groups, G = 2, unscorable rewards, half-precision inputs), errors, and the recipe keys
reaching the math through ``GRPO.advantages`` and the reward pipeline."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpokit import algo
from grpokit.config import RecipeError
from grpokit.estimators.grpo import GRPO
from grpokit.experience import Experience
from support import reference as ref
from support.helpers import tiny_recipe

f64 = torch.float64
NAN = math.nan
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
grid = st.integers(-800, 800).map(lambda k: k / 8.0)  # exact in binary: no accidental rounding ties


def _t(xs, dtype=f64):
    return torch.tensor(xs, dtype=dtype)


def _close(got, want):
    torch.testing.assert_close(got, _t(want, got.dtype), rtol=1e-12, atol=1e-12, equal_nan=True)


# -- RLOO ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rewards, g, want",
    [
        # A_i = r_i − mean of the others: 1 − (0+0+0)/3 = 1; 0 − (1+0+0)/3 = −1/3
        ([1.0, 0.0, 0.0, 0.0], 4, [1.0, -1 / 3, -1 / 3, -1 / 3]),
        # k = 3 scorable: 1 − (0+0.5)/2 = 0.75; 0 − (1+0.5)/2 = −0.75; 0.5 − (1+0)/2 = 0; NaN -> 0
        ([1.0, NAN, 0.0, 0.5], 4, [0.75, 0.0, -0.75, 0.0]),
        # G = 2: A = r_1 − r_2 and r_2 − r_1: 3 − 1 = 2; 0.25 − 0.75 = −0.5
        ([3.0, 1.0, 0.25, 0.75], 2, [2.0, -2.0, -0.5, 0.5]),
        # 0.3 and 0.1 + 0.2 are one value (constant group: exactly 0); one scorable reward: no one to leave out
        ([0.3, 0.1 + 0.2, 2.0, NAN], 2, [0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_rloo_by_hand(rewards, g, want):
    got = algo.rloo_advantages(_t(rewards), g)
    _close(got, want)
    assert got.dtype == f64 and bool((got[_t(want) == 0] == 0).all())  # exactly 0, not float residue


def test_rloo_differs_from_grpo_and_is_dr_grpo_times_g_over_g_minus_1():
    r = _t([1.0, 0.0, 0.0, 0.0])
    grpo = algo.group_advantages(r, 4)  # 0.75 / (0.5 + 1e-4) = 1.49970..., −0.25 / 0.5001 = −0.49990...
    _close(grpo, [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001])
    assert not torch.allclose(algo.rloo_advantages(r, 4), grpo)
    # every reward scorable: k/(k−1)·(r − mean) = 4/3 · [0.75, −0.25, ...] = [1, −1/3, ...]
    _close(algo.rloo_advantages(r, 4), (4 / 3 * algo.group_advantages(r, 4, scale="none")).tolist())


# -- REINFORCE++-baseline -----------------------------------------------------------------------------------


def test_reinforce_pp_by_hand():
    # G = 3. Group 0 = [1, 0, NaN]: mean 0.5, c = [0.5, −0.5, —]; group 1 = [3, 1, 2]: mean 2, c = [1, −1, 0].
    # Tokens L = [2, 2, 5, 1, 1, 2]; the unscorable row's 5 do not count: Σ L = 2+2+1+1+2 = 8.
    # μ = (2·0.5 − 2·0.5 + 1 − 1 + 0) / 8 = 0; σ² = (2·0.25 + 2·0.25 + 1 + 1 + 0) / 8 = 3/8, σ = 0.612372...
    r, lengths = _t([1.0, 0.0, NAN, 3.0, 1.0, 2.0]), torch.tensor([2, 2, 5, 1, 1, 2])
    s = math.sqrt(3 / 8)
    _close(algo.reinforce_pp_advantages(r, 3, lengths), [0.5 / s, -0.5 / s, 0.0, 1 / s, -1 / s, 0.0])
    # scale="none": centred on the token mean only (μ = 0 here): c itself
    _close(algo.reinforce_pp_advantages(r, 3, lengths, scale="none"), [0.5, -0.5, 0.0, 1.0, -1.0, 0.0])


def test_reinforce_pp_counts_constant_groups_in_the_batch_statistics_and_gives_them_0():
    # Group 0 = [1, 0]: c = [0.5, −0.5]; group 1 = [2, 2] constant: c = [0, 0], still counted.
    # L = [1, 3, 2, 2], Σ L = 8: μ = (0.5 − 1.5 + 0 + 0) / 8 = −1/8;
    # σ² = (1·(5/8)² + 3·(3/8)² + 2·(1/8)² + 2·(1/8)²) / 8 = (25 + 27 + 2 + 2) / 512 = 7/64, σ = √7/8.
    r, lengths = _t([1.0, 0.0, 2.0, 2.0]), torch.tensor([1, 3, 2, 2])
    s = math.sqrt(7) / 8
    got = algo.reinforce_pp_advantages(r, 2, lengths)
    _close(got, [(0.5 + 1 / 8) / s, (-0.5 + 1 / 8) / s, 0.0, 0.0])  # OpenRLHF: group 1 would get (0 + 1/8)/σ
    assert got[2] == 0 and got[3] == 0
    _close(algo.reinforce_pp_advantages(r, 2, lengths, scale="none"), [0.625, -0.375, 0.0, 0.0])
    # GRPO gives the varying group ±0.5 / (0.7071 + 1e-4), whatever the lengths
    assert not torch.allclose(got, algo.group_advantages(r, 2))


def test_reinforce_pp_floors_the_std_at_eps():
    # c = ±5e-7, μ = 0, σ = 5e-7 < eps = 1e-4: divided by 1e-4 (OpenRLHF: rsqrt(max(σ², 1e-8)))
    got = algo.reinforce_pp_advantages(_t([1e-6, 0.0]), 2, torch.tensor([1, 1]))
    _close(got, [5e-7 / 1e-4, -5e-7 / 1e-4])


def test_reinforce_pp_equals_openrlhfs_token_whitening():
    """OpenRLHF's ``reinforce_baseline``, written out on the token grid: the group-centred reward
    on every masked token, minus the masked mean, times ``rsqrt(clamp(var, 1e-8))`` (var = the
    masked population variance). Without constant groups or unscorable rows ours equals it."""
    gen = torch.Generator().manual_seed(3)
    b, g, t = 5, 4, 9
    r = torch.randn(b * g, generator=gen, dtype=f64)
    lengths = torch.randint(0, t + 1, (b * g,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]  # (N, T)
    c = (r.view(b, g) - r.view(b, g).mean(1, keepdim=True)).reshape(-1)
    tok = c[:, None] * mask  # (N, T)
    mean = tok.sum() / mask.sum()
    var = (((tok - mean) ** 2) * mask).sum() / mask.sum()
    whitened = (tok - mean) * var.clamp(min=1e-8).rsqrt()
    ours = algo.reinforce_pp_advantages(r, g, lengths)
    torch.testing.assert_close(torch.where(mask, ours[:, None].expand(-1, t), 0.0), whitened * mask)


# -- normalize each reward, then sum (GDPO) -----------------------------------------------------------------


def test_normalized_reward_sum_by_hand_and_against_the_plain_sum():
    # columns: correct? [1, 0, 1, 0] (mean 0.5, sample std 0.57735) and a length score [0, 0, 10, 10]
    # (mean 5, std 5.7735). z_1 = ±0.5/(0.57735 + 1e-4), z_2 = ±5/(5.7735 + 1e-4): R = z_1 + z_2
    r = _t([[1.0, 0.0], [0.0, 0.0], [1.0, 10.0], [0.0, 10.0]])
    a1, a2 = 0.5 / (math.sqrt(1 / 3) + 1e-4), 5 / (math.sqrt(100 / 3) + 1e-4)
    got = algo.normalized_reward_sum(r, _t([1.0, 1.0]), 4)
    _close(got, [a1 - a2, -a1 - a2, a1 + a2, -a1 + a2])
    # the plain sum [1, 0, 11, 10] lets the length score decide: the wrong row 3 far above the right row 0
    plain = algo.group_advantages(r.sum(1), 4)
    assert plain[3] - plain[0] > 1.5
    assert abs(got[3] - got[0]) < 1e-3  # normalized: one right and one long, equal standing


def test_normalized_reward_sum_keeps_compute_rewards_unscorable_rule():
    # w = [1, 0.5]; row 2 has None in a weighted column: NaN, and out of every column's statistics.
    # Rows 0-1: column 1 = [1, 0]: ±0.5 / (0.70711 + 1e-4); column 2 = [2, 4]: ∓1 / (1.41421 + 1e-4)
    r = _t([[1.0, 2.0], [0.0, 4.0], [NAN, 6.0]])
    z1, z2 = 0.5 / (math.sqrt(0.5) + 1e-4), 1 / (math.sqrt(2) + 1e-4)
    _close(algo.normalized_reward_sum(r, _t([1.0, 0.5]), 3), [z1 - 0.5 * z2, -z1 + 0.5 * z2, NAN])
    # a None in a column of weight 0 makes nothing unscorable; that column is ignored.
    # column 1 = [1, 0, 1]: mean 2/3, std 0.57735: [1/3, −2/3, 1/3] / (0.57735 + 1e-4)
    r = _t([[1.0, NAN], [0.0, 1.0], [1.0, 2.0]])
    d = math.sqrt(1 / 3) + 1e-4
    _close(algo.normalized_reward_sum(r, _t([1.0, 0.0]), 3), [1 / 3 / d, -2 / 3 / d, 1 / 3 / d])


def test_normalize_each_with_batch_scale_is_trls_normalize_then_sum():
    """TRL's ``normalize_then_sum`` written out (every row scorable): each function's group z-score
    (nan-aware mean, sample std, + 1e-4), weighted sum, then ``(R − mean_batch) / (std_batch + 1e-4)``.
    Here: ``normalized_reward_sum``, then ``group_advantages(scale="batch")``; each group's sum has
    mean 0, so the group mean it subtracts is the batch mean (up to rounding)."""
    gen = torch.Generator().manual_seed(5)
    b, g, k = 4, 5, 3
    r = torch.randint(0, 4, (b * g, k), generator=gen).double()
    w = _t([1.0, 0.5, 2.0])
    grouped = r.view(b, g, k)
    z = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    total = (z.reshape(-1, k) * w).sum(1)
    trl = (total - total.mean()) / (total.std() + 1e-4)
    ours = algo.group_advantages(algo.normalized_reward_sum(r, w, g), g, scale="batch")
    torch.testing.assert_close(ours, trl, rtol=1e-9, atol=1e-9)


def test_normalized_reward_sum_edges():
    # a column constant in a group adds exactly 0 there (G = 2: [1, 1]); G = 2 column [3, 1]: ±1/(√2 + 1e-4)
    r = _t([[3.0, 1.0], [1.0, 1.0]])
    _close(algo.normalized_reward_sum(r, _t([1.0, 5.0]), 2), [1 / (math.sqrt(2) + 1e-4), -1 / (math.sqrt(2) + 1e-4)])
    # every weight 0: the sum is 0 (compute_rewards' total is 0.0 then), nothing unscorable
    _close(algo.normalized_reward_sum(_t([[NAN], [1.0]]), _t([0.0]), 2), [0.0, 0.0])


# -- DAPO's soft overlong penalty -------------------------------------------------------------------------


def test_overlong_penalty_by_hand():
    # L_max = 16, L_cache = 4: 0 up to 12; (12 − |y|)/4 on (12, 16]: 13 -> −0.25, 15 -> −0.75, 16 -> −1; > 16: −1
    got = algo.overlong_penalty(torch.tensor([0, 10, 12, 13, 15, 16, 17]), 16, 4)
    assert got.dtype == f64
    assert got.tolist() == [0.0, 0.0, 0.0, -0.25, -0.75, -1.0, -1.0]
    assert algo.overlong_penalty(torch.tensor([3, 16]), 16, 0).tolist() == [0.0, 0.0]  # L_cache = 0: off
    # L_cache = L_max: a pure length penalty −|y|/L_max: 0, −8/16, −16/16
    assert algo.overlong_penalty(torch.tensor([0, 8, 16]), 16, 16).tolist() == [0.0, -0.5, -1.0]


def test_overlong_penalty_gives_a_constant_group_signal():
    # both right (reward 1) but 10 and 15 tokens: penalties 0 and (12 − 15)/4 = −0.75 -> rewards [1, 0.25]
    r = _t([1.0, 1.0]) + algo.overlong_penalty(torch.tensor([10, 15]), 16, 4)
    assert bool(algo.constant_groups(_t([1.0, 1.0]), 2)) and not bool(algo.constant_groups(r, 2))
    _close(algo.group_advantages(r, 2), [0.375 / (math.sqrt(2) * 0.375 + 1e-4), -0.375 / (math.sqrt(2) * 0.375 + 1e-4)])


# -- against the slow loops on random inputs ------------------------------------------------------------------


@st.composite
def grouped(draw, nan=True):
    g = draw(st.integers(2, 6))
    b = draw(st.integers(1, 4))
    elem = st.one_of(grid, st.just(NAN)) if nan else grid
    r = draw(st.lists(elem, min_size=b * g, max_size=b * g))
    lengths = draw(st.lists(st.integers(0, 12), min_size=b * g, max_size=b * g))
    return r, g, lengths


@SETTINGS
@given(grouped())
def test_rloo_equals_the_loop(rg):
    r, g, _ = rg
    _close(algo.rloo_advantages(_t(r), g), ref.rloo_advantages(r, g))


@SETTINGS
@given(grouped(), st.sampled_from(["batch", "none"]), st.sampled_from([1e-4, 0.5]))
def test_reinforce_pp_equals_the_loop(rg, scale, eps):
    r, g, lengths = rg
    got = algo.reinforce_pp_advantages(_t(r), g, torch.tensor(lengths), scale=scale, eps=eps)
    want = ref.reinforce_pp_advantages(r, g, lengths, scale=scale, eps=eps)
    # the batch whitening divides by std + eps: where the counted tokens' std is ~0 (one row with
    # tokens), float64 rounding of the centred rewards (~1e-15·max|r|, summed in another order than
    # the loop's) is amplified by 1/eps (seen: 1.4e-10 at max|r| = 64, eps = 1e-4)
    big = max((abs(x) for x in r if x == x), default=0.0)
    torch.testing.assert_close(got, _t(want), rtol=1e-10, atol=1e-10 + 1e-13 * big / eps)


@SETTINGS
@given(st.data(), st.integers(1, 3))
def test_normalized_reward_sum_equals_the_loop(data, k):
    g, b = data.draw(st.integers(2, 5)), data.draw(st.integers(1, 3))
    rows = data.draw(
        st.lists(st.lists(st.one_of(grid, st.just(NAN)), min_size=k, max_size=k), min_size=b * g, max_size=b * g)
    )
    weights = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0]), min_size=k, max_size=k))
    got = algo.normalized_reward_sum(_t(rows), _t(weights), g)
    torch.testing.assert_close(
        got, _t(ref.normalized_reward_sum(rows, weights, g)), rtol=1e-10, atol=1e-10, equal_nan=True
    )


@SETTINGS
@given(st.lists(st.integers(0, 40), min_size=1, max_size=20), st.integers(1, 32), st.data())
def test_overlong_penalty_equals_the_loop(lengths, max_length, data):
    buffer = data.draw(st.integers(0, max_length))
    got = algo.overlong_penalty(torch.tensor(lengths), max_length, buffer)
    _close(got, ref.overlong_penalty(lengths, max_length, buffer))


@SETTINGS
@given(grouped(nan=False))
def test_rloo_is_dr_grpo_times_g_over_g_minus_1_when_all_are_scorable(rg):
    r, g, _ = rg
    want = algo.group_advantages(_t(r), g, scale="none") * g / (g - 1)
    torch.testing.assert_close(algo.rloo_advantages(_t(r), g), want, rtol=1e-12, atol=1e-12)


# -- dtypes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_half_precision_inputs(dtype):
    """Output in the input dtype; a constant group exactly 0; values those of float64 statistics on
    the same (rounded) inputs, rounded once (the per-function sum: each function's z-score and the
    sum rounded)."""
    r = torch.tensor([0.35, 0.35, 0.35, 0.35, 1.0, 0.0, 0.5, 0.25], dtype=dtype)  # group 0 constant
    lengths = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    tol = {"rtol": torch.finfo(dtype).eps * 4, "atol": torch.finfo(dtype).eps * 4}
    for got, want in (
        (algo.rloo_advantages(r, 4), algo.rloo_advantages(r.double(), 4)),
        (algo.reinforce_pp_advantages(r, 4, lengths), algo.reinforce_pp_advantages(r.double(), 4, lengths)),
        (
            algo.normalized_reward_sum(torch.stack([r, r.flip(0)], 1), _t([1.0, 0.5]), 4),
            algo.normalized_reward_sum(torch.stack([r, r.flip(0)], 1).double(), _t([1.0, 0.5]), 4),
        ),
    ):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want.to(dtype).double(), **tol)
    assert torch.equal(algo.rloo_advantages(r, 4)[:4], torch.zeros(4, dtype=dtype))
    assert torch.equal(algo.reinforce_pp_advantages(r, 4, lengths)[:4], torch.zeros(4, dtype=dtype))
    # integer rewards: float32 out, as group_advantages
    assert algo.rloo_advantages(torch.tensor([1, 0]), 2).tolist() == [1.0, -1.0]
    assert algo.reinforce_pp_advantages(torch.tensor([1, 0]), 2, torch.tensor([1, 1])).dtype == torch.float32
    got = algo.normalized_reward_sum(torch.tensor([[1], [0]]), _t([1.0]), 2)  # ±0.5 / (0.70711 + 1e-4)
    assert got.dtype == torch.float32 and got[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4), rel=1e-6)


def test_extreme_rewards_stay_finite():
    big = torch.finfo(f64).max
    r = _t([big, -big, big / 2, 0.0])
    assert torch.isfinite(algo.rloo_advantages(r, 2)).all()  # 2·big saturates at the float64 max
    assert torch.isfinite(algo.reinforce_pp_advantages(r, 2, torch.tensor([1, 2, 3, 4]))).all()
    assert torch.isfinite(algo.normalized_reward_sum(r[:, None], _t([1.0]), 2)).all()


# -- the one place that chooses, and its errors -------------------------------------------------------


def test_outcome_advantages_group_is_group_advantages_bit_for_bit():
    r = torch.tensor([0.0, 1, 1, 0, 3, 3, 3, 5], dtype=torch.float32)
    for scale in algo.SCALES:
        assert torch.equal(algo.outcome_advantages(r, 4, scale=scale), algo.group_advantages(r, 4, scale=scale))
    assert torch.equal(algo.outcome_advantages(r, 4, baseline="rloo", scale="none"), algo.rloo_advantages(r, 4))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: algo.outcome_advantages(_t([1.0, 0.0]), 2, baseline="vimco"), "baseline must be one of"),
        (lambda: algo.outcome_advantages(_t([1.0, 0.0]), 2, baseline="rloo"), "baseline 'rloo' takes scale"),
        (
            lambda: algo.outcome_advantages(_t([1.0, 0.0]), 2, baseline="reinforce_pp", scale="group"),
            "baseline 'reinforce_pp' takes scale",
        ),
        (
            lambda: algo.outcome_advantages(_t([1.0, 0.0]), 2, baseline="reinforce_pp", scale="batch"),
            "needs lengths",
        ),
        (lambda: algo.rloo_advantages(_t([1.0, 0.0, 1.0]), 2), "not divisible"),
        (lambda: algo.reinforce_pp_advantages(_t([1.0, 0.0]), 2, torch.tensor([1, -1])), "lengths must be >= 0"),
        (lambda: algo.reinforce_pp_advantages(_t([1.0, 0.0]), 2, torch.tensor([1])), "shapes must match"),
        (lambda: algo.normalized_reward_sum(_t([1.0, 0.0]), _t([1.0]), 2), "rewards must be 2-D"),
        (lambda: algo.normalized_reward_sum(_t([[1.0], [0.0]]), _t([1.0, 2.0]), 2), r"weights must have shape \(1,\)"),
        (lambda: algo.overlong_penalty(torch.tensor([1]), 8, 9), r"buffer must be in \[0, max_length=8\]"),
        (lambda: algo.overlong_penalty(torch.tensor([-1]), 8, 2), "lengths must be >= 0"),
    ],
)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- the recipe keys reach the math ------------------------------------------------------------------------


def _exp(rewards, lengths, g):
    n, t = len(rewards), max(lengths) + 1
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return Experience.grouped(
        torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, 2, dtype=torch.bool),
        torch.ones(n, t, dtype=torch.long),
        mask,
        g,
        rewards=_t(rewards),
        completions=[f"c{i}" for i in range(n)],
    )


@pytest.mark.parametrize(
    "keys, want",
    [
        # default: GRPO's z-score, bit for bit what group_advantages gives
        ({}, lambda e: algo.group_advantages(e.rewards, 2, eps=1e-4)),
        # RLOO, G = 2: [1 − 0, 0 − 1, 3 − 1, 1 − 3]
        ({"advantage_baseline": "rloo", "advantage_scale": "none"}, lambda e: _t([1.0, -1.0, 2.0, -2.0])),
        # REINFORCE++: c = [.5, −.5, 1, −1], L = [1, 3, 2, 2]: μ = (.5 − 1.5 + 2 − 2)/8 = −1/8
        (
            {"advantage_baseline": "reinforce_pp", "advantage_scale": "batch", "advantage_eps": 0.25},
            lambda e: algo.reinforce_pp_advantages(e.rewards, 2, torch.tensor([1, 3, 2, 2]), eps=0.25),
        ),
        (
            {"advantage_baseline": "reinforce_pp", "advantage_scale": "none"},
            lambda e: _t([0.625, -0.375, 1.125, -0.875]),
        ),
    ],
)
def test_grpo_advantages_follow_the_recipe_keys(tmp_path, keys, want):
    a = tiny_recipe("m", tmp_path, algo=keys).algo
    e = _exp([1.0, 0.0, 3.0, 1.0], [1, 3, 2, 2], 2)
    got = GRPO(a, 8).advantages(e)
    assert got.dtype == torch.float32
    assert torch.equal(got, want(e).float())


def test_reward_pipeline_normalizes_each_and_adds_the_overlong_penalty(tmp_path):
    """``rewards.normalize_each`` and ``algo.overlong_buffer``/``overlong_penalty_weight`` from a
    recipe, through ``build_rewards``, on a fake experience."""
    from grpokit.rewards.pipeline import OverlongPenalty
    from grpokit.trainer.build import build_rewards

    recipe = tiny_recipe(
        "m",
        tmp_path,
        rollout={"group_size": 2, "max_new_tokens": 8},
        rewards={
            "functions": ["support.fake_rewards:length_reward", "support.fake_rewards:trl_answer_reward"],
            "weights": [1.0, 2.0],
            "normalize_each": True,
            "isolation": "thread",
        },
        algo={"overlong_buffer": 4, "overlong_penalty_weight": 0.5},
    )
    pipe = build_rewards(recipe)
    try:
        assert pipe.normalize_each and pipe.overlong == OverlongPenalty(8, 4, 0.5)
        e = _exp([0.0] * 4, [3, 6, 8, 2], 2)
        e.completions = ["x 5", "yy 7", "zzz 1", "w 1"]
        m = pipe.score(e, [{"prompt": "p", "answer": "5"}, {"prompt": "q", "answer": "2"}], ["answer"])
    finally:
        pipe.close()
    # length_reward = chars/100: [.03, .04] and [.05, .03]; trl_answer_reward = ends with the answer: [1, 0], [0, 0]
    # group 0: z(length) = ∓.005/(.0070711 + 1e-4) (row 0 the shorter: −), z(answer) = ±.5/(.70711 + 1e-4);
    # group 1: z(length) = ±.01/(.0141421 + 1e-4), answer constant: 0
    zl0, za0, zl1 = (
        0.005 / (math.sqrt(2) * 0.005 + 1e-4),
        0.5 / (math.sqrt(0.5) + 1e-4),
        0.01 / (math.sqrt(2) * 0.01 + 1e-4),
    )
    summed = [-zl0 + 2 * za0, zl0 - 2 * za0, zl1, -zl1]
    # |y| = [3, 6, 8, 2], L_max = 8, L_cache = 4: penalties [0, (4 − 6)/4, (4 − 8)/4, 0] = [0, −.5, −1, 0], weight 0.5
    penalty = [0.0, -0.5, -1.0, 0.0]
    torch.testing.assert_close(e.rewards, _t([s + 0.5 * p for s, p in zip(summed, penalty)]), rtol=1e-12, atol=1e-12)
    assert m["rewards/overlong_penalty"] == pytest.approx(-1.5 / 4)
    assert m["rewards/length_reward"] == pytest.approx(0.0375)  # raw values still logged


def test_reward_pipeline_defaults_leave_the_reward_as_it_was(tmp_path):
    from grpokit.trainer.build import build_rewards

    recipe = tiny_recipe("m", tmp_path, rewards={"isolation": "thread"})
    pipe = build_rewards(recipe)
    try:
        assert not pipe.normalize_each and pipe.overlong is None
        e = _exp([0.0] * 4, [3, 6, 8, 2], 2)
        e.completions = ["x 5", "yy 7", "zzz 1", "w 1"]
        m = pipe.score(e, [{"prompt": "p"}, {"prompt": "q"}], [])
    finally:
        pipe.close()
    assert e.rewards.tolist() == [0.03, 0.04, 0.05, 0.03] and "rewards/overlong_penalty" not in m


def test_an_overlong_penalty_name_clash_is_refused():
    from grpokit.rewards.pipeline import OverlongPenalty, RewardPipeline

    with pytest.raises(ValueError, match="overlong_penalty"):
        RewardPipeline({"overlong_penalty": lambda p, c, **_: [0.0] * len(c)}, {}, overlong=OverlongPenalty(8, 2))


# -- the recipe: choices, ranges, combinations, help -----------------------------------------------------


def test_the_recipe_choices_are_the_algo_tables():
    import dataclasses

    from grpokit.config import AlgoConfig, choices_of
    from grpokit.config.checks import BASELINE_SCALES

    field = {f.name: f for f in dataclasses.fields(AlgoConfig)}["advantage_baseline"]
    assert choices_of(field) == algo.BASELINES
    assert {k: v[0] for k, v in BASELINE_SCALES.items()} == algo.BASELINE_SCALES


@pytest.mark.parametrize(
    "sections, match",
    [
        ({"algo": {"advantage_baseline": "vimco"}}, "algo.advantage_baseline: 'vimco' is not one of"),
        ({"algo": {"advantage_baseline": "rloo"}}, r"algo.advantage_scale=group with algo.advantage_baseline=rloo"),
        (
            {"algo": {"advantage_baseline": "rloo", "advantage_scale": "batch"}},
            "algo.advantage_scale=batch with algo.advantage_baseline=rloo: RLOO's advantage is unscaled",
        ),
        (
            {"algo": {"advantage_baseline": "reinforce_pp"}},
            "algo.advantage_scale=group with algo.advantage_baseline=reinforce_pp",
        ),
        (
            {"algo": {"advantage_baseline": "rloo", "advantage_scale": "none", "estimator": "ppo"}},
            "algo.advantage_baseline=rloo: an outcome baseline of algo.estimator=grpo",
        ),
        (
            {"algo": {"advantage_baseline": "reinforce_pp", "advantage_scale": "batch", "supervision": "process"}},
            "algo.advantage_baseline=reinforce_pp: an outcome baseline; algo.supervision=process",
        ),
        ({"algo": {"supervision": "process"}, "rewards": {"normalize_each": True}}, "rewards.normalize_each: shapes"),
        ({"algo": {"supervision": "process", "overlong_buffer": 2}}, "algo.overlong_buffer: shapes"),
        ({"algo": {"overlong_buffer": 9}}, r"algo.overlong_buffer: must be in \[0, 8\]"),
        ({"algo": {"overlong_buffer": -1}}, r"algo.overlong_buffer: must be in \[0, 8\]"),
        (
            {"algo": {"overlong_buffer": 2, "overlong_penalty_weight": -0.5}},
            "algo.overlong_penalty_weight: must be >= 0",
        ),
        ({"algo": {"overlong_penalty_weight": math.inf}}, "algo.overlong_penalty_weight: expected a finite number"),
        # multi-turn: L_max = the model's tokens of a row, min(max_turns · max_new_tokens, max_total_tokens) = 20
        (
            {"algo": {"overlong_buffer": 21}, "rollout": {"env": "tools", "max_turns": 3, "max_total_tokens": 20}},
            r"algo.overlong_buffer: must be in \[0, 20\]",
        ),
    ],
)
def test_recipe_errors_name_the_keys(tmp_path, sections, match):
    with pytest.raises(RecipeError, match=match):
        tiny_recipe("m", tmp_path, **sections)  # max_new_tokens = 8


@pytest.mark.parametrize(
    "algo_keys",
    [
        {"advantage_baseline": "rloo", "advantage_scale": "none"},
        {"advantage_baseline": "reinforce_pp", "advantage_scale": "batch"},
        {"advantage_baseline": "reinforce_pp", "advantage_scale": "none"},
        {"advantage_baseline": "group", "advantage_scale": "none", "overlong_buffer": 8, "overlong_filter": True},
        {"estimator": "ppo", "overlong_buffer": 4},
        {"overlong_buffer": 24, "overlong_penalty_weight": 0.0},  # multi-turn limit: 4 turns · 8 tokens = 32
    ],
)
def test_recipes_that_make_sense_are_accepted(tmp_path, algo_keys):
    multi = {"env": "tools"} if algo_keys.get("overlong_buffer") == 24 else {}
    r = tiny_recipe("m", tmp_path, algo=algo_keys, rewards={"normalize_each": True}, rollout=multi)
    assert r.rewards.normalize_each and r.algo.advantage_baseline == algo_keys.get("advantage_baseline", "group")


def test_train_help_lists_the_keys_with_their_defaults(capsys):
    from grpokit.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for line in (
        "algo.advantage_baseline = 'group' [group | rloo | reinforce_pp]",
        "rewards.normalize_each = False",
        "algo.overlong_buffer = 0",
        "algo.overlong_penalty_weight = 1.0",
    ):
        assert line in out, line


def test_the_model_card_says_the_variants(tmp_path):
    from grpokit.trainer.model_card import model_card

    plain = model_card(tiny_recipe("m", tmp_path).to_dict(), 1, [], lora=False)
    assert "`algo.advantage_baseline`" not in plain and "`rewards.normalize_each`" not in plain
    assert "overlong penalty" not in plain
    recipe = tiny_recipe(
        "m",
        tmp_path,
        algo={"advantage_baseline": "rloo", "advantage_scale": "none", "overlong_buffer": 4},
        rewards={"normalize_each": True},
    )
    card = model_card(recipe.to_dict(), 1, [], lora=False)
    for row in (
        "| advantage baseline | `algo.advantage_baseline` | rloo |",
        "| each reward z-scored in its group before the sum | `rewards.normalize_each` | True |",
        "| DAPO soft overlong penalty (buffer tokens, weight) "
        "| `algo.overlong_buffer / algo.overlong_penalty_weight` | 4 / 1 |",
    ):
        assert row in card, row


# -- a real step --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_one_step_with_every_variant_on(tiny_model_dir, tmp_path):
    """REINFORCE++, per-function normalization and the overlong penalty together, one step on the
    tiny model: the penalty is in the reward and its metric, the update is finite and moves the weights."""
    from grpokit.metrics import read_metrics
    from grpokit.trainer.build import build_run
    from grpokit.trainer.loop import train

    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        algo={"advantage_baseline": "reinforce_pp", "advantage_scale": "batch", "overlong_buffer": 4},
        rewards={"normalize_each": True, "isolation": "thread"},
        train={"max_steps": 1},
    )
    run = build_run(recipe)
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    try:
        train(recipe, progress=False, run=run)
    finally:
        run.rewards.close()
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    # the tiny random model writes all 8 tokens (no EOS): |y| = L_max, R_len = (4 − 8)/4 = −1 for every row
    assert m["rewards/overlong_penalty"] == -1.0
    # one function z-scored per group sums to 0 in each group, so the reward's mean is the penalty's
    assert m["reward_mean"] == pytest.approx(-1.0, abs=1e-6)
    assert math.isfinite(m["loss"]) and m["skipped_updates"] == 0
    assert any(not torch.equal(before[k], v) for k, v in run.model.state_dict().items())
