"""Statistics for held-out evaluation: pass@k, mean@k, maj@k, intervals, paired model comparison.

Pure standard-library functions on Python lists (no torch, no numpy), so an eval script can import
them without the training stack. Conventions:

- A *problem* is one held-out prompt. Per problem we have the greedy correctness (bool) and,
  optionally, ``k`` sampled completions with their correctness flags and extracted final answers.
- Binomial counts (greedy accuracy, maj@k) get a Wilson score interval; averages of per-problem
  estimates that are not 0/1 (mean@k, pass@k) get a percentile bootstrap over problems.
- Two models on the same problems are compared *paired*: Newcombe's hybrid score interval for the
  difference of paired proportions (method 10) and the exact McNemar test.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from statistics import NormalDist
from typing import Any


def _z(confidence: float) -> float:
    """Two-sided normal quantile ``z = Φ⁻¹(1 − α/2)``, ``α = 1 − confidence``; ValueError unless in (0, 1)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, §2.1).

    ``pass@k = 1 − C(n−c, k) / C(n, k)``: the chance that a random size-``k`` subset of the ``n``
    samples holds at least one correct one. Computed as ``1 − Π_{i=n−c+1..n} (1 − k/i)`` (the paper's
    stable product form; no huge binomials), and exactly 1.0 when ``n − c < k``.

    Raises ValueError naming the argument if ``k < 1``, ``k > n``, ``c < 0`` or ``c > n``.

    >>> pass_at_k(4, 1, 2)  # 1 − C(3,2)/C(4,2) = 1 − 3/6
    0.5
    >>> pass_at_k(10, 3, 1)  # pass@1 = c/n
    0.3
    """
    if k < 1 or k > n:
        raise ValueError(f"k must satisfy 1 <= k <= n={n}, got k={k}")
    if c < 0 or c > n:
        raise ValueError(f"c must satisfy 0 <= c <= n={n}, got c={c}")
    if n - c < k:
        return 1.0
    if k == 1:
        return c / n  # the product telescopes to (n−c)/n; return the correctly rounded c/n
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_at_k(correct: Sequence[bool]) -> float:
    """mean@k: fraction of the ``k`` sampled completions of one problem that are correct.

    Raises ValueError on an empty list.

    >>> mean_at_k([True, False, False, True])
    0.5
    """
    if len(correct) == 0:
        raise ValueError("correct must hold at least one sample")
    return sum(map(bool, correct)) / len(correct)


def majority_index(answers: Sequence[str | None]) -> int | None:
    """Index of the majority-vote answer among ``k`` extracted final answers, or None if none voted.

    ``None`` answers (nothing extracted) do not vote. Answers vote by exact equality, so normalize
    them first. **Tie rule**: among the most frequent answers, the one whose first occurrence is
    earliest wins; the returned index is that first occurrence.

    >>> majority_index(["4", "5", "5", "4", None])  # "4" and "5" tie at 2; "4" comes first
    0
    >>> majority_index([None, None]) is None
    True
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(i for i, a in enumerate(answers) if a is not None and counts[a] == top)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """maj@k for one problem: is the majority-vote answer (:func:`majority_index`) correct?

    ``correct[i]`` is the correctness of ``answers[i]``; the flag of the winner's first occurrence is
    used. All answers ``None`` -> False. Raises ValueError if the lengths differ.

    >>> maj_at_k(["7", "8", "8"], [True, False, False])
    False
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers ({len(answers)}) and correct ({len(correct)}) differ in length")
    i = majority_index(answers)
    return False if i is None else bool(correct[i])


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``p̂ = successes / n`` (Wilson 1927).

    ``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)`` with ``z = Φ⁻¹(1 − α/2)``; the ends
    are the ``p`` solving ``(p̂ − p)² = z² p(1−p)/n``. Exactly 0 (1) at 0 (n) successes.
    Raises ValueError if ``n < 1`` or ``successes`` is outside ``[0, n]``.

    >>> [round(x, 4) for x in wilson_interval(5, 10)]
    [0.2366, 0.7634]
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must satisfy 0 <= successes <= n={n}, got {successes}")
    z2 = _z(confidence) ** 2
    p = successes / n
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) * math.sqrt(z2) / denom
    lo = 0.0 if successes == 0 else max(0.0, center - half)
    hi = 1.0 if successes == n else min(1.0, center + half)
    return lo, hi


def bootstrap_interval(
    values: Sequence[float], confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (Efron & Tibshirani 1993, §13.3).

    Draws ``n_resamples`` resamples of size ``len(values)`` with replacement from
    ``random.Random(seed)``, sorts their means ``m_(0) <= ... <= m_(R−1)`` and returns
    ``(m_(j), m_(R−1−j))`` with ``j = floor(R·α/2)`` (``R=2000, α=0.05 -> j=50``). Same seed, same
    interval. Raises ValueError on empty ``values`` or ``n_resamples < 1``.

    >>> bootstrap_interval([0.5, 0.5, 0.5])
    (0.5, 0.5)
    """
    if len(values) == 0:
        raise ValueError("values must be non-empty")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    alpha = 1.0 - confidence
    _z(confidence)  # validates confidence
    rng, n = random.Random(seed), len(values)
    means = sorted(math.fsum(rng.choices(values, k=n)) / n for _ in range(n_resamples))
    j = min(int(math.floor(n_resamples * alpha / 2 + 1e-9)), (n_resamples - 1) // 2)
    return means[j], means[n_resamples - 1 - j]


def mcnemar_exact_p(b_only: int, a_only: int) -> float:
    """Exact two-sided McNemar p-value: binomial test of the discordant pairs at 1/2.

    ``p = min(1, 2·P(X <= min(b_only, a_only)))`` with ``X ~ Bin(b_only + a_only, 1/2)``; 1.0 when
    there are no discordant pairs. Summed exactly in integers (``math.comb``), rounded once.

    >>> mcnemar_exact_p(5, 0)  # 2 · 1/32
    0.0625
    """
    if b_only < 0 or a_only < 0:
        raise ValueError(f"counts must be >= 0, got b_only={b_only}, a_only={a_only}")
    m = b_only + a_only
    tail = sum(math.comb(m, i) for i in range(min(b_only, a_only) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**m)))


