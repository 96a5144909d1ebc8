"""The held-out set a run evaluates on: generated separately from the training rows, and never
overlapping them.

- Generated data (``reasoning_gym:TASK``) is drawn with seed ``train.seed + EVAL_SEED_OFFSET``, the
  training rows with ``train.seed``: two different sets from the same generator settings
  (``eval.options``, default ``data.options`` when both sections name the same dataset).
  reasoning_gym draws item ``i`` from ``Random(seed + i)``, so seeds 0 and 1 give the same items
  shifted by one: the offset is 10⁹, beyond any dataset's size.
- The same file and split for both: the held-out rows are the first ``eval.limit`` rows and
  training starts at ``data.skip``; a range that overlaps is an error naming both keys. With
  ``data.shuffle_seed`` both sections take the rows in the same shuffled order first, so a file
  sorted by kind (MAWPS: singleeq, singleop, addsub, multiarith) is held out evenly.
- Whatever the source, a held-out problem whose question text is also a training question is left
  out and counted (a generator can draw the same problem twice; a file can repeat a question).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpokit.config import Recipe

EVAL_SEED_OFFSET = 10**9
"""Generated held-out data uses ``train.seed + EVAL_SEED_OFFSET`` (module docstring)."""


def is_generated(dataset: str | None) -> bool:
    """Whether ``dataset`` is generated from a seed (``reasoning_gym:TASK``)."""
    return str(dataset).startswith("reasoning_gym:")


def eval_seed(recipe: Recipe) -> int:
    """The data seed of the held-out rows (module docstring)."""
    return recipe.train.seed + (EVAL_SEED_OFFSET if is_generated(recipe.eval.dataset) else 0)


def same_rows(recipe: Recipe) -> bool:
    """Whether the eval section reads the training data's file and split (held out by position)."""
    e, d = recipe.eval, recipe.data
    return not is_generated(e.dataset) and e.dataset == d.dataset and e.split == d.split


def shuffle_seed(recipe: Recipe, section: str) -> int | None:
    """The seed that orders ``section``'s rows: ``data.shuffle_seed`` for the training rows, and for
    held-out rows read from the same file and split (one order, so that rows ``0..eval.limit-1``
    and the rows from ``data.skip`` on stay apart); ``None`` (file order) otherwise."""
    if section == "data" or same_rows(recipe):
        return recipe.data.shuffle_seed
    return None


def eval_options(recipe: Recipe) -> dict:
    """``eval.options``, else ``data.options`` when eval and data name the same dataset, else none."""
    e, d = recipe.eval, recipe.data
    if e.options is not None:
        return dict(e.options)
    return dict(d.options) if e.dataset == d.dataset else {}


def default_scorer(dataset: str) -> str:
    """The reward name that decides correctness for ``dataset``: ``reasoning_gym`` for
    ``reasoning_gym:TASK`` data, else ``math_correct``."""
    return "reasoning_gym" if is_generated(dataset) else "math_correct"


def answer_extractor(scorer: str) -> Callable[[str], str | None]:
    """The function that reads the final answer the way ``scorer`` does, for maj@k's votes:
    reasoning_gym's ``<answer>`` tags for the ``reasoning_gym`` scorer, else
    :func:`grpokit.rewards.math.extract_answer`."""
    if scorer == "reasoning_gym":
        from grpokit.data.reasoning_gym import extract_rg_answer

        return extract_rg_answer
    from grpokit.rewards.math import extract_answer

    return extract_answer


def check_scorer(scorer: str, dataset: str) -> None:
    """Raise ``ValueError`` when ``scorer`` cannot score ``dataset``'s rows (the reasoning_gym scorer
    needs the generator entry that only ``reasoning_gym:`` rows carry)."""
    if scorer == "reasoning_gym" and not is_generated(dataset):
        raise ValueError(
            f"scorer 'reasoning_gym' needs reasoning_gym: data, got dataset {dataset!r}; "
            f"use {default_scorer(dataset)!r}"
        )


def check_ranges(recipe: Recipe) -> None:
    """Raise ``ValueError`` when held-out and training rows are the same rows of one file/split.

    >>> from grpokit.config import Recipe
    >>> r = Recipe(); r.data.dataset = r.eval.dataset = "mawps"; r.data.split = r.eval.split = "singleop"
    >>> r.eval.limit, r.data.skip = 100, 100
    >>> check_ranges(r)  # rows 0-99 held out, training from row 100
    """
    e, d = recipe.eval, recipe.data
    if not same_rows(recipe):
        return
    if e.limit is None:
        raise ValueError(
            f"eval: eval.dataset={e.dataset!r} eval.split={e.split!r} is the training data and "
            "eval.limit is unset, so every row would be held out and trained on; set eval.limit=N "
            "and data.skip >= N"
        )
    if d.skip < e.limit:
        raise ValueError(
            f"eval: eval.dataset={e.dataset!r} eval.split={e.split!r} is the training data and "
            f"its held-out rows 0-{e.limit - 1} overlap the training rows (data.skip={d.skip}); set "
            "data.skip >= eval.limit so that training starts after the held-out rows"
        )


def drop_questions(
    rows: list[dict], others: list[dict], key: Callable[[str], str] | None = None
) -> tuple[list[dict], int]:
    """``rows`` without those whose ``prompt`` (the question) is also a question of ``others``,
    compared as ``key(prompt)`` (default: the exact text), and how many were left out.

    >>> drop_questions([{"prompt": "A b"}, {"prompt": "c"}], [{"prompt": "a B"}], key=str.lower)
    ([{'prompt': 'c'}], 1)
    """
    key = key or (lambda q: q)
    seen = {key(r["prompt"]) for r in others}
    kept = [r for r in rows if key(r["prompt"]) not in seen]
    return kept, len(rows) - len(kept)


def drop_training_questions(train_rows: list[dict], eval_rows: list[dict]) -> tuple[list[dict], int]:
    """``eval_rows`` without the rows whose ``prompt`` (the question) is a training question (exact
    text), and how many were left out.

    >>> drop_training_questions([{"prompt": "1+1"}], [{"prompt": "1+1"}, {"prompt": "2+2"}])
    ([{'prompt': '2+2'}], 1)
    """
    return drop_questions(eval_rows, train_rows)
