"""Exactly one BOS in front of every prompt when the model's tokenizer adds one (issue: a
tokenizer that adds a BOS, with no chat template, got prompts without it)."""

from __future__ import annotations

import pytest
import torch

from grpokit.data import filter_by_prompt_length
from grpokit.models.loading import bos_prefix, encode_prompts
from grpokit.rollout import SamplingParams, generate_rollouts

WORDS = ["[PAD]", "<s>", "</s>", "a", "b", "c", "d"]


def _word_tokenizer(add_bos: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[PAD]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if add_bos:  # as Llama/Mistral tokenizers do with add_special_tokens=True
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="[PAD]", unk_token="[PAD]"
    )


@pytest.fixture(scope="module")
def bos_tok():
    return _word_tokenizer(add_bos=True)


def test_bos_prefix_follows_what_the_tokenizer_adds(bos_tok, smollm2_tokenizer):
    assert bos_prefix(bos_tok) == [1]
    assert bos_prefix(_word_tokenizer(add_bos=False)) == []
    # SmolLM2's bos (<|im_start|>, 1) is written by its chat template, never added by the tokenizer
    assert bos_prefix(smollm2_tokenizer) == []


def test_encode_prompts_gives_exactly_one_bos(bos_tok, smollm2_tokenizer, smollm2_prompts):
    assert encode_prompts(bos_tok, ["a b c", "<s> a b", "d"]) == [[1, 3, 4, 5], [1, 3, 4], [1, 6]]
    assert encode_prompts(_word_tokenizer(add_bos=False), ["a b c"]) == [[3, 4, 5]]
    # a chat template that writes the special tokens: ids unchanged
    plain = smollm2_tokenizer(smollm2_prompts, add_special_tokens=False)["input_ids"]
    assert encode_prompts(smollm2_tokenizer, smollm2_prompts) == plain


def test_generation_and_scoring_ids_start_with_one_bos(bos_tok, tiny_model_v64):
    prompts = ["a b c", "<s> d"]
    r = generate_rollouts(
        tiny_model_v64,
        bos_tok,
        prompts,
        2,
        SamplingParams(temperature=1.0, max_new_tokens=3),
        eos_token_ids=[2],
        seed=0,
    )
    rows = [ids[m].tolist() for ids, m in zip(r.prompt_ids, r.prompt_mask)]  # what scoring feeds too
    assert rows == [[1, 3, 4, 5]] * 2 + [[1, 6]] * 2
    assert r.prompt_ids[2:, 0].tolist() == [0, 0]  # left padding, then the BOS
    assert r.prompt_mask.dtype == torch.bool


def test_prompt_length_filter_counts_the_bos(bos_tok):
    # "a b c" is 3 words + the BOS = 4 tokens
    assert filter_by_prompt_length(["a b c", "d"], bos_tok, 3) == ([1], 1)
    assert filter_by_prompt_length(["a b c", "d"], bos_tok, 4) == ([0, 1], 0)