def _newcombe_paired(both: int, b_only: int, a_only: int, neither: int, z: float) -> tuple[float, float]:
    """Newcombe (1998, Stat Med 17:2635, method 10) interval for ``acc_b − acc_a`` on paired data."""
    n = both + b_only + a_only + neither
    conf = 2 * NormalDist().cdf(z) - 1
    p1, p2 = (both + b_only) / n, (both + a_only) / n  # acc_b, acc_a
    l1, u1 = wilson_interval(both + b_only, n, conf)
    l2, u2 = wilson_interval(both + a_only, n, conf)
    margins = (both + b_only) * (a_only + neither) * (both + a_only) * (b_only + neither)
    cross = both * neither - b_only * a_only
    phi = 0.0  # Newcombe's corrected phi: 0 if a margin is 0 or 0 <= cross <= n/2
    if margins > 0 and cross > n / 2:
        phi = (cross - n / 2) / math.sqrt(margins)
    elif margins > 0 and cross < 0:
        phi = cross / math.sqrt(margins)
    dl, du = p1 - l1, u2 - p2
    lo = (p1 - p2) - math.sqrt(max(0.0, dl * dl - 2 * phi * dl * du + du * du))
    el, eu = u1 - p1, p2 - l2
    hi = (p1 - p2) + math.sqrt(max(0.0, el * el - 2 * phi * el * eu + eu * eu))
    return lo, hi


