"""Learned process reward models (PRMs) as process reward functions.

Both classes follow the process-reward protocol of ``grpokit.process.verifier``:
``prm(prompts, completions, steps, **columns) -> list[list[float | None]]``, one score in [0, 1] per
step, read at a *tag token* placed after each step.

- :class:`TokenProbPRM` (Math-Shepherd, arXiv 2312.08935): a causal LM; the score of step k is
  ``softmax([z_good, z_bad])[0]`` where ``z`` are the LM logits at the k-th step tag, i.e. P(good)
  renormalized over the two candidate tokens.
- :class:`ClassificationPRM` (Qwen2.5-Math-PRM style): a model emitting C ≥ 2 class logits per
  token (``AutoModelForTokenClassification``, or a PRM head); the score of step k is
  ``softmax(logits)[positive_label]`` at the k-th separator.

**Input layout** (one row per completion; pieces are tokenized *separately* and concatenated, so the
tag positions are known exactly, even if a step contains the tag text or the tag would merge with
its neighbours under whole-text tokenization)::

    ids = enc(format_prompt(prompt), add_special_tokens=True)
    for each step:  ids += enc(clean(step)) + tag_ids + enc(step_suffix)     # score at last tag id

``clean(step)`` strips whitespace and a trailing copy of the tag (steps generated in
``... ки`` format are not tagged twice). ``tag_ids = enc(tag)`` (or ``[tag]`` for an int id); a
multi-token tag is read at its **last** token. Rows are padded (left or right) with an attention
mask and explicit ``position_ids = cumsum(mask) - 1``, so a row scores the same alone or in a batch.
Steps whose tag falls beyond ``max_length`` tokens score None. One forward pass per batch of
``batch_size`` rows (rows sorted by length), under ``torch.inference_mode()``.

Differences from the reference implementations: they tokenize the whole text and search the tag
id; we assemble pieces (exact positions, no tag collisions). With a special-token tag such as
Qwen's ``<extra_0>`` both give the same ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from grpokit.rewards.scoring import PositionScorer, Scores

__all__ = ["ClassificationPRM", "StepLayout", "TokenProbPRM"]


def _default_format_prompt(prompt: str) -> str:
    return prompt.rstrip() + "\n"


def vocab_ids(tokenizer: Any, tag: str | int, what: str, *, single: bool = False) -> list[int]:
    """Token ids of ``tag`` (an int is taken as an id; ``single``: exactly one id). ``what`` names the
    key in the error.

    Raises:
        ValueError: ``tag`` empty or not in the tokenizer's vocabulary, or (``single``) more than one id.
    """
    vocab = len(tokenizer)
    if isinstance(tag, int):
        ids = [tag]
    else:
        ids = tokenizer.encode(tag, add_special_tokens=False) if tag else []
    unk = getattr(tokenizer, "unk_token_id", None)
    is_unk = unk is not None and unk in ids and tag not in (unk, getattr(tokenizer, "unk_token", None))
    if not ids or is_unk or any(not 0 <= i < vocab for i in ids):
        raise ValueError(f"{what} {tag!r} is not in the tokenizer's vocabulary (encodes to {ids})")
    if single and len(ids) != 1:
        raise ValueError(
            f"{what} {tag!r} must be a single token but encodes to {len(ids)} ids {ids}; "
            "pass the token id (int) instead"
        )
    return ids


def _clean_step(step: str, tag: str | int) -> str:
    s = step.strip()
    if isinstance(tag, str) and tag.strip() and s.endswith(tag.strip()):
        s = s[: -len(tag.strip())].rstrip()
    return s


class StepLayout:
    """The token layout of one PRM row (module docstring), without a model: what a PRM scores and
    what :mod:`grpokit.process.prm_train` trains on are built by the same code.

    Args:
        tokenizer: the PRM's tokenizer.
        tag: the step tag (or separator) text, or its token id.
        tag_what: the tag's name in error messages (``step_tag``/``separator``).
        step_suffix: text after each tag.
        format_prompt: ``prompt -> text`` before the steps (default ``prompt.rstrip() + "\\n"``).

    Raises:
        ValueError: the tag is not in the tokenizer's vocabulary.
    """

    def __init__(
        self,
        tokenizer: Any,
        tag: str | int,
        tag_what: str = "step_tag",
        step_suffix: str = "\n",
        format_prompt: Callable[[str], str] | None = None,
    ) -> None:
        self.tokenizer, self.tag = tokenizer, tag
        self.tag_ids = vocab_ids(tokenizer, tag, tag_what)
        self.suffix_ids = tokenizer.encode(step_suffix, add_special_tokens=False) if step_suffix else []
        self.format_prompt = format_prompt or _default_format_prompt

    def build(self, prompt: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        """``(ids, tag_positions)`` of one row: the prompt's ids, then per step its ids, the tag's ids
        (the position of the tag's last id recorded) and the suffix's ids."""
        enc = self.tokenizer.encode
        ids = list(enc(self.format_prompt(prompt), add_special_tokens=True))
        positions = []
        for step in steps:
            text = _clean_step(step, self.tag)
            ids += enc(text, add_special_tokens=False) if text else []
            ids += self.tag_ids
            positions.append(len(ids) - 1)
            ids += self.suffix_ids
        return ids, positions


class _Scorer:
    """A PRM's row layout (:class:`StepLayout`) on the shared scoring base
    (:class:`grpokit.rewards.scoring.PositionScorer`); each PRM gives it a ``read`` function."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        tag: str | int,
        tag_what: str,
        step_suffix: str,
        format_prompt: Callable[[str], str] | None,
        batch_size: int,
        device: str | torch.device,
        dtype: torch.dtype | None,
        padding_side: str | None,
        max_length: int | None,
    ) -> None:
        self.layout = StepLayout(tokenizer, tag, tag_what, step_suffix, format_prompt)
        pad = tokenizer.pad_token_id
        side = padding_side or getattr(tokenizer, "padding_side", None) or "right"
        self.base = PositionScorer(
            model,
            pad_id=pad if pad is not None else (tokenizer.eos_token_id or 0),
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            padding_side=side,
            max_length=max_length,
        )
        self.model = self.base.model

    def build(self, prompt: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        """``(ids, tag_positions)`` of one row (:meth:`StepLayout.build`)."""
        return self.layout.build(prompt, steps)

    def score(
        self, prompts: Sequence[str], steps: Sequence[Sequence[str]], read: Callable[[torch.Tensor], torch.Tensor]
    ) -> Scores:
        if len(prompts) != len(steps):
            raise ValueError(f"{len(prompts)} prompts but {len(steps)} step lists")
        return self.base.score([self.build(p, s) for p, s in zip(prompts, steps)], read)


class TokenProbPRM:
    """Math-Shepherd-style PRM: P(good token) vs P(bad token) at each step tag of a causal LM.

    ``score_k = exp(z_good) / (exp(z_good) + exp(z_bad))`` with ``z = model(ids).logits[tag_k]``
    (the next-token logits at the k-th tag position), computed in float32.

    Args:
        model: a causal LM (``.logits (B, L, V)``); moved to ``device`` (and ``dtype`` if given) and
            put in eval mode.
        tokenizer: its tokenizer.
        step_tag: tag string appended after each step (e.g. ``"ки"``), or its token id; a
            multi-token tag is read at its last token.
        good_token, bad_token: the two candidate next tokens (e.g. ``"+"``/``"-"``), each a string
            that encodes to exactly one token, or a token id.
        batch_size: rows per forward pass.
        device, dtype: where to run / the model dtype (None keeps it).
        padding_side: ``"left"``/``"right"``; default the tokenizer's (or right).
        max_length: truncate rows to this many tokens; steps whose tag is cut off score None.
        format_prompt: ``prompt -> text`` placed before the steps (default ``prompt.rstrip() +
            "\\n"``; e.g. use ``lambda q: q + " "`` for Math-Shepherd's ``question + " " + steps``).
        step_suffix: text after each tag (default ``"\\n"``, Math-Shepherd's ``"... ки\\nStep 2"``).

    Raises:
        ValueError: a tag/candidate not in the vocabulary, a multi-token candidate, a bad
            ``padding_side`` or ``batch_size``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        step_tag: str | int,
        good_token: str | int,
        bad_token: str | int,
        *,
        batch_size: int = 8,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        padding_side: str | None = None,
        max_length: int | None = None,
        format_prompt: Callable[[str], str] | None = None,
        step_suffix: str = "\n",
    ) -> None:
        self._scorer = _Scorer(
            model,
            tokenizer,
            step_tag,
            "step_tag",
            step_suffix,
            format_prompt,
            batch_size,
            device,
            dtype,
            padding_side,
            max_length,
        )
        self.candidate_ids = [
            vocab_ids(tokenizer, good_token, "good_token", single=True)[0],
            vocab_ids(tokenizer, bad_token, "bad_token", single=True)[0],
        ]
        self.__name__ = "token_prob_prm"

    @property
    def model(self) -> Any:
        """The causal LM scored with (on its device; :mod:`grpokit.process.prm_train` trains it in place)."""
        return self._scorer.model

    @property
    def layout(self) -> StepLayout:
        """The row layout: what training builds its rows with."""
        return self._scorer.layout

    def build(self, prompt: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        """The token ids of one row and the positions of its step tags (module docstring)."""
        return self._scorer.build(prompt, steps)

    @torch.inference_mode()
    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], steps: Sequence[Sequence[str]], **_: Any
    ) -> Scores:
        """One score in [0, 1] per step (None beyond ``max_length``); ``completions`` is unused."""
        cand = self.candidate_ids

        def read(logits: torch.Tensor) -> torch.Tensor:  # (K, V) -> (K,)
            return torch.softmax(logits[:, cand], dim=-1)[:, 0]

        return self._scorer.score(prompts, steps, read)


class ClassificationPRM:
    """Qwen2.5-Math-PRM-style PRM: a per-token classifier read at each step separator.

    ``score_k = softmax(logits[sep_k])[positive_label]`` (float32), ``logits (B, L, C)`` from
    ``model(...).logits`` (or ``output[0]``), C ≥ 2.

    Args:
        model: a token classifier, e.g. ``AutoModelForTokenClassification`` with ``num_labels=2``,
            or a causal LM whose head has 2 outputs; moved to ``device``/``dtype``, eval mode.
        tokenizer: its tokenizer.
        separator: text placed after each step (Qwen: ``"<extra_0>"``), or its token id; a
            multi-token separator is read at its last token.
        positive_label: the class index meaning "this step is correct".
        batch_size, device, dtype, padding_side, max_length, format_prompt: as
            :class:`TokenProbPRM`.
        step_suffix: text after each separator (default ``""``: Qwen joins steps as
            ``"<extra_0>".join(steps) + "<extra_0>"``).

    Raises:
        ValueError: separator not in the vocabulary, bad ``positive_label`` (when called: fewer
            than ``positive_label + 1`` classes), bad ``padding_side`` or ``batch_size``.

    For Qwen2.5-Math-PRM, format the prompt with its chat template::

        fmt = lambda q: tok.apply_chat_template(
            [{"role": "system", "content": "Please reason step by step, and put your final answer "
              "within \\\\boxed{}."}, {"role": "user", "content": q}], tokenize=False,
            add_generation_prompt=True)
        prm = ClassificationPRM(model, tok, "<extra_0>", format_prompt=fmt)
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        separator: str | int,
        *,
        positive_label: int = 1,
        batch_size: int = 8,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        padding_side: str | None = None,
        max_length: int | None = None,
        format_prompt: Callable[[str], str] | None = None,
        step_suffix: str = "",
    ) -> None:
        if positive_label < 0:
            raise ValueError(f"positive_label must be >= 0, got {positive_label}")
        self._scorer = _Scorer(
            model,
            tokenizer,
            separator,
            "separator",
            step_suffix,
            format_prompt,
            batch_size,
            device,
            dtype,
            padding_side,
            max_length,
        )
        self.positive_label = positive_label
        self.__name__ = "classification_prm"

    def build(self, prompt: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        """The token ids of one row and the positions of its separators (module docstring)."""
        return self._scorer.build(prompt, steps)

    @torch.inference_mode()
    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], steps: Sequence[Sequence[str]], **_: Any
    ) -> Scores:
        """One score in [0, 1] per step (None beyond ``max_length``); ``completions`` is unused."""
        label = self.positive_label

        def read(logits: torch.Tensor) -> torch.Tensor:  # (K, C) -> (K,)
            if logits.shape[-1] <= label:
                raise ValueError(f"ClassificationPRM: model gives {logits.shape[-1]} classes, positive_label={label}")
            return torch.softmax(logits, dim=-1)[:, label]

        return self._scorer.score(prompts, steps, read)
