"""Rewards equal up to rounding are a constant group: advantages exactly 0, whatever ``eps``.

``0.1 + 0.2 != 0.3`` in binary floating point (they differ by one ulp, 5.6e-17); with ``eps = 0``
an exact "varies" test divided that residue by its own std and gave 3.87 for the odd member of a
16-group. The rule (``algo.constant_groups``): spread <= 16 ulps of the input dtype at max|r|.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpokit import algo

f32, f64 = torch.float32, torch.float64
RESIDUE = 0.1 + 0.2  # 0.30000000000000004
assert RESIDUE != 0.3

# 15 + 1: mean 0.3 + 3.5e-18, std 1.4e-17; the odd member got (5.6e-17 − 3.5e-18) / 1.4e-17 = 3.873
ONE_OFF = torch.tensor([0.3] * 15 + [RESIDUE], dtype=f64)
# 8 / 8: the old advantages (±0.968) did not even sum to 0 over the group
SPLIT = torch.tensor([0.3] * 8 + [RESIDUE] * 8, dtype=f64)


@pytest.mark.parametrize("rewards", [ONE_OFF, SPLIT], ids=["15+1", "8/8"])
@pytest.mark.parametrize("eps", [0.0, 1e-4])
@pytest.mark.parametrize("scale", algo.SCALES)
def test_float_residue_is_a_constant_group(rewards, eps, scale):
    adv = algo.group_advantages(rewards, 16, scale=scale, eps=eps)
    assert torch.equal(adv, torch.zeros(16, dtype=f64))
    assert algo.constant_groups(rewards, 16).tolist() == [True]


@pytest.mark.parametrize(
    "low, high", [(0.3, 0.3 + 1e-9), (1.0, 1.0 + 1e-12), (0.0, 1e-300), (-1e300, -1e300 * (1 + 1e-12))]
)
@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_genuine_differences_still_vary(low, high, eps):
    """Far more than rounding apart (1e-12 relative is ~4500 ulps of float64): a real spread."""
    r = torch.tensor([low] * 3 + [high], dtype=f64)
    assert algo.constant_groups(r, 4).tolist() == [False]
    adv = algo.group_advantages(r, 4, eps=0.0)
    # three equal, one apart: (x − mean) / std = −1/2 and 3/2, whatever the gap; a gap of ~4500
    # ulps leaves the centred values with a relative error of a few ulps / 4500 (~1e-4)
    want = torch.tensor([-0.5, -0.5, -0.5, 1.5], dtype=f64) * math.copysign(1, high - low)
    torch.testing.assert_close(adv, want, rtol=1e-3, atol=0.0)
    assert (algo.group_advantages(r, 4, eps=eps) != 0).all()
    assert (algo.group_advantages(r, 4, scale="batch", eps=eps) != 0).all()
    assert (algo.group_advantages(r, 4, scale="none") != 0).all()


def test_float32_rewards_with_float32_residue():
    """0.1f + 0.6f = 0.70000005 but 0.7f = 0.69999999 (one float32 ulp, 6e-8): in float64 that gap
    is 5e8 float64 ulps, so the rule must use the input dtype's eps, not float64's."""
    a = torch.tensor([0.1, 0.1], dtype=f32) + torch.tensor([0.6, 0.6], dtype=f32)
    r = torch.cat([torch.tensor([0.7] * 6, dtype=f32), a])  # one group of 8
    assert (r != r[0]).any()
    for eps in (0.0, 1e-4):
        for scale in algo.SCALES:
            assert torch.equal(algo.group_advantages(r, 8, scale=scale, eps=eps), torch.zeros(8))
    assert algo.constant_groups(r, 8).tolist() == [True]
    # the same numbers handed over as float64 are 5e8 ulps apart: a genuine (tiny) difference
    assert algo.constant_groups(r.double(), 8).tolist() == [False]
    # and a float32 difference well above rounding still counts
    assert algo.constant_groups(torch.tensor([0.7, 0.7001], dtype=f32), 2).tolist() == [False]


def test_integer_rewards_are_exact():
    big = 2**40
    assert algo.constant_groups(torch.tensor([big, big + 1, 3, 3]), 2).tolist() == [False, True]
    assert (algo.group_advantages(torch.tensor([big, big + 1]), 2, eps=0.0) != 0).all()


def test_process_advantages_step_residue_is_constant():
    """Step rewards 0.3 and 0.1 + 0.2 pooled over the group: equal, so every token gets 0."""
    g, t = 4, 3
    step_r = torch.zeros(g, t, dtype=f64)
    ends = torch.zeros(g, t, dtype=torch.bool)
    ends[:, [0, 2]] = True
    step_r[ends] = torch.tensor([0.3, RESIDUE] * g, dtype=f64)
    mask = torch.ones(g, t, dtype=torch.bool)
    for eps in (0.0, 1e-4):
        assert torch.equal(algo.process_advantages(step_r, ends, mask, g, eps=eps), torch.zeros(g, t, dtype=f64))
    # float32 step rewards with float32 residue
    step32 = torch.zeros(g, t, dtype=f32)
    step32[ends] = torch.tensor([0.7, 0.1], dtype=f32).repeat(g) + torch.tensor([0.0, 0.6], dtype=f32).repeat(g)
    assert (step32[ends] != step32[0, 0]).any()
    assert torch.equal(algo.process_advantages(step32, ends, mask, g, eps=0.0), torch.zeros(g, t))
    # a genuine difference still gives non-zero advantages
    step_r[0, 0] = 0.3 + 1e-9
    assert algo.process_advantages(step_r, ends, mask, g, eps=0.0)[0, 0] != 0


def test_batch_scale_residue():
    """scale="batch": a residue group is constant (0) even though the batch varies; the batch std of
    a batch of residue only is a constant too (0 everywhere, no blow-up from eps = 0)."""
    res = torch.tensor([0.3, RESIDUE, RESIDUE, 0.3], dtype=f64)
    for eps in (0.0, 1e-4):
        both = algo.group_advantages(torch.cat([res, res]), 4, scale="batch", eps=eps)
        assert torch.equal(both, torch.zeros(8, dtype=f64))
        mixed = torch.cat([res, torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=f64)])
        got = algo.group_advantages(mixed, 4, scale="batch", eps=eps)
        assert torch.equal(got[:4], torch.zeros(4, dtype=f64))
        want = algo.group_advantages(
            torch.tensor([0.3] * 4 + [0.0, 1.0, 1.0, 0.0], dtype=f64), 4, scale="batch", eps=eps
        )
        torch.testing.assert_close(got, want)
        assert (got[4:] != 0).all()


def test_constant_groups_shapes_and_unscorable():
    nan, inf = math.nan, math.inf
    r = torch.tensor([1.0, nan, nan, nan, 2.0, inf, 0.5, 0.5, 0.0, 1.0], dtype=f64)
    got = algo.constant_groups(r, 2)
    assert got.dtype == torch.bool and got.shape == (5,)
    assert got.tolist() == [True, True, True, True, False]  # < 2 scorable, ±inf unscorable, equal, differ
    with pytest.raises(ValueError, match="constant_groups"):
        algo.constant_groups(r, 3)
    with pytest.raises(ValueError, match="constant_groups"):
        algo.constant_groups(r.view(5, 2), 2)


# -- process supervision: a group is constant when its pooled step rewards are ----------------------


def _steps(rows):
    """``(step_rewards, step_ends)`` ``(N, 3)`` from per-completion lists of step rewards (one step per
    token from the left; ``None`` = no step there)."""
    r = torch.zeros(len(rows), 3, dtype=f64)
    ends = torch.zeros(len(rows), 3, dtype=torch.bool)
    for i, row in enumerate(rows):
        for t, v in enumerate(row):
            if v is not None:
                r[i, t], ends[i, t] = v, True
    return r, ends


@pytest.mark.parametrize(
    "rows, constant",
    [
        ([[1.0, 0.0], [1.0]], False),  # the first completion's steps differ: signal though the last steps agree
        ([[1.0, 1.0], [1.0]], True),  # every step right
        ([[0.0], [0.0, 0.0, 0.0]], True),  # every step wrong, whatever the lengths
        ([[1.0], []], True),  # one scored step in the group: nothing to compare it with
        ([[1.0, float("nan")], [float("nan")]], True),  # NaN steps are unscored: one scored step left
        ([[0.3, RESIDUE], [0.3]], True),  # rounding residue is not a difference
        ([[0.5, 0.5], [0.5, 0.25]], False),  # the second completion's last step is worse
    ],
)
def test_process_constant_groups_hand_built(rows, constant):
    r, ends = _steps(rows)
    mask = torch.ones_like(ends)
    assert algo.process_constant_groups(r, ends, mask, 2).tolist() == [constant]
    for mode in algo.PROCESS_MODES:  # constant <=> every advantage of the group is 0
        adv = algo.process_advantages(r, ends, mask, 2, mode=mode)
        assert bool((adv == 0).all()) == constant, mode


def test_process_constant_groups_masked_step_ends_do_not_count():
    r, ends = _steps([[1.0, 0.0], [1.0, 1.0]])
    mask = torch.tensor([[True, False, False], [True, True, False]])  # the only 0.0 is masked out
    assert algo.process_constant_groups(r, ends, mask, 2).tolist() == [True]
    assert algo.process_constant_groups(r, ends, torch.ones_like(mask), 2).tolist() == [False]


def test_process_constant_groups_agrees_with_the_advantages_on_random_groups():
    """Many random groups of 0/1/½ step rewards with random step ends and masks: a group is
    constant exactly when :func:`algo.process_advantages` is 0 at all its tokens, in every mode."""
    gen = torch.Generator().manual_seed(0)
    b, g, t = 400, 3, 5
    r = torch.randint(0, 3, (b * g, t), generator=gen).to(f64) / 2
    ends = torch.rand(b * g, t, generator=gen) < 0.3
    mask = torch.arange(t)[None, :] < torch.randint(0, t + 1, (b * g, 1), generator=gen)
    const = algo.process_constant_groups(r, ends, mask, g)
    assert 0.1 < float(const.float().mean()) < 0.9  # both kinds are drawn
    for mode in algo.PROCESS_MODES:
        zero = (algo.process_advantages(r, ends, mask, g, mode=mode) == 0).view(b, g * t).all(1)
        assert torch.equal(const, zero), mode


def test_process_constant_groups_errors():
    r, ends = _steps([[1.0], [0.0], [1.0]])
    with pytest.raises(ValueError, match="process_constant_groups.*group_size"):
        algo.process_constant_groups(r, ends, torch.ones_like(ends), 2)
    with pytest.raises(ValueError, match="process_constant_groups"):
        algo.process_constant_groups(r, ends[:, :2], torch.ones_like(ends), 3)
