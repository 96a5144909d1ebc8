"""Held-out evaluation during a run: the eval section's rows kept apart from the training rows,
their prompts, and :func:`grpokit.evaluate.evaluate` on the current model through a rollout
engine (the run's ``eval_engine``, :class:`grpokit.build.Run`), saved as ``eval_<when>.json`` and
printed.

Built in two stages by :func:`grpokit.build.build_run`, so that bad input fails before anything
slow loads: :class:`HeldOutEval` (rows and scorer, no tokenizer), then :meth:`HeldOutEval.prepare`
(prompts, once the tokenizer and the model's context length are known).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.data import dataset_label

if TYPE_CHECKING:
    from grpokit.rollout.engine import RolloutEngine


class HeldOutEval:
    """The recipe's ``eval`` section applied to ``train_rows``' run.

    Raises:
        ValueError: a held-out range that overlaps the training rows (:func:`grpokit.heldout.check_ranges`),
            an unknown ``eval.scorer``, or no held-out row left once training questions are left out.
    """

    def __init__(self, recipe: Any, train_rows: list[dict]):
        from grpokit import heldout
        from grpokit.rows import section_rows
        from grpokit.rewards import get_reward_function

        self.recipe, e = recipe, recipe.eval
        heldout.check_ranges(recipe)
        self.scorer = e.scorer or heldout.default_scorer(e.dataset)
        try:
            self.scorer_fn = get_reward_function(self.scorer)  # a bad name fails before any model loads
        except ValueError as err:
            raise ValueError(f"eval.scorer: {err}") from None
        rows, dropped = heldout.drop_training_questions(train_rows, section_rows(recipe, "eval"))
        if not rows:
            raise ValueError(f"eval: every held-out problem of {dataset_label(e.dataset, e.split)} is also a "
                             "training question")
        self.rows, self.prompts = rows, None
        self.tokenizer, self.too_long = None, None  # set by prepare, with the prompts
        self.note = (f"{len(rows)} held-out problems, none a training question ({dropped} left out as "
                     f"training questions; data seed {heldout.eval_seed(recipe)})")

    @property
    def max_new_tokens(self) -> int:
        return self.recipe.eval.max_new_tokens or self.recipe.rollout.max_new_tokens

    def prepare(self, tokenizer: Any, max_positions: int | None) -> None:
        """Build the prompts; prompts that do not fit the context with ``max_new_tokens`` are
        dropped (ValueError if none fits: the message names the key)."""
        from grpokit.rows import load_prompts

        e = self.recipe.eval
        key = "eval.max_new_tokens" if e.max_new_tokens else "rollout.max_new_tokens (eval.max_new_tokens unset)"
        self.rows, self.prompts, self.too_long = load_prompts(
            self.recipe, tokenizer, dataset=e.dataset, split=e.split, limit=e.limit, rows=self.rows,
            max_new_tokens=self.max_new_tokens, max_positions=max_positions, new_tokens_key=key, section="eval")
        self.tokenizer = tokenizer

    def run(self, engine: RolloutEngine, out: Path, when: str) -> dict[str, Any]:
        """Evaluate the model ``engine`` generates from, now (greedy, and ``eval.num_samples``
        samples at ``rollout.temperature``); writes ``out/eval_<when>.json``, prints the summary and
        returns :func:`grpokit.evaluate.evaluate`'s result with ``dataset``, ``split``, ``when``,
        ``scorer`` and ``held_out`` added, and in its ``settings`` the prompt template, system prompt,
        whether the chat template was applied and how many prompts were left out as too long."""
        from grpokit.evaluate import evaluate, prompt_settings
        from grpokit.evalstats import format_summary
        from grpokit.heldout import answer_extractor

        r = self.recipe
        e = r.eval
        res = evaluate(engine, self.prompts, self.rows, max_new_tokens=self.max_new_tokens, scorer=self.scorer_fn,
                       batch_size=e.batch_size, scorer_timeout_s=r.rewards.timeout_s, isolation=r.rewards.isolation,
                       num_samples=e.num_samples, temperature=r.rollout.temperature, seed=r.train.seed,
                       extract_answer=answer_extractor(self.scorer))
        res.update(dataset=e.dataset, split=e.split, when=when, scorer=self.scorer, held_out=self.note)
        # the prompts as the model got them: with the budget and the sampling, what the numbers depend on
        res["settings"].update(prompt_settings(r.data, self.tokenizer, self.too_long), batch_size=e.batch_size)
        save_eval(out, res, when)
        print(f"[grpokit] eval {when}: {dataset_label(e.dataset, e.split)} accuracy {res['accuracy']:.3f} "
              f"({res['correct']}/{res['total']}, greedy; {self.note}; scorer {self.scorer})\n"
              f"{format_summary(res['metrics'])}", flush=True)
        self._warn(res, when)
        return res

    def _warn(self, res: dict[str, Any], when: str) -> None:
        """An evaluation that measured little (most answers cut, rows the scorer could not score)
        says so, as a training step does (``grpokit.metrics.RunWarning``)."""
        from grpokit.evaluate import measured_little
        from grpokit.metrics import RunWarning

        key = "eval.max_new_tokens" if self.recipe.eval.max_new_tokens else "rollout.max_new_tokens"
        for text in measured_little(res, budget=f"{key}={self.max_new_tokens}"):
            warnings.warn(f"eval {when}: {text}", RunWarning, stacklevel=3)


def save_eval(out: Path, res: dict[str, Any], when: str) -> dict[str, Any]:
    """Write ``out/eval_<when>.json``; returns ``res``."""
    (Path(out) / f"eval_{when}.json").write_text(json.dumps(res, indent=1))
    return res
