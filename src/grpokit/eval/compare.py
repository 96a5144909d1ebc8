"""What ``grpokit eval --against`` reports: two models' :func:`grpokit.eval.evaluate.evaluate` results
on the same problems, paired (:mod:`grpokit.eval.stats`), as JSON entries and printed lines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpokit.eval.stats import paired_comparison, paired_sampled_comparison


def compare(
    a: Mapping[str, Any], b: Mapping[str, Any], name_a: str, name_b: str, samples: int
) -> tuple[dict, list[str]]:
    """``b`` − ``a`` on the same problems: greedy accuracy by the exact McNemar test, and with
    ``samples`` = k > 0 also mean@k (exact sign test over problems) and maj@k (McNemar).

    Returns ``({"paired": ..., "paired_sampled": {"mean@k": ..., "maj@k": ...}}, lines)``: the
    :func:`~grpokit.eval.stats.paired_comparison` / :func:`~grpokit.eval.stats.paired_sampled_comparison`
    results for the output JSON (``paired_sampled`` only with samples) and one printed line each.
    Raises what those raise on outcomes of different lengths."""
    pc = paired_comparison(a["outcomes"], b["outcomes"])
    out: dict[str, Any] = {"paired": pc}
    lines = [_paired_line(name_b, name_a, "greedy", pc)]
    if samples:
        ms = paired_sampled_comparison(a["sampled_correct"], b["sampled_correct"], samples)
        mj = paired_comparison(a["maj_outcomes"], b["maj_outcomes"])
        lines.append(
            f"paired ({name_b} - {name_a}), mean@{samples}: {ms['diff']:+.3f} [{ms['diff_lo']:+.3f}, "
            f"{ms['diff_hi']:+.3f}] (95 %, {ms['interval']}); problems where the second is better "
            f"{ms['b_better']}, the first {ms['a_better']}; exact sign test p = {ms['p_value']:.3g}"
        )
        lines.append(_paired_line(name_b, name_a, f"maj@{samples}", mj))
        out["paired_sampled"] = {f"mean@{samples}": ms, f"maj@{samples}": mj}
    return out, lines


def _paired_line(name_b: str, name_a: str, metric: str, pc: dict) -> str:
    """One printed line of a :func:`grpokit.eval.stats.paired_comparison` result ``pc`` for ``metric``."""
    return (
        f"paired ({name_b} - {name_a}), {metric}: {pc['diff']:+.3f} [{pc['diff_lo']:+.3f}, {pc['diff_hi']:+.3f}] "
        f"(95 %, {pc['interval']}); only the second right {pc['b_only']}, only the first {pc['a_only']}; "
        f"exact McNemar p = {pc['p_value']:.3g}"
    )
