"""The ``tools`` environment: a call between tags runs its tool; anything a tool does wrong is a
result the model reads, counted, never an exception of the rollout."""

from __future__ import annotations

import json
import os
import time

import pytest

from grpokit.envs import load_env
from grpokit.envs.base import Environment, Observation
from grpokit.envs.tools import ToolEnv


def shout(text: str) -> str:
    return text.upper()


def raises(text: str) -> str:
    raise KeyError(text)


def not_text(text: str):
    return 42


def sleeps(text: str) -> str:
    time.sleep(5)
    return "late"


def huge(text: str) -> str:
    return "x" * 10_000


def step(env, turn: str, eos: bool = False) -> Observation:
    return env.start({"question": "q"}).step(turn, ended_by_eos=eos)


def test_a_calculator_call_gets_its_result():
    env = load_env("tools")
    assert isinstance(env, Environment) and env.stop_strings == ["</calc>"]
    obs = step(env, "First 12 apples times 7 plus 3: <calc>12*7+3</calc>")
    assert obs == Observation(
        text="<result>87</result>", done=False, counts={"tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}
    )
    assert step(env, "<calc>1/0</calc>").text == "<result>error: division by zero</result>"
    assert step(env, "<calc>1/0</calc>").counts["tool_errors"] == 1
    # the last call of the turn counts (the turn stopped at its closing tag)
    assert step(env, "<calc>1+1</calc> then <calc>2+3</calc>").text == "<result>5</result>"


def test_a_turn_without_a_call_ends_the_episode():
    env = ToolEnv()
    assert step(env, "The answer is 87.", eos=True).done
    assert step(env, "<calc>1+1</calc>", eos=True).done  # an EOS ends it whatever came before
    assert step(env, "no call, cut by the token limit").done
    obs = step(env, "oops 2+2</calc>")
    assert not obs.done and obs.text == "<result>error: </calc> without <calc></result>"


def spins(text: str) -> str:
    while True:
        pass


def exits(text: str) -> str:
    os._exit(3)


def quits(text: str) -> str:
    raise SystemExit(4)


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_user_tools_faults_become_results(isolation):
    mod = __name__
    env = ToolEnv(
        tools=["calculator", f"{mod}:shout", f"{mod}:raises", f"{mod}:not_text", f"{mod}:sleeps", f"{mod}:huge"],
        timeout_s=0.2,
        max_output_chars=50,
        isolation=isolation,
    )
    assert set(env.stop_strings) == {"</calc>", "</shout>", "</raises>", "</not_text>", "</sleeps>", "</huge>"}
    assert step(env, "<shout>hi</shout>").text == "<result>HI</result>"
    assert step(env, "<raises>k</raises>").text == "<result>error: the tool raised KeyError: 'k'</result>"
    assert step(env, "<not_text>k</not_text>").text == "<result>error: the tool returned int, not text</result>"
    t0 = time.perf_counter()
    obs = step(env, "<sleeps>k</sleeps>")
    assert time.perf_counter() - t0 < 2 and obs.counts == {"tool_calls": 1, "tool_errors": 1, "tool_timeouts": 1}
    assert obs.text == "<result>error: the tool timed out after 0.2 s</result>"
    assert step(env, "<huge>k</huge>").text == "<result>" + "x" * 50 + "… [cut at 50 characters]</result>"
    assert step(env, "<shout>again</shout>").text == "<result>AGAIN</result>"  # after a timeout
    env.close()
    quitting = ToolEnv(tools=[f"{mod}:quits"], isolation=isolation)  # SystemExit is the tool's fault too
    assert step(quitting, "<quits>x</quits>").text == "<result>error: the tool raised SystemExit: 4</result>"
    quitting.close()


def test_a_user_tool_in_its_process_is_killed_at_the_limit_and_a_dead_one_replaced():
    """isolation=process (the default): a tool that never returns is killed, not left running in
    a thread; a tool whose process dies is an error result and the next call gets a fresh one."""
    mod = __name__
    env = ToolEnv(tools=[f"{mod}:spins", f"{mod}:exits", f"{mod}:shout"], timeout_s=0.3)
    obs = step(env, "<spins>x</spins>")
    assert obs.text == "<result>error: the tool timed out after 0.3 s</result>" and obs.counts["tool_timeouts"] == 1
    (spinner,) = [w for w, _ in env._workers.values()]
    assert spinner.proc is None  # killed and joined at the limit
    obs = step(env, "<exits>x</exits>")
    assert obs.text.startswith("<result>error: the tool raised RuntimeError: the tool worker process exited (code 3)")
    assert obs.counts == {"tool_calls": 1, "tool_errors": 1, "tool_timeouts": 0}
    assert step(env, "<shout>ok</shout>").text == "<result>OK</result>"
    before = len(env._workers)
    env.close()
    assert before == 3 and not env._workers


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"tools": []}, "a list of tool names"),
        ({"tools": "calculator"}, "a list of tool names"),
        ({"tools": ["abacus"]}, "unknown tool 'abacus'; built-ins: calculator"),
        ({"tools": ["calculator", "calculator"]}, "two tools with the tag <calc>"),
        ({"result_template": "no field"}, "result_template"),
        ({"result_template": "{output} {other}"}, "no other field"),
        ({"max_output_chars": 0}, "max_output_chars must be >= 1"),
        ({"timeout_s": 0}, "timeout_s > 0"),
        ({"call_format": "xml"}, "call_format: one of tags, equals, json, got 'xml'"),
        ({"isolation": "vm"}, "isolation: process or thread, got 'vm'"),
        ({"result_role": " "}, "result_role: a chat role"),
        ({"call_format": "equals", "tools": ["calculator", "python"]}, "equals takes one tool, got 2"),
    ],
)
def test_bad_options_are_named(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        ToolEnv(**kwargs)


@pytest.mark.parametrize(
    "turn, text",
    [
        ("He has 7 + 2 =", " 9"),  # the arithmetic just before the "="
        ("So (3+4)*2 =", " 14"),
        ("The total is 1,200 - 50 =", " 1150"),
        ("12 / 5 =", " 2.4"),
        ("Cost: 3 ÷ 0 =", " error: division by zero"),
        ("x =", None),  # no digit: no call, the model goes on
        ("==", None),
    ],
)
def test_the_equals_format_calls_the_calculator_on_what_precedes_the_sign(turn, text):
    env = ToolEnv(call_format="equals")
    assert env.stop_strings == ["="]
    obs = env.start({}).step(turn, ended_by_eos=False)
    assert not obs.done and obs.text == text
    assert obs.counts.get("tool_calls", 0) == int(text is not None)
    assert obs.counts.get("tool_errors", 0) == int(bool(text) and "error" in text)
    assert env.start({}).step("7 + 2 = 9", ended_by_eos=True).done  # an EOS ends the row
    bracketed = ToolEnv(call_format="equals", result_template="[{output}]")
    assert bracketed.start({}).step("1+1=", ended_by_eos=False).text == "[2]"


@pytest.mark.parametrize(
    "turn, text, errors",
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "12*7+3"}}</tool_call>', "87", 0),
        ('Let me compute. <tool_call>\n{"name": "calc", "arguments": "2^10"}\n</tool_call>', "1024", 0),
        ('<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>', "HI", 0),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>',
            "error: division by zero",
            1,
        ),
        ("<tool_call>{name: calculator}</tool_call>", "error: the tool call is not JSON (", 1),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "error: the tool call is not JSON (nested too deep)", 1),
        ('<tool_call>["calculator"]</tool_call>', 'error: a tool call is {"name": ..., "arguments": ...}', 1),
        (
            '<tool_call>{"name": "abacus", "arguments": "1"}</tool_call>',
            "error: no tool named 'abacus'; tools: calc,",
            1,
        ),
        ('<tool_call>{"name": "calculator", "arguments": {"a": "1", "b": "2"}}</tool_call>', "error: the arguments", 1),
        ('{"name": "calculator"}</tool_call>', "error: </tool_call> without <tool_call>", 1),
    ],
)
def test_the_json_format_reads_chat_template_tool_calls(turn, text, errors):
    env = ToolEnv(tools=["calculator", f"{__name__}:shout"], call_format="json", result_role="tool", isolation="thread")
    assert env.stop_strings == ["</tool_call>"]
    obs = env.start({}).step(turn, ended_by_eos=False)
    assert obs.role == "tool" and not obs.done and obs.text.startswith(text)
    assert obs.counts["tool_calls"] == 1 and obs.counts["tool_errors"] == errors
    assert env.start({}).step("no call, the token limit", ended_by_eos=False).done


