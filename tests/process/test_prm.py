"""Learned PRM wrappers (grpokit.process.prm): wiring checked against a manual forward pass.

Tiny random Llama models (initializer_range 0.5 so that probabilities spread over (0, 1) and a
wrong position would be caught) with the real SmolLM2 tokenizer.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForTokenClassification

from grpokit.process.prm import ClassificationPRM, TokenProbPRM

PROMPTS = ["What is 2 + 3?", "Natalia sold 48 clips in April and half as many in May. Total?"]
STEPS = [
    ["  2 + 3 = 5\n\n", "The answer is 5."],
    ["In May: 48/2 = 24\n", "Total: 48 + 24 = 72 ки\n", "Answer: 72"],  # a step already tagged
]
LONG = (["Let me think about this problem step by step, slowly and carefully. " * 4] * 3, "Q" * 40)


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture
def lm(make_tiny_model):
    return make_tiny_model(initializer_range=0.5)


@pytest.fixture(scope="module")
def classifier():
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        num_labels=2,
        initializer_range=0.5,
        pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForTokenClassification(cfg).eval()


def _manual_row(tok, prompt, steps, tag_ids, suffix, tag_text):
    """The documented layout, rebuilt here: prompt + "\\n", then per step: stripped text, tag, suffix."""
    ids = tok.encode(prompt.rstrip() + "\n", add_special_tokens=True)
    positions = []
    for s in steps:
        s = s.strip()
        if s.endswith(tag_text):
            s = s[: -len(tag_text)].rstrip()
        ids += tok.encode(s, add_special_tokens=False) + tag_ids
        positions.append(len(ids) - 1)
        ids += tok.encode(suffix, add_special_tokens=False) if suffix else []
    return ids, positions


def test_token_prob_prm_matches_manual(tok, lm):
    prm = TokenProbPRM(lm, tok, "ки", "+", "-", batch_size=8)
    tag_ids = tok.encode("ки", add_special_tokens=False)
    assert len(tag_ids) == 2  # multi-token tag: read at its last token
    good, bad = tok.encode("+", add_special_tokens=False)[0], tok.encode("-", add_special_tokens=False)[0]
    scores = prm(PROMPTS, ["".join(s) for s in STEPS], STEPS)
    assert [len(s) for s in scores] == [len(s) for s in STEPS]
    for prompt, steps, got in zip(PROMPTS, STEPS, scores):
        ids, pos = _manual_row(tok, prompt, steps, tag_ids, "\n", "ки")
        assert prm.build(prompt, steps) == (ids, pos)
        assert all(ids[p] == tag_ids[-1] for p in pos)
        with torch.no_grad():
            logits = lm(torch.tensor([ids])).logits[0].float()  # (L, V)
        want = torch.softmax(logits[pos][:, [good, bad]], dim=-1)[:, 0]
        torch.testing.assert_close(torch.tensor(got), want)
        shifted = torch.softmax(logits[[p - 1 for p in pos]][:, [good, bad]], dim=-1)[:, 0]
        assert (torch.tensor(got) - shifted).abs().max() > 1e-3  # the position matters
    flat = [x for row in scores for x in row]
    assert all(0.0 < x < 1.0 for x in flat) and max(flat) - min(flat) > 0.1


def test_classification_prm_matches_manual(tok, classifier):
    sep = 1  # "<|im_start|>" as an id (a single special token)
    prm = ClassificationPRM(classifier, tok, sep, positive_label=1)
    scores = prm(PROMPTS, [""] * 2, STEPS)
    for prompt, steps, got in zip(PROMPTS, STEPS, scores):
        ids, pos = _manual_row(tok, prompt, steps, [sep], "", "\x00")
        assert prm.build(prompt, steps) == (ids, pos)
        with torch.no_grad():
            logits = classifier(torch.tensor([ids])).logits[0].float()  # (L, 2)
        torch.testing.assert_close(torch.tensor(got), torch.softmax(logits[pos], dim=-1)[:, 1])
    neg = ClassificationPRM(classifier, tok, "<|im_start|>", positive_label=0)(PROMPTS, [""] * 2, STEPS)
    for a, b in zip(scores, neg):
        torch.testing.assert_close(torch.tensor(a) + torch.tensor(b), torch.ones(len(a)))


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", ["token_prob", "classification"])
def test_padding_invariance(tok, lm, classifier, side, kind):
    def make(batch_size):
        if kind == "token_prob":
            return TokenProbPRM(lm, tok, "ки", "+", "-", batch_size=batch_size, padding_side=side)
        return ClassificationPRM(classifier, tok, "<|im_start|>", batch_size=batch_size, padding_side=side)

    alone = make(1)([PROMPTS[0]], [""], [STEPS[0]])[0]
    prompts, steps = [LONG[1], PROMPTS[0], PROMPTS[1]], [LONG[0], STEPS[0], STEPS[1]]
    prm = make(8)
    assert len(prm.build(LONG[1], LONG[0])[0]) > 2 * len(prm.build(PROMPTS[0], STEPS[0])[0])  # padded
    batched = prm(prompts, [""] * 3, steps)
    torch.testing.assert_close(torch.tensor(batched[1]), torch.tensor(alone))
    one_by_one = make(1)(prompts, [""] * 3, steps)
    for a, b in zip(batched, one_by_one):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b))


def test_max_length_and_empty_rows(tok, lm):
    prm = TokenProbPRM(lm, tok, "ки", "+", "-")
    full = prm(PROMPTS, [""] * 2, STEPS)
    ids, pos = prm.build(PROMPTS[1], STEPS[1])
    cut = TokenProbPRM(lm, tok, "ки", "+", "-", max_length=pos[1] + 1)
    got = cut(PROMPTS + ["q"], [""] * 3, STEPS + [[]])
    assert got[2] == []
    assert got[1][2] is None and got[1][:2] == pytest.approx(full[1][:2], abs=1e-5)
    assert prm([], [], []) == []


def test_errors(tok, lm, classifier):
    with pytest.raises(ValueError, match="step_tag '' is not in the tokenizer's vocabulary"):
        TokenProbPRM(lm, tok, "", "+", "-")
    with pytest.raises(ValueError, match="step_tag 10000000 is not in the tokenizer's vocabulary"):
        TokenProbPRM(lm, tok, 10_000_000, "+", "-")
    with pytest.raises(ValueError, match="good_token 'good job' must be a single token"):
        TokenProbPRM(lm, tok, "ки", "good job", "-")
    with pytest.raises(ValueError, match="padding_side"):
        TokenProbPRM(lm, tok, "ки", "+", "-", padding_side="middle")
    with pytest.raises(ValueError, match="1 prompts but 2 step lists"):
        TokenProbPRM(lm, tok, "ки", "+", "-")(PROMPTS[:1], [""], STEPS)
    with pytest.raises(ValueError, match="2 classes, positive_label=2"):
        ClassificationPRM(classifier, tok, 1, positive_label=2)(PROMPTS, [""] * 2, STEPS)
