"""Every hand-checked vector of ../shared/cases/algo_vectors.json (copied to tests/fixtures), as given."""

import json
import math
from pathlib import Path

import pytest
import torch

from grpokit.algo import (
    LossConfig,
    aggregate_loss,
    completion_terminated,
    group_advantages,
    kl_penalty,
    mask_completions,
    policy_loss,
    process_advantages,
    token_logprobs,
)

V = json.loads((Path(__file__).parents[1] / "fixtures" / "algo_vectors.json").read_text())
f64 = torch.float64


@pytest.mark.parametrize("case", V["outcome_advantages"], ids=lambda c: c["why"][:40])
def test_outcome_advantages(case):
    r = torch.tensor([math.nan if x is None else x for x in case["rewards"]], dtype=f64)
    got = group_advantages(r, case["group_size"], scale=case["scale"], eps=case["eps"])
    torch.testing.assert_close(got, torch.tensor(case["expected"], dtype=f64), rtol=1e-12, atol=1e-12)


def test_zero_variance_is_exactly_zero_in_float32():
    got = group_advantages(torch.full((8,), 0.35, dtype=torch.float32), 8)
    assert torch.equal(got, torch.zeros(8))


@pytest.mark.parametrize("case", V["process_advantages"], ids=lambda c: c["why"][:40])
def test_process_advantages(case):
    n, t = len(case["completion_lengths"]), case["T"]
    rewards = torch.zeros(n, t, dtype=f64)
    ends = torch.zeros(n, t, dtype=torch.bool)
    for i, (idx, vals) in enumerate(zip(case["step_end_index"], case["step_rewards"])):
        for j, v in zip(idx, vals):
            rewards[i, j], ends[i, j] = v, True
    mask = torch.arange(t)[None, :] < torch.tensor(case["completion_lengths"])[:, None]
    got = process_advantages(rewards, ends, mask, case["group_size"])
    torch.testing.assert_close(got, torch.tensor(case["expected"], dtype=f64), rtol=1e-12, atol=1e-12)


def _aggregation_setup():
    # completion 1: A=+1, 2 tokens; completion 2: A=-1, 4 tokens; T = 4; on-policy; per-token loss -A
    logp = torch.zeros(2, 4, dtype=f64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    return logp, mask, torch.tensor([1.0, -1.0], dtype=f64)


@pytest.mark.parametrize(
    "mode,key",
    [
        ("seq_mean_token_mean", "seq_mean_token_mean"),
        ("token_mean", "token_mean"),
        ("seq_mean_token_sum_norm", "seq_mean_token_sum_norm(max_tokens=8)"),
    ],
)
def test_loss_aggregation(mode, key):
    logp, mask, adv = _aggregation_setup()
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, LossConfig(aggregation=mode, max_completion_length=8))
    assert loss.item() == pytest.approx(V["loss_aggregation"][key], abs=1e-12)
    per_token = -adv[:, None].expand(2, 4)
    direct = aggregate_loss(per_token, mask, mode, max_completion_length=8)
    assert direct.item() == pytest.approx(V["loss_aggregation"][key], abs=1e-12)


@pytest.mark.parametrize("case", V["clipped_surrogate"], ids=lambda c: c["why"][:40])
def test_clipped_surrogate(case):
    logp = torch.tensor([[math.log(case["ratio"])]], dtype=f64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=f64)
    loss, _ = policy_loss(
        logp,
        old,
        torch.tensor([case["advantage"]], dtype=f64),
        torch.ones(1, 1, dtype=torch.bool),
        LossConfig(clip_eps_low=case["eps_low"], clip_eps_high=case["eps_high"]),
    )
    loss.backward()
    assert loss.item() == pytest.approx(case["per_token_loss"], abs=1e-12)
    assert logp.grad.item() == pytest.approx(case["grad_wrt_logp"], abs=1e-12)


@pytest.mark.parametrize("case", V["kl"])
def test_kl_estimators_and_k3_gradient(case):
    logp = torch.tensor([case["logp"]], dtype=f64, requires_grad=True)
    ref = torch.tensor([case["ref_logp"]], dtype=f64)
    for kind in ("k1", "k2", "k3"):
        assert kl_penalty(logp, ref, kind).item() == pytest.approx(case[kind], abs=1e-12)
    kl_penalty(logp, ref, "k3").sum().backward()
    assert logp.grad.item() == pytest.approx(case["d_k3_d_logp"], abs=1e-12)


def test_temperature_logprob():
    c = V["temperature_logprob"]
    logits = torch.tensor([[c["logits"]]], dtype=f64)
    got = token_logprobs(logits, torch.tensor([[c["token"]]]), temperature=c["temperature"])
    assert got.item() == pytest.approx(c["logprob"], abs=1e-6)  # float32 result
    assert math.exp(got.item()) == pytest.approx(c["prob"], abs=1e-6)


@pytest.mark.parametrize("case", V["eos_mask"], ids=lambda c: c["why"][:40])
def test_eos_mask(case):
    ids = torch.tensor([case["completion_ids"]])
    got = mask_completions(ids, case["eos_token_ids"])
    assert got.int().tolist() == [case["completion_mask"]]
    assert completion_terminated(ids, case["eos_token_ids"]).tolist() == [case["terminated"]]
