"""Tests for grpokit.eval.stats: each formula against brute force, hand arithmetic or a second route."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest

from grpokit.eval.stats import (
    bootstrap_interval,
    format_summary,
    maj_at_k,
    majority_index,
    mcnemar_exact_p,
    mean_at_k,
    paired_comparison,
    paired_sampled_comparison,
    pass_at_k,
    summarize,
    wilson_interval,
)

Z = 1.959963984540054  # Φ⁻¹(0.975)
Z2 = Z * Z  # 3.841458820694124


# ---------------------------------------------------------------- pass@k


def test_pass_at_k_equals_subset_enumeration():
    # Definition: P(a uniformly random size-k subset of the n samples holds >= 1 correct one).
    for n in range(1, 9):
        for c in range(n + 1):
            items = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(items, k))
                exact = Fraction(sum(any(s) for s in subsets), len(subsets))
                assert abs(pass_at_k(n, c, k) - float(exact)) <= 1e-12, (n, c, k)


def test_pass_at_1_is_c_over_n_and_hand_values():
    for n in range(1, 30):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == c / n
    # n=5, c=2, k=2: 1 − C(3,2)/C(5,2) = 1 − 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    # n=200, c=1, k=100: 1 − C(199,100)/C(200,100) = 1 − 100/200 = 0.5 (no overflow)
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize("n,c,k,name", [(4, 1, 0, "k"), (4, 1, 5, "k"), (4, -1, 2, "c"), (4, 5, 2, "c")])
def test_pass_at_k_errors_name_the_argument(n, c, k, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        pass_at_k(n, c, k)


# ---------------------------------------------------------------- mean@k, maj@k


def test_mean_at_k():
    assert mean_at_k([True, True, False, False, False]) == 0.4  # 2/5
    with pytest.raises(ValueError):
        mean_at_k([])


def test_majority_tie_breaks_to_earliest_first_occurrence():
    # "b" and "a" both appear twice; "b" is seen first (index 0) -> "b" wins, its index 0.
    assert majority_index(["b", "a", "a", "b"]) == 0
    assert maj_at_k(["b", "a", "a", "b"], [False, True, True, False]) is False
    assert maj_at_k(["b", "a", "a", "b"], [True, False, False, True]) is True
    # A strict majority wins wherever it first appears.
    assert majority_index(["a", "b", "c", "b"]) == 1


def test_majority_none_does_not_vote():
    # Three None outnumber "x", but None never votes: "x" wins.
    assert majority_index([None, "x", None, None]) == 1
    assert maj_at_k([None, "x", None, None], [False, True, False, False]) is True
    # A None before the tied answers does not shift the tie rule.
    assert majority_index([None, "q", "p", "p", "q"]) == 1
    # All None -> no vote -> incorrect.
    assert majority_index([None, None, None]) is None
    assert maj_at_k([None, None, None], [True, True, True]) is False


def test_maj_at_k_length_mismatch():
    with pytest.raises(ValueError, match="length"):
        maj_at_k(["a", "b"], [True])


# ---------------------------------------------------------------- Wilson


@pytest.mark.parametrize(
    "s,n,lo,hi",
    [
        # 0/10: p=0, d=1+Z2/10=1.384146, center=(Z2/20)/d=0.192073/1.384146=0.138766,
        #       half=Z·sqrt(Z2/400)/d=Z2/20/d=0.138766 -> (0, 0.277533)
        (0, 10, 0.0, 0.2775328),
        # 10/10: mirror of 0/10 -> (1 − 0.277533, 1)
        (10, 10, 0.7224672, 1.0),
        # 5/10: center 0.5; half=Z·sqrt(0.25/10 + Z2/400)/d = 1.959964·sqrt(0.025+0.0096036)/1.384146
        #       = 1.959964·0.186021/1.384146 = 0.263407 -> (0.236593, 0.763407)
        (5, 10, 0.2365931, 0.7634069),
        # 156/500: p=0.312, d=1+Z2/500=1.0076829, center=(0.312+0.0038415)/d=0.3134334,
        #          half=Z·sqrt(0.312·0.688/500 + Z2/1e6)/d = 1.959964·sqrt(4.29312e-4+3.8415e-6)/1.0076829
        #          = 1.959964·0.0208123/1.0076829 = 0.0404804 -> (0.272953, 0.353914)
        (156, 500, 0.2729529, 0.3539138),
    ],
)
def test_wilson_hand_values(s, n, lo, hi):
    got = wilson_interval(s, n)
    assert got[0] == pytest.approx(lo, abs=1e-6)
    assert got[1] == pytest.approx(hi, abs=1e-6)


def _wilson_by_bisection(s: int, n: int, z: float = Z) -> tuple[float, float]:
    """Second route: the ends are the p with (p̂ − p)² = z²·p(1−p)/n, found by bisection."""

    def f(p):
        return (s / n - p) ** 2 - z * z * p * (1 - p) / n

    def root(a, b):  # f(a) and f(b) have opposite signs (or one is 0)
        for _ in range(200):
            m = (a + b) / 2
            if (f(a) > 0) == (f(m) > 0):
                a = m
            else:
                b = m
        return (a + b) / 2

    p = s / n
    lo = 0.0 if s == 0 else root(0.0, p)
    hi = 1.0 if s == n else root(p, 1.0)
    return lo, hi


def test_wilson_matches_score_equation_and_properties():
    for n in (1, 2, 7, 30, 101):
        for s in range(n + 1):
            lo, hi = wilson_interval(s, n)
            ref = _wilson_by_bisection(s, n)
            assert lo == pytest.approx(ref[0], abs=1e-9) and hi == pytest.approx(ref[1], abs=1e-9)
            assert 0.0 <= lo <= s / n <= hi <= 1.0
            lo99, hi99 = wilson_interval(s, n, confidence=0.99)
            assert lo99 <= lo and hi <= hi99


def test_wilson_errors():
    for args in [(0, 0), (-1, 5), (6, 5)]:
        with pytest.raises(ValueError):
            wilson_interval(*args)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 5, confidence=1.0)


# ---------------------------------------------------------------- bootstrap


def test_bootstrap_deterministic_per_seed():
    rng = random.Random(7)
    values = [rng.random() for _ in range(30)]  # distinct values: resample means nearly continuous
    assert bootstrap_interval(values, seed=3) == bootstrap_interval(values, seed=3)
    assert bootstrap_interval(values, seed=3) != bootstrap_interval(values, seed=4)


def test_bootstrap_constant_list_is_the_point():
    lo, hi = bootstrap_interval([0.3] * 7)
    assert lo == hi == math.fsum([0.3] * 7) / 7
    assert lo == pytest.approx(0.3, abs=1e-15)


def test_bootstrap_contains_mean():
    rng = random.Random(11)
    values = [rng.random() ** 3 for _ in range(60)]  # skewed
    lo, hi = bootstrap_interval(values)
    assert lo < sum(values) / len(values) < hi


def test_bootstrap_close_to_wilson_on_bernoulli_n500():
    # 156/500 successes: Wilson (0.2730, 0.3539). The percentile bootstrap of the mean of 0/1
    # values should agree to about a point (1e-2): both ≈ p ± 1.96·sqrt(p(1−p)/500) = 0.312 ± 0.0406.
    values = [1.0] * 156 + [0.0] * 344
    lo, hi = bootstrap_interval(values, n_resamples=2000, seed=0)
    wlo, whi = wilson_interval(156, 500)
    assert abs(lo - wlo) < 0.01 and abs(hi - whi) < 0.01
    assert 0.07 < hi - lo < 0.09  # width ≈ 2·0.0406 = 0.081


def test_bootstrap_errors():
    with pytest.raises(ValueError):
        bootstrap_interval([])
    with pytest.raises(ValueError):
        bootstrap_interval([1.0], n_resamples=0)


# ---------------------------------------------------------------- McNemar and paired comparison


def test_mcnemar_hand_values():
    assert mcnemar_exact_p(0, 0) == 1.0  # no discordant pairs
    assert mcnemar_exact_p(5, 0) == 0.0625  # 2 · P(X<=0), X~Bin(5,½) = 2 · 1/32
    assert mcnemar_exact_p(0, 5) == 0.0625
    assert mcnemar_exact_p(6, 1) == 0.125  # 2 · (C(7,0)+C(7,1))/2^7 = 2 · 8/128
    assert mcnemar_exact_p(3, 3) == 1.0  # 2 · (1+6+15+20)/64 = 84/64 > 1 -> capped at 1


def _upper_tail_p(b_only: int, a_only: int) -> Fraction:
    """Second route: 2·P(X >= max) by the pmf recurrence pmf(i+1) = pmf(i)·(m−i)/(i+1)."""
    m = b_only + a_only
    pmf, total = Fraction(1, 2**m), Fraction(0)
    for i in range(m + 1):
        if i >= max(b_only, a_only):
            total += pmf
        pmf = pmf * (m - i) / (i + 1)
    return min(Fraction(1), 2 * total)


def test_mcnemar_large_case_exact():
    # 500 problems, 100 discordant (B alone right on 65, A alone on 35).
    a = [True] * 200 + [False] * 65 + [True] * 35 + [False] * 200
    b = [True] * 200 + [True] * 65 + [False] * 35 + [False] * 200
    r = paired_comparison(a, b)
    assert (r["n"], r["b_only"], r["a_only"]) == (500, 65, 35)
    assert r["p_value"] == float(_upper_tail_p(65, 35))
    assert 0.003 < r["p_value"] < 0.004  # ≈ 0.0035 (normal approx: z=(65−50)/5=3 -> 0.0027)
    for b_only, a_only in [(1, 0), (9, 4), (40, 60), (250, 251), (700, 600)]:
        assert mcnemar_exact_p(b_only, a_only) == float(_upper_tail_p(b_only, a_only))


def _table(both: int, b_only: int, a_only: int, neither: int) -> tuple[list[bool], list[bool]]:
    a = [True] * both + [False] * b_only + [True] * a_only + [False] * neither
    b = [True] * both + [True] * b_only + [False] * a_only + [False] * neither
    return a, b


def test_paired_counts_and_published_newcombe_value():
    # Cavo et al. 2012 (Fagerland, Lydersen & Laake, paired 2x2 chapter; contingencytables R package
    # test-ch8.R): table [[59, 6], [16, 80]], first measurement = rows. Newcombe square-and-add for
    # p_rows − p_cols: −0.0621 (95% CI −0.1186 to −0.0046). With A = rows, B = columns our
    # diff = acc_b − acc_a = (16 − 6)/161 = +0.0621 and the interval is the negation.
    a, b = _table(both=59, b_only=16, a_only=6, neither=80)
    r = paired_comparison(a, b)
    assert r["acc_a"] == 65 / 161 and r["acc_b"] == 75 / 161 and r["diff"] == 10 / 161
    assert r["diff_lo"] == pytest.approx(0.0046, abs=5e-5)
    assert r["diff_hi"] == pytest.approx(0.1186, abs=5e-5)
    # McNemar: 2·P(X<=6), X~Bin(22,½) = 2·(1+22+231+1540+7315+26334+74613)/2^22 = 220112/4194304
    assert r["p_value"] == 220112 / 4194304


def _newcombe_reference(both, b_only, a_only, neither, z=Z):
    """Second route, written from Newcombe 1998 / Fagerland et al. 2014 in table notation: rows =
    model B (n11 both right, n12 B only), Wilson ends by bisection, corrected phi."""
    n11, n12, n21, n22 = both, b_only, a_only, neither
    n = n11 + n12 + n21 + n22
    x1, x2 = n11 + n12, n11 + n21
    p1, p2 = x1 / n, x2 / n
    (l1, u1), (l2, u2) = _wilson_by_bisection(x1, n, z), _wilson_by_bisection(x2, n, z)
    margins = [n11 + n12, n21 + n22, n11 + n21, n12 + n22]
    big_a = n11 * n22 - n12 * n21
    if 0 in margins or 0 <= big_a <= n / 2:
        psi = 0.0
    else:
        psi = (big_a - n / 2 if big_a > n / 2 else big_a) / math.sqrt(math.prod(margins))
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2))
    up = d + math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1))
    return low, up


@pytest.mark.parametrize(
    "cells",
    [
        (59, 16, 6, 80),
        (1, 7, 1, 12),
        (10, 0, 0, 0),
        (0, 0, 0, 10),
        (5, 0, 0, 5),
        (0, 4, 3, 0),
        (3, 2, 0, 1),
        (120, 30, 45, 305),
    ],
)
def test_paired_interval_matches_second_route(cells):
    r = paired_comparison(*_table(*cells))
    ref = _newcombe_reference(*cells)
    assert r["diff_lo"] == pytest.approx(ref[0], abs=1e-8)
    assert r["diff_hi"] == pytest.approx(ref[1], abs=1e-8)
    assert -1.0 <= r["diff_lo"] <= r["diff"] <= r["diff_hi"] <= 1.0


def test_paired_interval_near_wald_for_large_n():
    # n=4000: both 1500, B only 300, A only 200, neither 2000. Wald for paired differences:
    # d = 100/4000 = 0.025, se = sqrt((300+200) − 100²/4000)/4000 = sqrt(497.5)/4000 = 0.0055762,
    # d ± Z·se = 0.025 ± 0.0109291 -> (0.0140709, 0.0359291). Newcombe should agree to ~1e-3.
    r = paired_comparison(*_table(1500, 300, 200, 2000))
    assert r["diff_lo"] == pytest.approx(0.0140709, abs=1e-3)
    assert r["diff_hi"] == pytest.approx(0.0359291, abs=1e-3)


def test_paired_symmetry():
    rng = random.Random(5)
    a = [rng.random() < 0.5 for _ in range(80)]
    b = [rng.random() < 0.6 for _ in range(80)]
    ab, ba = paired_comparison(a, b), paired_comparison(b, a)
    assert ab["p_value"] == ba["p_value"]
    assert ab["diff"] == -ba["diff"]
    assert ab["diff_lo"] == pytest.approx(-ba["diff_hi"], abs=1e-12)
    assert ab["diff_hi"] == pytest.approx(-ba["diff_lo"], abs=1e-12)
    assert (ab["b_only"], ab["a_only"]) == (ba["a_only"], ba["b_only"])


def test_paired_errors():
    with pytest.raises(ValueError):
        paired_comparison([True], [True, False])
    with pytest.raises(ValueError):
        paired_comparison([], [])


# ---------------------------------------------------------------- paired mean@k


def test_paired_sampled_hand_values():
    # d = (b - a) / 2 = [.5, 1, .5, .5, 0]: mean 0.5; 4 problems better under B, 0 under A;
    # sign test p = 2 · P(Bin(4, 1/2) <= 0) = 2/16
    r = paired_sampled_comparison([0, 0, 0, 0, 0], [1, 2, 1, 1, 0], 2)
    assert (r["n"], r["k"], r["mean_a"], r["mean_b"], r["diff"]) == (5, 2, 0.0, 0.5, 0.5)
    assert (r["b_better"], r["a_better"], r["p_value"]) == (4, 0, 0.125)
    assert (r["diff_lo"], r["diff_hi"]) == bootstrap_interval([0.5, 1.0, 0.5, 0.5, 0.0])
    assert r["diff_lo"] <= r["diff"] <= r["diff_hi"]


def test_paired_sampled_sign_test_by_enumeration():
    """Under "no difference" every problem that differs is B's or A's with probability 1/2: the p-value
    is the probability, over all 2^m such labellings, of a split at least as uneven as the one seen."""
    a, b = [3, 0, 1, 4, 2, 2, 0, 4], [4, 1, 0, 4, 4, 3, 2, 1]  # k = 4: B better on 5, A on 2, 1 tie
    r = paired_sampled_comparison(a, b, 4)
    m, seen = r["b_better"] + r["a_better"], min(r["b_better"], r["a_better"])
    uneven = sum(min(sum(lab), m - sum(lab)) <= seen for lab in itertools.product((0, 1), repeat=m))
    assert (r["b_better"], r["a_better"]) == (5, 2)
    assert r["p_value"] == pytest.approx(uneven / 2**m, abs=1e-15)  # 2 · (1 + 7 + 21) / 128


def test_paired_sampled_k1_is_mcnemar_and_swap_flips_sign():
    a, b = [1, 0, 0, 1, 0, 1], [1, 1, 1, 0, 1, 1]
    r, mc = paired_sampled_comparison(a, b, 1), paired_comparison([bool(x) for x in a], [bool(x) for x in b])
    assert (r["diff"], r["b_better"], r["a_better"], r["p_value"]) == (
        mc["diff"],
        mc["b_only"],
        mc["a_only"],
        mc["p_value"],
    )
    s = paired_sampled_comparison(b, a, 1)
    assert s["diff"] == -r["diff"] and s["p_value"] == r["p_value"]


@pytest.mark.parametrize(
    "a, b, k, msg",
    [
        ([], [], 2, "non-empty"),
        ([1], [1, 2], 2, "equal in length"),
        ([1], [1], 0, "k must be >= 1"),
        ([1, 3], [0, 0], 2, r"a\[1\] = 3"),
        ([0], [0.5], 2, r"b\[0\] = 0.5"),
        ([0], [-1], 2, r"b\[0\] = -1"),
    ],
)
def test_paired_sampled_errors_name_the_input(a, b, k, msg):
    with pytest.raises(ValueError, match=msg):
        paired_sampled_comparison(a, b, k)


# ---------------------------------------------------------------- summary and table


def _small_eval():
    greedy = [True, False, True, False]
    samples = [
        [True, True, False, False],  # c=2
        [False, False, False, False],  # c=0
        [True, False, False, False],  # c=1
        [True, True, True, True],  # c=4
    ]
    answers = [
        ["5", "5", "7", "7"],  # tie 5/7 -> "5" (first) -> correct
        ["1", "2", "2", None],  # "2" -> wrong
        ["9", "3", "3", "3"],  # "3" -> wrong
        ["4", "4", "4", "4"],  # correct
    ]
    return greedy, samples, answers


def test_summarize_hand_values():
    greedy, samples, answers = _small_eval()
    s = summarize(greedy, samples, answers)
    m = s["metrics"]
    assert (s["n_problems"], s["k"]) == (4, 4)
    assert list(m) == ["greedy", "mean@4", "pass@1", "pass@2", "pass@4", "maj@4"]
    assert m["greedy"]["value"] == 0.5  # 2/4
    assert (m["greedy"]["lo"], m["greedy"]["hi"]) == wilson_interval(2, 4)
    assert m["mean@4"]["value"] == 0.4375  # (2/4 + 0 + 1/4 + 1)/4 = 1.75/4
    assert m["pass@1"]["value"] == 0.4375  # pass@1 = c/n per problem: same as mean@4
    # pass@2 per problem: 1 − C(2,2)/C(4,2) = 5/6; 0; 1 − C(3,2)/C(4,2) = 1/2; 1 -> (5/6+1/2+1)/4 = 7/12
    assert m["pass@2"]["value"] == pytest.approx(7 / 12, abs=1e-12)
    assert m["pass@4"]["value"] == 0.75  # any correct among all 4: 1, 0, 1, 1
    assert m["maj@4"]["value"] == 0.5  # votes correct on problems 0 and 3
    assert (m["maj@4"]["lo"], m["maj@4"]["hi"]) == wilson_interval(2, 4)
    per_pass2 = [5 / 6, 0.0, 0.5, 1.0]
    assert (m["pass@2"]["lo"], m["pass@2"]["hi"]) == pytest.approx(bootstrap_interval(per_pass2))
    assert [v["interval"] for v in m.values()] == ["wilson"] + ["bootstrap"] * 4 + ["wilson"]


def test_summarize_custom_ks_and_errors():
    greedy, samples, answers = _small_eval()
    assert list(summarize(greedy, samples, ks=[3])["metrics"]) == ["greedy", "mean@4", "pass@3"]
    with pytest.raises(ValueError, match="same k"):
        summarize(greedy, [[True], [True, False], [True], [True]])
    with pytest.raises(ValueError, match="one row per problem"):
        summarize(greedy, samples[:3])
    with pytest.raises(ValueError, match="need samples"):
        summarize(greedy, answers=answers)
    with pytest.raises(ValueError, match="k must"):
        summarize(greedy, samples, ks=[5])


def test_format_summary_contains_numbers():
    s = summarize(*_small_eval())
    table = format_summary(s)
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "value", "95%", "interval", "method"]
    assert len(lines) == 1 + 6
    for line, (name, m) in zip(lines[1:], s["metrics"].items()):
        assert line.split()[0] == name
        assert f"{m['value']:.4f}" in line and f"[{m['lo']:.4f}, {m['hi']:.4f}]" in line
    assert "0.4375" in table and "0.5833" in table and "0.7500" in table