def paired_comparison(a: Sequence[bool], b: Sequence[bool], confidence: float = 0.95) -> dict:
    """Compare models A and B on the same ``n`` problems (``a[i]``, ``b[i]``: correct on problem i).

    Returns ``n``, ``acc_a``, ``acc_b``, ``diff = acc_b − acc_a``, its interval ``diff_lo``/``diff_hi``
    (Newcombe's hybrid score interval for paired proportions, method 10 of Newcombe 1998, with his
    corrected phi), ``b_only`` (B right, A wrong), ``a_only``, and ``p_value`` (exact McNemar,
    :func:`mcnemar_exact_p`). Raises ValueError if the lists are empty or differ in length.

    >>> r = paired_comparison([True, False, False, False], [True, True, True, False])
    >>> r["diff"], r["b_only"], r["a_only"], r["p_value"]
    (0.5, 2, 0, 0.5)
    """
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"a and b must be non-empty and equal in length, got {len(a)} and {len(b)}")
    pairs = Counter((bool(x), bool(y)) for x, y in zip(a, b))
    both, neither = pairs[(True, True)], pairs[(False, False)]
    b_only, a_only = pairs[(False, True)], pairs[(True, False)]
    n = len(a)
    lo, hi = _newcombe_paired(both, b_only, a_only, neither, _z(confidence))
    acc_a, acc_b = (both + a_only) / n, (both + b_only) / n
    return {
        "n": n,
        "acc_a": acc_a,
        "acc_b": acc_b,
        "diff": (b_only - a_only) / n,
        "diff_lo": lo,
        "diff_hi": hi,
        "b_only": b_only,
        "a_only": a_only,
        "p_value": mcnemar_exact_p(b_only, a_only),
        "interval": "newcombe-paired-10",
    }


