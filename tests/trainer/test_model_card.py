"""grpokit.trainer.model_card: the README.md of every checkpoint (and of ``grpokit export``'s output).

Pinned: the front matter parses as YAML and names the library (transformers, or peft for an adapter)
and the base model; the recipe block parses back to the recipe; the held-out numbers of the run
folder's ``eval_*.json`` appear (accuracy with its interval, correct/total); a tiny run's checkpoints
carry the card with the evaluations made so far; a write that fails before the rename leaves no card;
``grpokit export`` carries it, a merged export as a full model's.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml

from grpokit.cli.main import main
from grpokit.trainer.checkpoint import save_checkpoint
from grpokit.trainer.loop import train
from grpokit.trainer.model_card import merged_card, model_card, read_evals
from support.helpers import tiny_recipe


def front_matter(card: str) -> dict:
    """The card's YAML front matter (between the first two ``---`` lines)."""
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def recipe_block(card: str) -> dict:
    """The YAML of the card's ``Recipe`` section's fenced block."""
    m = re.search(r"## Recipe\n.*?\n```yaml\n(.*?)\n```\n", card, re.S)  # the first line that is ``` closes it
    assert m, card
    return yaml.safe_load(m.group(1))


def an_eval(when: str, correct: int, total: int, lo: float, hi: float, **extra) -> dict:
    """An ``eval_<when>.json`` as grpokit.eval.evaluate.save_eval writes it (the fields the card reads)."""
    metrics = {"greedy": {"value": correct / total, "lo": lo, "hi": hi, "interval": "wilson"}, **extra}
    return {
        "when": when,
        "accuracy": correct / total,
        "correct": correct,
        "total": total,
        "dataset": "gsm8k",
        "split": "test",
        "metrics": {"n_problems": total, "k": None, "confidence": 0.95, "metrics": metrics},
        "outcomes": [True] * correct + [False] * (total - correct),
    }


EVALS = [
    an_eval("before", 3, 40, 0.0259, 0.1989),
    an_eval("step10", 11, 40, 0.1613, 0.4226, **{"pass@4": {"value": 0.5, "lo": 0.35, "hi": 0.65}}),
]


def test_full_checkpoint_card(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, data={"dataset": "gsm8k", "split": "train"}).to_dict()
    recipe["data"]["prompt_template"] = "```\n{question}\n```"  # a recipe's backticks cannot close the block
    card = model_card(recipe, 10, EVALS, lora=False, num_prompts=7473)
    meta = front_matter(card)
    assert meta["library_name"] == "transformers" and meta["base_model"] == tiny_model_dir
    assert {"grpokit", "grpo"} <= set(meta["tags"]) and "lora" not in meta["tags"]
    assert meta["datasets"] == ["openai/gsm8k"]  # the hub dataset of the packaged gsm8k
    assert recipe_block(card) == recipe
    # the key settings, each with its recipe key: G, β, ε, learning rate, steps done of the max
    for row in (
        "| group size G (completions per prompt) | `rollout.group_size` | 2 |",
        "| β (KL coefficient) | `algo.beta` | 0.04 (k3 estimator) |",
        "| clip ε (low / high) | `algo.clip_eps_low / algo.clip_eps_high` | 0.2 / 0.2 |",
        "| learning rate | `train.learning_rate` | 0.01 (adamw, constant, 0 warm-up steps) |",
        "| steps done | `train.max_steps` | 10 of 2 |",
    ):
        assert row in card, row
    assert "- Training prompts: `gsm8k`, split `train` (`data.limit=8`)" in card
    assert "- 7473 training prompts" in card and "- 20 prompts sampled so far (10 steps × 2 prompts" in card
    # the held-out numbers: 3/40 = 0.075 with its Wilson interval, 11/40 = 0.275, and the sampled pass@4
    assert "| before training | `gsm8k/test` | 0.075 [0.026, 0.199] | 3/40 | - |" in card
    assert "| step 10 | `gsm8k/test` | 0.275 [0.161, 0.423] | 11/40 | pass@4 0.500 [0.350, 0.650] |" in card
    # loading: transformers, last
    load = card[card.index("## How to load") :]
    assert "AutoModelForCausalLM.from_pretrained(path)" in load and "peft" not in load
    assert card.rindex("\n## ") == card.index("\n## How to load")


