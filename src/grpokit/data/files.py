"""Rows from local files (``.jsonl``, ``.json``, ``.csv``, ``.parquet``) and Hugging Face datasets.

Column mapping (:func:`map_fields`): the prompt comes from ``prompt_field`` if given, else the
first present of :data:`PROMPT_FIELDS`; the answer from ``answer_field``, else the first present
of :data:`ANSWER_FIELDS`. A reference holding ``#### x`` (GSM8K style) becomes ``x`` with commas
removed; one holding ``\\boxed{..}`` becomes the last box's content; the unreduced text is kept
as ``solution`` when the row has no ``solution`` column yet. All other columns are kept.

A prompt column holding a list of ``{"role", "content"}`` messages (conversational format) is
checked (:func:`grpokit.data.prompts.check_messages`) and kept as the row's ``prompt_messages``
(a column name grpokit sets); the row's ``prompt`` is then the last user message's content, the
question rewards and held-out checks see. How a conversation is rendered:
:mod:`grpokit.data.prompts`.
"""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from grpokit.data.packaged import format_number
from grpokit.data.prompts import check_messages
from grpokit.utils.importing import install_hint, require
from grpokit.utils.textio import iter_utf8_lines, read_utf8

__all__ = [
    "FILE_SUFFIXES",
    "PROMPT_FIELDS",
    "ANSWER_FIELDS",
    "looks_like_path",
    "read_local_file",
    "read_hf_dataset",
    "map_fields",
]

FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
PROMPT_FIELDS = ("prompt", "question", "problem", "input", "query", "instruction")
ANSWER_FIELDS = ("answer", "final_answer", "target", "ground_truth", "solution", "output")


def looks_like_path(dataset: str) -> bool:
    """True if ``dataset`` names an existing file or ends with a supported file suffix."""
    return dataset.lower().endswith(FILE_SUFFIXES) or Path(dataset).expanduser().is_file()


