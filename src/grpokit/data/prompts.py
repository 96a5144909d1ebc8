"""Turn a question (or a conversation) into the model's prompt text, and drop prompts that are too long.

A row's prompt is either a question (text) or a conversation: a list of ``{"role", "content"}``
messages (the conversational format of TRL and most hub datasets), kept by
:func:`grpokit.data.files.map_fields` in the row's ``prompt_messages`` column (its ``prompt`` is
then the last user message's text). Rendering rules, the same for training, evaluation and SFT
(:func:`render_prompts`):

- ``data.prompt_template`` is applied to the last user message's content only (earlier turns are
  shown as written), as it is applied to a plain question;
- a conversation's own first-position system message replaces ``data.system_prompt``; without one,
  ``data.system_prompt`` (if set) is put first;
- a chat template without a system role (Gemma-style templates raise ``System role not
  supported``): the system text is folded into the first user message (``system + "\\n\\n" +
  user``), and :func:`render_prompts` says so in one line;
- no chat template at all: the messages' contents joined by blank lines (``system\\n\\nquestion``
  for a single question).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ROLES",
    "build_chat_prompt",
    "check_messages",
    "filter_by_prompt_length",
    "render_prompts",
    "system_role_supported",
]

ROLES = ("system", "user", "assistant", "tool")
"""The message roles a conversational prompt may use."""

_SYSTEM_SUPPORT: dict[str, bool] = {}  # repr(chat_template) -> whether it accepts a system message


def check_messages(value: Any, where: str) -> list[dict[str, Any]]:
    """A conversational prompt, checked: a copy of ``value`` as a list of message dicts.

    Args:
        value: the prompt field's value: a list (or tuple, or 1-d numpy array) of dicts, each with
            ``role`` (one of :data:`ROLES`) and ``content`` (str); other keys are kept.
        where: names the field in messages, e.g. ``"data.jsonl: row 3, field 'prompt'"``.

    Returns:
        A new list of new dicts (the input is not modified).

    Raises:
        ValueError: (one line starting with ``where``) an empty list, an element that is not a
            dict, a missing ``role``/``content``, an unknown role, a non-string content, a system
            message not in first position, no user message, or a last message that is neither a
            user nor a tool message (the model answers the last message).
    """
    if hasattr(value, "tolist") and getattr(value, "ndim", None) == 1:  # pandas/numpy list columns
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"{where}: expected a question (text) or a list of {{role, content}} messages, got a {type(value).__name__}"
        )
    if not value:
        raise ValueError(f"{where}: an empty list of messages")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise ValueError(f"{where}: message {j} is a {type(m).__name__}, expected a dict with role and content")
        missing = [k for k in ("role", "content") if k not in m]
        if missing:
            raise ValueError(f"{where}: message {j} has no {' or '.join(missing)}; keys present: {sorted(m)}")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise ValueError(f"{where}: message {j} has role {role!r}; expected one of {list(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(
                f"{where}: message {j} ({role}) has content of type {type(content).__name__}, expected text (str)"
            )
        if role == "system" and j > 0:
            raise ValueError(f"{where}: message {j} is a system message; a system message may only come first")
        out.append(dict(m))
    if not any(m["role"] == "user" for m in out):
        raise ValueError(f"{where}: no user message (roles: {[m['role'] for m in out]})")
    if out[-1]["role"] not in ("user", "tool"):
        raise ValueError(
            f"{where}: the last message has role {out[-1]['role']!r}; the prompt must end with "
            "a user (or tool) message, which the model answers"
        )
    return out


def _last_user(messages: list[dict[str, Any]]) -> int:
    return max(j for j, m in enumerate(messages) if m["role"] == "user")


def system_role_supported(tokenizer: Any) -> bool:
    """False if the tokenizer's chat template refuses a system message (raises a Jinja
    ``TemplateError`` for ``[system, user]`` but renders ``[user]``), else True (also without a
    chat template). Cached per chat template text."""
    chat_template = getattr(tokenizer, "chat_template", None)
    if not chat_template:
        return True
    key = repr(chat_template)
    if key not in _SYSTEM_SUPPORT:
        from jinja2.exceptions import TemplateError

        def renders(messages: list[dict[str, str]]) -> bool:
            try:
                tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            except TemplateError:
                return False
            return True

        user = {"role": "user", "content": "Hi"}
        _SYSTEM_SUPPORT[key] = renders([{"role": "system", "content": "Be brief."}, user]) or not renders([user])
    return _SYSTEM_SUPPORT[key]


def build_chat_prompt(
    tokenizer: Any,
    question: str | Sequence[Mapping[str, Any]],
    *,
    system_prompt: str | None = None,
    template: str = "{question}",
    fold_system: bool | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Format the question into ``template``, then apply the tokenizer's chat template
    (the rules are in the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer (anything with ``chat_template`` and
            ``apply_chat_template``).
        question: the question text, or a conversation (a list of ``{"role", "content"}``
            messages, checked by :func:`check_messages`); ``template`` then applies to the last
            user message's content, and the conversation's own system message replaces
            ``system_prompt``.
        system_prompt: optional system message.
        template: a ``str.format`` template with a ``{question}`` field, e.g.
            ``"{question}\\nPut your final answer within \\\\boxed{{}}."`` (double the braces
            that are not fields).
        fold_system: put the system text at the start of the first user message instead of in a
            system message; None: when :func:`system_role_supported` is False.
        tools: function specs handed to the chat template (``apply_chat_template(tools=...)``:
            a template that lists tools shows them, one that does not ignores them); None: none.
            Without a chat template they are not shown.

    Returns:
        The prompt text, ending with the assistant's generation prompt
        (``add_generation_prompt=True``, not tokenized). Without a chat template: the plain
        text, preceded by ``system_prompt + "\\n\\n"`` when a system prompt is given (for a
        conversation: its contents joined by ``"\\n\\n"``).

    Raises:
        ValueError: ``template`` has fields other than ``{question}`` or bad braces; a malformed
            conversation (:func:`check_messages`).
        jinja2.exceptions.TemplateError: the chat template refuses the messages for another reason.
    """
    if isinstance(question, str):
        messages = [{"role": "user", "content": question}]
    else:
        messages = check_messages(question, "conversational prompt")
    last = _last_user(messages)
    try:
        messages[last]["content"] = template.format(question=messages[last]["content"])
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"prompt template {template!r} must use only the field {{question}}"
            f" (write literal braces as {{{{ }}}}): {e!r}"
        ) from e
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    if not getattr(tokenizer, "chat_template", None):
        return "\n\n".join(m["content"] for m in messages)
    if fold_system is None:
        fold_system = not system_role_supported(tokenizer)
    if fold_system and messages[0]["role"] == "system":
        system, messages = messages[0]["content"], messages[1:]
        first = next(j for j, m in enumerate(messages) if m["role"] == "user")
        messages[first] = {**messages[first], "content": f"{system}\n\n{messages[first]['content']}"}
    extra = {"tools": [dict(t) for t in tools]} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)