def paired_sampled_comparison(
    a: Sequence[int], b: Sequence[int], k: int, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> dict:
    """Compare the mean@k of models A and B on the same ``n`` problems, paired by problem.

    ``a[i]``, ``b[i]``: how many of the ``k`` completions sampled for problem i were correct
    (integers in ``[0, k]``). Per problem the difference is ``d_i = (b_i − a_i) / k``; the result is
    ``diff = mean(d)`` (= mean@k of B − mean@k of A) with a percentile bootstrap interval over
    problems (:func:`bootstrap_interval` of the ``d_i``: problems are resampled, each keeps its pair),
    and the exact two-sided **sign test** (Dixon & Mood 1946): of the problems where the two
    differ, ``b_better`` have ``b_i > a_i`` and ``a_better`` have ``a_i > b_i``; under "no difference"
    each is B's with probability 1/2, so ``p_value = mcnemar_exact_p(b_better, a_better)``. With
    k = 1 this is McNemar's test on the sampled outcomes.

    Returns ``n``, ``k``, ``mean_a``, ``mean_b``, ``diff``, ``diff_lo``, ``diff_hi``, ``b_better``,
    ``a_better``, ``p_value``, ``interval`` (``"bootstrap-paired"``), ``test`` (``"sign"``).

    Raises:
        ValueError: empty or unequal lists, ``k < 1``, a count outside ``[0, k]``.

    >>> r = paired_sampled_comparison([0, 1, 2, 4], [2, 1, 3, 0], 4)
    >>> r["diff"], r["b_better"], r["a_better"], r["p_value"]
    (-0.0625, 2, 1, 1.0)
    """
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"a and b must be non-empty and equal in length, got {len(a)} and {len(b)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    for name, counts in (("a", a), ("b", b)):
        bad = [(i, c) for i, c in enumerate(counts) if not 0 <= int(c) <= k or int(c) != c]
        if bad:
            raise ValueError(f"{name}[{bad[0][0]}] = {bad[0][1]}: correct samples must be an integer in [0, {k}]")
    n = len(a)
    d = [(int(y) - int(x)) / k for x, y in zip(a, b)]
    lo, hi = bootstrap_interval(d, confidence=confidence, n_resamples=n_resamples, seed=seed)
    b_better, a_better = sum(x > 0 for x in d), sum(x < 0 for x in d)
    return {
        "n": n,
        "k": k,
        "mean_a": math.fsum(a) / (n * k),
        "mean_b": math.fsum(b) / (n * k),
        "diff": math.fsum(d) / n,
        "diff_lo": lo,
        "diff_hi": hi,
        "b_better": b_better,
        "a_better": a_better,
        "p_value": mcnemar_exact_p(b_better, a_better),
        "interval": "bootstrap-paired",
        "test": "sign",
    }


def _entry(value: float, lo: float, hi: float, method: str) -> dict:
    return {"value": value, "lo": lo, "hi": hi, "interval": method}


def summarize(
    greedy: Sequence[bool],
    samples: Sequence[Sequence[bool]] | None = None,
    answers: Sequence[Sequence[str | None]] | None = None,
    ks: Sequence[int] | None = None,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> dict:
    """Per-metric value and interval over problems.

    ``greedy[i]``: greedy correctness of problem i. ``samples[i]``: the ``k`` sampled correctness
    flags (same ``k`` for every problem). ``answers[i]``: the ``k`` extracted answers (for maj@k).
    ``ks``: pass@k sizes, default the powers of two ``<= k`` plus ``k``.
    Returns ``{"n_problems", "k", "metrics": {name: {"value", "lo", "hi", "interval"}}}`` with names
    ``greedy`` (Wilson), ``mean@k`` and ``pass@j`` (bootstrap over problems, one seed), ``maj@k`` (Wilson).

    >>> s = summarize([True, False], samples=[[True, False], [False, False]])
    >>> s["metrics"]["greedy"]["value"], s["metrics"]["mean@2"]["value"], s["metrics"]["pass@2"]["value"]
    (0.5, 0.25, 0.5)
    """
    n = len(greedy)
    if n == 0:
        raise ValueError("greedy must hold at least one problem")
    lo, hi = wilson_interval(sum(map(bool, greedy)), n, confidence)
    metrics = {"greedy": _entry(sum(map(bool, greedy)) / n, lo, hi, "wilson")}
    k = None
    if samples is not None:
        k = _common_k(samples, n, "samples")
        boot: dict[str, Any] = dict(confidence=confidence, n_resamples=n_resamples, seed=seed)
        per = [mean_at_k(s) for s in samples]
        metrics[f"mean@{k}"] = _entry(math.fsum(per) / n, *bootstrap_interval(per, **boot), "bootstrap")
        for j in ks or sorted({2**e for e in range(k.bit_length()) if 2**e <= k} | {k}):
            per = [pass_at_k(k, sum(map(bool, s)), j) for s in samples]
            metrics[f"pass@{j}"] = _entry(math.fsum(per) / n, *bootstrap_interval(per, **boot), "bootstrap")
        if answers is not None:
            if _common_k(answers, n, "answers") != k:
                raise ValueError("answers and samples must hold the same k per problem")
            wins = sum(maj_at_k(ans, s) for ans, s in zip(answers, samples))
            metrics[f"maj@{k}"] = _entry(wins / n, *wilson_interval(wins, n, confidence), "wilson")
    elif answers is not None:
        raise ValueError("answers need samples (the per-answer correctness flags)")
    return {"n_problems": n, "k": k, "confidence": confidence, "metrics": metrics}


def _common_k(rows: Sequence[Sequence], n: int, name: str) -> int:
    """The shared row length of ``rows`` (one row per problem); ValueError if ragged/empty/wrong count."""
    if len(rows) != n:
        raise ValueError(f"{name} must hold one row per problem ({n}), got {len(rows)}")
    lengths = {len(r) for r in rows}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"{name} must hold the same k >= 1 items per problem, got lengths {sorted(lengths)}")
    return lengths.pop()


def format_summary(summary: dict) -> str:
    """A plain-text table of :func:`summarize`'s output, values and bounds to 4 decimals.

    >>> print(format_summary(summarize([True, True, False, True])))
    metric  value   95% interval      method
    greedy  0.7500  [0.3006, 0.9544]  wilson
    """
    pct = f"{100 * summary['confidence']:g}%"
    rows = [("metric", "value", f"{pct} interval", "method")]
    for name, m in summary["metrics"].items():
        rows.append((name, f"{m['value']:.4f}", f"[{m['lo']:.4f}, {m['hi']:.4f}]", m["interval"]))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
