"""The recipe's rows: the training rows (``data`` section) and the held-out rows (``eval`` section)
read, shuffled and cut as the recipe says, and their chat prompts. Needs no model: bad data fails
here before anything slow loads."""

from __future__ import annotations

import random
import sys
from typing import Any

from grpokit.config import Recipe
from grpokit.utils.given import given_label


def load_data_rows(
    recipe: Recipe,
    *,
    dataset: str,
    split: str,
    limit: int | None,
    seed: int | None = None,
    options: dict | None = None,
    shuffle_seed: int | None = None,
) -> list[dict]:
    """Rows of ``dataset``/``split`` (validated: known dataset and split, prompt/answer columns,
    non-empty prompts); needs no tokenizer, so bad data fails before anything slow loads.
    ``seed``/``options`` default to ``train.seed``/``data.options``. With ``shuffle_seed`` every
    row is read and put in :func:`shuffled_rows` order before the first ``limit`` are kept."""
    from grpokit.data import load_rows

    d = recipe.data
    rows = load_rows(
        dataset,
        split,
        limit=limit if shuffle_seed is None else None,
        seed=recipe.train.seed if seed is None else seed,
        options=dict(d.options if options is None else options),
        prompt_field=d.prompt_field,
        answer_field=d.answer_field,
    )
    return shuffled_rows(rows, shuffle_seed)[:limit]


def shuffled_rows(rows: list[dict], seed: int | None) -> list[dict]:
    """``rows`` in the order of ``random.Random(seed).shuffle`` (a copy), or as they are for ``seed=None``.

    >>> [r["i"] for r in shuffled_rows([{"i": i} for i in range(5)], 0)]
    [2, 1, 0, 4, 3]
    """
    if seed is None:
        return rows
    out = list(rows)
    random.Random(seed).shuffle(out)
    return out


def section_rows(recipe: Recipe, section: str) -> list[dict]:
    """``load_data_rows`` for the ``data`` or ``eval`` section (``data.skip`` applied, the held-out seed and
    options for ``eval``); errors name the section's dataset, and its split where the source has splits
    (not a local file, reasoning_gym or rows given from Python)."""
    from grpokit.data import heldout

    sec = getattr(recipe, section)
    skip = recipe.data.skip if section == "data" else 0
    held = section == "eval"
    try:
        limit = None if sec.limit is None else skip + sec.limit
        rows = load_data_rows(
            recipe,
            dataset=sec.dataset,
            split=sec.split,
            limit=limit,
            seed=heldout.eval_seed(recipe) if held else None,
            options=heldout.eval_options(recipe) if held else None,
            shuffle_seed=heldout.shuffle_seed(recipe, section),
        )[skip:]
        if not rows:
            raise ValueError(f"no rows left after data.skip={skip}")
        return rows
    except (ValueError, FileNotFoundError) as e:
        # a fixed, one-argument class: ``type(e)(msg)`` fails for UnicodeDecodeError (5 arguments)
        cls = FileNotFoundError if isinstance(e, FileNotFoundError) else ValueError
        label = given_label(sec.dataset)
        if label != sec.dataset:  # rows given to the API: the message names rows= / eval_rows= (no split)
            raise cls(str(e) if str(e).startswith(label) else f"{label}: {e}") from e
        from grpokit.data import dataset_label

        split = f" {section}.split={sec.split!r}" if dataset_label(sec.dataset, sec.split) != sec.dataset else ""
        said = str(e).removeprefix(f"{sec.dataset}: ")  # the file is named once, by the key
        raise cls(f"{section}.dataset={sec.dataset!r}{split}: {said}") from e  # a split only where one is read


