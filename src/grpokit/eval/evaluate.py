"""Held-out evaluation: greedy accuracy, and over k samples per problem mean@k, pass@k and maj@k,
each with a 95 % interval (:mod:`grpokit.eval.stats`); per-problem outcomes for paired comparisons.

The scorer follows the data (:func:`grpokit.data.heldout.default_scorer`): reasoning_gym rows are scored by their
generator's own ``score_answer``, everything else by ``math_correct``; a completion is correct
when it scores >= 1. Scoring runs under :class:`grpokit.rewards.guard.GuardedReward` (a worker
process killed at the time limit): a completion it cannot score counts as wrong and is counted.

During a run, :class:`HeldOutEval` keeps the eval section's rows apart from the training rows,
builds their prompts and runs :func:`evaluate` on the current model through a rollout engine (the
run's ``eval_engine``, :class:`grpokit.trainer.build.Run`); :func:`save_eval` writes
``eval_<when>.json``. It is built in two stages by :func:`grpokit.trainer.build.build_run`, so that
bad input fails before anything slow loads: :class:`HeldOutEval` (rows and scorer, no tokenizer),
then :meth:`HeldOutEval.prepare` (prompts, once the tokenizer and the model's context length are
known).

:func:`evaluate` returns an :class:`EvalResult` (read as a mapping too: ``res["accuracy"]``);
``eval_<when>.json`` holds its :meth:`EvalResult.to_dict`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.data import dataset_label
from grpokit.rollout.engine import RolloutEngine, SamplingParams, rows_for
from grpokit.utils.records import KeyedRecord

if TYPE_CHECKING:
    from grpokit.config import Recipe


def _score(
    guard: Callable[..., list[float | None]], rows: list[dict], completions: list[str], per_row: int
) -> tuple[list[bool], int]:
    """Correctness of ``completions`` (``per_row`` consecutive ones per row), and how many the scorer
    gave no score (None: it raised, timed out, or could not read the reference)."""
    expanded = [r for r in rows for _ in range(per_row)]
    cols = {k: [r.get(k) for r in expanded] for k in rows[0] if k != "prompt"}
    scores = guard([r["prompt"] for r in expanded], completions, **cols)
    return [s is not None and s >= 1.0 for s in scores], sum(s is None for s in scores)


@dataclass
class _Tally:
    """What :func:`evaluate`'s passes gather: per problem, greedy correct or not; per problem, the k
    samples' correctness and answers; the greedy completions cut at ``max_new_tokens``, the first
    five examples, and the completions the scorer gave no score."""

    greedy: list[bool] = field(default_factory=list)
    sampled: list[list[bool]] = field(default_factory=list)
    answers: list[list[str | None]] = field(default_factory=list)
    truncated: int = 0
    unscorable: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)


def _greedy_pass(
    engine: RolloutEngine,
    guard: Callable[..., list[float | None]],
    prompts: list[str],
    rows: list[dict],
    tally: _Tally,
    *,
    batch_size: int,
    max_new_tokens: int,
    seed: int,
) -> None:
    """Each prompt once, greedy, ``batch_size`` per call; into ``tally``."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    for start in range(0, len(prompts), batch_size):
        chunk_rows, chunk = rows[start : start + batch_size], prompts[start : start + batch_size]
        # greedy draws no random numbers: the seed changes nothing (the engine needs one)
        ro = engine.generate(chunk, 1, params, seed * 100003 + start, **rows_for(engine, chunk_rows))
        assert ro.truncated is not None  # every engine's generate sets it
        ok, none = _score(guard, chunk_rows, ro.completions, 1)
        tally.greedy += ok
        tally.unscorable += none
        tally.truncated += int(ro.truncated.sum())
        tally.examples += [
            {
                "question": r["prompt"],
                "prompt": p,
                "answer": r.get("answer"),
                "completion": c,
                "correct": o,
                "truncated": bool(t),
            }
            for r, p, c, o, t in zip(chunk_rows, chunk, ro.completions, ok, ro.truncated.tolist())
        ][: max(0, 5 - len(tally.examples))]