def test_lora_checkpoint_card_and_its_merged_export_card(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, model={"lora": {"r": 4}}).to_dict()
    card = model_card(recipe, 2, EVALS[:1], lora=True)
    meta = front_matter(card)
    assert meta["library_name"] == "peft" and meta["base_model"] == tiny_model_dir
    assert {"grpokit", "grpo", "lora", f"base_model:adapter:{tiny_model_dir}"} <= set(meta["tags"])
    assert "datasets" not in meta  # packaged MAWPS: no hub name the card could give with certainty
    assert recipe_block(card) == recipe
    assert "| LoRA | `model.lora` | r=4, alpha=32, dropout=0.0 |" in card
    assert "| before training | `gsm8k/test` | 0.075 [0.026, 0.199] | 3/40 | - |" in card
    load = card[card.index("## How to load") :]
    assert "PeftModel.from_pretrained(base, path)" in load and f'from_pretrained("{tiny_model_dir}")' in load
    assert "grpokit export checkpoint-2 OUT --merge" in load
    # merged: a full model's front matter and loading, the rest (results, recipe) as the checkpoint's card
    merged = merged_card(card, recipe, 2)
    meta = front_matter(merged)
    assert meta["library_name"] == "transformers" and meta["base_model"] == tiny_model_dir
    assert "lora" not in meta["tags"] and not [t for t in meta["tags"] if t.startswith("base_model:")]
    assert "merged into the weights" in merged and recipe_block(merged) == recipe
    assert "| before training | `gsm8k/test` | 0.075 [0.026, 0.199] | 3/40 | - |" in merged
    load = merged[merged.index("## How to load") :]
    assert "AutoModelForCausalLM.from_pretrained(path)" in load and "peft" not in load


def test_read_evals_takes_the_run_folders_results_up_to_the_step(tmp_path):
    for e in [*EVALS, an_eval("step2", 1, 4, 0.0, 0.7), an_eval("step30", 9, 40, 0.1, 0.4)]:
        (tmp_path / f"eval_{e['when']}.json").write_text(json.dumps(e))
    (tmp_path / "eval_step5.json").write_text("{not json")  # a damaged file never stops a checkpoint
    (tmp_path / "eval_after.json").write_text(json.dumps({"accuracy": 0.5}))  # no correct/total: left out
    assert [e["when"] for e in read_evals(tmp_path, 10)] == ["before", "step2", "step10"]  # 2 < 10, not as text
    assert [e["when"] for e in read_evals(tmp_path)] == ["before", "step2", "step10", "step30"]
    assert read_evals(tmp_path / "absent", 3) == []
    assert "None yet" in model_card({}, 0, [], lora=False)


@pytest.mark.slow
def test_a_tiny_runs_checkpoints_carry_the_card_with_the_evaluations_so_far(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        data={"skip": 4, "limit": 8},
        train={"max_steps": 2, "save_steps": 1},
        eval={"dataset": "mawps", "split": "singleop", "limit": 2, "max_new_tokens": 2, "every_steps": 1},
    )
    train(recipe, progress=False)
    for step, whens in ((1, ["before", "step1"]), (2, ["before", "step1", "step2"])):
        card = (tmp_path / f"checkpoint-{step}" / "README.md").read_text()
        meta = front_matter(card)
        assert meta["library_name"] == "transformers" and meta["base_model"] == tiny_model_dir
        assert recipe_block(card) == json.loads((tmp_path / f"checkpoint-{step}" / "recipe.json").read_text())
        assert f"| steps done | `train.max_steps` | {step} of 2 |" in card
        assert "- 8 training prompts" in card
        for when in whens:  # each evaluation written before the checkpoint, with its numbers
            e = json.loads((tmp_path / f"eval_{when}.json").read_text())
            m = e["metrics"]["metrics"]["greedy"]
            label = "before training" if when == "before" else f"step {when[4:]}"
            interval = f"{m['value']:.3f} [{m['lo']:.3f}, {m['hi']:.3f}]"
            want = f"| {label} | `mawps/singleop` | {interval} | {e['correct']}/{e['total']} |"
            assert want in card, want
        assert "| step 2 |" not in card or step == 2
        # the evaluation after training, written after the last checkpoint, reaches its card
        assert ("| after training |" in card) == (step == 2)


