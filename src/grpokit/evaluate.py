"""Held-out accuracy: greedy decoding, answers checked with ``math_correct`` (math-verify)."""

from __future__ import annotations

import time
from typing import Any, Callable

from grpokit.rollout.hf import SamplingParams, generate_rollouts


def evaluate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    rows: list[dict],
    *,
    eos_token_ids: list[int],
    max_new_tokens: int,
    batch_size: int = 16,
    scorer: Callable | None = None,
) -> dict[str, Any]:
    """Greedy-decode each prompt once and score it; returns accuracy and counts.

    Args:
        prompts: ``B`` chat-templated prompts; rows: the matching data rows (``answer`` etc.).
        scorer: a reward function (default ``math_correct``); a completion is correct when it
            scores >= 1.

    Returns:
        ``{"accuracy", "correct", "total", "truncated_frac", "seconds", "samples"}`` (the first
        five completions with their scores in ``samples``).
    """
    if scorer is None:
        from grpokit.rewards.math import math_correct as scorer
    t0 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    correct, truncated, samples = 0, 0, []
    for start in range(0, len(prompts), batch_size):
        chunk_rows = rows[start : start + batch_size]
        ro = generate_rollouts(model, tokenizer, prompts[start : start + batch_size], 1, params,
                               eos_token_ids=eos_token_ids)
        cols = {k: [r.get(k) for r in chunk_rows] for k in chunk_rows[0] if k != "prompt"}
        scores = scorer([r["prompt"] for r in chunk_rows], ro.completions, **cols)
        for r, c, sc in zip(chunk_rows, ro.completions, scores):
            ok = sc is not None and sc >= 1.0
            correct += ok
            if len(samples) < 5:
                samples.append({"question": r["prompt"], "answer": r["answer"], "completion": c, "correct": ok})
        truncated += int(ro.truncated.sum())
    total = len(prompts)
    return {
        "accuracy": correct / total if total else 0.0, "correct": correct, "total": total,
        "truncated_frac": truncated / total if total else 0.0,
        "seconds": time.perf_counter() - t0, "samples": samples,
    }
