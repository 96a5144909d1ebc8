"""Faults of the loop found by trying other trainers' bug reports: the logged learning rate, steps
that train on nothing without a word, and prompts that do not fit the model's context."""

from __future__ import annotations

import warnings

import pytest
import torch

from grpokit.metrics import RunWarning, read_metrics
from grpokit.trainer.loop import train
from support.helpers import tiny_recipe


def _run(model_dir, out, **sections):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(tiny_recipe(model_dir, out, **sections), progress=False)
    return read_metrics(out / "metrics.jsonl"), [w for w in caught if issubclass(w.category, RunWarning)]


# -- the logged learning rate is the one each update used ------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "mu, warmup, expected",
    [
        # 3 warm-up updates of 3: factors (i+1)/(warmup+1) = 1/4, 2/4, 3/4 (the next step would use 1.0)
        (1, 3, [0.25, 0.5, 0.75]),
        # μ = 2 updates per step, 2 warm-up updates: step 1 uses 1/3 and 2/3 (mean 1/2), step 2 1 and 1
        (2, 2, [0.5, 1.0]),
    ],
)
def test_logged_lr_is_the_rate_the_update_used(tiny_model_dir, tmp_path, mu, warmup, expected):
    lr = 1e-2
    lines, _ = _run(
        tiny_model_dir,
        tmp_path,
        train={"max_steps": len(expected), "warmup_steps": warmup, "num_iterations": mu, "learning_rate": lr},
    )
    assert [m["lr"] for m in lines] == pytest.approx([f * lr for f in expected], rel=1e-12)