def test_a_result_role_keeps_the_template_bare_unless_given():
    assert step(ToolEnv(result_role="tool"), "<calc>2+2</calc>").text == "4"
    obs = step(ToolEnv(result_role="tool", result_template="<result>{output}</result>"), "<calc>2+2</calc>")
    assert (obs.text, obs.role) == ("<result>4</result>", "tool")
    assert step(ToolEnv(), "<calc>2+2</calc>").role is None


def test_load_env_names_what_is_wrong():
    with pytest.raises(ValueError, match="unknown environment 'chess'; built-ins: tools, feedback"):
        load_env("chess")
    with pytest.raises(ValueError, match="rollout.env_options do not fit"):
        load_env("tools", {"colour": "red"})
    with pytest.raises(ValueError, match="no start"):
        load_env(f"{__name__}:Observation")
    assert isinstance(load_env(f"{__name__}:StubEnv", {"answer": "x"}), StubEnv)


class StubEnv:
    """A user's environment: every turn gets ``answer`` back until the third."""

    stop_strings = ("!",)

    def __init__(self, answer: str):
        self.answer = answer

    def start(self, row):
        return self

    def step(self, turn, *, ended_by_eos):
        return Observation(text=self.answer)


def test_tool_calls_from_many_threads_each_get_their_own_result():
    """ToolEnv.parallel_steps: a round's rows step at once; a user tool's worker takes one call at a
    time, so every call gets its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    env = ToolEnv(tools=["calculator", f"{__name__}:shout"], timeout_s=5)
    assert env.parallel_steps
    turns = [f"<shout>row {i}</shout>" if i % 2 else f"<calc>{i}*{i}</calc>" for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda t: step(env, t).text, turns))
    want = [f"<result>ROW {i}</result>" if i % 2 else f"<result>{i * i}</result>" for i in range(16)]
    assert got == want
    env.close()


def described(text: str) -> str:
    """Reverses its input.

    Not part of the description."""
    return text[::-1]


def test_the_json_format_describes_its_tools_for_the_chat_template():
    env = ToolEnv(tools=["calculator", f"{__name__}:described", f"{__name__}:shout"], call_format="json")
    specs = env.tool_schemas
    assert [s["function"]["name"] for s in specs] == ["calculator", "described", "shout"]
    calc, desc, plain = (s["function"] for s in specs)
    assert all(s["type"] == "function" for s in specs)
    assert calc["parameters"] == {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    }
    assert desc["description"] == "Reverses its input." and desc["parameters"]["required"] == ["input"]
    assert plain["description"] == "The tool shout."  # no docstring
    # a call by the names the schemas give reaches the tools
    for name, arg, value, out in (("described", "input", "abc", "cba"), ("calculator", "expression", "2*3", "6")):
        call = json.dumps({"name": name, "arguments": {arg: value}})
        assert env.start({}).step(f"<tool_call>{call}</tool_call>", ended_by_eos=False).text == out
    assert ToolEnv(tools=["calculator"], call_format="json", schemas_in_prompt=False).tool_schemas is None
    assert ToolEnv(tools=["calculator"]).tool_schemas is None  # tags: the call format is not a chat template's
