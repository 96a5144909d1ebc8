"""Procedural tasks from ``reasoning_gym`` as prompt rows, and the reward that scores them.

``load_reasoning_gym(task, ...)`` builds ``reasoning_gym.create_dataset(task, size=..., seed=...,
**options)`` and returns rows ``{"prompt": entry["question"], "answer": str(entry["answer"]),
"rg_task": task, "rg_entry": entry}``. The entry (with its ``metadata``) travels with the row so
that :func:`reasoning_gym_score` (registry name ``reasoning_gym``) can score with the task's own
``score_answer(answer, entry)``. Everything runs offline; ``reasoning_gym`` (the optional extra
``grpokit[reasoning-gym]``) is imported lazily, when rows are generated or scored.

Answer extraction for scoring: the last ``<answer>...</answer>`` block, stripped (the rule of
reasoning_gym's own ``extract_answer`` helper, matching its system prompts, computed here in linear
time: its regex takes time quadratic in a run of unclosed ``<answer>`` tags, 25 s on 160k
characters); if there is none, grpokit's math :func:`~grpokit.rewards.math.extract_answer`
(``\\boxed{}``, ``#### x``, ``Answer: x``, last number). Any text is accepted (nothing raises).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any

from grpokit.utils.importing import require

__all__ = ["load_reasoning_gym", "reasoning_gym_score", "extract_rg_answer", "RG_DEFAULT_SIZE"]

RG_DEFAULT_SIZE = 1000
"""Dataset size when ``options`` gives no ``size``."""

log = logging.getLogger(__name__)


def _import_rg(why: str = "reasoning_gym: data") -> Any:
    """``reasoning_gym``, the optional extra ``grpokit[reasoning-gym]`` (ImportError naming it)."""
    return require("reasoning_gym", extra="reasoning-gym", why=why)


def load_reasoning_gym(
    task: str, *, limit: int | None, seed: int, options: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Generate rows of reasoning_gym task ``task``.

    Args:
        task: a registered reasoning_gym dataset name (``basic_arithmetic``, ``chain_sum``, ...).
        limit: keep only the first ``limit`` entries (only those are generated).
        seed: dataset seed (same seed -> same entries).
        options: ``size`` (default :data:`RG_DEFAULT_SIZE`) and any other keyword of the task's
            config, passed to ``create_dataset``.

    Returns:
        Rows with ``prompt``, ``answer``, ``rg_task``, ``rg_entry`` (``basic_arithmetic``: and
        ``solution``, :func:`_add_solutions`).

    Raises:
        ValueError: unknown task (lists the registered ones) or bad options.
        ImportError: reasoning_gym is not installed (the message names ``grpokit[reasoning-gym]``).
    """
    rg = _import_rg(f"dataset 'reasoning_gym:{task}'")
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise ValueError(f"unknown reasoning_gym task {task!r}; registered: {', '.join(sorted(DATASETS))}")
    opts = dict(options or {})
    size = int(opts.pop("size", RG_DEFAULT_SIZE))
    try:
        ds = rg.create_dataset(task, size=size, seed=seed, **opts)
    except TypeError as e:
        raise ValueError(f"reasoning_gym task {task!r}: bad options {opts}: {e}") from e
    n = len(ds) if limit is None else min(limit, len(ds))
    rows = []
    for i in range(n):
        entry = ds[i]
        rows.append(
            {
                "prompt": entry["question"],
                "answer": str(entry["answer"]),
                "rg_task": task,
                "rg_entry": entry,
            }
        )
    if task == "basic_arithmetic":
        _check_arithmetic_answers(rows, opts)
        _add_solutions(rows)
    return rows


def _add_solutions(rows: list[dict[str, Any]]) -> None:
    """Give each ``basic_arithmetic`` row a ``solution`` column: its expression solved one operation
    per line (:func:`grpokit.data.solutions.arithmetic_solution`), for ``sft.completion_template:
    "{solution}"``; None where the expression has ``/`` (reasoning_gym's answer there is not the exact
    quotient) or cannot be solved so."""
    from grpokit.data.solutions import arithmetic_solution

    for row in rows:
        expression = str(row["rg_entry"].get("metadata", {}).get("expression", ""))
        try:
            row["solution"] = None if not expression or "/" in expression else arithmetic_solution(expression)
        except ValueError:
            row["solution"] = None


