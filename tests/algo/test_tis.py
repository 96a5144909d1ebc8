"""Truncated importance sampling in the GRPO loss (``algo.tis_cap``; Yao et al. 2025): each token's
surrogate weighted by ``w = min(exp(old_logp − sampler_logp), C)``, without gradient through w,
the KL term unweighted. Hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit import algo
from grpokit.algo import LossConfig
from grpokit.config import AlgoConfig, RecipeError, recipe_from_dict
from grpokit.estimators.base import GRPO
from grpokit.experience import Experience

LOG2 = math.log(2.0)


def _case():
    logp = torch.zeros(1, 3, requires_grad=True)
    sampler = torch.tensor([[LOG2, 0.0, -LOG2]])  # w = exp(0 - sampler) = 0.5, 1, 2 -> capped at 1.5
    return logp, sampler, torch.tensor([1.0]), torch.ones(1, 3, dtype=torch.bool)


def test_weights_hand_computed():
    logp, sampler, adv, mask = _case()
    loss, st = algo.policy_loss(logp, logp.detach(), adv, mask, LossConfig(tis_cap=1.5), sampler_logp=sampler)
    st = st.as_dict()
    # per token -w·r·A with r = 1: [-0.5, -1, -1.5]; seq_mean_token_mean: the mean, -1
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -1.0, -1.5]]) / 3)
    assert st["tis_weight_mean"].item() == pytest.approx(1.0) and st["tis_capped_frac"].item() == pytest.approx(1 / 3)


def test_off_by_default_and_kl_not_weighted():
    logp, sampler, adv, mask = _case()
    plain, st = algo.policy_loss(logp, logp.detach(), adv, mask)
    st = st.as_dict()
    assert plain.item() == pytest.approx(-1.0) and "tis_weight_mean" not in st  # w = 1 everywhere
    ref = torch.full((1, 3), -0.3)
    zero = torch.zeros(1)  # no surrogate term: what is left is β·KL, the same with and without weights
    a, _ = algo.policy_loss(
        logp, logp.detach(), zero, mask, LossConfig(beta=0.5, tis_cap=1.5), ref_logp=ref, sampler_logp=sampler
    )
    b, _ = algo.policy_loss(logp, logp.detach(), zero, mask, LossConfig(beta=0.5), ref_logp=ref)
    assert a.item() == pytest.approx(b.item()) and a.item() > 0


def test_errors():
    logp, sampler, adv, mask = _case()
    with pytest.raises(ValueError, match="tis_cap=2.0 > 0 needs sampler_logp"):
        algo.policy_loss(logp, logp.detach(), adv, mask, LossConfig(tis_cap=2.0))
    with pytest.raises(ValueError, match="tis_cap must be >= 0"):
        algo.policy_loss(logp, logp.detach(), adv, mask, LossConfig(tis_cap=-1.0), sampler_logp=sampler)


def test_grpo_loss_passes_the_sampler_logprobs():
    logp, sampler, adv, mask = _case()
    mb = Experience.grouped(
        torch.ones(1, 2, dtype=torch.long),
        torch.ones(1, 2, dtype=torch.bool),
        torch.ones(1, 3, dtype=torch.long),
        mask,
        1,
        advantages=adv,
        sampler_logprobs=sampler,
    )
    loss, st = GRPO(AlgoConfig(tis_cap=1.5, beta=0.0), 3).loss(logp, mb, mask, num_sequences=1, num_tokens=3)
    assert loss.item() == pytest.approx(-1.0) and st.tis_capped_frac.item() == pytest.approx(1 / 3)


def test_recipe_needs_an_engine_with_sampler_logprobs():
    with pytest.raises(RecipeError, match="algo.tis_cap: .*rollout.engine=vllm"):
        recipe_from_dict({"algo": {"tis_cap": 2.0}})
    with pytest.raises(RecipeError, match="algo.tis_cap: must be >= 0"):
        recipe_from_dict({"algo": {"tis_cap": -1.0}})
    assert recipe_from_dict({"algo": {"tis_cap": 2.0}, "rollout": {"engine": "vllm"}}).algo.tis_cap == 2.0
