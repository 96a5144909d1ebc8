"""An environment's observation as a chat message (``Observation.role``), rendered by the tokenizer's
own chat template.

A multi-turn row is one token sequence; the model's turn is open when the environment answers (it
stopped at a tool call's closing tag) or just closed (it wrote its EOS). To append a ``tool`` or
``user`` message the way the model's template writes one, :func:`chat_message_text` renders a
two-message conversation with and without the new message (``apply_chat_template``, no tokens) and
takes the difference: what closes an assistant message (``<|im_end|>\\n`` for ChatML templates),
then the new message and the assistant's generation prompt. The whole conversation is never
re-rendered or re-tokenized; only this text is tokenized, once, when it is appended.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["chat_message_parts", "chat_message_text"]

_MARK = "GRPOKIT_ASSISTANT_TURN"  # a placeholder the templates copy verbatim


@lru_cache(maxsize=64)
def _pieces(tokenizer: Any, role: str) -> tuple[str, str, str]:
    """``(close, head, tail)``: the text after an assistant message's content, and the new message
    rendered around its content (``head + content + tail``), for ``tokenizer``'s template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"Observation.role={role!r}: the tokenizer {type(tokenizer).__name__} has no chat template; "
            "append plain text instead (Observation.role None)"
        )
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}]
    content = _MARK + "_CONTENT"
    a = tokenizer.apply_chat_template(base, tokenize=False)
    b = tokenizer.apply_chat_template(
        [*base, {"role": role, "content": content}], tokenize=False, add_generation_prompt=True
    )
    if not b.startswith(a) or _MARK not in a or b[len(a) :].count(content) != 1:
        raise ValueError(
            f"Observation.role={role!r}: this chat template does not render a {role} message after an "
            "assistant message as appended text (its rendering changes what came before); append "
            "plain text instead"
        )
    close = a[a.rindex(_MARK) + len(_MARK) :]
    head, tail = b[len(a) :].split(content)
    return close, head, tail


def chat_message_text(tokenizer: Any, role: str, content: str, *, after_eos: bool) -> str:
    """The text that appends a ``role`` message holding ``content`` to an assistant turn, in
    ``tokenizer``'s chat template, ending with the assistant's generation prompt.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        role: the message's role (``tool``, ``user``, ...).
        content: its text.
        after_eos: the model's turn ended with its EOS token: the closing text's leading EOS
            (``<|im_end|>``) is already in the transcript and is left out.

    Returns:
        e.g. for a ChatML template, ``"<|im_end|>\\n<|im_start|>tool\\n42<|im_end|>\\n<|im_start|>assistant\\n"``.

    Raises:
        ValueError: no chat template, or one that does not render the message as an appended
            suffix (the message names ``Observation.role``).
    """
    before, after = chat_message_parts(tokenizer, role, after_eos=after_eos)
    return before + content + after


def chat_message_parts(tokenizer: Any, role: str, *, after_eos: bool) -> tuple[str, str]:
    """``(before, after)``: the template's text around a ``role`` message's content appended to an
    assistant turn (:func:`chat_message_text` is ``before + content + after``); raises as it does."""
    close, head, tail = _pieces(tokenizer, role)
    if after_eos:
        eos = tokenizer.eos_token or ""
        close = close[len(eos) :] if eos and close.startswith(eos) else close
    return close + head, tail
