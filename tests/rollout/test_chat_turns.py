"""Observations as chat messages (``grpokit.rollout.chat_turns``): the text appended is what the
tokenizer's own template writes for that message after an assistant turn."""

from __future__ import annotations

import pytest

from grpokit.rollout.chat_turns import chat_message_text


def test_a_tool_message_in_smollm2s_chatml_template(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert chat_message_text(tok, "tool", "87", after_eos=False) == (
        "<|im_end|>\n<|im_start|>tool\n87<|im_end|>\n<|im_start|>assistant\n"
    )
    # the model wrote its EOS (<|im_end|>): only the rest of the closing text
    assert chat_message_text(tok, "user", "Try again.", after_eos=True) == (
        "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"
    )
    # appended to a rendered conversation, it gives the template's rendering of the longer one
    msgs = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "<calc>2+2</calc>"}]
    head = tok.apply_chat_template(msgs, tokenize=False)
    head = head[: head.rindex("<calc>2+2</calc>") + len("<calc>2+2</calc>")]
    whole = tok.apply_chat_template(
        [*msgs, {"role": "tool", "content": "4"}], tokenize=False, add_generation_prompt=True
    )
    assert head + chat_message_text(tok, "tool", "4", after_eos=False) == whole


class _Tok:
    """A tokenizer stand-in with a template given as a function of the messages."""

    eos_token = "</s>"

    def __init__(self, render, template="x"):
        self.render, self.chat_template = render, template

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
        return self.render(msgs, add_generation_prompt)


def test_templates_that_cannot_append_a_message_are_refused():
    with pytest.raises(ValueError, match="Observation.role='tool': the tokenizer _Tok has no chat template"):
        chat_message_text(_Tok(None, template=None), "tool", "x", after_eos=False)

    def last_only(msgs, gen):  # renders only the last message: not an appended suffix
        return f"[{msgs[-1]['role']}] {msgs[-1]['content']}</s>" + (" [assistant]" if gen else "")

    with pytest.raises(ValueError, match="does not render a tool message after an assistant message"):
        chat_message_text(_Tok(last_only), "tool", "x", after_eos=False)

    def plain(msgs, gen):
        return "".join(f"[{m['role']}] {m['content']}</s>\n" for m in msgs) + ("[assistant] " if gen else "")

    tok = _Tok(plain)
    assert chat_message_text(tok, "tool", "42", after_eos=False) == "</s>\n[tool] 42</s>\n[assistant] "
    assert chat_message_text(tok, "tool", "42", after_eos=True) == "\n[tool] 42</s>\n[assistant] "
