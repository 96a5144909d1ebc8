"""The ``tools`` environment: the model calls a tool by writing ``<calc>12*7+3</calc>``; the rollout
pauses at the closing tag, the tool runs on the text between the tags, and ``<result>87</result>``
is appended before the model goes on.

Tools (``rollout.env_options.tools``, a list; default ``[calculator]``):

- ``calculator`` (tag ``calc``): exact rational arithmetic, :func:`grpokit.envs.calculator.calculate`;
- ``python`` (tag ``python``): the code run in a separate, limited process, sandboxed where the
  machine allows (:mod:`grpokit.envs.python_tool`; its limits: ``rollout.env_options.python``);
- ``module:function`` or ``path/to/file.py:function``: a user's ``str -> str`` function, tag = the
  function's name. As a reward function is (:mod:`grpokit.rewards.guard`), it runs with
  ``timeout_s`` in a worker process forked at its first call (``isolation: process``, the default;
  killed at the limit, a fresh one forked for the next call) or in a thread (``isolation:
  thread``: a timed-out call cannot be stopped there and runs on in the background; for a tool
  that must share the trainer's live state). An exception, a non-string result, a timeout or a
  worker that dies becomes an ``error: ...`` result the model reads, counted in ``tool_errors`` /
  ``tool_timeouts``, never an exception of the rollout.

Call formats (``rollout.env_options.call_format``):

- ``tags`` (the default): ``<calc>12*7+3</calc>``, one tag per tool; the result is appended as
  ``result_template`` (default ``<result>{output}</result>``);
- ``equals``: for a model that writes ``expression = number`` (a word-problem warm-up does), one
  tool (the calculator): the rollout pauses at each ``=``, the tool runs on the arithmetic just
  before it (the longest run of digits, spaces, ``. , + - * / × ÷ ^ ( ) %`` ending at the ``=``)
  and its output is appended as ``result_template`` (default `` {output}``), so ``7 + 2 =`` reads
  ``7 + 2 = 9``. An ``=`` with no digit before it appends nothing (no call; the model goes on);
- ``json``: the tool-call format of chat templates with tools (Hermes, Qwen2.5):
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "12*7+3"}}</tool_call>``; the
  name is a tool's (``calculator``, ``python``, a function's name) or its tag, the arguments one
  text value (or the text itself); anything else is an ``error:`` result.

With the ``json`` format the environment also gives the prompts the tools' descriptions
(``tool_schemas``, JSON-schema function specs): the recipe's prompts are rendered with the chat
template's ``tools=`` (:func:`grpokit.data.render_prompts`), so a template that lists tools in its
system prompt (Qwen2.5, Hermes, Llama 3.1) shows them; ``schemas_in_prompt: false`` leaves them
out.

``result_role`` (``tool``, ``user``; default None) appends the result as a message of that role in
the tokenizer's chat template instead of plain text (``Observation.role``; default template then
``{output}``): ``<|im_end|>\n<|im_start|>tool\n87<|im_end|>\n<|im_start|>assistant\n`` for ChatML.

Results longer than ``max_output_chars`` are cut (``… [cut at N characters]``). A turn that ends
without a call (an EOS, or no closing tag) ends the episode. A closing tag without its opening
tag in the turn gets an ``error:`` result.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpokit.envs.base import Observation
from grpokit.envs.calculator import calculate

__all__ = ["BUILTIN_TOOLS", "CALL_FORMATS", "ToolEnv"]

#: ``call_format`` -> the default ``result_template``
CALL_FORMATS: dict[str, str] = {"tags": "<result>{output}</result>", "equals": " {output}", "json": "{output}"}

#: the characters of the arithmetic a call in the ``equals`` format ends with (before its ``=``)
_ARITHMETIC_CHARS = frozenset("0123456789.,+-*/×÷^()% \t\n\r\x0b\x0c")

#: built-in tool name -> tag
BUILTIN_TOOLS: dict[str, str] = {"calculator": "calc", "python": "python"}


def _builtin(name: str, python: Mapping[str, Any]) -> Callable[[str], tuple[str, dict[str, int]]]:
    """A built-in tool as ``text -> (output, counts)``."""
    if name == "python":
        from grpokit.envs.python_tool import PythonLimits, run_python

        try:
            limits = PythonLimits(**python)
        except TypeError as e:
            raise ValueError(f"rollout.env_options.python: {e}") from None
        from grpokit.envs.python_tool import check_sandbox

        check_sandbox(limits)  # sandbox: required refuses here, when the environment is built
        return functools.partial(run_python, limits=limits)

    def calc(text: str) -> tuple[str, dict[str, int]]:
        out = calculate(text)
        return out, {"tool_calls": 1, "tool_errors": int(out.startswith("error:")), "tool_timeouts": 0}

    return calc


def _tool(spec: str) -> tuple[str, Callable[[str], Any]]:
    if ":" not in spec:
        raise ValueError(
            f"rollout.env_options.tools: unknown tool {spec!r}; built-ins: {', '.join(BUILTIN_TOOLS)}, "
            "or module:function"
        )
    from grpokit.utils.importing import import_object

    fn = import_object(spec, what="rollout.env_options.tools")
    return getattr(fn, "__name__", spec.rpartition(":")[2]), fn


class ToolEnv:
    """Tool calls written as tags (module docstring). Its episodes step in parallel
    (``parallel_steps``): the rows of a round run their calls together, each user tool's worker
    process taking one call at a time.

    Args:
        tools: tool names (built-ins or ``module:function``).
        python: the ``python`` tool's limits (:class:`grpokit.envs.python_tool.PythonLimits` fields).
        result_template: the text appended after a call; ``{output}`` is the tool's output
            (default: the call format's, :data:`CALL_FORMATS`).
        call_format: ``tags``, ``equals`` or ``json`` (module docstring).
        isolation: where users' own tools run: ``process`` or ``thread`` (module docstring).
        result_role: None (plain text) or the chat role the result is appended as (``tool``).
        max_output_chars: the longest output appended (>= 1).
        timeout_s: a user tool's time limit per call, seconds (> 0).
        schemas_in_prompt: with the ``json`` format, give the prompts :attr:`tool_schemas`.

    Raises:
        ValueError: no tools, an unknown tool, two tools with one tag, a template without
            ``{output}``, a limit out of range, an unknown call format or ``equals`` with other than
            one tool (each names the ``rollout.env_options`` key).
        ImportError: a ``module:function`` tool that cannot be imported.
    """

    parallel_steps = True

    def __init__(
        self,
        tools: Sequence[str] = ("calculator",),
        result_template: str | None = None,
        max_output_chars: int = 1000,
        timeout_s: float = 10.0,
        python: Mapping[str, Any] | None = None,
        call_format: str = "tags",
        isolation: str = "process",
        result_role: str | None = None,
        schemas_in_prompt: bool = True,
    ):
        _check_options(call_format, isolation, result_role, max_output_chars, timeout_s)
        if result_template is None:
            result_template = "{output}" if result_role is not None else CALL_FORMATS[call_format]
        _check_template(result_template)
        self.call_format, self.isolation, self.result_role = call_format, isolation, result_role
        self.result_template, self.max_output_chars, self.timeout_s = result_template, max_output_chars, timeout_s
        self.schemas_in_prompt = bool(schemas_in_prompt)
        self._workers: dict[int, Any] = {}  # id(user tool) -> (its worker process, a lock)
        self._lock = threading.Lock()
        self._add_tools(tools, python)
        if call_format == "equals":
            if len(self.tools) != 1:
                raise ValueError(
                    f"rollout.env_options.call_format: equals takes one tool, got {len(self.tools)}: "
                    f"{', '.join(map(str, tools))}"
                )
            self.stop_strings = ["="]
        elif call_format == "json":
            self.stop_strings = ["</tool_call>"]
        else:
            self.stop_strings = [f"</{tag}>" for tag in self.tools]

    def _add_tools(self, tools: Sequence[str], python: Mapping[str, Any] | None) -> None:
        if isinstance(tools, str) or not tools:
            raise ValueError(f"rollout.env_options.tools: a list of tool names, got {tools!r}")
        self.tools: dict[str, Callable[[str], Any]] = {}
        self.builtin: set[str] = set()  # tags of built-ins: bounded, they return (output, counts)
        self.names: dict[str, str] = {}  # a tool's name or tag -> its tag (the json call format)
        self.display: dict[str, str] = {}  # tag -> the tool's name (a built-in's, a function's)
        for spec in map(str, tools):
            if spec in BUILTIN_TOOLS:
                tag, fn = BUILTIN_TOOLS[spec], _builtin(spec, python or {})
                self.builtin.add(tag)
                self.names[spec] = tag
            else:
                tag, fn = _tool(spec)
            self.names[tag] = tag
            self.display.setdefault(tag, spec if spec in BUILTIN_TOOLS else tag)
            if tag in self.tools:
                raise ValueError(f"rollout.env_options.tools: two tools with the tag <{tag}>")
            self.tools[tag] = fn
        if python is not None and "python" not in self.builtin:
            raise ValueError("rollout.env_options.python: set, but python is not one of rollout.env_options.tools")

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tools as chat-template function specs (``{"type": "function", "function": {name,
        description, parameters}}``, one text argument each: ``expression``, ``code`` or ``input``)
        for the ``json`` call format with ``schemas_in_prompt``; else None."""
        if self.call_format != "json" or not self.schemas_in_prompt:
            return None
        return [_schema(self.display[tag], tag in self.builtin, fn) for tag, fn in self.tools.items()]

    def start(self, row: Mapping[str, Any]) -> _ToolEpisode:
        """A new episode (tools see only the call's text, not the row)."""
        return _ToolEpisode(self)

    def run(self, tag: str, text: str) -> tuple[str, dict[str, int]]:
        """``(output, counts)`` of tool ``tag`` on ``text``: the output cut to ``max_output_chars``;
        ``counts``: ``tool_calls`` 1, ``tool_errors`` 1 for an ``error:`` output, ``tool_timeouts``."""
        fn = self.tools[tag]
        if tag in self.builtin:  # bounded, and never raises
            out, counts = fn(text)
        else:
            counts = {"tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}
            out = self._guarded(fn, text, counts)
            counts["tool_errors"] = int(out.startswith("error:"))
        if len(out) > self.max_output_chars:
            out = out[: self.max_output_chars] + f"… [cut at {self.max_output_chars} characters]"
        return out, counts

    def _guarded(self, fn: Callable[[str], Any], text: str, counts: dict[str, int]) -> str:
        """A user tool's output on ``text``, run as :attr:`isolation` says; a timeout, an exception
        (``SystemExit`` included), a dead worker or a non-string result is an ``error:`` text."""
        from grpokit.rewards.guard import RewardTimeout, call_in_thread

        try:
            if self.isolation == "process":
                out = self._in_process(fn, text)
            else:  # a hung call is abandoned in its thread
                out = call_in_thread(fn, self.timeout_s, (text,), {})
        except RewardTimeout:
            counts["tool_timeouts"] = 1
            return f"error: the tool timed out after {self.timeout_s:g} s"
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a user tool's fault is the model's observation
            return f"error: the tool raised {type(e).__name__}: {e}"
        if not isinstance(out, str):
            return f"error: the tool returned {type(out).__name__}, not text"
        return out

    def _in_process(self, fn: Callable[[str], Any], text: str) -> Any:
        """``fn(text)`` in the tool's worker process (forked at its first call), one call at a time."""
        from grpokit.rewards.guard import Worker

        with self._lock:
            if id(fn) not in self._workers:
                self._workers[id(fn)] = (Worker(fn, what="tool"), threading.Lock())
            worker, busy = self._workers[id(fn)]
        with busy:  # one call at a time through a worker's pipe
            return worker.call(self.timeout_s, (text,), {})

    def close(self) -> None:
        """End the users' tools' worker processes (they also end with this process)."""
        for worker, _ in self._workers.values():
            worker.close()
        self._workers.clear()


class _ToolEpisode:
    def __init__(self, env: ToolEnv):
        self.env = env

    def step(self, turn: str, *, ended_by_eos: bool) -> Observation:
        if ended_by_eos:
            return Observation(done=True)
        if self.env.call_format == "equals":
            return self._equals(turn)
        if self.env.call_format == "json":
            return self._json(turn)
        ends = [(turn.rfind(stop), tag) for tag, stop in zip(self.env.tools, self.env.stop_strings)]
        at, tag = max(ends)
        if at < 0:  # the turn stopped without a call: the token limit
            return Observation(done=True)
        opening = f"<{tag}>"
        start = turn.rfind(opening, 0, at)
        if start < 0:
            out, counts = f"error: </{tag}> without {opening}", {"tool_calls": 1, "tool_errors": 1}
        else:
            out, counts = self.env.run(tag, turn[start + len(opening) : at])
        return self._result(out, counts)

    def _equals(self, turn: str) -> Observation:
        at = turn.rfind("=")
        if at < 0:  # the turn stopped without a call: the token limit
            return Observation(done=True)
        start = at
        while start > 0 and turn[start - 1] in _ARITHMETIC_CHARS:  # linear, from the "=" back
            start -= 1
        expression = turn[start:at].strip()
        if not any(c.isdigit() for c in expression):
            return Observation(text=None)  # "x =", "==": no call, the model goes on
        (tag,) = self.env.tools
        out, counts = self.env.run(tag, expression)
        return self._result(out, counts)

    def _json(self, turn: str) -> Observation:
        at = turn.rfind("</tool_call>")
        if at < 0:  # the turn stopped without a call: the token limit
            return Observation(done=True)
        start = turn.rfind("<tool_call>", 0, at)
        if start < 0:
            return self._result("error: </tool_call> without <tool_call>", {"tool_calls": 1, "tool_errors": 1})
        tag, text = _json_call(turn[start + len("<tool_call>") : at], self.env.names)
        if tag is None:
            return self._result(text, {"tool_calls": 1, "tool_errors": 1})
        out, counts = self.env.run(tag, text)
        return self._result(out, counts)

    def _result(self, out: str, counts: dict[str, int]) -> Observation:
        cap = self.env.max_output_chars  # error texts too (they may quote the model's call)
        if len(out) > cap:
            out = out[:cap] + f"… [cut at {cap} characters]"
        return Observation(text=self.env.result_template.format(output=out), counts=counts, role=self.env.result_role)


#: a built-in tool's description and argument in :attr:`ToolEnv.tool_schemas`
_BUILTIN_SCHEMAS = {
    "calculator": ("Exact arithmetic on rational numbers: + - * / ^ and parentheses.", "expression"),
    "python": ("Runs Python code in a fresh sandboxed process and returns what it prints.", "code"),
}


def _schema(name: str, builtin: bool, fn: Callable[[str], Any]) -> dict[str, Any]:
    """One tool's function spec: a built-in's fixed text, a user tool's docstring (first paragraph)."""
    if builtin:
        description, arg = _BUILTIN_SCHEMAS[name]
    else:
        doc = (getattr(fn, "__doc__", None) or "").strip().split("\n\n")[0]
        description, arg = " ".join(doc.split()) or f"The tool {name}.", "input"
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
        },
    }


