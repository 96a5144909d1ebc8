"""The loss catalog (issue 60, item 1; docs/loss_variants.md, "Adding a variant"): a variant is one
function and one decorator; unknown names say which registry and what it knows; ``LossConfig`` is
frozen and checked once, when built; the typed stats give the trainer the keys it logged before."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from grpokit import algo
from grpokit.algo import LossConfig, catalog
from grpokit.algo.catalog import register_surrogate
from grpokit.config import AlgoConfig, choices_of, recipe_from_dict
from grpokit.estimators.base import GRPO
from grpokit.experience import Experience

f64 = torch.float64


# -- (a) a new surrogate: one function, one decorator ---------------------------------------------------


@pytest.fixture
def toy_surrogate():
    """``"toy"``: the unclipped importance-weighted objective ``r·A`` (REINFORCE with a ratio)."""

    @register_surrogate("toy")
    def toy(log_ratio, logp, advantages, live, *, eps_low, eps_high, dual_clip_c, delta):
        return torch.exp(log_ratio) * advantages

    try:
        yield toy
    finally:
        if "toy" in catalog.SURROGATES:
            catalog.SURROGATES.unregister("toy")


def test_a_registered_surrogate_works_through_the_config_and_the_loss(toy_surrogate):
    logp = torch.log(torch.tensor([[2.0, 0.5, 1.0]], dtype=f64)).requires_grad_()  # old = 0: r = 2, 0.5, 1
    adv = torch.tensor([[1.0, -1.0, 0.0]], dtype=f64)
    mask = torch.tensor([[True, True, False]])
    loss, stats = algo.policy_loss(logp, torch.zeros(1, 3, dtype=f64), adv, mask, LossConfig(surrogate="toy"))
    # l = -r·A on the 2 counted tokens: [-2, 0.5]; seq_mean_token_mean: (-2 + 0.5) / 2 = -0.75 (the clip
    # surrogate would give (-1.2 + 0.8) / 2 = -0.2)
    assert loss.item() == pytest.approx(-0.75, abs=1e-12)
    loss.backward()
    # d l / d logp = -r·A / 2 = [-1, 0.25] (no clip holds the gradient), 0 at the masked token
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 0.25, 0.0]], dtype=f64))
    # the default clip flags (by the sign of A): r = 2 > 1.2 with A > 0, r = 0.5 < 0.8 with A < 0
    assert stats.clip_frac_high.item() == 0.5 and stats.clip_frac_low.item() == 0.5
    # the recipe key takes the registered name too (its choices are the registry's)
    assert "toy" in choices_of(AlgoConfig.__dataclass_fields__["policy_loss"])
    assert recipe_from_dict({"algo": {"policy_loss": "toy"}}).algo.policy_loss == "toy"


def test_unregister_removes_the_name_and_its_clip_flags(toy_surrogate):
    assert "toy" in catalog.SURROGATES and "toy" in catalog.SURROGATE_CLIP_FLAGS
    catalog.SURROGATES.unregister("toy")
    assert "toy" not in catalog.SURROGATES and "toy" not in catalog.SURROGATE_CLIP_FLAGS
    with pytest.raises(ValueError, match="surrogate must be one of \\('clip', 'cispo'\\), got 'toy'"):
        LossConfig(surrogate="toy")
    register_surrogate("toy")(toy_surrogate)  # for the fixture to remove


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="surrogate: 'clip' is registered already"):
        register_surrogate("clip")(lambda *a, **k: None)
    assert catalog.SURROGATES.names() == ("clip", "cispo")


# -- (b) unknown names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,known",
    [
        ("surrogate", "('clip', 'cispo')"),
        ("importance_level", "('token', 'sequence', 'sequence_token')"),
        ("is_correction", "('tis', 'mis_token', 'mis_sequence')"),
        ("aggregation", "('seq_mean_token_mean', 'token_mean', 'seq_mean_token_sum_norm')"),
    ],
)
def test_an_unknown_name_names_the_key_and_the_choices(field, known):
    with pytest.raises(ValueError) as err:
        LossConfig(**{field: "nope"})
    assert str(err.value) == f"LossConfig: {field} must be one of {known}, got 'nope'"


def test_an_unknown_advantage_baseline_names_the_key_and_the_choices():
    with pytest.raises(ValueError) as err:
        algo.outcome_advantages(torch.tensor([1.0, 0.0]), 2, baseline="vimco")
    assert (
        str(err.value) == "outcome_advantages: baseline must be one of ('group', 'rloo', 'reinforce_pp'), got 'vimco'"
    )
    assert tuple(catalog.ADVANTAGE_SCALES) == ("group", "batch", "none")  # algo.advantage_scale's choices


# -- (c) frozen, checked when built -------------------------------------------------------------------


def test_loss_config_is_frozen_and_a_changed_copy_is_checked_again():
    config = LossConfig(beta=0.04)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.beta = 0.5  # type: ignore[misc]
    assert dataclasses.replace(config, delta=2.0).delta == 2.0
    with pytest.raises(ValueError, match="LossConfig: delta must be 0 \\(off\\) or > 1 \\+ clip_eps_high"):
        dataclasses.replace(config, delta=1.1)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(surrogate="cispo", importance_level="sequence"), "importance_level must be 'token'"),
        (dict(surrogate="cispo", delta=2.0), "surrogate 'cispo' has none"),
        (dict(is_correction="mis_sequence", tis_cap=0.5), "tis_cap = C must be > 1"),
        (dict(aggregation="seq_mean_token_sum_norm"), "needs max_completion_length >= 1, got None"),
        (dict(clip_eps_high=-0.1), "must be >= 0"),
        (dict(kl_estimator="k4"), "kl_estimator must be one of"),
    ],
)
def test_a_bad_combination_raises_when_the_config_is_built(kw, match):
    with pytest.raises(ValueError, match="^LossConfig: .*" + match):
        LossConfig(**kw)


def test_the_config_is_checked_once_not_per_call(monkeypatch):
    checks = []
    real = LossConfig.__post_init__
    monkeypatch.setattr(LossConfig, "__post_init__", lambda self: checks.append(1) or real(self))
    config = LossConfig(importance_level="sequence_token", tis_cap=2.0, is_correction="mis_token")
    lp = torch.zeros(2, 3)
    for _ in range(3):
        algo.policy_loss(lp, lp, torch.ones(2), torch.ones(2, 3).bool(), config, sampler_logp=lp)
    assert len(checks) == 1


# -- (d) the typed stats: the keys the trainer logged before ----------------------------------------------

BASE = ["clip_frac_low", "clip_frac_high", "kl", "ratio_mean", "num_tokens"]


@pytest.mark.parametrize(
    "kw,extra",
    [
        ({}, []),
        (dict(beta=0.04), []),
        (dict(importance_level="sequence"), ["seq_ratio_mean"]),
        (dict(importance_level="sequence_token"), ["seq_ratio_mean"]),
        (dict(surrogate="cispo", clip_eps_low=1.0), []),
        (dict(dual_clip_c=3.0), ["clip_frac_dual"]),
        (dict(delta=2.0), ["clip_frac_delta"]),
        (dict(importance_level="sequence", dual_clip_c=1.5), ["clip_frac_dual", "seq_ratio_mean"]),
        (dict(tis_cap=2.0), ["tis_weight_mean", "tis_capped_frac"]),
        (dict(tis_cap=2.0, is_correction="mis_token"), ["mis_weight_mean", "mis_dropped_frac"]),
        (
            dict(tis_cap=2.0, is_correction="mis_sequence", importance_level="sequence_token", delta=1.5),
            ["clip_frac_delta", "seq_ratio_mean", "mis_weight_mean", "mis_dropped_frac"],
        ),
        (dict(entropy_coef=0.1), []),
    ],
    ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else None,
)
def test_the_stats_mapping_has_the_old_keys(kw, extra):
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=gen)
    old = logp + 0.3 * torch.randn(4, 5, generator=gen)
    mask = torch.arange(5)[None] < torch.tensor([5, 3, 0, 4])[:, None]
    config = LossConfig(**kw)
    out = algo.policy_loss(
        logp,
        old,
        torch.randn(4, generator=gen),
        mask,
        config,
        ref_logp=logp - 0.1,
        sampler_logp=old + 0.1 * torch.randn(4, 5, generator=gen),
        entropy=torch.rand(4, 5, generator=gen),
    )
    assert isinstance(out, algo.LossOutput) and out.loss.dim() == 0
    mapping = out.stats.as_dict()
    assert list(mapping) == BASE + extra
    for key, value in mapping.items():
        assert value is getattr(out.stats, key) and value.dim() == 0 and not value.requires_grad, key
    assert out.stats.num_tokens.item() == 12  # the weight the trainer's token-weighted sum reads
    assert math.isfinite(out.loss.item())


def test_grpo_loss_logs_the_same_keys_plus_the_entropy_coefficient():
    n, t = 4, 3
    mask = torch.ones(n, t, dtype=torch.bool)
    mb = Experience.grouped(
        torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, 2, dtype=torch.bool),
        torch.ones(n, t, dtype=torch.long),
        mask,
        2,
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
    )
    logp = -torch.rand(n, t, generator=torch.Generator().manual_seed(1))
    grpo = GRPO(AlgoConfig(beta=0.0, dual_clip_c=3.0, entropy_coef=0.01), t)
    assert grpo.loss_config == LossConfig(max_completion_length=t, dual_clip_c=3.0, entropy_coef=0.01)
    _, stats = grpo.loss(logp, mb, mask, num_sequences=n, num_tokens=n * t, entropy=torch.rand(n, t))
    assert list(stats.as_dict()) == BASE + ["clip_frac_dual", "entropy_coef"]
