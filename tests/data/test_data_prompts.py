"""build_chat_prompt / filter_by_prompt_length with a tiny in-memory tokenizer."""

import pytest

from grpokit.data import build_chat_prompt, filter_by_prompt_length

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_no_chat_template_returns_plain_text(tokenizer):
    assert tokenizer.chat_template is None
    assert build_chat_prompt(tokenizer, "What is 2+2?") == "What is 2+2?"
    out = build_chat_prompt(tokenizer, "Q", system_prompt="Be brief.", template="{question}\nThink.")
    assert out == "Be brief.\n\nQ\nThink."


def test_chat_template_applied(tokenizer):
    tokenizer.chat_template = TEMPLATE
    try:
        out = build_chat_prompt(
            tokenizer, "What is 2+2?", system_prompt="S", template="{question} Put it in \\boxed{{}}."
        )
    finally:
        tokenizer.chat_template = None
    assert out == "<|system|>S\n<|user|>What is 2+2? Put it in \\boxed{}.\n<|assistant|>"


def test_bad_template_is_clear(tokenizer):
    with pytest.raises(ValueError, match="only the field"):
        build_chat_prompt(tokenizer, "Q", template="{problem}")
    with pytest.raises(ValueError, match="only the field"):
        build_chat_prompt(tokenizer, "Q", template="\\boxed{} {question}")


def test_filter_by_prompt_length(tokenizer):
    prompts = ["a b c", "a", "a b c d e", "a b"]  # 3, 1, 5, 2 tokens
    assert filter_by_prompt_length(prompts, tokenizer, 3) == ([0, 1, 3], 1)
    assert filter_by_prompt_length(prompts, tokenizer, 5) == ([0, 1, 2, 3], 0)
    assert filter_by_prompt_length([], tokenizer, 5) == ([], 0)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        filter_by_prompt_length(prompts, tokenizer, 0)
