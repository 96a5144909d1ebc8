"""Property-based tests (hypothesis) for the algorithm core and the math answer parser.

Advantages: finite and the right shape for any rewards (NaN included); invariant to a constant
shift of a group (scale=group) or of the batch (scale=batch); invariant to a positive scale with
eps=0 (group, batch); sum to 0 over a group's scorable rewards; process advantages are 0 on
masked tokens. Tokens that count for nothing (masked, or with advantage 0) change nothing in the
policy loss, its stats and gradient, nor in PPO's value loss, GAE and whitening, whatever they hold
(NaN, ±inf, 149-nat gaps, log-ratios up to 1e4); k3, entropies and log-probs match float64.
Parser: no exception and < 1 s on arbitrary text.

Rewards are drawn on a grid of multiples of 1/8 so that shifting and scaling are exact in binary
floating point: two different rewards never round to the same value, which would turn a varying
group into a constant one (advantage 0) and is not what these properties are about.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from grpokit import algo
from grpokit.rewards.math import extract_answer, math_correct

SETTINGS = settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
# the parser tests bound CPU time themselves (a wall-clock deadline fails on a loaded machine)
PARSER_SETTINGS = settings(SETTINGS, deadline=None)
NAN = float("nan")

grid = st.integers(-800, 800).map(lambda k: k / 8.0)  # [-100, 100] in steps of 1/8


@st.composite
def grouped_rewards(draw, values=grid, nan=True):
    g = draw(st.integers(2, 6))
    b = draw(st.integers(1, 4))
    elem = st.one_of(values, st.just(NAN)) if nan else values
    r = draw(st.lists(elem, min_size=b * g, max_size=b * g))
    return torch.tensor(r, dtype=torch.float64), g


def _valid_varying(r: torch.Tensor, g: int) -> torch.Tensor:
    """(N,) True where the reward is scorable and its group has >= 2 different scorable rewards."""
    out = torch.zeros(len(r), dtype=torch.bool)
    for i in range(0, len(r), g):
        vals = [x for x in r[i : i + g].tolist() if math.isfinite(x)]
        if len(vals) >= 2 and max(vals) > min(vals):
            out[i : i + g] = torch.isfinite(r[i : i + g])
    return out


@SETTINGS
@given(
    st.data(),
    st.sampled_from(algo.SCALES),
    st.sampled_from([torch.float32, torch.float64]),
    st.sampled_from([0.0, 1e-4]),
)
def test_group_advantages_finite_and_shaped(data, scale, dtype, eps):
    any_float = st.floats(allow_nan=True, allow_infinity=True, width=32 if dtype == torch.float32 else 64)
    r, g = data.draw(st.one_of(grouped_rewards(), grouped_rewards(values=any_float)))
    r = r.to(dtype)
    adv = algo.group_advantages(r, g, scale=scale, eps=eps)  # eps=0: a constant group is 0/0
    assert adv.shape == r.shape and adv.dtype == dtype
    assert torch.isfinite(adv).all(), (r, adv)
    assert (adv[~torch.isfinite(r)] == 0).all()  # unscorable -> 0
    assert (adv[~_valid_varying(r.double(), g)] == 0).all()  # constant or < 2 scorable -> exactly 0


@SETTINGS
@given(grouped_rewards(), st.data())
def test_group_shift_leaves_group_scaled_advantages_unchanged(rg, data):
    r, g = rg
    shifts = torch.tensor(data.draw(st.lists(grid, min_size=len(r) // g, max_size=len(r) // g)), dtype=torch.float64)
    shifted = r + shifts.repeat_interleave(g)  # a different constant per group
    for eps in (0.0, 1e-4):
        torch.testing.assert_close(
            algo.group_advantages(shifted, g, scale="group", eps=eps),
            algo.group_advantages(r, g, scale="group", eps=eps),
        )
    torch.testing.assert_close(
        algo.group_advantages(shifted, g, scale="none"), algo.group_advantages(r, g, scale="none")
    )


@SETTINGS
@given(grouped_rewards(), grid)
def test_batch_shift_leaves_batch_scaled_advantages_unchanged(rg, c):
    r, g = rg
    torch.testing.assert_close(
        algo.group_advantages(r + c, g, scale="batch"), algo.group_advantages(r, g, scale="batch")
    )


@SETTINGS
@given(grouped_rewards(), st.floats(1e-3, 1e3))
def test_positive_scale_leaves_advantages_unchanged_without_eps(rg, k):
    r, g = rg
    for scale in ("group", "batch"):
        torch.testing.assert_close(
            algo.group_advantages(r * k, g, scale=scale, eps=0.0), algo.group_advantages(r, g, scale=scale, eps=0.0)
        )
    # scale="none" only centres: advantages scale with the rewards
    torch.testing.assert_close(
        algo.group_advantages(r * k, g, scale="none"), algo.group_advantages(r, g, scale="none") * k
    )
    # with eps > 0 the only effect is eps's: (k r - k m) / (k s + eps) = (r - m) / (s + eps / k)
    for scale in ("group", "batch"):
        torch.testing.assert_close(
            algo.group_advantages(r * k, g, scale=scale, eps=1e-4),
            algo.group_advantages(r, g, scale=scale, eps=1e-4 / k),
        )


@SETTINGS
@given(grouped_rewards(), st.sampled_from(algo.SCALES))
def test_advantages_sum_to_zero_over_scorable_group_members(rg, scale):
    r, g = rg
    adv = algo.group_advantages(r, g, scale=scale)
    valid = torch.isfinite(r)
    for i in range(0, len(r), g):
        s = adv[i : i + g][valid[i : i + g]].sum().item()
        assert abs(s) < 1e-9 * max(1.0, adv.abs().max().item()) * g


@st.composite
def process_batch(draw):
    g = draw(st.integers(2, 4))
    b = draw(st.integers(1, 3))
    t = draw(st.integers(1, 8))
    n = b * g
    lengths = draw(st.lists(st.integers(0, t), min_size=n, max_size=n))
    mask = torch.tensor([[j < ln for j in range(t)] for ln in lengths])
    ends = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=n, max_size=n)))
    vals = draw(st.lists(st.lists(st.one_of(grid, st.just(NAN)), min_size=t, max_size=t), min_size=n, max_size=n))
    return torch.tensor(vals, dtype=torch.float64), ends, mask, g


@SETTINGS
@given(process_batch())
def test_process_advantages_finite_and_zero_on_masked_tokens(batch):
    r, ends, mask, g = batch
    adv = algo.process_advantages(r, ends, mask, g)
    assert adv.shape == r.shape and torch.isfinite(adv).all()
    assert (adv[~mask] == 0).all()
    # tokens after a row's last (unmasked) step end get 0
    for i in range(r.shape[0]):
        idx = (ends[i] & mask[i]).nonzero()
        last = int(idx[-1]) if len(idx) else -1
        assert (adv[i, last + 1 :] == 0).all()


@SETTINGS
@given(process_batch(), grid)
def test_process_advantages_shift_invariant(batch, c):
    r, ends, mask, g = batch
    torch.testing.assert_close(algo.process_advantages(r + c, ends, mask, g), algo.process_advantages(r, ends, mask, g))


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 6), st.data())
def test_policy_loss_finite_for_finite_inputs(n, t, data):
    floats = st.floats(-30.0, 0.0)
    logp = torch.tensor(
        data.draw(st.lists(st.lists(floats, min_size=t, max_size=t), min_size=n, max_size=n)), requires_grad=True
    )
    old = torch.tensor(data.draw(st.lists(st.lists(floats, min_size=t, max_size=t), min_size=n, max_size=n)))
    adv = torch.tensor(data.draw(st.lists(st.floats(-10, 10), min_size=n, max_size=n)))
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=n, max_size=n)))
    agg = data.draw(st.sampled_from(algo.AGGREGATIONS))
    loss, stats = algo.policy_loss(
        logp, old, adv, mask, algo.LossConfig(beta=0.04, aggregation=agg, max_completion_length=t), ref_logp=old
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v).all() for v in stats.as_dict().values())
    assert (algo.kl_penalty(logp.detach(), old, "k3") >= -1e-6).all()  # >= 0 up to float32 rounding


# -- tokens that count for nothing change nothing (issue 29) ------------------------------------

#: what a masked position may hold: anything, NaN and ±inf included
extreme = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([149.0, -149.0, 200.0]))


@st.composite
def token_batch(draw, max_n=3, max_t=5):
    """``(logp, old, ref, adv (N, T), mask)`` float32 with at least one counted token."""
    n, t = draw(st.integers(1, max_n)), draw(st.integers(1, max_t))

    def grid2(elem):
        return torch.tensor(
            draw(st.lists(st.lists(elem, min_size=t, max_size=t), min_size=n, max_size=n)), dtype=torch.float32
        )

    logp, old, ref = (grid2(st.floats(-20.0, 0.0, width=32)) for _ in range(3))
    adv = grid2(st.one_of(st.just(0.0), st.floats(-5.0, 5.0, width=32)))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=n, max_size=n)))
    assume(bool(mask.any()))
    return logp, old, ref, adv, mask


def _policy(logp, old, ref, adv, mask, agg):
    logp = logp.clone().requires_grad_()
    config = algo.LossConfig(beta=0.04, aggregation=agg, max_completion_length=mask.shape[1])
    loss, st_ = algo.policy_loss(logp, old, adv, mask, config, ref_logp=ref)
    loss.backward()
    return loss.detach(), st_.as_dict(), logp.grad


@SETTINGS
@given(token_batch(), st.sampled_from(algo.AGGREGATIONS), st.data())
def test_policy_loss_never_reads_masked_positions(batch, agg, data):
    logp, old, ref, adv, mask = batch
    want = _policy(logp, old, ref, adv, mask, agg)
    bad = [x.clone() for x in (logp, old, ref, adv)]
    for x in bad:
        for i, j in (~mask).nonzero().tolist():
            x[i, j] = data.draw(extreme)
    got = _policy(*bad, mask, agg)
    torch.testing.assert_close(got[0], want[0])
    for k in want[1]:
        torch.testing.assert_close(got[1][k], want[1][k])
    torch.testing.assert_close(got[2], want[2])
    assert (got[2][~mask] == 0).all()


@SETTINGS
@given(token_batch(), st.sampled_from(algo.AGGREGATIONS), st.data())
def test_zero_advantage_tokens_add_nothing_whatever_their_ratio(batch, agg, data):
    logp, old, ref, adv, mask = batch
    zero = adv == 0
    at_one = torch.where(zero, logp, old)  # the same batch with those tokens' ratio 1
    far = old.clone()
    for i, j in zero.nonzero().tolist():
        far[i, j] = logp[i, j] - data.draw(st.floats(-1e4, 1e4, width=32))  # log-ratio up to ±1e4
    want, got = _policy(logp, at_one, ref, adv, mask, agg), _policy(logp, far, ref, adv, mask, agg)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[2], want[2])
    assert all(torch.isfinite(v) for v in got[1].values())


@SETTINGS
@given(token_batch(), st.data())
def test_ppo_pieces_never_read_masked_positions(batch, data):
    v, old_v, ret, _, mask = batch
    bad = [x.clone() for x in (v, old_v, ret)]
    for x in bad:
        for i, j in (~mask).nonzero().tolist():
            x[i, j] = data.draw(extreme)

    def run(v, old_v, ret):
        v = v.clone().requires_grad_()
        loss, frac = algo.value_loss(v, old_v, ret, mask)
        loss.backward()
        gae = algo.gae_advantages(ret.double(), old_v.double(), mask, gamma=0.9, lam=0.8)
        return loss.detach(), frac, v.grad, algo.masked_whiten(v.detach().double(), mask), *gae

    for g, w in zip(run(*bad), run(v, old_v, ret)):
        torch.testing.assert_close(g, w)


@SETTINGS
@given(st.floats(-80.0, 80.0, width=32))
def test_k3_matches_float64_for_any_gap(d):
    got = algo.kl_penalty(torch.zeros(1), torch.tensor([d]), "k3").double()
    x = torch.tensor([d], dtype=torch.float64)
    # float64 expm1(d) − d still cancels (relative 2·eps/|d|): its series where |d| < 1e-3
    series = x * x * (1 / 2 + x * (1 / 6 + x * (1 / 24 + x / 120)))
    want = torch.where(x.abs() < 1e-3, series, torch.expm1(x) - x)
    torch.testing.assert_close(got, want, rtol=3e-6, atol=1e-37)  # atol: float32 subnormals


@SETTINGS
@given(st.integers(2, 40), st.data())
def test_entropy_and_logprobs_match_float64_for_logits_up_to_45(v, data):
    z = torch.tensor(data.draw(st.lists(st.floats(-45.0, 45.0, width=32), min_size=v, max_size=v)))[None, None]
    tau = data.draw(st.sampled_from([1.0, 0.7]))
    lp64 = torch.log_softmax(z.double() / tau, -1)
    want_h = -(lp64.exp() * lp64).sum(-1)
    torch.testing.assert_close(algo.token_entropy(z, temperature=tau).double(), want_h, rtol=0, atol=2e-6)
    ids = torch.tensor([[data.draw(st.integers(0, v - 1))]])
    want = lp64.gather(-1, ids[..., None]).squeeze(-1)
    got = algo.token_logprobs(z, ids, temperature=tau).double()
    torch.testing.assert_close(got, want, rtol=2e-7, atol=2e-7)


# -- the answer parser --------------------------------------------------------------------------

_PIECES = [
    "\\boxed{",
    "\\boxed ",
    "\\fbox{",
    "{",
    "}",
    "\\frac{1}{2}",
    "\\dfrac",
    "\\",
    "####",
    "#### ",
    "Answer:",
    "answer is",
    "The answer is ",
    "**",
    "$",
    "1",
    "42",
    "2.5",
    "-3",
    "1,000",
    "3/4",
    ".5",
    " ",
    "\n",
    "x",
    "=",
    "\\text{(C)}",
    "\\sqrt{2}",
    "^",
    "(",
    ")",
    "[",
    "]",
    ",",
    ".",
    "e",
    "%",
    "\\infty",
    "\\pi",
]
answer_like = st.lists(st.sampled_from(_PIECES), max_size=60).map("".join)
any_text = st.one_of(
    st.text(max_size=300), answer_like, st.text(alphabet="\\{}boxed0123456789#$.,/- answerAnsw:is\n", max_size=300)
)


_GOLDS = ["42", "\\frac{1}{2}", "x^2", "\\text{(C)}", "1,000"]


@pytest.fixture(scope="module", autouse=True)
def _warm_math_verify():
    """math-verify and sympy import submodules on first use (~1 s, once per process): pay that
    here, so the time bounds below measure the parsing itself."""
    texts = [
        "\\boxed{\\frac{1}{2}}",
        "answer is-3answer is z",
        "The answer is x+1 y",
        "\\sqrt{2}^2",
        "\\boxed{\\text{(C)}}",
        "(1, 2]",
        "\\infty",
        "x = \\pi e%",
    ]
    for gold in _GOLDS:
        math_correct(["q"] * len(texts), texts, answer=[gold] * len(texts))


@PARSER_SETTINGS
@given(any_text)
def test_extract_answer_total_and_fast(text):
    t0 = time.process_time()
    out = extract_answer(text)
    assert time.process_time() - t0 < 1.0
    assert out is None or isinstance(out, str)


@PARSER_SETTINGS
@given(any_text, st.sampled_from(_GOLDS))
def test_math_correct_total_and_fast(text, gold):
    t0 = time.process_time()  # CPU time: a loaded machine must not make this fail
    out = math_correct(["q"], [text], answer=[gold])
    assert time.process_time() - t0 < 1.0, text
    assert out in ([0.0], [1.0])


def test_extract_answer_many_unclosed_boxes_is_fast():
    """Worst case for the brace matcher: every ``\\boxed{`` scans to the end of the text."""
    text = "\\boxed{" * 600 + "1"  # ~4k characters, about what a 1k-token completion holds
    t0 = time.process_time()
    assert extract_answer(text) == "1"
    assert time.process_time() - t0 < 1.0


# -- rewards equal up to rounding are a constant group ------------------------------------------


def _nudged(base: list[float], ulps: list[int], dtype: torch.dtype) -> torch.Tensor:
    """``base[i]`` moved ``ulps[i]`` representable steps up (> 0) or down (< 0) in ``dtype``."""
    out = torch.tensor(base, dtype=dtype)
    for i, k in enumerate(ulps):
        toward = torch.tensor(math.copysign(math.inf, k), dtype=dtype)
        for _ in range(abs(k)):
            out[i] = torch.nextafter(out[i], toward)
    return out


@st.composite
def noisy_constant_groups(draw, max_ulps=4):
    """B groups of G copies of one normal, finite value each (float32 or float64), every member
    moved by up to ``max_ulps`` ulps: what summing the same reward in another order leaves."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    fi = torch.finfo(dtype)
    g, b = draw(st.integers(2, 8)), draw(st.integers(1, 3))
    width = 32 if dtype == torch.float32 else 64
    magnitude = st.floats(fi.tiny * 2**8, fi.max / 2, width=width)  # normal, nudging stays finite
    base = [draw(magnitude) * draw(st.sampled_from([-1, 1])) for _ in range(b) for _ in range(g)]
    base = [base[(i // g) * g] for i in range(b * g)]  # one value per group
    ulps = draw(st.lists(st.integers(-max_ulps, max_ulps), min_size=b * g, max_size=b * g))
    return _nudged(base, ulps, dtype), g


@SETTINGS
@given(noisy_constant_groups(), st.sampled_from(algo.SCALES), st.sampled_from([0.0, 1e-4]))
def test_rounding_noise_on_a_constant_group_gives_zeros(rg, scale, eps):
    r, g = rg
    assert algo.constant_groups(r, g).all()
    assert torch.equal(algo.group_advantages(r, g, scale=scale, eps=eps), torch.zeros_like(r))
    # the same rewards as one step ending at the last token of each completion
    n, t = len(r), 3
    step_r = torch.zeros(n, t, dtype=r.dtype)
    step_r[:, -1] = r
    ends = torch.zeros(n, t, dtype=torch.bool)
    ends[:, -1] = True
    adv = algo.process_advantages(step_r, ends, torch.ones(n, t, dtype=torch.bool), g, eps=eps)
    assert torch.equal(adv, torch.zeros_like(step_r))


@SETTINGS
@given(noisy_constant_groups(max_ulps=40))
def test_constant_groups_is_the_rule_of_the_advantages(rg):
    """Noise on both sides of the 16-ulp threshold: a group's advantages (eps = 0, scale=group)
    are all 0 exactly when ``constant_groups`` says so (the trainer's ``frac_zero_std``)."""
    r, g = rg
    adv = algo.group_advantages(r, g, scale="group", eps=0.0).view(-1, g)
    assert ((adv == 0).all(dim=1) == algo.constant_groups(r, g)).all()