def prompt_tools(recipe: Recipe) -> list[dict] | None:
    """The tool schemas the recipe's prompts are rendered with: ``rollout.env``'s ``tool_schemas``
    (:class:`grpokit.envs.Environment`; the ``tools`` environment's ``json`` call format), or None
    (no environment, or one without them).

    Raises:
        ValueError, ImportError: what :func:`grpokit.envs.load_env` raises (names ``rollout.env``).
    """
    r = recipe.rollout
    if r.env is None:
        return None
    from grpokit.envs import load_env

    env = load_env(r.env, r.env_options)
    try:
        schemas = getattr(env, "tool_schemas", None)
    finally:
        getattr(env, "close", lambda: None)()
    return None if not schemas else [dict(x) for x in schemas]


def load_prompts(
    recipe: Recipe,
    tokenizer: Any,
    *,
    dataset: str,
    split: str,
    limit: int | None,
    rows: list[dict] | None = None,
    max_new_tokens: int | None = None,
    max_positions: int | None = None,
    new_tokens_key: str = "rollout.max_new_tokens",
    section: str = "data",
) -> tuple[list[dict], list[str], int]:
    """Rows of ``dataset``/``split`` (or the given ``rows``) and their chat prompts
    (:func:`grpokit.data.render_prompts`: conversational rows, a chat template without a system
    role); prompts longer
    than ``data.max_prompt_tokens``, or whose tokens plus ``max_new_tokens`` exceed the model's
    ``max_positions``, are dropped and counted.

    Raises:
        ValueError: ``max_new_tokens >= max_positions`` (no room for any prompt), or no prompt
            left; the message names ``new_tokens_key``, both numbers and the dataset. A row whose
            messages the chat template refuses (names the section, dataset and row).
    """
    from grpokit.data import dataset_label, filter_by_prompt_length, render_prompts

    d = recipe.data
    if rows is None:
        rows = load_data_rows(recipe, dataset=dataset, split=split, limit=limit)
    label = dataset_label(dataset, split)
    prompts = render_prompts(
        tokenizer,
        rows,
        system_prompt=d.system_prompt,
        template=d.prompt_template,
        source=f"{section}: {label}",
        tools=prompt_tools(recipe),
    )
    keep, skipped = filter_by_prompt_length(prompts, tokenizer, d.max_prompt_tokens)
    if not keep:
        raise ValueError(
            f"{section}: all {len(rows)} prompts of {label} are longer than "
            f"data.max_prompt_tokens={d.max_prompt_tokens}"
        )
    if max_positions is not None and max_new_tokens is not None:
        room = max_positions - max_new_tokens  # longest prompt that leaves room for a whole completion
        context = f"{new_tokens_key}={max_new_tokens} and the model's {max_positions} positions"
        if room < 1:
            raise ValueError(
                f"{new_tokens_key}={max_new_tokens} leaves no room for a prompt: the model "
                f"has {max_positions} positions (prompt tokens + new tokens must fit)"
            )
        fits, over = filter_by_prompt_length([prompts[i] for i in keep], tokenizer, room)
        if not fits:
            raise ValueError(
                f"{section}: all {len(keep)} prompts of {label} are longer than {room} "
                f"tokens, the most that fits with {context}"
            )
        if over:
            print(
                f"[grpokit] note: {over} prompts of {label} skipped: longer than {room} tokens, "
                f"the most that fits with {context}",
                file=sys.stderr,
                flush=True,
            )
        keep, skipped = [keep[i] for i in fits], skipped + over
    return [rows[i] for i in keep], [prompts[i] for i in keep], skipped


def training_prompts(
    recipe: Recipe, tokenizer: Any, rows: list[dict], max_positions: int | None
) -> tuple[list[dict], list[str], int]:
    """:func:`load_prompts` of the recipe's training ``rows`` (the ``data`` section's, e.g. from
    :func:`section_rows`): room left for ``rollout.max_new_tokens`` within ``max_positions``.
    Returns ``(rows, prompts, skipped)`` and raises as :func:`load_prompts`."""
    d = recipe.data
    return load_prompts(
        recipe,
        tokenizer,
        dataset=d.dataset,
        split=d.split,
        limit=d.limit,
        rows=rows,
        max_new_tokens=recipe.rollout.max_new_tokens,
        max_positions=max_positions,
    )
