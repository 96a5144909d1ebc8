"""grpokit.metrics: metrics.jsonl read back on resume; damaged files give one-line errors naming them."""

from __future__ import annotations

import json

import pytest

from grpokit.metrics import RunLogger, read_metrics


def _lines(*steps):
    return b"".join(json.dumps({"step": s, "loss": 0.5}).encode() + b"\n" for s in steps)


def test_truncate_after_keeps_earlier_steps_and_drops_a_torn_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(_lines(1, 2, 3) + b'{"step": 4, "lo')
    RunLogger(tmp_path, tensorboard=False).truncate_after(2)
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


@pytest.mark.parametrize("name", ["metrics.jsonl", "samples.jsonl"])
def test_truncate_after_on_a_non_utf8_file_names_it_and_leaves_it(tmp_path, name):
    content = _lines(1) + b'{"step": 2, "text": "caf\xe9"}\n'
    (tmp_path / name).write_bytes(content)
    offset = len(_lines(1)) + len(b'{"step": 2, "text": "caf')
    with pytest.raises(ValueError) as e:
        RunLogger(tmp_path, tensorboard=False).truncate_after(1)
    assert str(e.value) == (
        f"{tmp_path / name}: line 2: not valid UTF-8 (byte 0xe9 at offset {offset} of the"
        f" file); repair or remove it to resume in {tmp_path}"
    )
    assert (tmp_path / name).read_bytes() == content


def test_read_metrics_damaged_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_bytes(_lines(1) + b"\xff\n")
    with pytest.raises(ValueError, match=rf"line 2: not valid UTF-8 \(byte 0xff at offset {len(_lines(1))} "):
        read_metrics(p)
    p.write_bytes(_lines(1) + b"{oops\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        read_metrics(p)


def test_a_fresh_run_replaces_a_non_utf8_metrics_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(_lines(1) + b"\xe9\n")
    RunLogger(tmp_path, tensorboard=False).truncate_after(0)
    assert (tmp_path / "metrics.jsonl").read_bytes() == b""


# -- samples.jsonl and the step warnings say what happened ---------------------------------------


@pytest.mark.slow
def test_samples_show_the_prompt_the_model_saw_and_each_advantage(tiny_model_dir, tmp_path):
    from grpokit.trainer.loop import train
    from support.helpers import tiny_recipe

    train(
        tiny_recipe(tiny_model_dir, tmp_path, train={"max_steps": 1}, data={"system_prompt": "Be brief."}),
        progress=False,
    )
    lines = [json.loads(l) for l in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 4  # B=2 prompts x G=2
    for s in lines:  # the question inside the template, the system prompt and the chat turns, as tokenized
        assert s["model_prompt"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
        assert s["prompt"] in s["model_prompt"] and s["model_prompt"].endswith("<|im_start|>assistant\n")
        assert s["truncated"] in (True, False)
    for a, b in (lines[0:2], lines[2:4]):  # a group of 2, rewards r_a, r_b: mean (r_a + r_b)/2, sample std
        assert a["model_prompt"] == b["model_prompt"]  # |r_a - r_b|/√2, so A_a = ((r_a - r_b)/2)/(std + 1e-4)
        d = a["reward"] - b["reward"]
        want = 0.0 if d == 0 else (d / 2) / (abs(d) / 2**0.5 + 1e-4)
        assert a["advantage"] == pytest.approx(want, rel=1e-5) and b["advantage"] == pytest.approx(-want, rel=1e-5)


@pytest.mark.slow
def test_samples_show_each_reward_functions_own_value(tiny_model_dir, tmp_path):
    """samples.jsonl gives each function's value before its weight, labelled as its metric, beside
    the weighted total (TRL users read rewards per function)."""
    from grpokit.trainer.loop import train
    from support.helpers import tiny_recipe

    fns = ["support.fake_rewards:length_reward", "support.fake_rewards:constant_reward"]
    recipe = tiny_recipe(
        tiny_model_dir, tmp_path, train={"max_steps": 1}, rewards={"functions": fns, "weights": [2.0, 0.5]}
    )
    train(recipe, progress=False)
    lines = [json.loads(l) for l in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    for s in lines:
        parts = s["rewards"]
        assert set(parts) == {"length_reward", "constant_reward"}  # the labels of rewards/<label>
        assert s["reward"] == pytest.approx(2.0 * parts["length_reward"] + 0.5 * parts["constant_reward"])
    metric = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    mean = sum(s["rewards"]["length_reward"] for s in lines) / 4
    assert metric["rewards/length_reward"] == pytest.approx(mean)


def test_sample_lines_of_token_advantages_give_the_first_tokens(smollm2_tokenizer):
    import torch

    from grpokit.experience import Experience
    from grpokit.metrics import sample_lines

    ids = smollm2_tokenizer(["Hi", "Hello there"], add_special_tokens=False)["input_ids"]
    width = max(map(len, ids))
    prompt = torch.tensor([[2] * (width - len(x)) + x for x in ids])  # left-padded with the pad id 2
    mask = torch.tensor([[False] * (width - len(x)) + [True] * len(x) for x in ids])
    exp = Experience(
        prompt_ids=prompt,
        prompt_mask=mask,
        completion_ids=torch.ones(2, 3, dtype=torch.long),
        completion_mask=torch.ones(2, 3, dtype=torch.bool),
        group_index=torch.tensor([0, 1]),
        group_size=1,
        truncated=torch.tensor([True, False]),
        completions=["a", "b"],
        rewards=torch.tensor([1.0, float("nan")], dtype=torch.float64),
    )
    # process supervision: token advantages; a token's = the sum of the normalized step rewards from it on
    exp.advantages = torch.tensor([[0.75, 0.25, 0.25], [-0.5, -0.5, 0.0]])
    rows = [{"prompt": "q0", "answer": "1"}, {"prompt": "q1"}]
    got = sample_lines(rows, exp, smollm2_tokenizer)
    assert [g["model_prompt"] for g in got] == ["Hi", "Hello there"]  # padding left out
    assert [g["advantage"] for g in got] == [0.75, -0.5] and [g["reward"] for g in got] == [1.0, None]
    assert [g["truncated"] for g in got] == [True, False] and got[1]["answer"] is None


def test_no_signal_under_process_supervision_quotes_the_step_reward_fraction():
    import warnings

    import torch

    from grpokit.metrics import RunWarning, warn_if_step_did_nothing

    m = {"step": 3, "truncated_frac": 0.0, "unscorable_frac": 0.0, "frac_zero_std": 0.5, "step_frac_zero_std": 1.0}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert warn_if_step_did_nothing(m, torch.zeros(4, 3), max_new_tokens=8, warned_at={}) == ["no_signal"]
    (w,) = [w for w in said if issubclass(w.category, RunWarning)]
    assert str(w.message).startswith(
        "step 3: no learning signal: every group's step rewards were equal "
        "(step_frac_zero_std=1.00; outcome rewards: frac_zero_std=0.50, "
    )
