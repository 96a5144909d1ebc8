"""Automatic step labels (Math-Shepherd, Wang et al. 2023, arXiv 2312.08935, §3.3): label each reasoning
step of a policy's own solutions by whether completions sampled from the solution up to that step
still reach the answer.

For problem ``b`` (formatted prompt ``prompts[b]``, data row ``rows[b]``), :func:`label_steps`:

1. samples ``K = samples_per_problem`` solutions through a rollout engine (the seam
   ``generate(prompts, group_size, sampling, seed, first_prompt=0) -> Experience`` of
   ``grpokit.rollout.engine``, passed in: layer 5 does not import layer 4);
2. cuts solution ``g`` into steps ``s_1 … s_S`` (:func:`~grpokit.process.steps.split_steps`; they
   concatenate back to the solution);
3. for each step ``k < S`` samples ``R = rollouts_per_step`` continuations ``c_{k,r}`` of the prompt
   text followed by ``s_1 … s_k`` (as text: the engine tokenizes it anew) and judges ``s_1 … s_k c_{k,r}``;
4. ``soft_k = #{r : judge >= threshold} / R`` (the paper's soft estimation) and ``hard_k = 1`` if
   ``soft_k > 0`` else 0 (hard estimation: some continuation reaches the answer). The last step is
   labelled by the solution's own outcome, ``hard_S = soft_S = [judge(solution) >= threshold]``, and
   nothing is sampled after it. A judge value of None (cannot score) counts as not reaching it.

An empty solution (no step) gets a record with no steps, so a problem's records always number ``K``
(what :func:`read_labels` checks to resume); a truncated solution is labelled as written.

Seeding: solution ``(b, g)`` is row ``(b, g)`` of ``generate(prompts, K, sampling, seed,
first_prompt=first_problem)``, drawn from ``request_seed(seed, first_problem + b, g)``. The prefix
continuations of problem ``p`` are one ``generate`` call over its prefixes in (sample, step) order,
with seed :func:`prefix_seed` ``(seed, p)`` and ``first_prompt=0``: rollout ``r`` of its ``j``-th prefix
draws from ``request_seed(prefix_seed(seed, p), j, r)``. Not one call over the whole batch: the seam
numbers a call's prompts consecutively, and a batch-wide number of a prefix would depend on how many
steps the earlier problems' solutions have, i.e. on where the batch starts; ``j`` depends on problem
``p``'s own solutions only. So a problem's labels are the same alone, in any batch, or after a resume
(for engines whose rows draw from ``request_seed`` alone; not the hf engine's ``multinomial`` sampler).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.process.steps import split_steps, step_texts
from grpokit.rewards.calling import RewardCall

if TYPE_CHECKING:
    from grpokit.experience import Experience

__all__ = ["LabelFile", "StepLabels", "TokenCount", "append_labels", "label_steps", "prefix_seed", "read_labels"]


@dataclass(frozen=True)
class StepLabels:
    """The labels of one solution: sample ``sample`` of problem ``problem`` (one JSON line).

    ``steps`` are the solution's step texts (they concatenate to it); ``hard[k]`` in {0, 1} and
    ``soft[k]`` in [0, 1] label step ``k`` (module docstring). ``question`` is the row's ``prompt``
    column, ``prompt`` the formatted prompt the policy saw, ``answer`` the row's ``answer`` (or None).
    The rest is provenance: how the labels were made (``policy``: the name of the model sampled, None
    where not given).
    """

    problem: int
    sample: int
    question: Any
    prompt: str
    answer: Any
    steps: list[str]
    hard: list[int]
    soft: list[float]
    truncated: bool
    samples_per_problem: int
    rollouts_per_step: int
    seed: int
    step_rule: str
    threshold: float
    policy: str | None = None

    def to_json(self) -> str:
        """One line of JSON (no newline), non-ASCII kept as is."""
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> StepLabels:
        """The record :meth:`to_json` wrote.

        Raises:
            ValueError: not a JSON object, or a field missing or unknown (named).
        """
        d = json.loads(line)
        if not isinstance(d, dict):
            raise ValueError(f"StepLabels.from_json: expected a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        optional = {"policy"}  # not in the first files written
        if not (names - optional <= set(d) <= names):
            missing, unknown = sorted(names - optional - set(d)), sorted(set(d) - names)
            raise ValueError(f"StepLabels.from_json: missing field(s) {missing}, unknown {unknown}")
        return cls(**d)


def prefix_seed(seed: int, problem: int) -> int:
    """The ``seed`` of the one ``generate`` call that samples problem ``problem``'s prefix
    continuations: a 63-bit hash of both numbers, apart from the solutions' own stream.

    >>> prefix_seed(7, 3) == prefix_seed(7, 3) != prefix_seed(7, 4)
    True
    """
    digest = hashlib.blake2b(f"grpokit:step-labels:{int(seed)}:{int(problem)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _judge(judge: Callable, prompts: list[Any], texts: list[str], columns: dict[str, list]) -> list[float | None]:
    """``judge`` on every text in one call (its reward call form), checked: one number or None each."""
    name = str(getattr(judge, "name", None) or getattr(judge, "__name__", None) or type(judge).__name__)
    out = RewardCall(judge, name)(prompts, texts, **columns)
    if not isinstance(out, (list, tuple)) or len(out) != len(texts):
        got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
        raise ValueError(f"label_steps: judge {name!r} returned {got} for {len(texts)} texts")
    for i, v in enumerate(out):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise ValueError(f"label_steps: judge {name!r} returned {v!r} at index {i}; expected a float or None")
    return list(out)


def _check(
    prompts: Any, rows: Any, samples_per_problem: Any, rollouts_per_step: Any, threshold: Any, first: Any
) -> None:
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("label_steps: prompts must be a non-empty list of non-empty strings")
    if not isinstance(rows, list) or len(rows) != len(prompts) or not all(isinstance(r, dict) for r in rows):
        n = len(rows) if isinstance(rows, list) else type(rows).__name__
        raise ValueError(f"label_steps: rows must be a list of {len(prompts)} dicts (one per prompt), got {n}")
    for name, v, low in [
        ("samples_per_problem", samples_per_problem, 1),
        ("rollouts_per_step", rollouts_per_step, 1),
        ("first_problem", first, 0),
    ]:
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"label_steps: {name} must be an int >= {low}, got {v!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not math.isfinite(threshold):
        raise ValueError(f"label_steps: threshold must be a finite number, got {threshold!r}")


def label_steps(
    engine: Any,
    prompts: list[str],
    rows: list[dict[str, Any]],
    *,
    judge: Callable[..., list[float | None]],
    samples_per_problem: int,
    rollouts_per_step: int,
    sampling: Any,
    seed: int,
    step_rule: str = "lines",
    threshold: float = 1.0,
    first_problem: int = 0,
    policy: str | None = None,
) -> list[StepLabels]:
    """Label the steps of ``samples_per_problem`` sampled solutions of each prompt (module docstring).

    Args:
        engine: a single-turn rollout engine (``generate`` as in ``grpokit.rollout.engine.RolloutEngine``).
        prompts: ``B`` formatted prompts; problem ``b`` is problem ``first_problem + b`` of the data.
        rows: the ``B`` data rows; every column but ``prompt`` goes to the judge as a keyword (a list
            per column, one value per judged text), as the reward pipeline calls reward functions.
        judge: an outcome reward in either reward call form (``f(prompts, completions, **columns)``
            or TRL's ``f(completions, **kwargs)``), e.g. ``grpokit.rewards.math.math_correct``;
            called once per batch on every judged text (solutions and prefix + continuation).
        samples_per_problem: ``K`` solutions per problem.
        rollouts_per_step: ``R`` continuations per prefix.
        sampling: the engine's ``SamplingParams``, for solutions and continuations alike.
        seed: the labelling seed (module docstring, "Seeding").
        step_rule: a :func:`~grpokit.process.steps.split_steps` rule.
        threshold: a judged text reaches the answer when its value is ``>= threshold``.
        first_problem: the data index of ``prompts[0]`` (a batch of a longer run).
        policy: the name of the policy that ``engine`` samples from, kept in each record.

    Returns:
        ``B·K`` records, problem-major (``problem = first_problem + b``, ``sample = g``).

    Raises:
        ValueError: a bad argument (named): empty ``prompts``, ``rows`` not one dict per prompt,
            ``samples_per_problem``/``rollouts_per_step`` < 1, ``first_problem`` < 0, a non-finite
            ``threshold``, an unknown ``step_rule``; a multi-turn engine (``wants_rows``); an engine
            returning the wrong number of completions; a judge returning the wrong number of values
            or a non-number (named).
    """
    _check(prompts, rows, samples_per_problem, rollouts_per_step, threshold, first_problem)
    split_steps("x", step_rule)  # an unknown rule fails before anything is sampled
    if getattr(engine, "wants_rows", False):
        raise ValueError("label_steps: engine is multi-turn (wants_rows); step labels need a single-turn engine")
    K, R = samples_per_problem, rollouts_per_step
    solutions = _generate(engine, prompts, K, sampling, seed, first_problem)
    truncated = [False] * len(solutions.completions) if solutions.truncated is None else solutions.truncated.tolist()
    steps = [step_texts(t, split_steps(t, step_rule)) for t in solutions.completions]  # (B·K) lists

    # judged texts: every solution, then every rollout; each with the index of its problem
    texts, owner = list(solutions.completions), [i // K for i in range(len(solutions.completions))]
    for b in range(len(prompts)):
        prefixes = ["".join(s[: k + 1]) for s in steps[b * K : (b + 1) * K] for k in range(len(s) - 1)]
        if prefixes:
            ro = _generate(
                engine, [prompts[b] + x for x in prefixes], R, sampling, prefix_seed(seed, first_problem + b)
            )
            texts += [prefixes[j // R] + c for j, c in enumerate(ro.completions)]
            owner += [b] * len(ro.completions)
    columns = sorted({k for r in rows for k in r} - {"prompt"})
    questions = [rows[b].get("prompt", prompts[b]) for b in owner]
    values = _judge(judge, questions, texts, {k: [rows[b].get(k) for b in owner] for k in columns})
    reached = [v is not None and v >= threshold for v in values]

    records, at = [], len(solutions.completions)  # `at`: the next prefix's first rollout in `reached`
    for i, s in enumerate(steps):
        b, g = divmod(i, K)
        soft = []
        for _ in range(len(s) - 1):
            soft.append(sum(reached[at : at + R]) / R)
            at += R
        if s:
            soft.append(float(reached[i]))  # the last step: the solution's own outcome
        records.append(
            StepLabels(
                problem=first_problem + b,
                sample=g,
                question=rows[b].get("prompt"),
                prompt=prompts[b],
                answer=rows[b].get("answer"),
                steps=s,
                hard=[int(x > 0) for x in soft],
                soft=soft,
                truncated=bool(truncated[i]),
                samples_per_problem=K,
                rollouts_per_step=R,
                seed=seed,
                step_rule=step_rule,
                threshold=float(threshold),
                policy=policy,
            )
        )
    return records


class TokenCount:
    """A rollout engine that counts what it generates: ``tokens`` is the sum of the completion tokens
    (``completion_mask``) of every ``generate`` call so far; every other attribute is the engine's.
    What labelling costs, in the unit a user pays (``grpokit prm label``'s ``tokens``, iterative RL's
    ``prm_label_tokens``).

    >>> class E:
    ...     def generate(self, prompts, group_size, sampling, seed, first_prompt=0):
    ...         import torch
    ...         from types import SimpleNamespace
    ...         return SimpleNamespace(completion_mask=torch.ones(len(prompts) * group_size, 3, dtype=torch.bool))
    >>> e = TokenCount(E()); _ = e.generate(["a", "b"], 2, None, 0); e.tokens
    12
    """

    def __init__(self, engine: Any):
        self.engine, self.tokens = engine, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, *args: Any, **kwargs: Any) -> Experience:
        exp = self.engine.generate(*args, **kwargs)
        self.tokens += int(exp.completion_mask.sum())
        return exp


def _generate(engine: Any, prompts: list[str], group: int, sampling: Any, seed: int, first: int = 0) -> Experience:
    exp = engine.generate(prompts, group, sampling, seed, first_prompt=first)
    if len(exp.completions) != len(prompts) * group:
        raise ValueError(
            f"label_steps: engine returned {len(exp.completions)} completions for {len(prompts)} prompts × {group}"
        )
    return exp


@dataclass
class LabelFile:
    """What :func:`read_labels` found: ``records`` (the last line of each ``(problem, sample)``),
    ``complete`` (problems with all ``samples_per_problem`` samples: skip them on resume),
    ``partial`` (1 if the file ended in a line without its newline, ignored; else 0) and
    ``replaced`` (earlier lines of a ``(problem, sample)`` written again, e.g. after a resume)."""

    records: list[StepLabels]
    complete: set[int]
    partial: int
    replaced: int


def append_labels(path: str | Path, records: Iterable[StepLabels]) -> int:
    """Append ``records`` to the JSON-lines file ``path`` (created if absent), one line each, then
    flush and fsync, so that lines written before a crash are on disk. A final line without its
    newline (a write cut short) is cut off first, so new lines never join it. Returns the lines written."""
    lines = "".join(r.to_json() + "\n" for r in records).encode()
    with open(path, "ab+") as f:
        _cut_partial_line(f)
        f.write(lines)
        f.flush()
        os.fsync(f.fileno())
    return lines.count(b"\n")


def _cut_partial_line(f: Any) -> None:
    """Truncate the binary file ``f`` after its last newline (nothing if it ends with one, or is empty)."""
    end = pos = f.seek(0, os.SEEK_END)
    while pos > 0:
        start = max(0, pos - 65536)
        f.seek(start)
        nl = f.read(pos - start).rfind(b"\n")
        if nl >= 0:
            pos = start + nl + 1
            break
        pos = start
    if pos != end:
        f.truncate(pos)


def read_labels(path: str | Path) -> LabelFile:
    """The records of the JSON-lines file ``path`` (empty if it does not exist), to resume a run.

    A final line without its newline is a write cut short: it is ignored and counted in
    ``partial``. A problem is complete when its records hold every sample ``0 … K-1``
    (``K = samples_per_problem`` of its records).

    Raises:
        ValueError: a line before the last that is not a record (names the line number), or
            records of one problem that disagree on ``samples_per_problem``.
    """
    p = Path(path)
    if not p.exists():
        return LabelFile([], set(), 0, 0)
    lines = p.read_bytes().split(b"\n")  # bytes: a cut-short line may end inside a UTF-8 character
    partial = int(lines[-1] != b"")  # what follows the last newline: a cut-short line, or nothing
    by_key: dict[tuple[int, int], StepLabels] = {}
    replaced = 0
    for n, line in enumerate(lines[:-1], start=1):
        try:
            r = StepLabels.from_json(line.decode("utf-8"))
        except (ValueError, TypeError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise ValueError(f"read_labels: {p}: line {n} is not a StepLabels record: {e}") from e
        replaced += (r.problem, r.sample) in by_key
        by_key[(r.problem, r.sample)] = r
    samples: dict[tuple[int, int], set[int]] = {}  # (problem, K) -> its samples
    for r in by_key.values():
        samples.setdefault((r.problem, r.samples_per_problem), set()).add(r.sample)
    if len({q for q, _ in samples}) != len(samples):
        raise ValueError(f"read_labels: {p}: records of one problem disagree on samples_per_problem")
    complete = {q for (q, k), got in samples.items() if got >= set(range(k))}
    return LabelFile(list(by_key.values()), complete, partial, replaced)
