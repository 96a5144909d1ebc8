"""The ``feedback`` environment (``grpokit.envs.feedback``): a turn judged wrong by a reward function
gets the retry message and another turn; right, or a judge that fails, ends the episode."""

from __future__ import annotations

import copy

import pytest

from grpokit.backends import install_backend
from grpokit.envs.base import load_env
from grpokit.envs.feedback import FEEDBACK_MESSAGE, FeedbackEnv
from grpokit.rollout import SamplingParams
from grpokit.rollout.multiturn import generate_multiturn
from support.helpers import true_runs

ROW = {"prompt": "What is 5 + 7?", "answer": "12"}


def test_a_right_first_answer_ends_the_episode():
    ep = FeedbackEnv().start(ROW)
    obs = ep.step("5 + 7 = 12, so the answer is 12.", ended_by_eos=True)
    assert obs.done and obs.text is None
    assert obs.counts == {"first_correct": 1}


def test_a_wrong_answer_is_told_to_retry_and_a_later_right_one_ends_it():
    env = FeedbackEnv(message=" No. ")
    ep = env.start(ROW)
    first = ep.step("The answer is 13.", ended_by_eos=True)
    assert not first.done and first.text == " No. "
    assert first.counts == {"first_correct": 0, "wrong_answers": 1}
    second = ep.step("Sorry: 12.", ended_by_eos=True)  # the turn alone is judged, not the transcript
    assert second.done and second.counts == {"first_correct": 0}
    as_user = FeedbackEnv(role="user").start(ROW).step("13", ended_by_eos=True)
    assert (as_user.text, as_user.role) == ("That is not right, try again.", "user")
    third_try = env.start(ROW)
    third_try.step("11", ended_by_eos=True)
    assert third_try.step("still 13", ended_by_eos=True).counts == {"first_correct": 0, "wrong_answers": 1}


def test_the_judge_sees_the_rows_columns(tmp_path):
    """reasoning_gym's reward scores with the row's task entry, passed as a column."""
    from grpokit.data import load_rows

    row = load_rows("reasoning_gym:basic_arithmetic", limit=1, seed=3, options={"size": 5})[0]
    env = FeedbackEnv(reward="reasoning_gym")
    assert env.start(row).step(f"<answer>{row['answer']}</answer>", ended_by_eos=True).done
    assert not env.start(row).step("<answer>123456789</answer>", ended_by_eos=True).done


def test_a_judge_that_raises_or_gives_no_score_ends_the_episode_counted(tmp_path):
    judge = tmp_path / "judges.py"
    judge.write_text(
        "def boom(prompts, completions, **_):\n    raise RuntimeError('judge down')\n"
        "def none(prompts, completions, **_):\n    return [None]\n"
    )
    for name in ("boom", "none"):
        obs = FeedbackEnv(reward=f"{judge}:{name}").start(ROW).step("12", ended_by_eos=True)
        assert obs.done and obs.counts == {"first_correct": 0, "check_errors": 1}


def test_bad_options_name_the_option():
    with pytest.raises(ValueError, match="rollout.env_options.message"):
        FeedbackEnv(message="")
    with pytest.raises(ValueError, match="rollout.env_options.role"):
        FeedbackEnv(role="")
    with pytest.raises(ValueError, match="rollout.env_options.threshold"):
        FeedbackEnv(threshold="high")
    with pytest.raises(ValueError, match="rollout.env_options.reward: unknown reward 'nope'"):
        FeedbackEnv(reward="nope")
    with pytest.raises(ValueError, match="rollout.env_options do not fit"):
        load_env("feedback", {"tries": 3})
    assert isinstance(load_env("feedback", {"reward": "math_correct"}), FeedbackEnv)


def test_in_a_rollout_each_wrong_answer_gets_the_message_out_of_the_completion_mask(tiny_model, smollm2_tokenizer):
    """A random model never writes the answer: every turn that ends at an EOS is followed by the
    message's tokens (attended to, not trained on) and another turn, max_turns turns in all."""
    model = copy.deepcopy(tiny_model)
    install_backend(model, "plain", announce=False)
    many_eos = list(range(0, 49152, 4))  # a turn ends at an EOS within a few tokens
    prompts = ["The cat sat on", "A dog ran to"]
    rows = [{"prompt": p, "answer": "987654321"} for p in prompts]
    exp = generate_multiturn(
        model,
        smollm2_tokenizer,
        prompts,
        2,
        SamplingParams(temperature=1.0, max_new_tokens=8),
        env=FeedbackEnv(),
        rows=rows,
        eos_token_ids=many_eos,
        max_turns=3,
        seed=5,
    )
    msg = smollm2_tokenizer(FEEDBACK_MESSAGE, add_special_tokens=False)["input_ids"]
    assert exp.attention_mask is not None
    checked = 0
    for r in range(len(exp)):
        turns = true_runs(exp.completion_mask[r])
        ended = [int(exp.completion_ids[r, t[-1]]) in many_eos for t in turns]
        # every turn but the last ended at an EOS and was answered with the message
        assert all(ended[:-1]) and len(turns) <= 3
        for a, b in zip(turns, turns[1:]):
            between = exp.completion_ids[r, a[-1] + 1 : b[0]]
            assert between.tolist() == msg
            assert bool(exp.attention_mask[r, a[-1] + 1 : b[0]].all())
            checked += 1
        assert int(exp.env_counts["wrong_answers"][r]) == sum(ended)
        assert int(exp.env_counts["first_correct"][r]) == 0
    assert checked >= 2
