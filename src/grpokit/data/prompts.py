"""Turn a question into the model's prompt text, and drop prompts that are too long."""

from __future__ import annotations

from typing import Any

__all__ = ["build_chat_prompt", "filter_by_prompt_length"]


def build_chat_prompt(
    tokenizer: Any,
    question: str,
    *,
    system_prompt: str | None = None,
    template: str = "{question}",
) -> str:
    """Format ``question`` into ``template``, then apply the tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with ``chat_template`` and
            ``apply_chat_template``).
        question: the question text.
        system_prompt: optional system message.
        template: a ``str.format`` template with a ``{question}`` field, e.g.
            ``"{question}\\nPut your final answer within \\\\boxed{{}}."`` (double the braces
            that are not fields).

    Returns:
        The prompt text, ending with the assistant's generation prompt
        (``add_generation_prompt=True``, not tokenized). Without a chat template: the plain
        text, preceded by ``system_prompt + "\\n\\n"`` when a system prompt is given.

    Raises:
        ValueError: ``template`` has fields other than ``{question}`` or bad braces.
    """
    try:
        user_text = template.format(question=question)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"prompt template {template!r} must use only the field {{question}}"
            f" (write literal braces as {{{{ }}}}): {e!r}"
        ) from e
    if not getattr(tokenizer, "chat_template", None):
        return f"{system_prompt}\n\n{user_text}" if system_prompt else user_text
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": user_text})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def filter_by_prompt_length(
    prompts: list[str],
    tokenizer: Any,
    max_prompt_tokens: int,
) -> tuple[list[int], int]:
    """Indices of prompts with at most ``max_prompt_tokens`` tokens, and how many were skipped.

    Args:
        prompts: prompt texts, formatted for the model (chat template applied, or plain text).
        tokenizer: the model's tokenizer; prompts are counted as
            :func:`grpokit.models.encode_prompts` encodes them for generation (a BOS included
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
    from grpokit.models import encode_prompts

    ids = encode_prompts(tokenizer, list(prompts))
    kept = [i for i, seq in enumerate(ids) if len(seq) <= max_prompt_tokens]
    return kept, len(prompts) - len(kept)
