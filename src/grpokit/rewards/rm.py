"""A learned outcome reward model as a reward function (``rewards.functions: ["rm:PATH_OR_HUB_NAME"]``).

The reward model is a sequence classifier (``AutoModelForSequenceClassification``, the kind TRL,
verl and OpenRLHF accept: a decoder backbone with a linear ``score`` head, e.g. Skywork-Reward or
a model trained with TRL's ``RewardTrainer``). Its score for a completion is the head's output
(``label``, default 0: the single output of a one-label RM) at the **last real token** of the text

- with a chat template (the RM tokenizer has one): ``apply_chat_template([user: prompt,
  assistant: completion])``, tokenized without adding special tokens again;
- otherwise: ``prompt + separator + completion`` (``separator`` default ``"\\n"``), tokenized with
  the tokenizer's special tokens.

The text is always re-tokenized by the RM's own tokenizer from the decoded prompt (the row's question)
and completion, never from the policy's ids, so the policy and the RM may use different
tokenizers. A text longer than ``max_length`` keeps its last ``max_length`` tokens (the end is what is
scored). The head is applied to the backbone's hidden state at that token only (so the score does not
depend on how the model's own pooling finds the last token under padding); batches, padding and
positions come from the shared scoring base :class:`grpokit.rewards.scoring.PositionScorer`.

``normalize=True`` turns each call's scores into ``(s - mean) / (std + 1e-8)`` over the batch
(population std), so that the RM's scale does not decide its weight against rule-based rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from grpokit.rewards.scoring import PositionScorer, keep_last

__all__ = ["RewardModel", "RM_PREFIX", "load_reward_model"]

RM_PREFIX = "rm:"


def _head_and_backbone(model: Any) -> tuple[Any, Any]:
    """``(backbone, score head)`` of a decoder sequence classifier; ValueError names the class."""
    head = getattr(model, "score", None)
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(head, torch.nn.Module) or not isinstance(backbone, torch.nn.Module):
        raise ValueError(
            f"reward model {type(model).__name__}: expected a decoder sequence classifier with a "
            "`score` head on its base model (LlamaForSequenceClassification, Qwen2ForSequenceClassification, "
            "GPT2ForSequenceClassification, ...)"
        )
    return backbone, head


class RewardModel:
    """An outcome reward model scoring ``(prompt, completion)`` pairs, one float per completion.

    Args:
        model: a decoder sequence classifier (``.score`` head, backbone at ``base_model_prefix``);
            moved to ``device``/``dtype``, eval mode, no gradients.
        tokenizer: the RM's own tokenizer.
        label: which head output is the reward (0 for a one-label RM).
        batch_size: rows per forward pass.
        device, dtype: where the RM runs and its dtype (None keeps the model's).
        padding_side: ``"left"`` or ``"right"`` (scores are the same either way).
        max_length: keep the last ``max_length`` tokens of a longer text (None = the model's
            ``max_position_embeddings`` if it has one).
        normalize: z-score each call's scores over the batch.
        separator: between prompt and completion when the tokenizer has no chat template.
        name: the function name in logs and errors.

    Raises:
        ValueError: not a decoder sequence classifier; ``label`` beyond the head's outputs;
            ``batch_size < 1``; a bad ``padding_side``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        label: int = 0,
        batch_size: int = 16,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        padding_side: str = "left",
        max_length: int | None = None,
        normalize: bool = False,
        separator: str = "\n",
        name: str = "reward_model",
    ):
        self.backbone, self.head = _head_and_backbone(model)
        n_labels = self.head.out_features if hasattr(self.head, "out_features") else None
        if n_labels is not None and not 0 <= label < n_labels:
            raise ValueError(f"reward model {name}: label={label} but the head has {n_labels} output(s)")
        pad = tokenizer.pad_token_id
        pad = pad if pad is not None else (tokenizer.eos_token_id or 0)
        self.max_length = max_length or getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.base = PositionScorer(
            model,
            pad_id=pad,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            padding_side=padding_side,
            forward=self._hidden,
        )
        self.tokenizer, self.label, self.normalize, self.separator = tokenizer, label, normalize, separator
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.__name__ = name
        self.isolation = "thread"  # a model in the trainer's memory (maybe on its GPU): no forked worker

    def _hidden(self, model: Any, kwargs: dict[str, Any]) -> torch.Tensor:
        """The backbone's last hidden states ``(B, T, H)``."""
        return self.backbone(**kwargs)[0]

    def text_ids(self, prompt: str, completion: str) -> list[int]:
        """The RM's token ids of one ``(prompt, completion)`` pair (module docstring), cut to
        ``max_length`` from the left."""
        tok = self.tokenizer
        if self.chat:
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], tokenize=False
            )
            ids = tok.encode(text, add_special_tokens=False)
        else:
            ids = tok.encode(prompt + self.separator + completion, add_special_tokens=True)
        return keep_last(ids, self.max_length)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
        """One score per completion (``prompts[i]`` is the question ``completions[i]`` answers).

        Raises:
            ValueError: ``prompts`` and ``completions`` differ in length.
        """
        if len(prompts) != len(completions):
            raise ValueError(f"reward model {self.__name__}: {len(prompts)} prompts for {len(completions)} completions")
        rows = []
        for p, c in zip(prompts, completions):
            ids = self.text_ids(p, c)
            rows.append((ids, [len(ids) - 1]))
        label = self.label

        def read(hidden: torch.Tensor) -> torch.Tensor:  # (K, H) -> (K,)
            return self.head(hidden.to(self.head.weight.dtype)).float()[:, label]

        # no None: the scorer has no max_length (text_ids cut the texts), so every row is read
        scores = cast("list[float]", [s[0] for s in self.base.score(rows, read)])
        if self.normalize and len(scores) > 1:
            t = torch.tensor(scores, dtype=torch.float64)
            scores = ((t - t.mean()) / (t.std(unbiased=False) + 1e-8)).tolist()
        return scores


def load_reward_model(
    spec: str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    batch_size: int = 16,
    normalize: bool = False,
    max_length: int | None = None,
) -> RewardModel:
    """Load ``rm:PATH_OR_HUB_NAME`` with ``AutoModelForSequenceClassification`` and its tokenizer.

    Raises:
        ValueError: ``spec`` does not start with ``rm:``, names nothing, or the model cannot be
            loaded (the message names ``spec``; offline runs need a local folder); a name meant
            as a path (:func:`grpokit.utils.hub.looks_like_local_path`) that does not exist.
        ConnectionError: a hub id, not in the local cache, while the hub cannot be reached (one
            line, in seconds: :func:`grpokit.utils.hub.hub_access`).
    """
    if not spec.startswith(RM_PREFIX) or not spec[len(RM_PREFIX) :].strip():
        raise ValueError(f"reward model {spec!r}: expected 'rm:PATH_OR_HUB_NAME'")
    name = spec[len(RM_PREFIX) :].strip()
    from pathlib import Path

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from grpokit.utils.hub import from_pretrained_options, looks_like_local_path

    if not Path(name).expanduser().exists() and looks_like_local_path(name):
        raise ValueError(f"reward model {spec!r}: no such local folder ({Path(name).absolute()})")
    hub = from_pretrained_options("reward model", name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **hub)
        model = AutoModelForSequenceClassification.from_pretrained(name, dtype=dtype, **hub)
    except (OSError, ValueError) as e:
        raise ValueError(f"reward model {spec!r}: cannot load it ({type(e).__name__}: {e})") from e
    model.requires_grad_(False)
    return RewardModel(
        model,
        tokenizer,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        normalize=normalize,
        max_length=max_length,
        name=spec,
    )
