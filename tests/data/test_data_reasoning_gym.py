"""reasoning_gym rows and the reasoning_gym reward, on basic_arithmetic (offline)."""

import pytest

from grpokit.data import load_rows
from grpokit.data.reasoning_gym import reasoning_gym_score
from grpokit.rewards import get_reward_function


@pytest.fixture(scope="module")
def rows():
    return load_rows("reasoning_gym:basic_arithmetic", limit=4, seed=3, options={"size": 50})


def test_rows(rows):
    assert len(rows) == 4
    for r in rows:
        assert r["prompt"] == r["rg_entry"]["question"]
        assert r["answer"] == str(r["rg_entry"]["answer"])
        assert r["rg_task"] == "basic_arithmetic"
    again = load_rows("reasoning_gym:basic_arithmetic", limit=4, seed=3, options={"size": 50})
    assert [r["prompt"] for r in again] == [r["prompt"] for r in rows]  # deterministic


def test_score_with_task_scorer(rows):
    cols = {k: [r[k] for r in rows] for k in ("answer", "rg_entry", "rg_task")}
    a = [r["answer"] for r in rows]
    completions = [
        f"<think>easy</think><answer>{a[0]}</answer>",  # tags (reasoning_gym style)
        f"so the result is \\boxed{{{a[1]}}}",  # fallback: grpokit's math extraction
        "<answer>123456789012</answer>",  # wrong
        "no idea",  # nothing extractable
    ]
    fn = get_reward_function("reasoning_gym")
    assert fn is reasoning_gym_score
    scores = fn([r["prompt"] for r in rows], completions, **cols)
    assert scores[0] == 1.0 and scores[1] == 1.0
    assert scores[2] < 1.0 and scores[3] == 0.0


def test_missing_entry_is_unscorable():
    assert reasoning_gym_score(["q"], ["<answer>1</answer>"], rg_entry=[None], rg_task=[None]) == [None]
    with pytest.raises(ValueError, match="1 completions, 2 rg_entry"):
        reasoning_gym_score(["q"], ["x"], rg_entry=[{}, {}])


def test_unknown_task_lists_registered():
    with pytest.raises(ValueError, match=r"unknown reasoning_gym task 'nope'.*basic_arithmetic"):
        load_rows("reasoning_gym:nope")


_NO_PARENS = {"size": 200, "min_terms": 3, "max_terms": 4, "min_digits": 2, "max_digits": 3, "allow_negation": False}


def test_left_to_right_answers_are_refused():
    """reasoning_gym folds an expression without parentheses left to right, so with * its answer
    ignores precedence (17 - 30 + 78 * 0 is given 0); grpokit recomputes and refuses such rows."""
    opts = {**_NO_PARENS, "operators": ["+", "-", "*"], "allow_parentheses": False}
    msg = r"basic_arithmetic: \d+ of 200 answers are not the value.*allow_parentheses: true"
    with pytest.raises(ValueError, match=msg):
        load_rows("reasoning_gym:basic_arithmetic", limit=None, seed=10**9, options=opts)


@pytest.mark.parametrize(
    "opts",
    [
        {**_NO_PARENS, "operators": ["+", "-"], "allow_parentheses": False},  # no precedence to ignore
        {**_NO_PARENS, "operators": ["+", "-", "*"], "allow_parentheses": True},  # computed with precedence
    ],
)
def test_answers_follow_precedence(opts):
    from grpokit.envs.calculator import calculate

    rows = load_rows("reasoning_gym:basic_arithmetic", limit=None, seed=10**9, options=opts)
    assert len(rows) == 200
    assert all(calculate(r["rg_entry"]["metadata"]["expression"]) == r["answer"] for r in rows)
    if "*" in opts["operators"]:
        assert sum("*" in r["prompt"] for r in rows) > 50  # the check had products to look at
