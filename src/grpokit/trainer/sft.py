"""Supervised warm-up before GRPO (``grpokit sft``): a short fine-tune on worked answers.

GRPO learns only from groups whose completions differ in reward; a model that almost never
samples a right answer gives it almost no gradient (docs/efficacy.md, word-problem pilots W1-W5).
DeepSeekMath runs GRPO on an instruction-tuned (SFT) model, and π_ref is that model (§4.1,
§4.2). This module makes such a starting point: the model is fine-tuned to write each row's
``completion_template`` (e.g. ASDiv's equation ``"7 + 2 = 9"``) after the row's chat-templated
prompt, with the same prompt text GRPO will use.

The loop is transformers' :class:`~transformers.Trainer` (AdamW, linear decay after a linear
warm-up, gradient clipping at 1.0); grpokit supplies only the rows, their token ids and the
labels: ``-100`` on every prompt token, the completion's ids and the end-of-turn token
(``tokenizer.eos_token_id``) on the rest, so the loss is the mean cross-entropy over completion
tokens only. The model is written to a temporary sibling folder and moved into place, so an
interrupted run leaves no half-written model.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from grpokit.data import dataset_label, render_prompts
from grpokit.data.heldout import drop_questions
from grpokit.models.loading import encode_prompts
from grpokit.utils.hf_trainer import atomic_folder, trainer_arguments
from grpokit.utils.outputs import check_output_dir

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from grpokit.config import Recipe

__all__ = ["IGNORE_INDEX", "collate", "completion_rows", "drop_heldout_questions", "encode_rows", "main_sft", "run_sft"]

IGNORE_INDEX = -100
"""The label that :class:`torch.nn.CrossEntropyLoss` (and transformers' causal-LM loss) skips."""


def _key(question: str) -> str:
    return re.sub(r"\s+", "", question.lower())


def drop_heldout_questions(rows: list[dict], heldout: list[dict]) -> tuple[list[dict], int]:
    """``rows`` without those whose question is a held-out question, compared without case and
    whitespace (``"She has 7 ."`` equals ``"she has 7."``), and how many were dropped.

    >>> drop_heldout_questions([{"prompt": "Tom has 7 ."}, {"prompt": "2+2"}], [{"prompt": "tom has 7."}])
    ([{'prompt': '2+2'}], 1)
    """
    return drop_questions(rows, heldout, key=_key)


def completion_rows(rows: list[dict], completion_template: str) -> tuple[list[dict], int]:
    """Each row with its ``completion`` text (``completion_template`` formatted with the row's
    columns); rows where a field of the template is missing or None are left out.

    Returns:
        (rows with a ``completion`` key, number left out).

    Raises:
        ValueError: no row has the template's fields (names the template and the columns present).
    """
    out, skipped = [], 0
    for row in rows:
        try:
            text = completion_template.format(**{k: v for k, v in row.items() if v is not None})
        except (KeyError, IndexError, TypeError, AttributeError):  # a missing field, or one without that index
            skipped += 1
            continue
        out.append({**row, "completion": text})
    if not out:
        raise ValueError(
            f"sft: no row has the fields of completion template {completion_template!r}; "
            f"the rows have {sorted(rows[0]) if rows else 'no columns (no rows)'}"
        )
    return out, skipped


def encode_rows(
    tokenizer: Any,
    rows: list[dict],
    *,
    prompt_template: str,
    system_prompt: str | None = None,
    tools: list[dict] | None = None,
) -> list[dict[str, list[int]]]:
    """Token ids and labels of each row: the chat-templated prompt as GRPO sees it
    (:func:`grpokit.data.render_prompts`, :func:`grpokit.models.loading.encode_prompts`; ``tools``:
    the tool schemas the chat template shows, :func:`grpokit.data.rows.prompt_tools`), then the
    completion and the end-of-turn token.

    Returns:
        One dict per row: ``input_ids`` (P + C + 1 ints) and ``labels`` (``IGNORE_INDEX`` at the P
        prompt positions, the C + 1 completion ids after them).

    Raises:
        ValueError: the tokenizer has no ``eos_token_id`` (the end-of-turn token the model must learn).
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("sft: the tokenizer has no eos_token_id, so the completions could not be taught to end")
    prompts = render_prompts(
        tokenizer,
        rows,
        system_prompt=system_prompt,
        template=prompt_template,
        source="sft",
        system_key="the system prompt (--system-prompt or data.system_prompt)",
        tools=tools,
    )
    prompt_ids = encode_prompts(tokenizer, prompts)
    completion_ids = tokenizer([r["completion"] for r in rows], add_special_tokens=False)["input_ids"]
    encoded = []
    for p, c in zip(prompt_ids, completion_ids):
        target = list(c) + [int(eos)]
        encoded.append({"input_ids": list(p) + target, "labels": [IGNORE_INDEX] * len(p) + target})
    return encoded


def collate(features: list[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of :func:`encode_rows` items into a batch.

    Returns:
        ``input_ids`` (B, L) int64 padded with ``pad_token_id``, ``attention_mask`` (B, L) int64
        (1 on real tokens), ``labels`` (B, L) int64 padded with ``IGNORE_INDEX``.
    """
    length = max(len(f["input_ids"]) for f in features)
    batch = {
        k: torch.full((len(features), length), fill, dtype=torch.long)
        for k, fill in (("input_ids", pad_token_id), ("attention_mask", 0), ("labels", IGNORE_INDEX))
    }
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        batch["input_ids"][i, :n] = torch.tensor(f["input_ids"])
        batch["attention_mask"][i, :n] = 1
        batch["labels"][i, :n] = torch.tensor(f["labels"])
    return batch


def _check_out(out: str | Path) -> Path:
    """``out`` as a Path, checked as the output folder ``OUT`` (:func:`grpokit.utils.outputs.check_output_dir`:
    FileExistsError when it is a file or a folder that is not empty, NotADirectoryError below a file,
    PermissionError where it cannot be written)."""
    return check_output_dir(out, "OUT", empty=True)


def run_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    encoded: list[dict[str, list[int]]],
    out: str | Path,
    *,
    epochs: float = 1.0,
    max_steps: int = -1,
    learning_rate: float = 2e-5,
    batch_size: int = 16,
    warmup_steps: int = 10,
    seed: int = 0,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune ``model`` on ``encoded`` rows with transformers' Trainer and write it (and the
    tokenizer) to ``out`` as a Hugging Face folder that ``model.name_or_path`` can name.

    Args:
        model: a causal LM on its device, float32 (Trainer trains it in place).
        encoded: :func:`encode_rows` items.
        out: the folder to write; it must not exist or be empty.
        epochs, max_steps: how long (``max_steps > 0`` overrides ``epochs``), in optimizer steps of
            ``batch_size`` rows.
        learning_rate: AdamW's peak rate (betas 0.9/0.999, no weight decay), reached after
            ``warmup_steps`` and decayed linearly to 0 at the last step.
        seed: Trainer's seed (row order, any dropout).
        info: more settings to record in ``out/sft_info.json``.

    Returns:
        The record written to ``out/sft_info.json``: the settings, ``rows``, ``steps``, ``seconds``
        and ``train_loss`` (the mean of the logged losses over the run).

    Raises:
        FileExistsError: ``out`` is a file, or a folder that is not empty.
        NotADirectoryError / PermissionError: ``out`` is below a file, or cannot be written.
        ValueError: ``encoded`` is empty.
    """
    from transformers import Trainer

    out = _check_out(out)
    if not encoded:
        raise ValueError("sft: no training rows")
    with atomic_folder(out) as tmp:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        args = trainer_arguments(
            tmp / "trainer",
            batch_size=batch_size,
            epochs=epochs,
            max_steps=max_steps,
            learning_rate=learning_rate,
            warmup_steps=warmup_steps,
            seed=seed,
            logging_steps=10,
            on_cpu=next(model.parameters()).device.type == "cpu",
        )
        trainer = Trainer(
            model=model, args=args, train_dataset=encoded, data_collator=lambda feats: collate(feats, pad)
        )
        start = time.time()
        result = trainer.train()
        record = {
            **(info or {}),
            "rows": len(encoded),
            "epochs": epochs,
            "max_steps": max_steps,
            "learning_rate": learning_rate,
            "batch_size": batch_size,
            "warmup_steps": warmup_steps,
            "seed": seed,
            "steps": result.global_step,
            "seconds": round(time.time() - start, 1),
            "train_loss": result.training_loss,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        }
        shutil.rmtree(tmp / "trainer", ignore_errors=True)
        cast("PreTrainedModel", model).save_pretrained(tmp)  # a transformers model (typed nn.Module)
        tokenizer.save_pretrained(tmp)
        (tmp / "sft_info.json").write_text(json.dumps(record, indent=1, default=str))
    return record


def main_sft(recipe: Recipe, *, model: str, out: str | Path, heldout_of: str | None) -> dict[str, Any]:
    """``grpokit sft`` (:mod:`grpokit.cli.sft`): the rows of ``recipe.sft``, the held-out check, the
    model, :func:`run_sft`. ``heldout_of``: the recipe file whose held-out (eval) problems ``recipe``
    holds; its rows' questions are left out (None: no row is). Every check that needs no model runs
    before the model loads.

    Raises:
        ValueError: bad data or template (the message names the dataset or the key); no row left after
            the held-out questions are left out; ``sft.dataset`` or ``sft.completion_template`` not set.
        OSError: ``out`` is a file, a non-empty folder, below a file or not writable (:func:`_check_out`).
        FileNotFoundError: unknown model or dataset file.
    """
    from grpokit.data.rows import load_data_rows, prompt_tools, section_rows
    from grpokit.models.loading import load_model, load_tokenizer, resolve_model_paths
    from grpokit.trainer.build import resolve_device

    s = recipe.sft
    if s.dataset is None or s.completion_template is None:
        raise ValueError("sft: set sft.dataset and sft.completion_template (--dataset, --completion-template)")
    checked_out = _check_out(out)
    template = recipe.data.prompt_template if s.prompt_template is None else s.prompt_template
    system = recipe.data.system_prompt if s.system_prompt is None else s.system_prompt
    rows = load_data_rows(recipe, dataset=s.dataset, split=s.split, limit=s.limit, shuffle_seed=s.shuffle_seed)
    rows, no_fields = completion_rows(rows, s.completion_template)
    dropped = 0
    if heldout_of:
        rows, dropped = drop_heldout_questions(rows, section_rows(recipe, "eval"))
        if not rows:
            raise ValueError(
                f"sft: every row of {dataset_label(s.dataset, s.split)} is a held-out problem of {heldout_of}"
            )
    print(
        f"[grpokit] sft: {len(rows)} rows of {dataset_label(s.dataset, s.split)}; left out: {no_fields} "
        "without the fields "
        f"of {s.completion_template!r}, {dropped} held-out questions"
        f"{f' of {heldout_of}' if heldout_of else ' (no --heldout-of: not checked)'}",
        flush=True,
    )
    device = resolve_device(recipe.model.device)
    resolve_model_paths(model)  # a LoRA adapter folder: its base model too
    tokenizer = load_tokenizer(model)
    tools = prompt_tools(recipe)  # the prompts GRPO will see: the environment's tool schemas too
    encoded = encode_rows(tokenizer, rows, prompt_template=template, system_prompt=system, tools=tools)
    policy = load_model(model, device=device)
    policy.train()
    info = {
        "model": model,
        "dataset": s.dataset,
        "split": s.split,
        "completion_template": s.completion_template,
        "prompt_template": template,
        "system_prompt": system,
        "heldout_of": heldout_of,
        "heldout_left_out": dropped,
        "example": rows[0]["completion"],
        "tools": tools,
    }
    return run_sft(
        policy,
        tokenizer,
        encoded,
        checked_out,
        epochs=s.epochs,
        max_steps=s.max_steps,
        learning_rate=s.learning_rate,
        batch_size=s.batch_size,
        warmup_steps=s.warmup_steps,
        seed=s.seed,
        info=info,
    )
