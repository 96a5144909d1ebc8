"""``process_advantages(mode=...)``: the paper's reverse sum, its per-step mean, and step rewards as
differences, on hand-built groups."""

import math

import pytest
import torch

from grpokit.algo import process_advantages


def _group():
    """G = 2 completions of 4 tokens. Row 0: steps end at tokens 0, 1, 3 with rewards 1, 1, 0.
    Row 1: one step ending at token 1 with reward 0; tokens 2-3 are padding.
    Pooled rewards [1, 1, 0, 0]: mean 0.5, sample std sqrt(1/3)."""
    r = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    ends = torch.tensor([[True, True, False, True], [False, True, False, False]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    return r, ends, mask


S = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # |normalized reward| of every step: +S for 1, -S for 0


@pytest.mark.parametrize(
    "mode, row0, row1",
    [
        # sum: token t gets the sum of the normalized rewards of the steps ending at or after t
        ("sum", [S + S - S, S - S, -S, -S], [-S, -S, 0, 0]),
        # mean: that sum over the number of those steps (3, 2, 1, 1)
        ("mean", [(S + S - S) / 3, (S - S) / 2, -S, -S], [-S, -S, 0, 0]),
        # diff: step rewards become S, S - S = 0, -S - S = -2S; reverse sums telescope to r̃_K - r̃_{j-1}
        ("diff", [-S, -S - S, -S - S, -S - S], [-S, -S, 0, 0]),
        # change: each token only its own step's difference: step 1 S - 0, step 2 S - S, step 3 -S - S
        ("change", [S, 0, -S - S, -S - S], [-S, -S, 0, 0]),
    ],
)
def test_modes_by_hand(mode, row0, row1):
    r, ends, mask = _group()
    adv = process_advantages(r, ends, mask, 2, mode=mode)
    assert adv[0].tolist() == pytest.approx(row0, rel=1e-12)
    assert adv[1].tolist() == pytest.approx(row1, rel=1e-12)


def test_mean_diff_and_change_follow_from_sum_on_random_groups():
    """Against a slow loop over steps, from the sum mode's normalized step rewards."""
    g = torch.Generator().manual_seed(0)
    n, t = 6, 12
    r = torch.randint(0, 3, (n, t), generator=g).double()
    ends = torch.rand(n, t, generator=g) < 0.4
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 9:] = False
    total = process_advantages(r, ends, mask, 3, mode="sum")
    mean = process_advantages(r, ends, mask, 3, mode="mean")
    diff = process_advantages(r, ends, mask, 3, mode="diff")
    change = process_advantages(r, ends, mask, 3, mode="change")
    for i in range(n):
        pos = [k for k in range(t) if ends[i, k] and mask[i, k]]
        # normalized reward of each step = sum-mode advantage at its end minus the next step's
        norm = {
            k: float(total[i, k]) - (float(total[i, pos[j + 1]]) if j + 1 < len(pos) else 0.0)
            for j, k in enumerate(pos)
        }
        for tok in range(t):
            later = [k for k in pos if k >= tok]
            if not mask[i, tok] or not later:
                assert mean[i, tok] == 0 and diff[i, tok] == 0 and change[i, tok] == 0
                continue
            assert float(mean[i, tok]) == pytest.approx(sum(norm[k] for k in later) / len(later), abs=1e-12)
            before = [k for k in pos if k < later[0]]
            expect = norm[later[-1]] - (norm[before[-1]] if before else 0.0)
            assert float(diff[i, tok]) == pytest.approx(expect, abs=1e-12)
            own = norm[later[0]] - (norm[before[-1]] if before else 0.0)
            assert float(change[i, tok]) == pytest.approx(own, abs=1e-12)


def test_unknown_mode_is_refused():
    r, ends, mask = _group()
    with pytest.raises(ValueError, match="process_advantages: mode must be one of"):
        process_advantages(r, ends, mask, 2, mode="median")
