"""Held-out rows from the training file: ``data.shuffle_seed`` orders both sections the same way,
so the held-out prefix and the training rows never overlap and draw from every part of the file."""

from __future__ import annotations

import json
import random

import pytest

from grpokit.config import Recipe
from grpokit.data.heldout import check_ranges, shuffle_seed
from grpokit.data.rows import section_rows, shuffled_rows


@pytest.fixture
def sorted_file(tmp_path):
    """40 rows sorted by kind (like MAWPS's test file): kinds a, b, c, d in blocks of 10."""
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": str(i), "kind": "abcd"[i // 10]}) + "\n" for i in range(40))
    )
    return str(path)


def _recipe(path, *, seed, limit=12, skip=12):
    r = Recipe()
    r.data.dataset = r.eval.dataset = path
    r.data.split = r.eval.split = "test"
    r.data.shuffle_seed, r.eval.limit, r.data.skip = seed, limit, skip
    return r


def test_shuffled_rows_is_random_shuffle_with_the_seed():
    rows = [{"i": i} for i in range(30)]
    expect = list(range(30))
    random.Random(7).shuffle(expect)
    assert [r["i"] for r in shuffled_rows(rows, 7)] == expect
    assert [r["i"] for r in rows] == list(range(30))  # a copy: the input keeps its order
    assert shuffled_rows(rows, None) is rows


def test_held_out_and_training_rows_split_one_shuffled_order(sorted_file):
    r = _recipe(sorted_file, seed=3)
    order = list(range(40))
    random.Random(3).shuffle(order)
    held = [int(x["answer"]) for x in section_rows(r, "eval")]
    train = [int(x["answer"]) for x in section_rows(r, "data")]
    assert held == order[:12] and train == order[12:]
    assert not set(held) & set(train) and sorted(held + train) == list(range(40))
    kinds = {x["kind"] for x in section_rows(r, "eval")}
    assert len(kinds) >= 3  # file order would hold out kind "a" only
    r.data.limit = 5  # data.limit counts after data.skip, in the shuffled order
    assert [int(x["answer"]) for x in section_rows(r, "data")] == order[12:17]


def test_file_order_without_a_seed_and_overlap_still_refused(sorted_file):
    r = _recipe(sorted_file, seed=None)
    assert [int(x["answer"]) for x in section_rows(r, "eval")] == list(range(12))
    r = _recipe(sorted_file, seed=3, skip=11)
    with pytest.raises(ValueError, match="data.skip"):
        check_ranges(r)


def test_another_held_out_dataset_keeps_its_file_order(sorted_file, tmp_path):
    r = _recipe(sorted_file, seed=3)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"question": f"o{i}", "answer": str(i)}) + "\n" for i in range(20)))
    r.eval.dataset = str(other)
    assert shuffle_seed(r, "eval") is None and shuffle_seed(r, "data") == 3
    assert [int(x["answer"]) for x in section_rows(r, "eval")] == list(range(12))
