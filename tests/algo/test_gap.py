"""grpokit.algo.gap: |sampler − trainer| log-prob gap over counted tokens, summed over micro-batches."""

from __future__ import annotations

import pytest
import torch

from grpokit.algo import LogprobGap, logprob_gap


def test_gap_counts_only_masked_in_tokens():
    s = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]])
    t = torch.tensor([[-1.1, -2.0, -1.0], [-0.2, 7.0, 7.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])
    total, count, mx = logprob_gap(s, t, m)
    assert count == 4
    assert total == pytest.approx(0.1 + 0.0 + 2.0 + 0.3)
    assert mx == pytest.approx(2.0)
    assert logprob_gap(s, t, torch.zeros_like(m)) == (0.0, 0, 0.0)


def test_micro_batches_add_up_to_the_whole_batch():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    m = torch.rand(6, 5, generator=g) > 0.3
    acc = LogprobGap()
    for rows in (slice(0, 2), slice(2, 5), slice(5, 6)):
        acc.add(s[rows], t[rows], m[rows])
    total, count, mx = logprob_gap(s, t, m)
    assert acc.metrics() == pytest.approx({"logprob_gap_mean": total / count, "logprob_gap_max": mx})
    assert mx == pytest.approx(float((s - t).abs()[m].max()))


def test_no_sampler_logprobs_no_metrics_and_bad_inputs_raise():
    acc = LogprobGap()
    acc.add(None, torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))  # an engine that reports none
    assert acc.metrics() == {}
    with pytest.raises(ValueError, match="logprob_gap: shapes must match"):
        logprob_gap(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="logprob_gap: mask must be bool"):
        logprob_gap(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3))
