"""Issue 29 items 6, 7, 9: files with a UTF-8 BOM, conversational prompt columns, chat templates
without a system role. Tiny files and an in-memory word-level tokenizer (no model)."""

import json
import re

import pytest

from grpokit.config import recipe_from_dict
from grpokit.data import load_rows
from grpokit.data import prompts as P
from grpokit.data.rows import load_prompts
from grpokit.utils.textio import NotUtf8Error, iter_utf8_lines, read_utf8

BOM = b"\xef\xbb\xbf"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Gemma-style: a system message is refused with transformers' raise_exception
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _tokenizer(chat_template=None, name="tiny-tok"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", name_or_path=name)
    out.chat_template = chat_template
    return out


# -- item 6: a leading byte-order mark ----------------------------------------------------------

ROWS = [{"question": "1+1?", "answer": "2"}, {"question": "2+3?", "answer": "5"}]
FILES = {
    "data.csv": "question,answer\r\n1+1?,2\r\n2+3?,5\r\n",
    "data.jsonl": "".join(json.dumps(r) + "\n" for r in ROWS),
    "data.json": json.dumps(ROWS),
    "lines.json": "".join(json.dumps(r) + "\n" for r in ROWS),  # JSON lines saved as .json
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_bom_file_reads_the_same_rows(tmp_path, name):
    plain, marked = tmp_path / name, tmp_path / f"bom_{name}"
    plain.write_bytes(FILES[name].encode())
    marked.write_bytes(BOM + FILES[name].encode())
    want = load_rows(str(plain))
    assert [(r["prompt"], r["answer"]) for r in want] == [("1+1?", "2"), ("2+3?", "5")]
    assert load_rows(str(marked)) == want
    assert load_rows(str(marked), limit=1) == want[:1]  # the streamed (limited) read too


def test_textio_drops_only_a_leading_bom(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(BOM + "a\r\nb\ufeff\n".encode())
    assert read_utf8(p) == "a\r\nb\ufeff\n"  # a BOM later in the file is text, kept
    assert list(iter_utf8_lines(p)) == [(1, "a\r\n"), (2, "b\ufeff\n")]
    # byte offsets still count the mark: they are offsets in the file
    p.write_bytes(BOM + b"ok\n\xe9\n")
    for read in (read_utf8, lambda q: list(iter_utf8_lines(q))):
        with pytest.raises(NotUtf8Error) as e:
            read(p)
        assert (e.value.line, e.value.offset) == (2, 6)


def test_bom_recipe_and_adapter_config(tmp_path):
    from grpokit.config import load_recipe
    from grpokit.models.lora import _base_of

    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(BOM + b"train:\n  max_steps: 3\n")
    assert load_recipe(recipe).train.max_steps == 3
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "adapter_config.json").write_bytes(BOM + json.dumps({"base_model_name_or_path": "org/base"}).encode())
    assert _base_of(ckpt)[0] == "org/base"
    (ckpt / "recipe.json").write_bytes(BOM + json.dumps({"model": {"name_or_path": "org/other"}}).encode())
    assert _base_of(ckpt)[0] == "org/other"


# -- item 7: conversational prompt columns ------------------------------------------------------

CONVO = [
    {"role": "system", "content": "Own system."},
    {"role": "user", "content": "First?"},
    {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "What is 2+2?"},
]


def _jsonl(tmp_path, rows, name="convo.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(p)


def test_conversational_rows_are_kept_as_messages(tmp_path):
    path = _jsonl(tmp_path, [{"prompt": CONVO, "answer": 4}, {"prompt": "Plain?", "answer": "1"}])
    rows = load_rows(path)
    assert rows[0]["prompt"] == "What is 2+2?"  # the question: the last user message
    assert rows[0]["prompt_messages"] == CONVO and rows[0]["answer"] == "4"
    assert "prompt_messages" not in rows[1] and rows[1]["prompt"] == "Plain?"


def test_conversation_rendering_rules():
    tok = _tokenizer(TEMPLATE)
    rows = [
        {"prompt": "What is 2+2?", "prompt_messages": CONVO},
        {"prompt": "Hi?", "prompt_messages": [{"role": "user", "content": "Hi?"}]},
        {"prompt": "Q"},
    ]
    got = P.render_prompts(tok, rows, system_prompt="Default.", template="{question} Box it.", source="t")
    # own system replaces the default; the template only wraps the last user turn
    assert got[0] == (
        "<|system|>Own system.\n<|user|>First?\n<|assistant|>Yes.\n<|user|>What is 2+2? Box it.\n<|assistant|>"
    )
    assert got[1] == "<|system|>Default.\n<|user|>Hi? Box it.\n<|assistant|>"
    assert got[2] == P.build_chat_prompt(tok, "Q", system_prompt="Default.", template="{question} Box it.")
    assert got[1] == got[2].replace("Q Box", "Hi? Box")  # a one-turn conversation renders as its question
    # without a chat template: the contents joined by blank lines, as for a plain question
    plain = P.render_prompts(_tokenizer(), rows[:2], system_prompt="Default.", template="{question}", source="t")
    assert plain == ["Own system.\n\nFirst?\n\nYes.\n\nWhat is 2+2?", "Default.\n\nHi?"]
    assert CONVO[3]["content"] == "What is 2+2?"  # the input is not modified


@pytest.mark.parametrize(
    "prompt, says",
    [
        ([], "an empty list of messages"),
        (["hello"], "message 0 is a str, expected a dict"),
        ({"role": "user", "content": "x"}, "expected a question \\(text\\) or a list of .* messages, got a dict"),
        ([{"role": "user"}], "message 0 has no content"),
        ([{"content": "x"}], "message 0 has no role"),
        ([{"role": "human", "content": "x"}], "message 0 has role 'human'"),
        ([{"role": "user", "content": ["x"]}], "message 0 \\(user\\) has content of type list"),
        ([{"role": "user", "content": "x"}, {"role": "system", "content": "s"}], "message 1 is a system message"),
        ([{"role": "system", "content": "s"}], "no user message"),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
            "the last message has role 'assistant'",
        ),
    ],
)
def test_malformed_messages_name_file_row_and_field(tmp_path, prompt, says):
    path = _jsonl(tmp_path, [{"question": "fine", "answer": "1"}, {"question": prompt, "answer": "1"}])
    with pytest.raises(ValueError, match=f"^{re.escape(path)}: row 1, field 'question': {says}") as e:
        load_rows(path)
    assert "\n" not in str(e.value)


def test_check_messages_accepts_numpy_lists():
    np = pytest.importorskip("numpy")
    arr = np.array([{"role": "user", "content": "x"}], dtype=object)
    assert P.check_messages(arr, "w") == [{"role": "user", "content": "x"}]


def test_training_eval_and_sft_render_a_conversation_alike(tmp_path):
    from grpokit.models.loading import encode_prompts
    from grpokit.trainer.sft import encode_rows

    tok = _tokenizer(TEMPLATE)
    tok.eos_token = "[UNK]"
    path = _jsonl(tmp_path, [{"prompt": CONVO, "answer": "4"}])
    recipe = recipe_from_dict(
        {"data": {"dataset": path, "system_prompt": "Default.", "prompt_template": "{question} Box it."}}
    )
    rows, prompts, _ = load_prompts(recipe, tok, dataset=path, split="train", limit=None)  # training
    _, eval_prompts, _ = load_prompts(recipe, tok, dataset=path, split="train", limit=None, section="eval")
    want = "<|system|>Own system.\n<|user|>First?\n<|assistant|>Yes.\n<|user|>What is 2+2? Box it.\n<|assistant|>"
    assert prompts == eval_prompts == [want]
    enc = encode_rows(
        tok, [{**rows[0], "completion": "4"}], prompt_template="{question} Box it.", system_prompt="Default."
    )
    p = encode_prompts(tok, [want])[0]
    assert enc[0]["input_ids"][: len(p)] == list(p)


# -- item 9: a chat template without a system role ----------------------------------------------


def test_system_prompt_is_folded_into_the_first_user_turn(tmp_path, capsys):
    tok = _tokenizer(NO_SYSTEM_TEMPLATE, name="org/gemma-like")
    path = _jsonl(tmp_path, [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": CONVO, "answer": "4"}])
    recipe = recipe_from_dict({"data": {"dataset": path, "system_prompt": "Be brief."}})
    _, prompts, _ = load_prompts(recipe, tok, dataset=path, split="train", limit=None)
    assert prompts == [
        "<user>Be brief.\n\nWhat is 2+2?\n<assistant>",
        "<user>Own system.\n\nFirst?\n<assistant>Yes.\n<user>What is 2+2?\n<assistant>",
    ]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "org/gemma-like" in err[0] and "data.system_prompt and the rows' system messages" in err[0]
    # no system text: nothing folded, nothing said
    recipe.data.system_prompt = None
    _, prompts, _ = load_prompts(recipe, tok, dataset=path, split="train", limit=1)
    assert prompts == ["<user>What is 2+2?\n<assistant>"] and capsys.readouterr().err == ""


def test_a_template_refusing_a_row_is_one_line_naming_it(tmp_path):
    strict = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ raise_exception('no assistant') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    tok = _tokenizer(strict, name="org/strict")
    path = _jsonl(tmp_path, [{"prompt": "fine", "answer": "1"}, {"prompt": CONVO[1:], "answer": "1"}])
    recipe = recipe_from_dict({"data": {"dataset": path}})
    with pytest.raises(
        ValueError,
        match=r"^data: .*convo.jsonl: row 1 \('What is 2\+2\?'\): the chat "
        r"template of org/strict refuses its messages: no assistant$",
    ):
        load_prompts(recipe, tok, dataset=path, split="train", limit=None)


def test_messages_name_a_split_only_where_one_is_read(tmp_path):
    """Local files and reasoning_gym ignore ``split``: their messages name the dataset alone."""
    from grpokit.data import dataset_label

    f = tmp_path / "qa.jsonl"
    f.write_text('{"question": "1+1", "answer": "2"}\n')
    assert dataset_label(str(f), "singleop") == str(f)
    assert dataset_label("./missing.csv", "test") == "./missing.csv"
    assert dataset_label("reasoning_gym:basic_arithmetic", "singleop") == "reasoning_gym:basic_arithmetic"
    assert dataset_label("mawps", "singleop") == "mawps/singleop"
    assert dataset_label("hf:org/name", "train") == "hf:org/name/train"
    assert dataset_label("gsm8k", "test") == "gsm8k/test"


# -- tool schemas (rollout.env's tool_schemas) in the chat template --------------------------------

TOOLS_TEMPLATE = (
    "{% if tools %}<|tools|>{% for t in tools %}{{ t['function']['name'] }} {% endfor %}\n{% endif %}" + TEMPLATE
)


def test_training_eval_and_sft_show_the_environments_tools(tmp_path, capsys):
    from grpokit.data.rows import prompt_tools
    from grpokit.models.loading import encode_prompts
    from grpokit.trainer.sft import encode_rows

    path = _jsonl(tmp_path, [{"prompt": "What is 2+2?", "answer": "4"}])
    raw = {
        "data": {"dataset": path},
        "rollout": {"env": "tools", "env_options": {"tools": ["calculator"], "call_format": "json"}},
    }
    recipe = recipe_from_dict(raw)
    (spec,) = prompt_tools(recipe)
    assert spec["function"]["name"] == "calculator"
    tok = _tokenizer(TOOLS_TEMPLATE)
    tok.eos_token = "[UNK]"
    rows, prompts, _ = load_prompts(recipe, tok, dataset=path, split="train", limit=None)
    _, eval_prompts, _ = load_prompts(recipe, tok, dataset=path, split="train", limit=None, section="eval")
    want = "<|tools|>calculator <|user|>What is 2+2?\n<|assistant|>"  # trim_blocks ate the newline
    assert prompts == eval_prompts == [want] and capsys.readouterr().err == ""
    enc = encode_rows(tok, [{**rows[0], "completion": "4"}], prompt_template="{question}", tools=[spec])
    assert len(enc[0]["input_ids"]) == len(encode_prompts(tok, [want])[0]) + 2  # prompt, "4", EOS
    # a template that ignores tools: the prompts as without them, and one line saying so
    plain = _tokenizer(TEMPLATE, name="org/no-tools")
    _, prompts, _ = load_prompts(recipe, plain, dataset=path, split="train", limit=None)
    assert prompts == ["<|user|>What is 2+2?\n<|assistant|>"]
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "org/no-tools does not show tools" in line
    # no environment, the tags format, or schemas_in_prompt: false: no tools
    for env in (None, "tools"):
        assert prompt_tools(recipe_from_dict({**raw, "rollout": {"env": env}})) is None
    off = {"tools": ["calculator"], "call_format": "json", "schemas_in_prompt": False}
    assert prompt_tools(recipe_from_dict({**raw, "rollout": {"env": "tools", "env_options": off}})) is None