def _check_options(
    call_format: str, isolation: str, result_role: str | None, max_output_chars: int, timeout_s: float
) -> None:
    if call_format not in CALL_FORMATS:
        raise ValueError(f"rollout.env_options.call_format: one of {', '.join(CALL_FORMATS)}, got {call_format!r}")
    if isolation not in ("process", "thread"):
        raise ValueError(f"rollout.env_options.isolation: process or thread, got {isolation!r}")
    if result_role is not None and (not isinstance(result_role, str) or not result_role.strip()):
        raise ValueError(f"rollout.env_options.result_role: a chat role such as tool, or null; got {result_role!r}")
    if max_output_chars < 1 or not timeout_s > 0:
        raise ValueError(
            f"rollout.env_options: max_output_chars must be >= 1 and timeout_s > 0, got {max_output_chars}, {timeout_s}"
        )


def _check_template(result_template: str) -> None:
    try:
        ok = "\0" in result_template.format(output="\0")
    except (KeyError, IndexError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            f"rollout.env_options.result_template: {result_template!r} must use {{output}} and no other field"
        )


def _json_call(body: str, names: Mapping[str, str]) -> tuple[str | None, str]:
    """``(tag, input)`` of a JSON tool call ``{"name": ..., "arguments": ...}``, or ``(None, error)``."""
    import json

    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"error: the tool call is not JSON ({e.msg} at character {e.pos})"
    except (ValueError, RecursionError):  # nested too deep for the parser
        return None, "error: the tool call is not JSON (nested too deep)"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None, 'error: a tool call is {"name": ..., "arguments": ...}'
    tag = names.get(call["name"])
    if tag is None:
        return None, f"error: no tool named {call['name']!r}; tools: {', '.join(sorted(names))}"
    args = call.get("arguments", "")
    if isinstance(args, str):
        return tag, args
    if isinstance(args, dict) and len(args) == 1 and isinstance(next(iter(args.values())), str):
        return tag, next(iter(args.values()))
    return None, 'error: the arguments must be one text value, such as {"expression": "2+2"}'