def _sampled_pass(
    engine: RolloutEngine,
    guard: Callable[..., list[float | None]],
    prompts: list[str],
    rows: list[dict],
    tally: _Tally,
    extract_answer: Callable[[str], str | None],
    *,
    per_call: int,
    k: int,
    params: SamplingParams,
    seed: int,
) -> None:
    """``k`` samples per prompt, ``per_call`` prompts per call; into ``tally``."""
    for start in range(0, len(prompts), per_call):
        chunk_rows, chunk = rows[start : start + per_call], prompts[start : start + per_call]
        ro = engine.generate(chunk, k, params, seed * 100003 + start, **rows_for(engine, chunk_rows))
        ok, none = _score(guard, chunk_rows, ro.completions, k)
        tally.unscorable += none
        for i in range(len(chunk)):
            tally.sampled.append(ok[i * k : (i + 1) * k])
            tally.answers.append([extract_answer(c) for c in ro.completions[i * k : (i + 1) * k]])


#: the keys every result has, in order
_CORE_KEYS = (
    "accuracy",
    "correct",
    "total",
    "unscorable",
    "truncated_frac",
    "seconds",
    "examples",
    "outcomes",
    "metrics",
    "settings",
)
#: the keys of a held-out evaluation (:meth:`HeldOutEval.run`), in the order its result gives them
_HELD_OUT_KEYS = ("dataset", "split", "when", "scorer", "held_out")


@dataclass(eq=False)
class EvalResult(KeyedRecord):
    """What :func:`evaluate` returns (and :meth:`HeldOutEval.run`, with the held-out fields set).

    Read as a mapping of its keys too (``res["accuracy"]``, ``"maj_outcomes" in res``, ``dict(res)``):
    the fields below that are present, in this order; :meth:`to_dict` is what ``eval_<when>.json``
    holds. ``sampled_correct`` and ``maj_outcomes`` are present with samples; ``dataset``, ``split``,
    ``when``, ``scorer`` and ``held_out`` together, once ``when`` is set; ``model`` once set.

    Attributes:
        accuracy: greedy accuracy, ``correct / total`` (0.0 with no problem).
        correct: problems whose greedy completion is correct.
        total: problems evaluated.
        unscorable: completions (greedy and sampled) the scorer gave no score (counted wrong).
        truncated_frac: the fraction of greedy completions that reached ``max_new_tokens`` without EOS.
        seconds: wall-clock seconds of the evaluation.
        examples: the first five greedy completions (``question``, ``prompt``, ``answer``,
            ``completion``, ``correct``, ``truncated``).
        outcomes: per problem, greedy correct or not.
        metrics: :func:`grpokit.eval.stats.summarize`'s result (``n_problems``, ``k``, ``confidence``,
            ``metrics``: each metric's ``value``, ``lo``, ``hi``, ``interval``); None with no problem.
        settings: what decides the numbers (``max_new_tokens``, ``greedy``, ``num_samples``,
            ``temperature``, ``seed``, ``scorer``, ``scorer_timeout_s``; a held-out run's prompt
            settings and ``batch_size`` too).
        sampled_correct: per problem, how many of the k samples were correct (with samples).
        maj_outcomes: per problem, maj@k right or not (with samples).
        dataset, split: the held-out data; when: ``before``, ``after``, ``step<k>``, ``api``...;
        scorer: the held-out scorer's name; held_out: how the held-out rows were chosen (a sentence).
        model: the model evaluated (:meth:`grpokit.api.Trainer.evaluate`).
    """

    accuracy: float
    correct: int
    total: int
    unscorable: int
    truncated_frac: float
    seconds: float
    examples: list[dict[str, Any]]
    outcomes: list[bool]
    metrics: dict[str, Any] | None
    settings: dict[str, Any]
    sampled_correct: list[int] | None = None
    maj_outcomes: list[bool] | None = None
    dataset: str | None = None
    split: str | None = None
    when: str | None = None
    scorer: str | None = None
    held_out: str | None = None
    model: str | None = None

    @property
    def metric_intervals(self) -> dict[str, dict[str, Any]]:
        """Each metric's ``value``, ``lo``, ``hi`` and ``interval`` by name (``greedy``, ``mean@k``,
        ``pass@j``, ``maj@k``): ``metrics["metrics"]``, {} when there is none."""
        return dict((self.metrics or {}).get("metrics") or {})

    def _present(self) -> list[str]:
        keys = list(_CORE_KEYS)
        if self.sampled_correct is not None:
            keys.append("sampled_correct")
        if self.maj_outcomes is not None:
            keys.append("maj_outcomes")
        if self.when is not None:
            keys += _HELD_OUT_KEYS
        return keys + (["model"] if self.model is not None else [])

    def to_dict(self) -> dict[str, Any]:
        """The keys present (the class docstring), in order, with their values: what
        ``eval_<when>.json`` holds (``json.dumps(..., indent=1)``)."""
        return super().to_dict()


