"""get_reward_function / compute_rewards: resolution, errors, weighting, validation."""

import doctest
import math

import numpy as np
import pytest
import torch

import grpokit.rewards.base as rb
from grpokit.rewards import RewardFunction, compute_rewards, format_reward, get_reward_function, math_correct


def test_builtin_names_resolve():
    assert get_reward_function("math_correct") is math_correct
    assert get_reward_function("format") is format_reward
    for name in rb.BUILTIN_REWARDS:
        assert callable(get_reward_function(name))
    assert isinstance(math_correct, RewardFunction)


def test_unknown_name_lists_builtins():
    with pytest.raises(ValueError, match=r"unknown reward 'nope'.*math_correct"):
        get_reward_function("nope")


def test_module_function_spec(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_mod.py").write_text(
        "def length_reward(prompts, completions, **_):\n"
        "    return [float(len(c)) for c in completions]\n"
        "class Holder:\n"
        "    @staticmethod\n"
        "    def one(prompts, completions, **_):\n"
        "        return [1.0] * len(completions)\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = get_reward_function("my_rewards_mod:length_reward")
    assert fn(["q", "q"], ["ab", "abc"]) == [2.0, 3.0]
    assert get_reward_function("my_rewards_mod:Holder.one")(["q"], ["x"]) == [1.0]
    with pytest.raises(ValueError, match=r"'my_rewards_mod:missing'.*no attribute 'missing'"):
        get_reward_function("my_rewards_mod:missing")
    with pytest.raises(ValueError, match=r"'my_rewards_mod:NOT_CALLABLE'.*not callable"):
        get_reward_function("my_rewards_mod:NOT_CALLABLE")


def test_spec_errors():
    with pytest.raises(ValueError, match=r"'no_such_module_xyz:f'.*cannot import module"):
        get_reward_function("no_such_module_xyz:f")
    with pytest.raises(ValueError, match=r"expected 'module:function'"):
        get_reward_function("mod:")


def test_register_reward(monkeypatch):
    monkeypatch.setattr(rb, "BUILTIN_REWARDS", dict(rb.BUILTIN_REWARDS))

    def const(prompts, completions, **_):
        return [0.5] * len(completions)

    rb.register_reward("const", const)
    assert get_reward_function("const") is const
    with pytest.raises(ValueError, match="already registered"):
        rb.register_reward("const", const)
    with pytest.raises(ValueError, match="must not contain ':'"):
        rb.register_reward("a:b", const)


def _const(values):
    return lambda prompts, completions, **_: list(values)


def _raw(out):
    return lambda prompts, completions, **_: out


def test_compute_rewards_weighted_sum():
    # total = 1.0*a + 0.5*b: [1 + 0.5*0, 0 + 0.5*1, None (a is None), 1 + 0.5*None -> None]
    funcs = {"a": _const([1.0, 0.0, None, 1.0]), "b": _const([0.0, 1.0, 1.0, float("nan")])}
    total, parts = compute_rewards(funcs, {"b": 0.5}, ["q"] * 4, ["c"] * 4, {})
    assert total == [1.0, 0.5, None, None]
    assert parts["a"] == [1.0, 0.0, None, 1.0]
    assert parts["b"][:3] == [0.0, 1.0, 1.0] and parts["b"][3] is None  # NaN -> None


def test_zero_weight_component_is_logged_but_ignored():
    funcs = {"a": _const([1.0, 2.0]), "b": _const([None, 5.0])}
    total, parts = compute_rewards(funcs, {"b": 0.0}, ["q"] * 2, ["c"] * 2, {})
    assert total == [1.0, 2.0]
    assert parts["b"] == [None, 5.0]


def test_compute_rewards_passes_columns():
    total, parts = compute_rewards(
        {"math_correct": math_correct},
        {},
        ["q", "q"],
        [r"\boxed{18}", r"\boxed{17}"],
        {"answer": ["18", "18"], "idx": [0, 0]},
    )
    assert total == [1.0, 0.0]


@pytest.mark.parametrize(
    "fn,match",
    [
        (_const([1.0]), r"reward 'bad' returned 1 values for 2 completions"),
        (lambda p, c, **_: (x for x in [1.0, 1.0]), r"reward 'bad' returned generator"),
        (_const([1.0, "1"]), r"reward 'bad' returned '1' \(str\) at index 1"),
        (_const([1.0, [1.0]]), r"reward 'bad' returned \[1.0\] \(list\) at index 1"),
        (_raw(np.ones((2, 1))), r"reward 'bad' returned ndarray of shape \(2, 1\); expected a list"),
        (_raw(torch.tensor(1.0)), r"reward 'bad' returned Tensor of shape \(\); expected a list"),
    ],
)
def test_compute_rewards_validates_outputs(fn, match):
    with pytest.raises(ValueError, match=match):
        compute_rewards({"bad": fn}, {}, ["q"] * 2, ["c"] * 2, {})


@pytest.mark.parametrize(
    "out",
    [
        [True, False, None],  # TRL takes bools as 1.0 / 0.0
        np.array([1.0, 0.0, np.nan]),
        torch.tensor([1.0, 0.0, float("nan")]),
        np.array([True, False, True]),
        [np.float32(1.0), np.bool_(False), torch.tensor(float("nan"))],
        (1, 0, None),
    ],
)
def test_compute_rewards_takes_what_trl_takes(out):
    total, parts = compute_rewards({"f": _raw(out)}, {}, ["q"] * 3, ["c"] * 3, {})
    want = {0: 1.0, 1: 0.0}
    assert parts["f"][:2] == [want[0], want[1]] and all(type(v) is float for v in parts["f"][:2])
    last = parts["f"][2]
    assert last == (1.0 if isinstance(out, np.ndarray) and out.dtype == bool else None)


def test_compute_rewards_input_errors():
    ok = {"a": _const([1.0, 1.0])}
    with pytest.raises(ValueError, match=r"unknown reward\(s\) \['zz'\]"):
        compute_rewards(ok, {"zz": 1.0}, ["q"] * 2, ["c"] * 2, {})
    with pytest.raises(ValueError, match=r"column 'answer' has 1 values, expected 2"):
        compute_rewards(ok, {}, ["q"] * 2, ["c"] * 2, {"answer": ["1"]})
    with pytest.raises(ValueError, match="no reward functions"):
        compute_rewards({}, {}, [], [], {})
    with pytest.raises(ValueError, match="1 prompts for 2 completions"):
        compute_rewards(ok, {}, ["q"], ["c"] * 2, {})


def test_compute_rewards_names_a_raising_function():
    def broken(prompts, completions, **_):
        raise KeyError("answer")

    with pytest.raises(RuntimeError, match=r"reward 'broken' raised KeyError"):
        compute_rewards({"broken": broken}, {}, ["q"], ["c"], {})


def test_numpy_like_reals_accepted():
    import numpy as np

    total, _ = compute_rewards({"a": _const([np.float32(0.5), np.int64(2)])}, {}, ["q"] * 2, ["c"] * 2, {})
    assert total == [0.5, 2.0] and all(type(t) is float for t in total)
    assert not any(isinstance(t, float) and math.isnan(t) for t in total)


def test_doctests():
    assert doctest.testmod(rb).failed == 0