def _take(records: Iterable[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` records; reads no record past them (a damaged line beyond is not seen)."""
    out: list[dict[str, Any]] = []
    if limit == 0:
        return out
    for rec in records:
        out.append(rec)
        if limit is not None and len(out) >= limit:
            break
    return out


class DuplicateFieldError(ValueError):
    """A JSON object of a data file writes one field twice (``json`` would silently keep the last)."""


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of every data-file JSON read: the object, or :class:`DuplicateFieldError`."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateFieldError(f"field {key!r} is written twice in one object; each field may appear once")
        out[key] = value
    return out


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_unique_fields)


def _jsonl_records(path: Path, name: str) -> Iterable[dict[str, Any]]:
    """JSON lines of ``path`` (``name``: the path as the user wrote it, for messages)."""
    for lineno, line in iter_utf8_lines(path):
        if not line.strip():
            continue
        try:
            yield _loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name}: line {lineno} is not valid JSON: {e}") from None
        except DuplicateFieldError as e:
            raise ValueError(f"{name}: line {lineno}: {e}") from None


def _csv_records(path: Path, name: str) -> Iterable[dict[str, Any]]:
    """Rows of a CSV file with a header line; a row with more fields than the header is an error."""
    reader = csv.DictReader(line for _, line in iter_utf8_lines(path))
    header = reader.fieldnames or []
    twice = sorted({f for f in header if header.count(f) > 1})
    if twice:
        raise ValueError(
            f"{name}: line 1: column {twice[0]!r} appears {header.count(twice[0])} times in the "
            "header; each column may appear once"
        )
    while True:
        try:
            rec = next(reader)
        except StopIteration:
            return
        except csv.Error as e:  # e.g. a field over csv.field_size_limit()
            raise ValueError(f"{name}: line {reader.reader.line_num}: not valid CSV: {e}") from None
        if None in rec:
            raise ValueError(
                f"{name}: line {reader.line_num}: {len(rec) - 1 + len(rec[None])} fields,"
                f" but the header line has {len(reader.fieldnames or ())}"
            )
        yield rec


def read_local_file(path_str: str, limit: int | None) -> list[dict[str, Any]]:
    """Read the first ``limit`` records (all if None) of a local data file, in file order.

    ``.json`` may hold a list of objects, an object with a single list value (``{"data": [...]}``)
    or JSON lines. ``.parquet`` needs ``pyarrow`` (or ``pandas``):
    the optional extra ``grpokit[datasets]``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unsupported suffix or unreadable content: bytes that are not UTF-8
            (:class:`grpokit.utils.textio.NotUtf8Error`: file, line, byte offset), invalid JSON or CSV
            (file and line), a field written twice in one JSON object or a column named twice in a
            CSV header (file, line, field), a parquet file pyarrow/pandas cannot read. Messages are one line.
        ImportError: parquet without pyarrow/pandas.
    """
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path_str!r} not found")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        records: Iterable[dict[str, Any]] = _jsonl_records(path, path_str)
    elif suffix == ".json":
        text = read_utf8(path)
        try:
            data = _loads(text)
        except json.JSONDecodeError:
            records = _jsonl_records(path, path_str)  # JSON lines saved as .json
        except DuplicateFieldError as e:
            raise ValueError(f"{path_str}: {e}") from None
        else:
            if isinstance(data, dict):
                lists = [v for v in data.values() if isinstance(v, list)]
                if len(lists) != 1:
                    raise ValueError(
                        f"{path_str}: expected a list of objects or an object with one list"
                        f" value; got keys {sorted(data)}"
                    )
                data = lists[0]
            if not isinstance(data, list):
                raise ValueError(f"{path_str}: expected a list of objects, got {type(data).__name__}")
            records = data
    elif suffix == ".csv":
        return _take(_csv_records(path, path_str), limit)
    elif suffix == ".parquet":
        return _take(_parquet_records(path, path_str), limit)
    else:
        raise ValueError(f"dataset file {path_str!r}: unsupported suffix {suffix!r}; use one of {FILE_SUFFIXES}")
    out = _take(records, limit)
    for i, rec in enumerate(out):
        if not isinstance(rec, dict):
            raise ValueError(f"{path_str}: row {i} is a {type(rec).__name__}, expected an object")
    return out


def _parquet_records(path: Path, name: str) -> Iterable[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e_pa:
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                f"reading {path} needs pyarrow or pandas, neither is installed:"
                f" {install_hint('datasets')} (or pip install pyarrow)"
            ) from e_pa
        read = lambda: pd.read_parquet(path).to_dict("records")  # noqa: E731
    else:
        read = lambda: pq.read_table(path).to_pylist()  # noqa: E731
    try:
        return read()
    except (ImportError, MemoryError):
        raise
    except Exception as e:  # pyarrow's own errors (ArrowInvalid, OSError, ...): kept, on one line
        detail = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"{name}: not a readable parquet file: {detail}") from None


def read_hf_dataset(name: str, split: str, limit: int | None, options: dict[str, Any]) -> list[dict[str, Any]]:
    """Load ``datasets.load_dataset(name, split=..., **options)`` (first ``limit`` rows).

    Raises:
        ImportError: the ``datasets`` package is not installed (the message names the extra,
            ``grpokit[datasets]``).
        ConnectionError: the hub cannot be reached and ``name`` is not cached (one line, within
            seconds: :func:`grpokit.utils.hub.hub_access`).
    """
    datasets = require(
        "datasets",
        extra="datasets",
        why=f"dataset {name!r} (not a packaged name or a local file, so loaded from the Hugging Face hub)",
    )
    from unittest import mock

    from grpokit.utils.hub import hub_access

    cache_only = hub_access("dataset", name, repo_type="dataset")  # seconds, not a minute of retries
    split_spec = split if limit is None else f"{split}[:{limit}]"
    with mock.patch.object(datasets.config, "HF_HUB_OFFLINE", True) if cache_only else contextlib.nullcontext():
        ds = datasets.load_dataset(name, split=split_spec, **options)
    return [dict(rec) for rec in ds]


def _reduce_reference(text: str) -> str:
    if "####" in text:
        return text.split("####")[-1].strip().replace(",", "")
    if "\\boxed" in text or "\\fbox" in text:
        from grpokit.rewards.math import boxed_contents

        boxed = boxed_contents(text)
        if boxed:
            return boxed[-1].strip()
    return text.strip()


def map_fields(
    records: list[dict[str, Any]],
    source: str,
    prompt_field: str | None,
    answer_field: str | None,
) -> list[dict[str, Any]]:
    """Add ``prompt``/``answer`` (str) to every record; see the module docstring.

    Raises:
        ValueError: a row lacks the prompt or answer column, or has a null answer (message gives
            the row index and the fields present); a prompt that is a malformed list of messages
            (message names ``source``, the row and the field).
    """
    rows = []
    for i, rec in enumerate(records):
        p_key = prompt_field or next((k for k in PROMPT_FIELDS if k in rec), None)
        a_key = answer_field or next((k for k in ANSWER_FIELDS if k in rec), None)
        for role, key, wanted, candidates in (
            ("prompt", p_key, prompt_field, PROMPT_FIELDS),
            ("answer", a_key, answer_field, ANSWER_FIELDS),
        ):
            if wanted is not None and wanted not in rec:  # the column the recipe names is not there
                raise ValueError(
                    f"{source}: row {i} has no column {wanted!r} (data.{role}_field={wanted!r});"
                    f" fields present: {sorted(rec)}"
                )
            if key is None or key not in rec or rec[key] is None:
                looked = repr(wanted) if wanted else f"any of {list(candidates)}"
                raise ValueError(
                    f"{source}: row {i} has no {role} column ({looked});"
                    f" fields present: {sorted(rec)}; set data.{role}_field to choose one"
                )
        assert p_key is not None and a_key is not None  # else the loop above raised
        row = dict(rec)
        value = rec[a_key]
        raw_answer = format_number(value) if isinstance(value, float) else str(value)
        value = rec[p_key]
        if isinstance(value, (list, tuple, Mapping)) or (hasattr(value, "tolist") and getattr(value, "ndim", 0) == 1):
            messages = check_messages(value, f"{source}: row {i}, field {p_key!r}")
            row["prompt_messages"] = messages
            row["prompt"] = messages[max(j for j, m in enumerate(messages) if m["role"] == "user")]["content"]
        else:
            row["prompt"] = value if isinstance(value, str) else str(value)
        row["answer"] = _reduce_reference(raw_answer)
        if row["answer"] != raw_answer.strip() and "solution" not in row:
            row["solution"] = raw_answer
        rows.append(row)
    return rows
