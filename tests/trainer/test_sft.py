"""grpokit.trainer.sft / ``grpokit sft``: labels on completion tokens only, the loss Trainer minimizes,
held-out questions left out, the written model, and the errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpokit.cli.main import main
from grpokit.data import build_chat_prompt
from grpokit.data.packaged import asdiv_equation
from grpokit.models.loading import encode_prompts, load_model
from grpokit.trainer.sft import IGNORE_INDEX, collate, completion_rows, drop_heldout_questions, encode_rows, run_sft

TEMPLATE = "{question}\nAnswer with just the number."
ROWS = [
    {"prompt": "Tom has 3 apples and gets 4 more. How many apples?", "answer": "7", "equation": "3 + 4 = 7"},
    {"prompt": "Ann had 9 pens and lost 2. How many pens now?", "answer": "7", "equation": "9 - 2 = 7"},
    {"prompt": "5 boxes hold 6 eggs each. How many eggs?", "answer": "30", "equation": "5 * 6 = 30"},
    {"prompt": "12 cakes shared by 4 kids. How many each?", "answer": "3", "equation": "12 / 4 = 3"},
]


def test_asdiv_equation_spaces_plain_arithmetic_and_refuses_the_rest():
    assert asdiv_equation("8*4+2=34", "34") == "8 * 4 + 2 = 34"
    assert asdiv_equation("26-22+15=19", "19") == "26 - 22 + 15 = 19"
    assert asdiv_equation("(6+5)*2=22", "22") == "(6 + 5) * 2 = 22"
    assert asdiv_equation("7+2=9", "8") is None  # the result is not the answer
    assert asdiv_equation("99+99=198 cents", "198") is None  # units
    assert asdiv_equation("4+5=9 apples < 10 apples", "Yes") is None


def test_encode_rows_labels_only_the_completion_and_its_end(smollm2_tokenizer):
    tok = smollm2_tokenizer
    rows, skipped = completion_rows(ROWS, "{equation}")
    assert skipped == 0 and rows[0]["completion"] == "3 + 4 = 7"
    enc = encode_rows(tok, rows, prompt_template=TEMPLATE)
    for row, e in zip(rows, enc):
        prompt = encode_prompts(tok, [build_chat_prompt(tok, row["prompt"], template=TEMPLATE)])[0]
        completion = tok(row["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert e["input_ids"] == prompt + completion
        assert e["labels"] == [IGNORE_INDEX] * len(prompt) + completion
    assert tok.decode(enc[0]["input_ids"][-len(tok("3 + 4 = 7")["input_ids"]) - 1 :]) == "3 + 4 = 7<|im_end|>"


def test_collate_pads_right():
    batch = collate(
        [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}], pad_token_id=2
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 2, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]


def test_the_loss_is_the_mean_cross_entropy_over_completion_tokens(tiny_model, smollm2_tokenizer):
    tok = smollm2_tokenizer
    enc = encode_rows(tok, completion_rows(ROWS, "{equation}")[0], prompt_template=TEMPLATE)
    batch = collate(enc, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        loss = tiny_model(**batch).loss.item()
        total, count = 0.0, 0
        for e in enc:  # slow reference: token t is predicted from position t - 1, prompt tokens never
            logits = tiny_model(input_ids=torch.tensor([e["input_ids"]])).logits[0].double()
            for t, label in enumerate(e["labels"]):
                if label != IGNORE_INDEX:
                    total -= torch.log_softmax(logits[t - 1], -1)[label].item()
                    count += 1
    assert count == sum(len(tok(r["equation"], add_special_tokens=False)["input_ids"]) + 1 for r in ROWS)
    assert loss == pytest.approx(total / count, rel=1e-5)


def test_drop_heldout_questions_ignores_case_and_spaces():
    kept, dropped = drop_heldout_questions(ROWS, [{"prompt": "tom has 3 apples and gets 4 more . How many apples ?"}])
    assert dropped == 1 and [r["equation"] for r in kept] == ["9 - 2 = 7", "5 * 6 = 30", "12 / 4 = 3"]


def test_completion_rows_leaves_out_rows_without_the_field_and_refuses_a_template_nobody_has():
    rows, skipped = completion_rows([*ROWS, {"prompt": "q", "answer": "1", "equation": None}], "{equation}")
    assert (len(rows), skipped) == (4, 1)
    with pytest.raises(ValueError, match=r"\{solution\}.*answer.*equation.*prompt"):
        completion_rows(ROWS, "{solution}")


@pytest.mark.slow
def test_run_sft_learns_the_completions_and_writes_a_loadable_model(tiny_model_dir, smollm2_tokenizer, tmp_path):
    tok = smollm2_tokenizer
    enc = encode_rows(tok, completion_rows(ROWS, "{equation}")[0], prompt_template=TEMPLATE)
    batch = collate(enc, pad_token_id=tok.pad_token_id)
    model = load_model(tiny_model_dir).train()
    with torch.no_grad():
        before = model(**batch).loss.item()
    out = tmp_path / "sft"
    record = run_sft(model, tok, enc, out, max_steps=30, learning_rate=1e-2, batch_size=4, warmup_steps=2)
    assert record["steps"] == 30 and record["rows"] == 4 and len(record["losses"]) == 3
    assert json.loads((out / "sft_info.json").read_text())["steps"] == 30
    assert [p.name for p in tmp_path.iterdir()] == ["sft"]  # no temporary folder left
    reloaded = load_model(str(out))
    with torch.no_grad():
        after = reloaded(**batch).loss.item()
    assert math.log(tok.vocab_size) * 0.99 < before and after < before / 2
    with pytest.raises(FileExistsError, match="not empty"):
        run_sft(model, tok, enc, out, max_steps=1)


@pytest.mark.slow
def test_cli_sft_leaves_out_heldout_questions_and_names_bad_input(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    heldout = tmp_path / "held.jsonl"
    heldout.write_text(json.dumps({"question": ROWS[1]["prompt"].upper(), "answer": "7"}) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'eval:\n  dataset: {heldout}\n  limit: 10\ndata:\n  prompt_template: "{{question}} ="\n')
    out = tmp_path / "m"
    args = [
        "sft",
        tiny_model_dir,
        str(out),
        "--dataset",
        str(data),
        "--completion-template",
        "{equation}",
        "--heldout-of",
        str(recipe),
        "--max-steps",
        "2",
        "--batch-size",
        "2",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "3 rows" in printed and "1 held-out questions" in printed
    info = json.loads((out / "sft_info.json").read_text())
    assert info["heldout_left_out"] == 1 and info["prompt_template"] == "{question} =" and info["steps"] == 2
    assert main(args) == 1 and "not empty" in capsys.readouterr().err
    bad = ["sft", tiny_model_dir, str(tmp_path / "m2"), "--dataset", str(data), "--completion-template", "{sol}"]
    assert main(bad) == 1 and "{sol}" in capsys.readouterr().err
    assert main([*bad[:-1], "{equation}", "--learning-rate", "0"]) == 1
    assert "--learning-rate" in capsys.readouterr().err