def evaluate(
    engine: RolloutEngine,
    prompts: list[str],
    rows: list[dict],
    *,
    max_new_tokens: int,
    batch_size: int = 16,
    scorer: Callable | None = None,
    scorer_timeout_s: float = 10.0,
    isolation: str = "process",
    num_samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    extract_answer: Callable[[str], str | None] | None = None,
) -> EvalResult:
    """Greedy-decode each prompt once (and sample ``num_samples`` more) and score them.

    Args:
        engine: generates the completions (:class:`~grpokit.rollout.engine.RolloutEngine`, e.g. the
            run's ``eval_engine``, or ``load_engine("hf", model=..., tokenizer=..., eos_token_ids=...)``):
            greedy with ``SamplingParams(temperature=0)`` over ``batch_size`` prompts per call,
            samples at ``temperature`` over ``batch_size // num_samples`` prompts per call.
        prompts: ``B`` formatted prompts; rows: the matching data rows (``answer`` etc.).
        scorer: a reward function (default ``math_correct``); correct = score >= 1. It runs under
            ``GuardedReward`` with ``scorer_timeout_s`` and ``isolation``.
        num_samples: k >= 1 adds mean@k, pass@j (j = 1, 2, 4, … k) and maj@k from k completions
            per problem sampled at ``temperature`` (seeded with ``seed``); 0 = greedy only.
        extract_answer: reads a completion's final answer for maj@k's votes (default
            :func:`grpokit.rewards.math.extract_answer`; use the scorer's own reader,
            :func:`grpokit.data.heldout.answer_extractor`).

    Returns:
        an :class:`EvalResult`: ``accuracy``, ``correct``, ``total``, ``unscorable`` (completions,
        greedy and sampled, the scorer gave no score: counted wrong), ``truncated_frac`` (greedy
        completions that reached ``max_new_tokens`` without an EOS: an answer cut off there is scored
        as it stands, usually wrong; :func:`measured_little`),
        ``seconds``, ``examples`` (the first five greedy completions: the row's ``question``, the
        ``prompt`` the model was given, ``completion``, ``correct``, ``truncated``), ``settings``
        (what decides the numbers: ``max_new_tokens``, ``num_samples`` and, with samples,
        ``temperature`` and ``seed``, the scorer), ``outcomes`` (per problem,
        greedy correct or not, for :func:`grpokit.eval.stats.paired_comparison`) and ``metrics``
        (:func:`grpokit.eval.stats.summarize`: each metric's value and 95 % interval); with samples
        also ``sampled_correct`` (per problem, how many of the k samples were correct, for
        :func:`grpokit.eval.stats.paired_sampled_comparison`) and ``maj_outcomes`` (per problem,
        maj@k right or not).

    Raises:
        ValueError: ``num_samples < 0``, ``temperature <= 0`` with samples, rows/prompts mismatch.
    """
    from grpokit.eval import stats as evalstats
    from grpokit.rewards.guard import GuardedReward

    if extract_answer is None:
        from grpokit.rewards.math import extract_answer as math_extract_answer

        extract_answer = math_extract_answer

    if num_samples < 0 or (num_samples and temperature <= 0):
        raise ValueError(
            f"evaluate: num_samples must be >= 0 and temperature > 0 with samples, got "
            f"num_samples={num_samples}, temperature={temperature}"
        )
    if len(prompts) != len(rows):
        raise ValueError(f"evaluate: {len(prompts)} prompts for {len(rows)} rows")
    if scorer is None:
        from grpokit.rewards.math import math_correct

        scorer = math_correct
    name = getattr(scorer, "__name__", type(scorer).__name__)
    guard = GuardedReward(f"eval:{name}", scorer, timeout_s=scorer_timeout_s, on_error="none", isolation=isolation)
    t0 = time.perf_counter()
    tally = _Tally()
    try:
        _greedy_pass(
            engine, guard, prompts, rows, tally, batch_size=batch_size, max_new_tokens=max_new_tokens, seed=seed
        )
        if num_samples:
            params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
            per_call = max(1, batch_size // num_samples)
            _sampled_pass(
                engine,
                guard,
                prompts,
                rows,
                tally,
                extract_answer,
                per_call=per_call,
                k=num_samples,
                params=params,
                seed=seed,
            )
    finally:
        guard.close()
    total, greedy, sampled, answers = len(prompts), tally.greedy, tally.sampled, tally.answers
    summary = evalstats.summarize(greedy, sampled or None, answers or None) if total else None
    return EvalResult(
        accuracy=sum(greedy) / total if total else 0.0,
        correct=sum(greedy),
        total=total,
        unscorable=tally.unscorable,
        truncated_frac=tally.truncated / total if total else 0.0,
        seconds=time.perf_counter() - t0,
        examples=tally.examples,
        outcomes=greedy,
        metrics=summary,
        settings={
            "max_new_tokens": max_new_tokens,
            "greedy": True,
            "num_samples": num_samples,
            "temperature": temperature if num_samples else None,
            "seed": seed if num_samples else None,
            "scorer": name,
            "scorer_timeout_s": scorer_timeout_s,
        },
        sampled_correct=[sum(x) for x in sampled] if sampled else None,
        maj_outcomes=[evalstats.maj_at_k(ans, x) for ans, x in zip(answers, sampled)] if sampled else None,
    )


def measured_little(res: Mapping[str, Any], *, budget: str) -> list[str]:
    """What makes an :func:`evaluate` result ``res`` measure less than it seems, one sentence each
    (empty when nothing): at least :data:`grpokit.metrics.TRUNCATED_WARN_FRAC` of the greedy
    completions cut at the token budget (an answer cut off there is scored as it stands, usually
    wrong), completions the scorer could not score. ``budget``: how the token budget was set, e.g.
    ``"--max-new-tokens=256"`` or ``"eval.max_new_tokens=64"``. The run's evaluations warn with them
    (``RunWarning``), ``grpokit eval`` prints them."""
    from grpokit.metrics import TRUNCATED_WARN_FRAC

    said = []
    if res["truncated_frac"] >= TRUNCATED_WARN_FRAC:
        said.append(
            f"{res['truncated_frac']:.0%} of the greedy completions reached {budget} without an EOS: "
            "an answer cut off there is scored as it stands, usually wrong"
        )
    if res.get("unscorable"):
        said.append(
            f"the scorer gave no score (raised, timed out, or could not read the reference) for "
            f"{res['unscorable']} completions (counted as wrong)"
        )
    return said


def prompt_settings(data: Any, tokenizer: Any, too_long: int | None) -> dict[str, Any]:
    """How an evaluation's prompts were made, for its record: the recipe's ``data`` section's
    ``prompt_template``, ``system_prompt`` and ``max_prompt_tokens``, whether the tokenizer's chat
    template was applied (``chat_template``: False means plain text), and ``prompts_too_long``
    (prompts left out as too long for ``max_prompt_tokens`` or the context)."""
    return {
        "prompt_template": data.prompt_template,
        "system_prompt": data.system_prompt,
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "max_prompt_tokens": data.max_prompt_tokens,
        "prompts_too_long": too_long,
    }


def default_output_name(dataset: str, split: str) -> str:
    """``grpokit eval``'s default output file, ``eval_<dataset>_<split>.json`` in the working
    folder: a data file's name without its folders and suffix, every character that is not a
    letter, digit, ``.``, ``-`` or ``_`` written as ``_``.

    >>> default_output_name("data/qa.jsonl", "test"), default_output_name("reasoning_gym:chain_sum", "train")
    ('eval_qa_test.json', 'eval_reasoning_gym_chain_sum_train.json')
    """
    import re

    path = Path(dataset)
    name = path.stem if path.suffix in (".jsonl", ".json", ".csv", ".parquet") else path.name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"eval_{name}_{split}") + ".json"


