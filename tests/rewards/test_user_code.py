"""User code named by a recipe (issue #29, item 15): a module in the working directory is importable
(as under ``python -m``), a file can be named by its path, and a spec that names nothing says which
forms are accepted. The same for every key that names user code: ``rewards.functions``,
``eval.scorer`` (both through ``get_reward_function``) and ``algo.process_reward``."""

from __future__ import annotations

import os
import re
import sys
import zlib

import pytest

from grpokit.process.wiring import resolve_process_reward
from grpokit.rewards import get_reward_function
from grpokit.rewards.calling import RewardSignatureError
from grpokit.rewards.guard import GuardedReward
from grpokit.utils.importing import SPEC_FORMS, import_object
from support.helpers import tiny_recipe

REWARD = (
    "def exact(prompts, completions, answer, **_):\n"
    "    import {helper}  # a file beside this one, imported at call time (in the reward worker)\n"
    "    return [{helper}.score(c, a) for c, a in zip(completions, answer)]\n"
)
HELPER = "def score(c, a):\n    return float(c.strip() == str(a))\n"


@pytest.fixture
def scratch(tmp_path, monkeypatch, request):
    """A scratch working directory not on ``sys.path`` (pytest run as ``python -m pytest`` puts the
    directory it started in there, as ``''``); modules imported from it are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", os.getcwd(), str(tmp_path))])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


def _write_reward(folder, module: str, helper: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(REWARD.format(helper=helper))
    (folder / f"{helper}.py").write_text(HELPER)


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_module_in_the_working_directory_is_found(scratch, isolation):
    _write_reward(scratch, f"myreward_{isolation}", f"myhelper_{isolation}")
    fn = get_reward_function(f"myreward_{isolation}:exact")
    guard = GuardedReward("r", fn, timeout_s=5, isolation=isolation)
    try:  # "12" == 12, "13" != 12
        assert guard(["q", "q"], ["12", "13"], answer=[12, 12]) == [1.0, 0.0]
    finally:
        guard.close()


@pytest.mark.parametrize("form", ["./sub/{m}.py", "sub/{m}.py", "{abs}/sub/{m}.py"])
def test_a_file_is_named_by_its_path(scratch, form):
    tag = zlib.crc32(form.encode())
    module, helper = f"filereward_{tag}", f"filehelper_{tag}"
    _write_reward(scratch / "sub", module, helper)
    fn = get_reward_function(form.format(m=module, abs=scratch) + ":exact")
    guard = GuardedReward("r", fn, timeout_s=5)
    try:  # imports its sibling helper from its own folder
        assert guard(["q", "q"], ["7", "8"], answer=["7", "7"]) == [1.0, 0.0]
    finally:
        guard.close()


def test_a_file_named_like_a_loaded_module_does_not_replace_it(scratch):
    (scratch / "json.py").write_text("def exact(prompts, completions, **_):\n    return [2.0] * len(completions)\n")
    fn = get_reward_function("./json.py:exact")
    assert fn(["q"], ["x"]) == [2.0]
    import json

    assert json.dumps([1]) == "[1]" and sys.modules["json"] is json  # the standard library's, untouched


def test_a_file_in_the_working_directory_never_shadows_an_installed_module(scratch):
    (scratch / "colorsys.py").write_text("def rgb_to_hls(*a):\n    return 'shadow'\n")
    assert import_object("colorsys:rgb_to_hls")(1.0, 0.0, 0.0) != "shadow"  # the standard library's
    assert import_object("./colorsys.py:rgb_to_hls")() == "shadow"  # the path form names the file


@pytest.mark.parametrize(
    "spec, parts",
    [
        ("nosuchreward_xyz:exact", ["cannot import module 'nosuchreward_xyz'", "the working directory", SPEC_FORMS]),
        ("./nosuchreward_xyz.py:exact", ["no file", "nosuchreward_xyz.py", SPEC_FORMS]),
        ("nosuchreward_xyz", ["'module:function' or 'path/to/file.py:function'"]),
    ],
)
def test_a_spec_that_names_nothing_says_which_forms_are_accepted(scratch, spec, parts):
    with pytest.raises(ValueError) as e:
        get_reward_function(spec)
    msg = str(e.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, (p, msg)


@pytest.mark.parametrize(
    "body, shown",
    [
        ("import nosuchdep_xyz\n", "importing module 'badmod_{i}' failed: No module named 'nosuchdep_xyz'"),
        ("x = undefined_name\n", "importing module 'badmod_{i}' failed: NameError"),
        ("def f(:\n", "importing module 'badmod_{i}' failed: SyntaxError"),
    ],
)
def test_a_module_that_fails_to_import_is_one_line_naming_it(scratch, body, shown):
    i = zlib.crc32(body.encode())
    (scratch / f"badmod_{i}.py").write_text(body)
    with pytest.raises(ValueError) as e:
        get_reward_function(f"badmod_{i}:f")
    assert shown.format(i=i) in str(e.value) and str(e.value).startswith(f"reward 'badmod_{i}:f'")
    with pytest.raises(ValueError, match=rf"importing .*badmod_{i}\.py failed"):
        get_reward_function(f"./badmod_{i}.py:f")


def test_process_rewards_take_the_same_forms(scratch):
    (scratch / "mysteps.py").write_text(
        "def per_step(prompts, completions, steps, **_):\n    return [[float(len(s)) for s in row] for row in steps]\n"
        "def no_steps(prompts, completions):\n    return []\n"
    )
    for spec in ["mysteps:per_step", "./mysteps.py:per_step"]:
        recipe = tiny_recipe("unused-model", scratch / "out", algo={"supervision": "process", "process_reward": spec})
        guard = resolve_process_reward(recipe)
        try:
            assert guard(["q"], ["ab\nc"], steps=[["ab", "c"]]) == [[2.0, 1.0]]
        finally:
            guard.close()
    recipe = tiny_recipe(
        "unused-model", scratch / "out", algo={"supervision": "process", "process_reward": "mysteps:no_steps"}
    )
    with pytest.raises(
        RewardSignatureError,
        match=r"^algo.process_reward: process reward 'mysteps:no_steps': "
        r".*unexpected keyword argument 'steps'",
    ):
        resolve_process_reward(recipe)
    recipe.algo.process_reward = "./nosuchsteps.py:f"
    with pytest.raises(ValueError, match=r"^algo.process_reward: .*no file .*" + re.escape(SPEC_FORMS)):
        resolve_process_reward(recipe)
