"""How well a PRM's step scores match step labels: step accuracy, AUC, and ProcessBench's
first-wrong-step F1 (Zheng et al. 2024, arXiv 2412.06559, §3).

Pure Python on lists; no torch. A step's label is 1 (good: some continuation from it reaches the
answer, Math-Shepherd's hard label) or 0; its score is the PRM's P(good) in [0, 1], or None where the
PRM could not score it (beyond its ``max_length``).

- **Step accuracy**: the share of scored steps with ``(score >= threshold) == label``.
- **AUC**: P(score of a random good step > score of a random bad step), ties counting one half
  (the Mann-Whitney U statistic / (#good · #bad)); None when either class is empty.
- **First-wrong-step F1** (ProcessBench): a solution's reference is the index of its first step
  labelled 0, or -1 when every step is labelled 1; the PRM's prediction is the index of its first
  step scored below ``threshold`` (-1 if none). ``acc_erroneous`` is the share of solutions with a
  wrong step whose index is predicted exactly; ``acc_correct`` the share of all-good solutions
  predicted -1; F1 is their harmonic mean (0 when both are 0; None when a side has no solution). A
  solution with an unscored step is left out of this measure and counted in ``solutions_unscored``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["auc", "first_wrong_step", "prm_metrics"]


def first_wrong_step(values: Sequence[float], threshold: float = 0.5) -> int:
    """The index of the first value below ``threshold``, or -1 if none is.

    >>> first_wrong_step([1, 1, 0, 1]), first_wrong_step([0.9, 0.7]), first_wrong_step([0.2], 0.1)
    (2, -1, -1)
    """
    return next((k for k, v in enumerate(values) if v < threshold), -1)


def auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """Area under the ROC curve of ``scores`` for the positive ``labels`` (1), ties counted as one
    half; None when there is no positive or no negative.

    >>> auc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0])  # pairs (good, bad): 1, 1, 0.5, 1 -> 3.5 / 4
    0.875

    Raises:
        ValueError: ``scores`` and ``labels`` differ in length.
    """
    if len(scores) != len(labels):
        raise ValueError(f"auc: {len(scores)} scores but {len(labels)} labels")
    ranked = sorted(zip(scores, labels))
    n_pos = sum(1 for _, y in ranked if y)
    n_neg = len(ranked) - n_pos
    if not n_pos or not n_neg:
        return None
    # U = sum over positives of (negatives below it + half the negatives tied with it)
    u, i, below = 0.0, 0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        pos = sum(1 for _, y in ranked[i:j] if y)
        neg = (j - i) - pos
        u += pos * (below + neg / 2)
        below += neg
        i = j
    return u / (n_pos * n_neg)


def prm_metrics(
    scores: Sequence[Sequence[float | None]], labels: Sequence[Sequence[int]], threshold: float = 0.5
) -> dict[str, float | int | None]:
    """Step accuracy, AUC and first-wrong-step F1 of PRM ``scores`` against step ``labels``
    (module docstring), one list per solution.

    Returns:
        ``steps`` (scored steps), ``steps_unscored``, ``good_frac`` (share of scored steps labelled
        1), ``step_accuracy``, ``auc``, ``solutions``, ``solutions_unscored``, ``acc_erroneous``,
        ``acc_correct``, ``first_wrong_f1`` (None where undefined: no scored step, or a class empty).

    Raises:
        ValueError: ``scores`` and ``labels`` differ in length, or a solution's lists do (names it),
            or a label not in {0, 1}.
    """
    if len(scores) != len(labels):
        raise ValueError(f"prm_metrics: {len(scores)} score lists but {len(labels)} label lists")
    flat_s: list[float] = []
    flat_y: list[int] = []
    unscored, sol_unscored, hit_err, n_err, hit_ok, n_ok = 0, 0, 0, 0, 0, 0
    for i, (s, y) in enumerate(zip(scores, labels)):
        if len(s) != len(y):
            raise ValueError(f"prm_metrics: solution {i} has {len(s)} scores but {len(y)} labels")
        if any(v not in (0, 1) for v in y):
            raise ValueError(f"prm_metrics: solution {i} has a label not in {{0, 1}}: {list(y)}")
        for v, lab in zip(s, y):
            if v is None:
                unscored += 1
            else:
                flat_s.append(float(v))
                flat_y.append(int(lab))
        if not y:
            continue
        if any(v is None for v in s):
            sol_unscored += 1
            continue
        ref, pred = first_wrong_step(y), first_wrong_step([float(v) for v in s if v is not None], threshold)
        if ref < 0:
            n_ok, hit_ok = n_ok + 1, hit_ok + (pred < 0)
        else:
            n_err, hit_err = n_err + 1, hit_err + (pred == ref)
    acc_err = hit_err / n_err if n_err else None
    acc_ok = hit_ok / n_ok if n_ok else None
    f1 = None
    if acc_err is not None and acc_ok is not None:
        f1 = 0.0 if acc_err + acc_ok == 0 else 2 * acc_err * acc_ok / (acc_err + acc_ok)
    n = len(flat_s)
    return {
        "steps": n,
        "steps_unscored": unscored,
        "good_frac": sum(flat_y) / n if n else None,
        "step_accuracy": sum((v >= threshold) == bool(y) for v, y in zip(flat_s, flat_y)) / n if n else None,
        "auc": auc(flat_s, flat_y),
        "solutions": n_err + n_ok,
        "solutions_unscored": sol_unscored,
        "acc_erroneous": acc_err,
        "acc_correct": acc_ok,
        "first_wrong_f1": f1,
    }