class HeldOutEval:
    """The recipe's ``eval`` section applied to ``train_rows``' run.

    Raises:
        ValueError: a held-out range that overlaps the training rows
            (:func:`grpokit.data.heldout.check_ranges`), an unknown ``eval.scorer`` or one that
            cannot score the data, or no held-out row left once training questions are left out.
    """

    def __init__(self, recipe: Recipe, train_rows: list[dict]):
        from grpokit.data import heldout
        from grpokit.data.rows import section_rows
        from grpokit.rewards import get_reward_function

        self.recipe, e = recipe, recipe.eval
        if e.dataset is None:
            raise ValueError(
                "eval.dataset: not set; the held-out problems are eval.dataset's (the recipe's eval section)"
            )
        heldout.check_ranges(recipe)
        self.dataset: str = e.dataset
        self.scorer = e.scorer or heldout.default_scorer(e.dataset)
        try:
            heldout.check_scorer(self.scorer, e.dataset)
            self.scorer_fn = get_reward_function(self.scorer)  # a bad name fails before any model loads
        except ValueError as err:
            raise ValueError(f"eval.scorer: {err}") from None
        rows, dropped = heldout.drop_training_questions(train_rows, section_rows(recipe, "eval"))
        if not rows:
            raise ValueError(
                f"eval: every held-out problem of {dataset_label(e.dataset, e.split)} is also a training question"
            )
        self.rows = rows
        # set by prepare, with the prompts
        self.prompts: list[str] | None = None
        self.tokenizer: Any = None
        self.too_long: int | None = None
        self.note = (
            f"{len(rows)} held-out problems, none a training question ({dropped} left out as "
            f"training questions; data seed {heldout.eval_seed(recipe)})"
        )

    @property
    def max_new_tokens(self) -> int:
        return self.recipe.eval.max_new_tokens or self.recipe.rollout.max_new_tokens

    def prepare(self, tokenizer: Any, max_positions: int | None) -> None:
        """Build the prompts; prompts that do not fit the context with ``max_new_tokens`` are
        dropped (ValueError if none fits: the message names the key)."""
        from grpokit.data.rows import load_prompts

        e = self.recipe.eval
        key = "eval.max_new_tokens" if e.max_new_tokens else "rollout.max_new_tokens (eval.max_new_tokens unset)"
        self.rows, self.prompts, self.too_long = load_prompts(
            self.recipe,
            tokenizer,
            dataset=self.dataset,
            split=e.split,
            limit=e.limit,
            rows=self.rows,
            max_new_tokens=self.max_new_tokens,
            max_positions=max_positions,
            new_tokens_key=key,
            section="eval",
        )
        self.tokenizer = tokenizer

    def run(self, engine: RolloutEngine, out: Path, when: str) -> EvalResult:
        """Evaluate the model ``engine`` generates from, now (greedy, and ``eval.num_samples``
        samples at ``rollout.temperature``); writes ``out/eval_<when>.json``, prints the summary and
        returns :func:`grpokit.eval.evaluate.evaluate`'s result with ``dataset``, ``split``, ``when``,
        ``scorer`` and ``held_out`` added, and in its ``settings`` the prompt template, system prompt,
        whether the chat template was applied and how many prompts were left out as too long."""
        from grpokit.data.heldout import answer_extractor
        from grpokit.eval.stats import format_summary

        if self.prompts is None:
            raise RuntimeError("HeldOutEval.run: prepare() first (grpokit.trainer.build.build_run does)")
        r = self.recipe
        e = r.eval
        res = evaluate(
            engine,
            self.prompts,
            self.rows,
            max_new_tokens=self.max_new_tokens,
            scorer=self.scorer_fn,
            batch_size=e.batch_size,
            scorer_timeout_s=r.rewards.timeout_s,
            isolation=r.rewards.isolation,
            num_samples=e.num_samples,
            temperature=r.rollout.temperature,
            seed=r.train.seed,
            extract_answer=answer_extractor(self.scorer),
        )
        res.dataset, res.split, res.when, res.scorer, res.held_out = self.dataset, e.split, when, self.scorer, self.note
        # the prompts as the model got them: with the budget and the sampling, what the numbers depend on
        res.settings.update(prompt_settings(r.data, self.tokenizer, self.too_long), batch_size=e.batch_size)
        save_eval(out, res, when)
        print(
            f"[grpokit] eval {when}: {dataset_label(self.dataset, e.split)} accuracy {res.accuracy:.3f} "
            f"({res.correct}/{res.total}, greedy; {self.note}; scorer {self.scorer})\n"
            f"{format_summary(res.metrics or {})}",
            flush=True,
        )
        self._warn(res, when)
        return res

    def _warn(self, res: EvalResult, when: str) -> None:
        """An evaluation that measured little (most answers cut, rows the scorer could not score)
        says so, as a training step does (``grpokit.metrics.RunWarning``)."""
        from grpokit.metrics import RunWarning

        key = "eval.max_new_tokens" if self.recipe.eval.max_new_tokens else "rollout.max_new_tokens"
        for text in measured_little(res, budget=f"{key}={self.max_new_tokens}"):
            warnings.warn(f"eval {when}: {text}", RunWarning, stacklevel=3)


def save_eval(out: Path, res: EvalResult, when: str) -> EvalResult:
    """Write ``out/eval_<when>.json`` (``res.to_dict()`` as JSON, indented by one); returns ``res``.

    Raises:
        OSError: the file cannot be written.
    """
    (Path(out) / f"eval_{when}.json").write_text(json.dumps(res.to_dict(), indent=1))
    return res
