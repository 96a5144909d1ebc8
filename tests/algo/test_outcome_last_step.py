"""``outcome_at_last_step`` (``algo.process_last_step=outcome``): each completion's last counted step
takes its outcome reward; then ``diff`` process advantages credit a step with the outcome against the
scorer's value of the prefix before it."""

import math

import pytest
import torch

from grpokit.algo import outcome_at_last_step, process_advantages


def _slow(step_rewards, step_ends, completion_mask, rewards):
    """Reference loop: the last column of each row where a step ends on a counted token."""
    out = [list(map(float, row)) for row in step_rewards.tolist()]
    for i, (ends, mask) in enumerate(zip(step_ends.tolist(), completion_mask.tolist())):
        last = None
        for t, (e, m) in enumerate(zip(ends, mask)):
            if e and m:
                last = t
        if last is not None:
            out[i][last] = float(rewards[i])
    return out


def test_hand_vector():
    # row 0: steps end at 0 and 2 (PRM 0.5, 0.75), answer wrong (0): the 0.75 becomes 0.
    # row 1: steps end at 0, 1 (0.25, 0.5), answer right (1): the 0.5 becomes 1.
    # row 2: a step end at 3 off the completion mask is ignored: its last step is at 1 -> NaN reward.
    # row 3: no step end at all: unchanged.
    s = torch.tensor([[0.5, 0, 0.75, 0], [0.25, 0.5, 0, 0], [0.5, 0.5, 0, 0.25], [0, 0, 0, 0]], dtype=torch.float64)
    ends = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    rewards = torch.tensor([0.0, 1.0, math.nan, 1.0], dtype=torch.float64)
    got = outcome_at_last_step(s, ends, mask, rewards)
    assert got[0].tolist() == [0.5, 0, 0.0, 0]
    assert got[1].tolist() == [0.25, 1.0, 0, 0]
    assert got[2, 0] == 0.5 and math.isnan(got[2, 1]) and got[2, 3] == 0.25
    assert got[3].tolist() == [0, 0, 0, 0]
    assert got.dtype == torch.float64 and s[0, 2] == 0.75  # a copy: the input is untouched


def test_against_slow_loop_on_random_rows():
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        n, t = 6, 9
        s = torch.rand(n, t, generator=g)
        ends = torch.rand(n, t, generator=g) < 0.3
        mask = torch.rand(n, t, generator=g) < 0.8
        rewards = torch.randint(0, 2, (n,), generator=g).float()
        torch.testing.assert_close(
            outcome_at_last_step(s, ends, mask, rewards), torch.tensor(_slow(s, ends, mask, rewards)), rtol=0, atol=0
        )


def test_diff_credits_the_outcome_against_the_prefix_value():
    # G = 2. Row 0: PRM 0.75 then the answer (wrong, 0); row 1: PRM 0.25 then the answer (right, 1).
    # Pooled [0.75, 0, 0.25, 1]: mean 0.5, sample std sqrt(((.25)^2 + .5^2 + .25^2 + .5^2) / 3) = sqrt(5/24).
    # diff telescopes to A = (r_K − s_{j−1}) / σ (the mean cancels); step 1's tokens get r̃_K.
    s = torch.tensor([[0.75, 0.6, 0.0], [0.25, 0.9, 0.0]], dtype=torch.float64)  # 0.6 / 0.9: the PRM's last-step guess
    ends = torch.tensor([[True, True, False], [True, True, False]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    r = outcome_at_last_step(s, ends, mask, torch.tensor([0.0, 1.0], dtype=torch.float64))
    adv = process_advantages(r, ends, mask, 2, eps=0.0, mode="diff")
    sd = math.sqrt(5 / 24)
    want = torch.tensor(
        [[(0 - 0.5) / sd, (0 - 0.75) / sd, 0.0], [(1 - 0.5) / sd, (1 - 0.25) / sd, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(adv, want)


def test_bad_input_is_refused_by_name():
    s = torch.zeros(2, 3)
    ends = torch.zeros(2, 3, dtype=torch.bool)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"outcome_at_last_step: rewards must have shape \(2,\)"):
        outcome_at_last_step(s, ends, mask, torch.zeros(3))
    with pytest.raises(ValueError, match="outcome_at_last_step: step_ends must be bool"):
        outcome_at_last_step(s, ends.int(), mask, torch.zeros(2))
    with pytest.raises(ValueError, match="outcome_at_last_step: shapes must match"):
        outcome_at_last_step(s, ends[:, :2], mask, torch.zeros(2))
    with pytest.raises(ValueError, match="outcome_at_last_step: step_rewards must be 2-D"):
        outcome_at_last_step(s[0], ends, mask, torch.zeros(2))