@pytest.mark.slow
def test_the_rate_the_optimizer_used_is_what_was_logged(tiny_model_dir, tmp_path, monkeypatch):
    used = []
    real = torch.optim.AdamW.step

    def spy(self, *a, **k):
        used.append(self.param_groups[0]["lr"])
        return real(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    lines, _ = _run(tiny_model_dir, tmp_path, train={"max_steps": 3, "warmup_steps": 2, "lr_scheduler": "linear"})
    assert [m["lr"] for m in lines] == used


# -- a step that carries no signal is said -----------------------------------------------------------


@pytest.mark.slow
def test_all_truncated_warns_naming_max_new_tokens(tiny_model_dir, tmp_path):
    # a random tiny model never samples EOS in 8 tokens: every completion is cut
    lines, said = _run(tiny_model_dir, tmp_path, train={"max_steps": 3})
    assert all(m["truncated_frac"] == 1.0 for m in lines)
    truncated = [str(w.message) for w in said if "max_new_tokens" in str(w.message)]
    # said on step 1, then at most once per 10 steps
    assert truncated == [
        "step 1: 100% of the completions reached rollout.max_new_tokens=8 without an EOS; "
        "raise rollout.max_new_tokens (or ask for shorter answers) so that rewards see "
        "whole answers"
    ]


@pytest.mark.slow
def test_constant_rewards_warn_no_learning_signal(tiny_model_dir, tmp_path):
    lines, said = _run(
        tiny_model_dir,
        tmp_path,
        rewards={"functions": ["support.fake_rewards:constant_reward"]},
        algo={"beta": 0.0},
        train={"max_steps": 2},
    )
    assert [m["frac_zero_std"] for m in lines] == [1.0, 1.0]
    assert [m["grad_norm"] for m in lines] == [0.0, 0.0]
    no_signal = [str(w.message) for w in said if "no learning signal" in str(w.message)]
    assert no_signal == [
        "step 1: no learning signal: every group's rewards were equal (frac_zero_std=1.00, "
        "unscorable_frac=0.00), so every advantage is 0 and the policy-gradient term of "
        "this update is zero (the optimizer step was skipped: zero gradient)"
    ]
    assert [m["zero_grad_updates"] for m in lines] == [1, 1]


@pytest.mark.slow
def test_all_unscorable_warns_no_learning_signal(tiny_model_dir, tmp_path):
    lines, said = _run(
        tiny_model_dir,
        tmp_path,
        rewards={"functions": ["support.fake_rewards:raising_reward"], "on_error": "none", "weights": [1.0]},
        train={"max_steps": 1},
    )
    texts = [str(w.message) for w in said]
    assert any("reward rows raised or timed out" in t for t in texts)
    assert lines[0]["reward_failures"] == 1


@pytest.mark.slow
def test_a_step_with_signal_says_nothing_of_it(tiny_model_dir, tmp_path):
    _, said = _run(tiny_model_dir, tmp_path, train={"max_steps": 1})
    assert not [w for w in said if "no learning signal" in str(w.message)]


# -- prompt + completion must fit the model's positions ----------------------------------------------


@pytest.fixture(scope="module")
def short_context_dir(tmp_path_factory, smollm2_tokenizer):
    """The tiny Llama of ``tiny_model_dir`` with 32 positions (MAWPS chat prompts are 56-71 tokens)."""
    from conftest import _make_tiny_model

    path = tmp_path_factory.mktemp("tiny_llama_32")
    _make_tiny_model(max_position_embeddings=32).save_pretrained(path, safe_serialization=True)
    smollm2_tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.slow
def test_prompts_that_cannot_fit_the_context_are_refused_before_training(short_context_dir, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"all 8 prompts of mawps/singleop are longer than 24 tokens, the most "
        r"that fits with rollout.max_new_tokens=8 and the model's 32 positions",
    ):
        train(tiny_recipe(short_context_dir, tmp_path), progress=False)
    assert not (tmp_path / "metrics.jsonl").exists()
    with pytest.raises(
        ValueError,
        match=r"rollout.max_new_tokens=40 leaves no room for a prompt: the model "
        r"has 32 positions",
    ):
        train(tiny_recipe(short_context_dir, tmp_path, rollout={"max_new_tokens": 40}), progress=False)


def test_prompts_over_the_context_are_skipped_and_counted(
    tiny_model_dir, tmp_path, monkeypatch, capsys, smollm2_tokenizer
):
    import grpokit.trainer.build
    from grpokit.data import build_chat_prompt, load_rows

    rows = load_rows("mawps", "singleop", limit=8, seed=0)
    lengths = sorted(
        len(smollm2_tokenizer(build_chat_prompt(smollm2_tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"])
        for r in rows
    )
    room = lengths[4]  # the 3+ longest prompts do not fit
    over = sum(n > room for n in lengths)
    import grpokit.models.loading

    monkeypatch.setattr(grpokit.models.loading, "model_max_positions", lambda *a, **k: room + 8)
    run = grpokit.trainer.build.build_run(tiny_recipe(tiny_model_dir, tmp_path))
    assert run.data.skipped == over and len(run.data.rows) == 8 - over
    assert f"{over} prompts of mawps/singleop skipped: longer than {room} tokens" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_prompts_that_cannot_fit_are_refused_before_training(tiny_model_dir, tmp_path):
    # training prompts fit the tiny model's 512 positions with 8 new tokens; eval's 500 leave 12
    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        data={"skip": 4},
        eval={"dataset": "mawps", "split": "singleop", "limit": 4, "max_new_tokens": 500},
    )
    with pytest.raises(
        ValueError,
        match=r"all \d prompts of mawps/singleop are longer than 12 tokens, the most "
        r"that fits with eval.max_new_tokens=500 and the model's 512 positions",
    ):
        train(recipe, progress=False)
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("always::grpokit.metrics.RunWarning")
def test_cli_says_the_warning_in_one_line(tiny_model_dir, tmp_path, capsys):
    from grpokit.cli.main import main
    from support.helpers import tiny_recipe_dict, write_recipe

    path = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tiny_model_dir, tmp_path / "out", train={"max_steps": 1}))
    assert main(["train", str(path), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "[grpokit] warning: step 1: 100% of the completions reached rollout.max_new_tokens=8" in err


@pytest.mark.slow
def test_rewards_equal_up_to_rounding_are_a_constant_group_in_the_loop(tiny_model_dir, tmp_path):
    lines, said = _run(
        tiny_model_dir,
        tmp_path,
        rewards={"functions": ["support.fake_rewards:residue_reward"]},
        algo={"beta": 0.0, "advantage_eps": 0.0},
        train={"max_steps": 1},
    )
    assert lines[0]["frac_zero_std"] == 1.0 and lines[0]["grad_norm"] == 0.0
    assert any("no learning signal" in str(w.message) for w in said)


@pytest.mark.slow
def test_a_damaged_checkpoint_weight_file_is_a_one_line_error(tiny_model_dir, tmp_path):
    train(tiny_recipe(tiny_model_dir, tmp_path, train={"max_steps": 1}), progress=False)
    (weights,) = (tmp_path / "checkpoint-1").glob("*.safetensors")
    weights.write_bytes(b"\xe9 not a safetensors file")
    with pytest.raises(ValueError, match=r"checkpoint-1: model.safetensors cannot be read .*train.resume=none"):
        train(tiny_recipe(tiny_model_dir, tmp_path, train={"max_steps": 2}), progress=False)


@pytest.mark.slow
def test_an_eval_whose_answers_are_cut_says_so(tiny_model_dir, tmp_path):
    _, said = _run(
        tiny_model_dir,
        tmp_path,
        train={"max_steps": 1},
        data={"skip": 2},
        eval={"dataset": "mawps", "split": "singleop", "limit": 2, "max_new_tokens": 4},
    )
    cut = [str(w.message) for w in said if str(w.message).startswith("eval ")]
    assert cut == [
        f"eval {when}: 100% of the greedy completions reached eval.max_new_tokens=4 without an EOS: "
        "an answer cut off there is scored as it stands, usually wrong"
        for when in ("before", "after")
    ]


@pytest.mark.slow
def test_periodic_held_out_eval_is_logged_with_training_minutes(tiny_model_dir, tmp_path):
    lines, _ = _run(
        tiny_model_dir,
        tmp_path,
        data={"skip": 4, "limit": 8},
        train={"max_steps": 2},
        eval={
            "dataset": "mawps",
            "split": "singleop",
            "limit": 3,
            "max_new_tokens": 4,
            "every_steps": 2,
            "before": False,
            "after": False,
            "num_samples": 2,
        },
    )
    assert "eval/greedy" not in lines[0]
    m = lines[1]
    for name in ("greedy", "mean@2", "pass@2", "maj@2"):
        assert m[f"eval/{name}_lo"] <= m[f"eval/{name}"] <= m[f"eval/{name}_hi"]
    assert 0 < lines[0]["train_minutes"] < m["train_minutes"]
    from grpokit.data import load_rows

    rows = load_rows("mawps", "singleop", limit=12)
    train_q = {r["prompt"] for r in rows[4:12]}
    dropped = sum(r["prompt"] in train_q for r in rows[:3])  # MAWPS repeats some questions
    saved = __import__("json").loads((tmp_path / "eval_step2.json").read_text())
    assert saved["total"] == 3 - dropped and saved["scorer"] == "math_correct"
    assert f"({dropped} left out as training questions" in saved["held_out"]


def test_held_out_rows_overlapping_training_rows_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"held-out rows 0-3 overlap the training rows \(data.skip=2\)"):
        train(
            tiny_recipe(
                tiny_model_dir, tmp_path, data={"skip": 2}, eval={"dataset": "mawps", "split": "singleop", "limit": 4}
            ),
            progress=False,
        )


@pytest.mark.slow
def test_generated_held_out_set_is_seed_separated_and_deduplicated(tiny_model_dir, tmp_path, monkeypatch):
    import grpokit.eval.evaluate
    import grpokit.trainer.build

    seen = {}
    real = grpokit.eval.evaluate.HeldOutEval.__init__

    def spy(self, recipe, train_rows):
        real(self, recipe, train_rows)
        seen["train"], seen["eval"] = train_rows, self.rows
        raise SystemExit  # stop before the model loads

    monkeypatch.setattr(grpokit.eval.evaluate.HeldOutEval, "__init__", spy)
    opts = {"size": 300, "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"]}
    with pytest.raises(SystemExit):
        grpokit.trainer.build.build_run(
            tiny_recipe(
                tiny_model_dir,
                tmp_path,
                data={"dataset": "reasoning_gym:basic_arithmetic", "options": opts, "limit": None},
                eval={"dataset": "reasoning_gym:basic_arithmetic", "limit": 300},
            )
        )
    train_q = {r["prompt"] for r in seen["train"]}
    eval_q = {r["prompt"] for r in seen["eval"]}
    assert not train_q & eval_q  # nothing held out was trained on
    # another set, not the training items shifted: reasoning_gym seeds item i with seed + i, so a
    # held-out seed of train.seed + 1 would repeat 299 of the 300 (all left out as duplicates)
    assert len(eval_q) > 250


def test_eval_scorer_that_does_not_match_the_data_is_refused_before_any_model_loads(tmp_path):
    from grpokit.eval.evaluate import HeldOutEval

    recipe = tiny_recipe("m", tmp_path, eval={"dataset": "svamp", "split": "test", "scorer": "reasoning_gym"})
    with pytest.raises(ValueError, match="eval.scorer: scorer 'reasoning_gym' needs reasoning_gym: data"):
        HeldOutEval(recipe, [])


@pytest.mark.slow
def test_the_after_eval_reuses_the_last_steps_periodic_eval(tiny_model_dir, tmp_path, monkeypatch):
    import grpokit.eval.evaluate

    calls = []
    real = grpokit.eval.evaluate.evaluate

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(grpokit.eval.evaluate, "evaluate", spy)
    _run(
        tiny_model_dir,
        tmp_path,
        data={"skip": 4, "limit": 8},
        train={"max_steps": 2},
        eval={
            "dataset": "mawps",
            "split": "singleop",
            "limit": 2,
            "max_new_tokens": 2,
            "every_steps": 2,
            "before": False,
        },
    )
    assert len(calls) == 1  # step 2's evaluation is the "after" one: not run twice
    import json

    after, step2 = (json.loads((tmp_path / f"eval_{w}.json").read_text()) for w in ("after", "step2"))
    assert after["when"] == "after" and after["outcomes"] == step2["outcomes"]
