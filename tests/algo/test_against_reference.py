"""Vectorized algorithm core == the slow loops of tests/support/reference.py on random inputs."""

import math

import pytest
import torch

from grpokit import algo
from support import reference as ref

f64 = torch.float64
LAYOUTS = [(1, 2), (3, 4), (2, 7), (4, 16), (5, 3)]  # (B, G)


def _ragged_mask(gen, n, t):
    lengths = torch.randint(0, t + 1, (n,), generator=gen)  # 0 = empty completion
    return torch.arange(t)[None, :] < lengths[:, None]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("b,g", LAYOUTS)
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages(seed, b, g, scale):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (b * g,), generator=gen).to(f64) / 2  # ties and constant groups happen
    r[torch.rand(b * g, generator=gen) < 0.2] = math.nan
    got = algo.group_advantages(r, g, scale=scale)
    want = torch.tensor(ref.group_advantages(r.tolist(), g, scale), dtype=f64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", algo.PROCESS_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("b,g", LAYOUTS)
def test_process_advantages(seed, b, g, mode):
    gen = torch.Generator().manual_seed(seed)
    n, t = b * g, 9
    mask = _ragged_mask(gen, n, t)
    ends = (torch.rand(n, t, generator=gen) < 0.35) & mask
    rewards = torch.rand(n, t, generator=gen, dtype=f64)
    rewards[torch.rand(n, t, generator=gen) < 0.1] = math.nan
    got = algo.process_advantages(rewards, ends, mask, g, mode=mode)
    want = ref.process_advantages(rewards.tolist(), ends.tolist(), mask.tolist(), g, mode=mode)
    torch.testing.assert_close(got, torch.tensor(want, dtype=f64), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("b,g", LAYOUTS)
def test_process_advantages_with_rounding_residue(seed, b, g):
    gen = torch.Generator().manual_seed(seed)
    n, t = b * g, 6
    mask = _ragged_mask(gen, n, t)
    ends = (torch.rand(n, t, generator=gen) < 0.5) & mask
    pick = torch.randint(0, 2, (n, t), generator=gen) + 2 * torch.randint(0, 3, (b, 1, 1), generator=gen).expand(
        b, g, t
    ).reshape(n, t)
    rewards = torch.tensor(_RESIDUE_VALUES, dtype=f64)[pick]
    for eps in (0.0, 1e-4):
        got = algo.process_advantages(rewards, ends, mask, g, eps=eps)
        want = ref.process_advantages(rewards.tolist(), ends.tolist(), mask.tolist(), g, eps)
        torch.testing.assert_close(got, torch.tensor(want, dtype=f64), rtol=1e-10, atol=1e-12)


# rewards equal up to rounding (0.3 and 0.1 + 0.2; 0.7 and 0.1 + 0.6) next to genuinely different ones
_RESIDUE_VALUES = [0.3, 0.1 + 0.2, 0.7, 0.1 + 0.6, 0.3 + 1e-9, 1.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("b,g", LAYOUTS)
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("eps", [0.0, 1e-4])
@pytest.mark.parametrize("dtype", [torch.float32, f64])
def test_group_advantages_with_rounding_residue(seed, b, g, scale, eps, dtype):
    """The constancy rule (spread <= 16 ulps of the input dtype at max|r|) is the reference's too."""
    gen = torch.Generator().manual_seed(seed)
    # few distinct values per group, so constant-up-to-rounding groups are common
    pick = torch.randint(0, 2, (b * g,), generator=gen) + 2 * torch.randint(
        0, 3, (b,), generator=gen
    ).repeat_interleave(g)
    r = torch.tensor(_RESIDUE_VALUES, dtype=f64)[pick].to(dtype)
    r[torch.rand(b * g, generator=gen) < 0.15] = math.nan
    got = algo.group_advantages(r, g, scale=scale, eps=eps)
    want = ref.group_advantages(r.tolist(), g, scale, eps, rounding_eps=torch.finfo(dtype).eps)
    torch.testing.assert_close(got, torch.tensor(want, dtype=f64).to(dtype), rtol=1e-10, atol=1e-12)
    groups = r.view(b, g).tolist()
    assert algo.constant_groups(r, g).tolist() == [
        ref._constant([x for x in grp if not math.isnan(x)], torch.finfo(dtype).eps) for grp in groups
    ]


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_advantages_of_rewards_near_the_float64_limit(scale):
    """Rewards up to float64's max: the statistics run on rewards divided by a power of two, so
    sums and squares do not overflow (inf − inf was NaN); eps = 0 makes the result scale-free."""
    gen = torch.Generator().manual_seed(4)
    r = torch.rand(12, generator=gen, dtype=f64) * 2 - 1
    big = torch.finfo(f64).max
    want = algo.group_advantages(r, 4, scale=scale, eps=0.0)
    torch.testing.assert_close(algo.group_advantages(r * big, 4, scale=scale, eps=0.0), want, rtol=1e-12, atol=0)
    pair = algo.group_advantages(torch.tensor([big, -big], dtype=f64), 2, scale=scale, eps=0.0)
    torch.testing.assert_close(pair, torch.tensor([1.0, -1.0], dtype=f64) / math.sqrt(2))
    t, mask = 5, torch.ones(12, 5, dtype=torch.bool)
    ends = torch.zeros(12, t, dtype=torch.bool)
    ends[:, [1, 4]] = True
    step_r = torch.rand(12, t, generator=gen, dtype=f64) * 2 - 1
    torch.testing.assert_close(
        algo.process_advantages(step_r * big, ends, mask, 4, eps=0.0),
        algo.process_advantages(step_r, ends, mask, 4, eps=0.0),
        rtol=1e-12,
        atol=1e-12,
    )


def test_integer_step_rewards_give_float32_process_advantages():
    """As group_advantages: integer rewards are scored as floats (they were truncated to 0 once)."""
    ends = torch.tensor([[True, False], [True, False]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    got = algo.process_advantages(torch.tensor([[1, 0], [0, 0]]), ends, mask, 2)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, algo.process_advantages(torch.tensor([[1.0, 0], [0, 0]]), ends, mask, 2))
    assert got[0, 0] > 0.7


def test_centred_advantages_saturate_beyond_the_dtype():
    """scale="none" returns r − mean in the rewards' dtype: a value past its range is clamped to
    the largest finite one (float32 rewards, a difference of 4/3 · max)."""
    big = torch.finfo(torch.float32).max
    got = algo.group_advantages(torch.tensor([big, big, -big]), 3, scale="none")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor([2 / 3 * big, 2 / 3 * big, -big]))


def test_process_single_step_at_last_token_equals_outcome():
    """One step ending at the last token: every token gets the outcome advantage (same pooled stats)."""
    gen = torch.Generator().manual_seed(3)
    b, g, t = 3, 4, 6
    lengths = torch.randint(1, t + 1, (b * g,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    rewards = torch.rand(b * g, generator=gen, dtype=f64)
    ends = torch.zeros(b * g, t, dtype=torch.bool)
    ends[torch.arange(b * g), lengths - 1] = True
    step_r = torch.zeros(b * g, t, dtype=f64)
    step_r[ends] = rewards
    got = algo.process_advantages(step_r, ends, mask, g)
    want = algo.group_advantages(rewards, g)[:, None].expand(-1, t) * mask
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_mask_completions(seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 6, (10, 8), generator=gen)
    got = algo.mask_completions(ids, [0, 5])
    assert got.tolist() == ref.mask_completions(ids.tolist(), {0, 5})


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_token_logprobs(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(11, 5, 7, generator=gen, dtype=f64) * 3  # 11 rows > one chunk
    ids = torch.randint(0, 7, (11, 5), generator=gen)
    got = algo.token_logprobs(logits, ids, temperature=temperature)
    want = torch.tensor(ref.token_logprobs(logits.tolist(), ids.tolist(), temperature))
    torch.testing.assert_close(got, want.float())


def test_token_logprobs_bf16_logits_upcast():
    logits = torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 50, (3, 4))
    got = algo.token_logprobs(logits.bfloat16(), ids)
    want = algo.token_logprobs(logits.bfloat16().float(), ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_token_entropy_matches_definition():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(2))
    p = torch.softmax(logits / 0.8, -1)
    want = -(p * p.log()).sum(-1)
    torch.testing.assert_close(algo.token_entropy(logits, temperature=0.8), want)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("kind,beta", [("k3", 0.04), ("k1", 0.1), ("k2", 0.5), ("k3", 0.0)])
@pytest.mark.parametrize("token_level", [False, True])
def test_policy_loss(seed, aggregation, kind, beta, token_level):
    gen = torch.Generator().manual_seed(seed)
    n, t = 12, 7
    mask = _ragged_mask(gen, n, t)
    logp = -torch.rand(n, t, generator=gen, dtype=f64) * 3
    old = logp + torch.randn(n, t, generator=gen, dtype=f64) * 0.3
    refl = logp + torch.randn(n, t, generator=gen, dtype=f64) * 0.3
    adv = torch.randn((n, t) if token_level else (n,), generator=gen, dtype=f64)
    got, _ = algo.policy_loss(
        logp,
        old,
        adv,
        mask,
        algo.LossConfig(
            beta=beta,
            clip_eps_low=0.2,
            clip_eps_high=0.28,
            kl_estimator=kind,
            aggregation=aggregation,
            max_completion_length=t,
        ),
        ref_logp=refl,
    )
    want = ref.policy_loss(
        logp.tolist(),
        old.tolist(),
        adv.tolist(),
        mask.tolist(),
        refl.tolist(),
        beta,
        0.2,
        0.28,
        kind,
        aggregation,
        t,
    )
    assert got.item() == pytest.approx(want, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.5)])
def test_gae(seed, gamma, lam):
    gen = torch.Generator().manual_seed(seed)
    n, t = 5, 6
    mask = _ragged_mask(gen, n, t)
    r = torch.randn(n, t, generator=gen, dtype=f64)
    v = torch.randn(n, t, generator=gen, dtype=f64)
    adv, ret = algo.gae_advantages(r, v, mask, gamma=gamma, lam=lam)
    want = torch.tensor(ref.gae(r.tolist(), v.tolist(), mask.tolist(), gamma, lam), dtype=f64)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, (want + v) * mask)
