"""Outcome reward models (grpokit.rewards.rm): scores equal an independent forward pass at the last
real token, whatever the padding, batching, tokenizer or chat template."""

from __future__ import annotations

import pytest
import torch

from grpokit.rewards.rm import RewardModel, load_reward_model

PROMPTS = ["What is 2 + 3?", "Tom has 4 apples and eats one. How many are left?", "7 - 2?"]
COMPLETIONS = ["5", "He has 4 - 1 = 3 apples left. The answer is 3.", "It is five, I think"]


def make_rm(vocab_size=49152, num_labels=1, seed=0, pad_token_id=2):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=num_labels,
        pad_token_id=pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForSequenceClassification(cfg).eval()


def char_tokenizer():
    """A byte-level tokenizer unlike the policy's (vocab 259, no chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{chr(i): 3 + i for i in range(256)}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def reference(model, ids, label=0):
    """HF's own pooled score of one unpadded row (batch of 1: its last token is the last real one)."""
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, label])


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_scores_equal_single_row_forward_at_last_real_token(smollm2_tokenizer, padding_side):
    model = make_rm()
    rm = RewardModel(model, smollm2_tokenizer, batch_size=2, padding_side=padding_side)
    scores = rm(PROMPTS, COMPLETIONS)
    lengths = [len(rm.text_ids(p, c)) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert len(set(lengths)) == 3  # the batch really is padded
    want = [reference(model, rm.text_ids(p, c)) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scores == pytest.approx(want, abs=1e-5)
    assert len(set(round(s, 6) for s in scores)) == 3


def test_chat_template_is_applied_when_the_rm_has_one(smollm2_tokenizer):
    rm = RewardModel(make_rm(), smollm2_tokenizer)
    chat = [{"role": "user", "content": PROMPTS[1]}, {"role": "assistant", "content": COMPLETIONS[1]}]
    text = smollm2_tokenizer.apply_chat_template(chat, tokenize=False)
    assert rm.text_ids(PROMPTS[1], COMPLETIONS[1]) == smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert "<|im_start|>assistant" in text


def test_a_tokenizer_unlike_the_policys_rescores_the_text():
    tok = char_tokenizer()
    model = make_rm(vocab_size=len(tok), pad_token_id=0)
    rm = RewardModel(model, tok, batch_size=3, padding_side="right")
    ids = rm.text_ids(PROMPTS[0], COMPLETIONS[0])
    assert ids == tok.encode("What is 2 + 3?\n5", add_special_tokens=True)  # prompt + "\n" + completion
    want = [reference(model, rm.text_ids(p, c)) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert rm(PROMPTS, COMPLETIONS) == pytest.approx(want, abs=1e-5)


def test_label_normalize_and_max_length(smollm2_tokenizer):
    model = make_rm(num_labels=3)
    rm = RewardModel(model, smollm2_tokenizer, label=2)
    want = [reference(model, rm.text_ids(p, c), label=2) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert rm(PROMPTS, COMPLETIONS) == pytest.approx(want, abs=1e-5)

    norm = RewardModel(model, smollm2_tokenizer, label=2, normalize=True)(PROMPTS, COMPLETIONS)
    t = torch.tensor(want, dtype=torch.float64)
    assert norm == pytest.approx(((t - t.mean()) / t.std(unbiased=False)).tolist(), abs=1e-4)

    cut = RewardModel(model, smollm2_tokenizer, label=2, max_length=8)
    full = RewardModel(model, smollm2_tokenizer, label=2).text_ids(PROMPTS[1], COMPLETIONS[1])
    assert cut.text_ids(PROMPTS[1], COMPLETIONS[1]) == full[-8:]  # the end is what is scored
    assert cut(PROMPTS[1:2], COMPLETIONS[1:2]) == pytest.approx([reference(model, full[-8:], 2)], abs=1e-5)


def test_bad_models_and_labels_are_refused(smollm2_tokenizer, tiny_model):
    with pytest.raises(ValueError, match="LlamaForCausalLM.*sequence classifier"):
        RewardModel(tiny_model, smollm2_tokenizer)
    with pytest.raises(ValueError, match="label=1 but the head has 1 output"):
        RewardModel(make_rm(), smollm2_tokenizer, label=1)
    with pytest.raises(ValueError, match="rm:PATH_OR_HUB_NAME"):
        load_reward_model("rm:  ")
    with pytest.raises(ValueError, match=r"rm:/no/such/folder': no such local folder \(/no/such/folder\)"):
        load_reward_model("rm:/no/such/folder")


def test_load_reward_model_from_a_folder(tmp_path, smollm2_tokenizer):
    model = make_rm()
    model.save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    rm = load_reward_model(f"rm:{tmp_path}", batch_size=2)
    assert rm.__name__ == f"rm:{tmp_path}" and rm.isolation == "thread"
    assert not any(p.requires_grad for p in rm.base.model.parameters())
    want = [reference(model, rm.text_ids(p, c)) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert rm(PROMPTS, COMPLETIONS) == pytest.approx(want, abs=1e-5)