def render_prompts(
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    *,
    system_prompt: str | None,
    template: str,
    source: str,
    system_key: str = "data.system_prompt",
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[str]:
    """:func:`build_chat_prompt` of every row (its ``prompt_messages`` if it has them, else its
    ``prompt``): the one place training, evaluation and SFT render prompts.

    With a chat template that has no system role and a system text to show (``system_prompt``
    or a row's own system message), the text is folded into the first user message and one line
    on stderr says so, naming ``system_key`` and the model. ``tools`` (the environment's
    ``tool_schemas``) go to the chat template; one line on stderr says so when it does not show
    them (no chat template, or one that ignores ``tools=``).

    Raises:
        ValueError: a bad ``template``; one line naming ``source`` and the row: a malformed
            conversation, or a chat template that refuses the row's messages (its message quoted).
    """
    from jinja2.exceptions import TemplateError

    model = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    questions = [
        row["prompt"]
        if row.get("prompt_messages") is None
        else check_messages(row["prompt_messages"], f"{source}: row {i}, field 'prompt_messages'")
        for i, row in enumerate(rows)
    ]
    fold = not system_role_supported(tokenizer)
    if fold:
        own = any(not isinstance(q, str) and q[0]["role"] == "system" for q in questions)
        what = " and ".join(([system_key] if system_prompt else []) + (["the rows' system messages"] if own else []))
        if what:
            print(
                f"[grpokit] note: the chat template of {model} has no system role, so {what} is put at the start "
                "of the first user message",
                file=sys.stderr,
                flush=True,
            )
    if tools and not _shows_tools(tokenizer, tools):
        print(
            f"[grpokit] note: the chat template of {model} does not show tools, so the prompts do not list "
            "rollout.env's tool schemas (the model learns the call format from the warm-up or the prompt template)",
            file=sys.stderr,
            flush=True,
        )
    out = []
    for i, (row, question) in enumerate(zip(rows, questions)):
        try:
            out.append(
                build_chat_prompt(
                    tokenizer, question, system_prompt=system_prompt, template=template, fold_system=fold, tools=tools
                )
            )
        except TemplateError as e:
            raise ValueError(
                f"{source}: row {i} ({str(row.get('prompt', ''))[:40]!r}): the chat template of "
                f"{model} refuses its messages: {' '.join(str(e).split())}"
            ) from None
    return out


def _shows_tools(tokenizer: Any, tools: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the tokenizer's chat template renders a conversation differently with ``tools``."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    user = [{"role": "user", "content": "Hi"}]
    plain = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    return plain != tokenizer.apply_chat_template(
        user, tokenize=False, add_generation_prompt=True, tools=[dict(t) for t in tools]
    )


def filter_by_prompt_length(
    prompts: list[str],
    tokenizer: Any,
    max_prompt_tokens: int,
) -> tuple[list[int], int]:
    """Indices of prompts with at most ``max_prompt_tokens`` tokens, and how many were skipped.

    Args:
        prompts: prompt texts, formatted for the model (chat template applied, or plain text).
        tokenizer: the model's tokenizer; prompts are counted as
            :func:`grpokit.models.loading.encode_prompts` encodes them for generation (a BOS included
            where the tokenizer adds one).
        max_prompt_tokens: the limit (inclusive).

    Returns:
        ``(kept_indices, n_skipped)`` with ``kept_indices`` in increasing order.

    Raises:
        ValueError: ``max_prompt_tokens < 1``.
    """
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    if not prompts:
        return [], 0
    from grpokit.models.loading import encode_prompts

    ids = encode_prompts(tokenizer, list(prompts))
    kept = [i for i, seq in enumerate(ids) if len(seq) <= max_prompt_tokens]
    return kept, len(prompts) - len(kept)
