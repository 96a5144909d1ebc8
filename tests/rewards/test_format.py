"""Format rewards: boxed, answer line, number at end, custom patterns."""

import doctest
import re

import pytest

import grpokit.rewards.format as rf
from grpokit.rewards.format import answer_line_format, format_reward, make_format_reward, number_at_end


@pytest.mark.parametrize(
    "completion,expected",
    [
        (r"so $\boxed{42}$", 1.0),
        (r"\boxed{\frac{1}{2}} done", 1.0),
        (r"\boxed{}", 0.0),
        (r"\boxed{  }", 0.0),
        (r"\boxed{3", 0.0),  # unbalanced
        ("The answer is 42", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward_boxed(completion, expected):
    assert format_reward(["q"], [completion]) == [expected]


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("work\nAnswer: 7", 1.0),
        ("work\n**Final Answer:** 7\n\n", 1.0),
        ("work\nanswer:7", 1.0),
        ("Answer: 7\nmore text", 0.0),
        ("work\nAnswer:", 0.0),
        ("The answer is 7", 0.0),
    ],
)
def test_answer_line_format(completion, expected):
    assert answer_line_format(["q"], [completion]) == [expected]


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("so it is 42", 1.0),
        ("so it is 42.\n", 1.0),
        ("total: $1,200", 1.0),
        (r"\boxed{-3.5}", 1.0),
        ("42 apples", 0.0),
        ("x5", 0.0),
        ("", 0.0),
    ],
)
def test_number_at_end(completion, expected):
    assert number_at_end(["q"], [completion]) == [expected]


def test_make_format_reward_scopes():
    texts = ["<answer>4</answer>\nthanks", "<answer>4</answer>"]
    assert make_format_reward("<answer>.*</answer>")(["q"] * 2, texts) == [1.0, 1.0]
    assert make_format_reward("<answer>.*</answer>$", scope="last_line")(["q"] * 2, texts) == [0.0, 1.0]
    assert make_format_reward("<answer>.*</answer>", scope="whole")(["q"] * 2, texts) == [0.0, 1.0]
    fn = make_format_reward(re.compile("ANSWER", re.I), name="has_answer")
    assert fn.__name__ == "has_answer"
    assert fn(["q"], ["the answer"]) == [1.0]


def test_make_format_reward_errors():
    with pytest.raises(ValueError, match="unknown scope 'end'"):
        make_format_reward("x", scope="end")
    with pytest.raises(ValueError, match="bad pattern"):
        make_format_reward("(")


def test_doctests():
    assert doctest.testmod(rf).failed == 0