def _check_arithmetic_answers(rows: list[dict[str, Any]], options: dict[str, Any]) -> None:
    """Refuse ``basic_arithmetic`` rows whose answer is not the value of their expression.

    reasoning_gym (0.1.25) builds an expression without parentheses (``allow_parentheses:
    false``) by folding its terms left to right, so with ``*`` or ``/`` among the operators the
    stored answer ignores operator precedence: ``17 - 30 + 78 * 0`` is given the answer 0, not -13
    (208 of 600 rows with 3-4 terms of ``+ - *``). Every row whose expression has no ``/`` (floor
    division there) is recomputed with the exact calculator; a disagreement raises.

    Raises:
        ValueError: naming how many rows disagree, the first one and the options that avoid it.
    """
    from grpokit.envs.calculator import calculate

    wrong = []
    for i, row in enumerate(rows):
        expression = str(row["rg_entry"].get("metadata", {}).get("expression", ""))
        if not expression or "/" in expression:
            continue
        value = calculate(expression)
        if value != row["answer"]:
            wrong.append((i, expression, value))
    if wrong:
        i, expression, value = wrong[0]
        raise ValueError(
            f"reasoning_gym:basic_arithmetic: {len(wrong)} of {len(rows)} answers are not the value of "
            f"their expression (row {i}: {expression} = {value}, the dataset says "
            f"{rows[i]['answer']}); reasoning_gym computes an expression without parentheses left to "
            f"right, ignoring operator precedence (options {options}); set allow_parentheses: true "
            "(its answers follow precedence) or use only the + and - operators"
        )


@cache
def _scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    return _import_rg("reward 'reasoning_gym'").get_score_answer_fn(task)


def _tagged_answer(text: str, open_tag: str = "<answer>", close_tag: str = "</answer>") -> str | None:
    """The last ``<answer>...</answer>`` block, stripped, or None: what reasoning_gym's
    ``extract_answer`` returns (the last of the non-overlapping matches of
    ``<answer>\\s?(.*?)\\s?</answer>``), found with two ``str.find`` scans."""
    found, pos = None, 0
    while (start := text.find(open_tag, pos)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:  # no later tag can be closed either
            break
        found, pos = text[start + len(open_tag) : end], end + len(close_tag)
    return None if found is None else found.strip()


def extract_rg_answer(completion: str) -> str | None:
    """The answer :func:`reasoning_gym_score` scores: the last ``<answer>...</answer>`` block, else
    :func:`grpokit.rewards.math.extract_answer`'s (``\\boxed{}``, ``#### x``, last number)."""
    from grpokit.rewards.math import extract_answer

    tagged = _tagged_answer(completion)
    return tagged if tagged is not None else extract_answer(completion)


def reasoning_gym_score(
    prompts: list[str],
    completions: list[str],
    *,
    rg_entry: list[dict[str, Any] | None],
    rg_task: list[str | None] | None = None,
    answer: list[Any] | None = None,
    **_: Any,
) -> list[float | None]:
    """Score completions with each reasoning_gym task's own ``score_answer``.

    Args:
        prompts: unused (reward protocol).
        completions: the completions.
        rg_entry: the ``rg_entry`` column from :func:`load_reasoning_gym` (the task entry).
        rg_task: the ``rg_task`` column; the scorer is that of
            ``entry["metadata"]["source_dataset"]`` when present (composite datasets), else this.
        answer: unused (the entry holds the reference).

    Returns:
        The task's score in [0, 1] per completion; 0.0 when no answer can be extracted or the
        task's scorer raises on it; None when the row has no entry or no known task.

    Raises:
        ValueError: columns misaligned with ``completions``.
    """
    n = len(completions)
    tasks = list(rg_task) if rg_task is not None else [None] * n
    if len(rg_entry) != n or len(tasks) != n:
        raise ValueError(f"reasoning_gym_score: {n} completions, {len(rg_entry)} rg_entry, {len(tasks)} rg_task")
    out: list[float | None] = []
    for completion, entry, task in zip(completions, rg_entry, tasks):
        meta = (entry or {}).get("metadata") or {}
        name = meta.get("source_dataset") or task
        if not entry or not name:
            out.append(None)
            continue
        pred = extract_rg_answer(completion or "")
        if pred is None:
            out.append(0.0)
            continue
        scorer = _scorer(name)  # unknown task: ValueError from reasoning_gym
        try:
            out.append(float(scorer(pred, entry)))
        except Exception:  # a model's odd answer must not stop training
            log.debug("reasoning_gym scorer %r failed on %r", name, pred, exc_info=True)
            out.append(0.0)
    return out
