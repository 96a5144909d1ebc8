"""Step segmentation and step-end token mapping (grpokit.process.steps), on the real SmolLM2 tokenizer."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.process.steps import (
    _char_ends_slow,
    scatter_step_rewards,
    split_steps,
    step_end_masks,
    step_texts,
    step_token_ends,
    token_char_ends,
)

EOS = 2  # SmolLM2 <|im_end|>


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


# ---- split_steps ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, rule, pieces",
    [
        ("a\nb\nc", "lines", ["a\n", "b\n", "c"]),
        ("  a\n\n\nb\n", "lines", ["  a\n\n\n", "b\n"]),  # leading space -> step 1; blanks -> previous
        ("\n\n  a\n  b", "lines", ["\n\n  a\n", "  b"]),  # indentation starts the next step
        ("a\n \t\nb", "lines", ["a\n \t\n", "b"]),  # whitespace-only line is blank
        ("a\r\nb", "lines", ["a\r\n", "b"]),
        ("one line, no break", "lines", ["one line, no break"]),
        ("   \n  ", "lines", ["   \n  "]),  # whitespace only: one step
        ("", "lines", []),
        ("a\nb\n\nc\n\n\nd", "paragraphs", ["a\nb\n\n", "c\n\n\n", "d"]),
        ("Step 1: x. Step 2: y. Step 3: z", r"regex:Step \d+:", ["Step 1: x. ", "Step 2: y. ", "Step 3: z"]),
        ("intro Step 1: x", r"regex:Step \d+:", ["intro ", "Step 1: x"]),
        ("  Step 1: x", r"regex:Step \d+:", ["  Step 1: x"]),
        ("x ки\ny ки\n", "tag:ки", ["x ки\n", "y ки\n"]),
        ("x ки y", "tag:ки", ["x ки ", "y"]),
        ("no tag", "tag:ки", ["no tag"]),
    ],
)
def test_split_steps_table(text, rule, pieces):
    spans = split_steps(text, rule)
    assert step_texts(text, spans) == pieces


@pytest.mark.parametrize("rule", ["lines", "paragraphs", "regex:[.!?] ", "tag:\n", "tag:ки"])
def test_split_steps_covers_text_contiguously(rule):
    texts = ["", " ", "a", "\n\nx\n\n", "é∑ 😀\n\nb ки c\n d. e! f", "Step 1: 1+1=2.\nStep 2: ok ки\n\n"]
    for text in texts:
        spans = split_steps(text, rule)
        assert (spans == []) == (text == "")
        if spans:
            assert spans[0][0] == 0 and spans[-1][1] == len(text)
            assert all(spans[k][1] == spans[k + 1][0] for k in range(len(spans) - 1))
            assert all(s < e for s, e in spans)
            assert all(text[s:e].strip() for s, e in spans[1:])  # only step 1 may be blank


@pytest.mark.parametrize("rule", ["sentences", "regex:(", "tag:"])
def test_split_steps_bad_rule(rule):
    with pytest.raises(ValueError, match="split_steps"):
        split_steps("a\nb", rule)


# ---- token offsets ---------------------------------------------------------------------------------
TEXTS = [
    "  Step 1: 48/2 = 24\n\nStep 2: 3 × 4 = 12\n",
    "no break at all",
    "é∑ 😀 a\nb 😀\n😀",  # emoji split over several byte tokens
    "a\n    b\n  c",  # tokens "\n   " straddle the line boundaries
    "Done.)\n\n  Next step\n\n",
    "x ки\ny ки",
    "日本語のテキスト\n次の行",
]


def _clean_len(s: str, text: str | None = None) -> int:
    """Characters of ``s`` (a prefix decode) that are final: no trailing U+FFFD, agreeing with text."""
    s = s.rstrip("\ufffd")
    k = 0
    while text is not None and k < min(len(s), len(text)) and s[k] == text[k]:
        k += 1
    return len(s) if text is None else k


@pytest.mark.parametrize("text", TEXTS)
def test_token_char_ends_match_prefix_decodes(tok, text):
    ids = tok.encode(text, add_special_tokens=False) + [EOS]
    decoded, ends = token_char_ends(ids, tok)
    assert decoded == text
    assert len(ends) == len(ids) and ends[-1] == len(text)
    assert all(a <= b for a, b in zip(ends, ends[1:]))
    for i in range(len(ids)):  # slow reference: decode every prefix
        prefix = tok.decode(ids[: i + 1], skip_special_tokens=True)
        assert ends[i] == _clean_len(prefix, text)
    assert _char_ends_slow(ids, tok, text) == ends  # the fallback path agrees


# ---- step_token_ends ---------------------------------------------------------------------------------
def _check_step_ends(tok, ids, ends, spans, text):
    """Properties of the mapping, checked with plain prefix decodes (independent of the code)."""
    n = len(ids)
    clean = [_clean_len(tok.decode(ids[: i + 1], skip_special_tokens=True)) for i in range(n)]
    assert ends == sorted(set(ends)) and ends[-1] == n - 1
    assert len(spans) == len(ends) and spans[0][0] == 0 and spans[-1][1] == len(text)
    for k, ((s, e), t) in enumerate(zip(spans, ends)):
        if k == len(ends) - 1:
            break
        assert clean[t] <= e  # the step-end token does not reach into the next step
        assert clean[t] > s  # the step owns characters of a token ending inside it
        nxt = next(i for i in range(t + 1, n) if clean[i] > clean[t])
        assert clean[nxt] > e  # the next token producing characters ends in a later step


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("rule", ["lines", "paragraphs", "tag:ки", r"regex:\s"])
def test_step_token_ends_properties(tok, text, rule):
    ids = tok.encode(text, add_special_tokens=False) + [EOS]
    ends, spans, decoded = step_token_ends(ids, len(ids), None, tok, rule=rule)
    assert decoded == text
    _check_step_ends(tok, ids, ends, spans, text)


def test_step_token_ends_by_hand(tok):
    text = "  Step 1: 48/2 = 24\n\nStep 2: 3 × 4 = 12\n"
    ids = tok.encode(text, add_special_tokens=False) + [EOS]
    ends, spans, _ = step_token_ends(ids, len(ids), None, tok)
    # tokens: ' ', ' Step', ..., '4', '\n', '\n', 'Step', ..., '\n', EOS
    assert tok.decode(ids[: ends[0] + 1]) == "  Step 1: 48/2 = 24\n\n"
    assert ends[1] == len(ids) - 1  # the last step ends at the EOS
    assert step_texts(text, spans) == ["  Step 1: 48/2 = 24\n\n", "Step 2: 3 × 4 = 12\n"]


def test_straddling_token_goes_to_the_step_it_ends_in(tok):
    text = "a\n    b"
    ids = tok.encode(text, add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == ["a", "\n   ", " b"]  # "\n   " straddles the boundary
    ends, spans, _ = step_token_ends(ids, len(ids), split_steps(text), tok)
    assert ends == [0, 2] and spans == [(0, 2), (2, 7)]


def test_partial_utf8_tokens_go_with_the_character(tok):
    text = "é∑ 😀 a\nb 😀\n😀"
    ids = tok.encode(text, add_special_tokens=False) + [EOS]
    ends, spans, _ = step_token_ends(ids, len(ids), None, tok)
    assert step_texts(text, spans) == ["é∑ 😀 a\n", "b 😀\n", "😀"]
    assert [tok.decode(ids[: e + 1], skip_special_tokens=True) for e in ends] == [
        "é∑ 😀 a\n",
        "é∑ 😀 a\nb 😀\n",
        text,
    ]


def test_step_without_own_token_is_merged(tok):
    text = "Step one Step two"  # "regex:tep" cuts inside the token "Step": step "S" owns no token
    ids = tok.encode(text, add_special_tokens=False)
    spans = split_steps(text, "regex:tep")
    assert step_texts(text, spans) == ["S", "tep one S", "tep two"]
    ends, merged, _ = step_token_ends(ids, len(ids), spans, tok)
    assert step_texts(text, merged) == ["Step one S", "tep two"]
    assert len(ends) == 2 and ends[-1] == len(ids) - 1


def test_empty_and_eos_only(tok):
    assert step_token_ends([EOS, 7, 7], 0, None, tok) == ([], [], "")
    assert step_token_ends([EOS, 7, 7], 1, None, tok) == ([0], [(0, 0)], "")


def test_step_token_ends_errors(tok):
    ids = tok.encode("a\nb", add_special_tokens=False)
    with pytest.raises(ValueError, match="not the decode"):
        step_token_ends(ids, len(ids), None, tok, text="a\nc")
    with pytest.raises(ValueError, match="contiguously"):
        step_token_ends(ids, len(ids), [(0, 1)], tok)
    with pytest.raises(ValueError, match="num_tokens"):
        step_token_ends(ids, len(ids) + 1, None, tok)


# ---- batched -------------------------------------------------------------------------------------
def test_step_end_masks_batch_equals_rows(tok):
    texts = ["Step 1: 2 + 2 = 4\nStep 2: 4 × 3 = 12\nAnswer: 12", "one step", "a\n    b\n\nc d"]
    rows = [tok.encode(t, add_special_tokens=False) + [EOS] for t in texts]
    t_max = max(map(len, rows)) + 3
    ids = torch.full((len(rows), t_max), EOS, dtype=torch.long)  # pad == eos on purpose
    mask = torch.zeros(len(rows), t_max, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    ends_mask, spans = step_end_masks(ids, mask, texts, "lines", tok)
    assert ends_mask.shape == (3, t_max) and ends_mask.dtype == torch.bool
    assert not (ends_mask & ~mask).any()
    for i, r in enumerate(rows):
        ends, sp, _ = step_token_ends(r, len(r), None, tok)
        assert ends_mask[i].nonzero().flatten().tolist() == ends and spans[i] == sp
        assert ends_mask[i, len(r) - 1]  # the last step ends at the EOS
    assert ends_mask.sum(1).tolist() == [3, 1, 3]
    assert step_end_masks(ids, mask, None, "lines", tok)[0].equal(ends_mask)


def test_step_end_masks_errors(tok):
    ids = torch.tensor([[5, 6, EOS]])
    with pytest.raises(ValueError, match="prefix"):
        step_end_masks(ids, torch.tensor([[True, False, True]]), None, "lines", tok)
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        step_end_masks(ids, torch.ones(1, 2, dtype=torch.bool), None, "lines", tok)
    with pytest.raises(ValueError, match="not the decode"):
        step_end_masks(ids, torch.ones(1, 3, dtype=torch.bool), ["zz"], "lines", tok)


# ---- scatter_step_rewards ------------------------------------------------------------------------------
def test_scatter_step_rewards():
    mask = torch.tensor([[False, True, False, True], [True, False, False, False], [False] * 4])
    r, k = scatter_step_rewards([[0.25, None], [1.0], []], mask)
    assert k.tolist() == [2, 1, 0] and r.dtype == torch.float32
    assert r[0, 1].item() == 0.25 and math.isnan(r[0, 3].item()) and r[1, 0].item() == 1.0
    assert r[~mask].eq(0).all()
    with pytest.raises(ValueError, match="row 1 has 2 scores but 1 steps"):
        scatter_step_rewards([[0.0, 0.0], [1.0, 1.0], []], mask)
    with pytest.raises(ValueError, match="score rows"):
        scatter_step_rewards([[0.0, 0.0]], mask)


def test_scatter_step_rewards_unscorable_and_malformed_rows():
    """A None row (the guard's ``rewards.on_error=none`` for a row whose process reward failed) is
    NaN at every step; a row that is no list of scores is a ValueError naming the row."""
    mask = torch.tensor([[False, True, False, True], [True, False, False, False], [False] * 4])
    r, k = scatter_step_rewards([None, [1.0], None], mask)
    assert k.tolist() == [2, 1, 0]
    assert torch.isnan(r[0, [1, 3]]).all() and r[1, 0].item() == 1.0
    assert r[~mask].eq(0).all()
    r, _ = scatter_step_rewards([torch.tensor([0.5, 0.25]), (1.0,), []], mask)  # any sized rows
    assert r[mask].tolist() == [0.5, 0.25, 1.0]
    with pytest.raises(ValueError, match=r"row 1 is float 0.5, expected a list of 1 step scores or None"):
        scatter_step_rewards([None, 0.5, []], mask)
    with pytest.raises(ValueError, match=r"row 0 is str"):
        scatter_step_rewards(["ab", [1.0], []], mask)
    with pytest.raises(ValueError, match=r"row 0, step 1: score 'x' is not a number"):
        scatter_step_rewards([[1.0, "x"], [1.0], []], mask)


def test_pipeline_ids_to_step_rewards(tok):
    """ids -> step_end_masks -> step_texts -> a process reward fn -> scatter_step_rewards."""
    from grpokit.process.verifier import arithmetic_step_rewards

    texts = ["2 + 2 = 4\n4 * 3 = 13\nAnswer: 13", "2 + 2 = 4\nAnswer: 4"]
    rows = [tok.encode(t, add_special_tokens=False) + [EOS] for t in texts]
    ids = torch.full((2, 30), EOS, dtype=torch.long)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), True
    ends, spans = step_end_masks(ids, mask, texts, "lines", tok)
    steps = [step_texts(t, s) for t, s in zip(texts, spans)]
    scores = arithmetic_step_rewards(["q", "q"], texts, steps, answer=[None, "4"])
    assert scores == [[1.0, 0.0, 0.0], [1.0, 1.0]]
    rewards, counts = scatter_step_rewards(scores, ends)
    assert counts.tolist() == [3, 2]
    assert rewards[ends].tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert rewards[0, len(rows[0]) - 1] == 0.0 and rewards[1, len(rows[1]) - 1] == 1.0
