"""The environment seam: what a multi-turn rollout (:mod:`grpokit.rollout.multiturn`) talks to.

An :class:`Environment` is made once per run from the recipe (``rollout.env``, :func:`load_env`); for
each row it starts an :class:`Episode` that sees the row's columns (``question``, ``answer``, ...).
The rollout samples a model turn until an EOS, a token budget, or one of the environment's
``stop_strings`` (the end of a tool call: ``</calc>``); the episode reads that turn's text and
answers with an :class:`Observation`: text appended to the transcript as context the policy attends
to but never trains on, or ``done`` (the row's transcript ends there).

Built-ins (:data:`ENVIRONMENTS`): ``tools`` (:mod:`grpokit.envs.tools`: calculator, Python, users'
own ``module:function`` tools) and ``feedback`` (:mod:`grpokit.envs.feedback`: a wrong answer is
told so and gets another turn). A user's own environment is named ``module:Class`` (or
``path/to/file.py:Class``) and built with the recipe's ``rollout.env_options`` as keyword arguments.
Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["ENVIRONMENTS", "Environment", "Episode", "Observation", "load_env"]


@dataclass
class Observation:
    """An environment's answer to one model turn.

    ``text``: appended to the transcript after the turn (tokenized once, never trained on); None or
    "" appends nothing. ``done``: the row's transcript ends after this turn (``text`` is then not
    appended). ``counts``: per-row event counts summed over the episode and logged as
    ``env/<name>`` metrics (``tool_calls``, ``tool_errors``, ``tool_timeouts``). ``role``: None
    appends ``text`` as it is; a role (``tool``, ``user``) appends it as a message of that role in
    the tokenizer's chat template, the model's turn closed first
    (:func:`grpokit.rollout.chat_turns.chat_message_text`)."""

    text: str | None = None
    done: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    role: str | None = None


@runtime_checkable
class Episode(Protocol):
    """One row's conversation with the environment."""

    def step(self, turn: str, *, ended_by_eos: bool) -> Observation:
        """The model's ``turn`` (the text it wrote since the last observation, decoded without special
        tokens; ``ended_by_eos``: the turn ended with an EOS token, not at a stop string) ->
        what to append, or done. Must not raise for any text the model may write: a malformed call is
        an observation telling the model so."""
        ...


@runtime_checkable
class Environment(Protocol):
    """Makes an :class:`Episode` per row; ``stop_strings``: the texts at which a model turn pauses
    for the environment (empty: a turn ends only at an EOS or the token limit). An environment may
    also set ``parallel_steps = True``: its episodes may step at the same time, in threads (the
    rows of a round ask them together; the built-in ``tools`` does), and ``tool_schemas``: a list
    of chat-template function specs the prompts are rendered with (``apply_chat_template(tools=…)``,
    :func:`grpokit.data.render_prompts`), or None (the ``tools`` environment's ``json`` format sets it)."""

    stop_strings: Sequence[str]

    def start(self, row: Mapping[str, Any]) -> Episode:
        """A new episode for the dataset row ``row`` (its columns)."""
        ...


#: ``rollout.env`` name -> ``module:Class``; imported when chosen
ENVIRONMENTS = {"tools": "grpokit.envs.tools:ToolEnv", "feedback": "grpokit.envs.feedback:FeedbackEnv"}


def load_env(name: str, options: Mapping[str, Any] | None = None) -> Environment:
    """The environment ``name`` (a built-in of :data:`ENVIRONMENTS`, or ``module:Class``) built with
    ``options`` as keyword arguments.

    Raises:
        ValueError: an unknown name, options the class does not take, or an object that is not an
            :class:`Environment` (no ``start`` or ``stop_strings``); the message names ``rollout.env``.
        ImportError: a ``module:Class`` that cannot be imported.
    """
    from grpokit.utils.importing import import_object

    spec = ENVIRONMENTS.get(name, name)
    if ":" not in spec:
        raise ValueError(
            f"rollout.env: unknown environment {name!r}; built-ins: {', '.join(ENVIRONMENTS)}, or module:Class"
        )
    cls = import_object(spec, what="rollout.env")
    try:
        env = cls(**dict(options or {}))
    except TypeError as e:
        raise ValueError(f"rollout.env={name!r}: rollout.env_options do not fit {spec}: {e}") from None
    if not isinstance(env, Environment):
        raise ValueError(f"rollout.env={name!r}: {spec} has no start(row) method or no stop_strings")
    return env