def test_a_write_that_fails_before_the_rename_leaves_no_card(tmp_path, make_tiny_model, smollm2_tokenizer, monkeypatch):
    import grpokit.trainer.checkpoint

    model = make_tiny_model(vocab_size=64, pad_token_id=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    parts = dict(
        model=model,
        tokenizer=smollm2_tokenizer,
        optimizer=opt,
        scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0),
        trainer_state={"epoch": 0, "position": 0},
        recipe={"train": {"seed": 0}},
        keep=5,
    )
    assert (save_checkpoint(tmp_path, 1, **parts) / "README.md").is_file()  # a partial recipe: defaults fill in

    def fail(path):  # after every file (the card too) is in the temporary folder, before the rename
        assert (path / "README.md").is_file()
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(grpokit.trainer.checkpoint, "honour_umask", fail)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, **parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("README.md")] == ["checkpoint-1/README.md"]


@pytest.mark.slow
def test_export_carries_the_card(tiny_model_dir, tmp_path):
    """A full checkpoint's card is copied; a LoRA adapter's too; ``--merge`` writes a full model's card."""
    train(tiny_recipe(tiny_model_dir, tmp_path / "full", train={"max_steps": 1}, algo={"beta": 0.0}), progress=False)
    ckpt = tmp_path / "full" / "checkpoint-1"
    assert main(["export", str(ckpt), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "README.md").read_text() == (ckpt / "README.md").read_text()

    pytest.importorskip("peft")
    lora = tiny_recipe(tiny_model_dir, tmp_path / "lora", train={"max_steps": 1}, model={"lora": {"r": 4, "alpha": 8}})
    train(lora, progress=False)
    ckpt = tmp_path / "lora" / "checkpoint-1"
    assert front_matter((ckpt / "README.md").read_text())["library_name"] == "peft"
    assert main(["export", str(ckpt), str(tmp_path / "adapter")]) == 0
    assert (tmp_path / "adapter" / "README.md").read_text() == (ckpt / "README.md").read_text()
    assert main(["export", str(ckpt), str(tmp_path / "merged"), "--merge"]) == 0
    card = (tmp_path / "merged" / "README.md").read_text()
    assert front_matter(card)["library_name"] == "transformers" and "grpokit export --merge" in card
    assert recipe_block(card) == json.loads((ckpt / "recipe.json").read_text())
    (ckpt / "README.md").unlink()  # a checkpoint of an earlier grpokit: the card is made from recipe.json
    assert main(["export", str(ckpt), str(tmp_path / "merged2"), "--merge"]) == 0
    card = (tmp_path / "merged2" / "README.md").read_text()
    assert front_matter(card)["library_name"] == "transformers" and "merged into the weights" in card


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {"dataset": "obj:data-rows-0123456789", "split": "singleop", "limit": None},
            "- Training prompts: rows given from Python (`Trainer(rows=...)`, content hash `0123456789`)\n",
        ),
        (
            {"dataset": "reasoning_gym:basic_arithmetic", "split": "singleop", "limit": None},
            "- Training prompts: `reasoning_gym:basic_arithmetic`\n",
        ),
        (
            {"dataset": "data/train.jsonl", "split": "singleop", "limit": None},
            "- Training prompts: `data/train.jsonl`\n",
        ),
        ({"dataset": "gsm8k", "split": "train", "limit": None}, "- Training prompts: `gsm8k`, split `train`\n"),
    ],
)
def test_the_data_line_names_what_was_trained_on_as_the_user_gave_it(tiny_model_dir, tmp_path, data, line):
    """No split for sources that read none (Python rows, reasoning_gym, a local file), and rows from
    Python said so, not by their internal ``obj:`` name."""
    recipe = tiny_recipe(tiny_model_dir, tmp_path).to_dict()
    recipe["data"].update(data)
    card = model_card(recipe, 1, [], lora=False)
    assert line in card, card[card.index("## Data") :][:300]
    assert "obj:" not in card[card.index("## Data") : card.index("## Recipe")]
