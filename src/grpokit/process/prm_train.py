"""Training a process reward model on automatic step labels (Math-Shepherd, Wang et al. 2023,
arXiv 2312.08935, §3.4), and loading the result as a :class:`~grpokit.process.prm.TokenProbPRM`.

A row is laid out as the PRM will score it (:class:`~grpokit.process.prm.StepLayout`): the question,
then each step followed by the step tag and the step suffix. At the tag of step ``k`` the model's
next-token logits are read at two candidate tokens, ``good`` and ``bad``:

    p_k = softmax([z_good, z_bad])[0]
    loss = mean over all tags of the batch of  -( y_k log p_k + (1 - y_k) log(1 - p_k) )

with ``y_k`` the step's label: ``hard`` (0/1: some continuation from the step reached the answer) or
``soft`` (the share that did). Math-Shepherd trains the same cross-entropy at the tag with the
labels as the tokens ``+``/``-``; restricting the softmax to the two candidates is what the PRM reads
(``TokenProbPRM``), so training and scoring measure the same number. Only tag positions carry a
loss; the question and step tokens are context.

The folder written is a Hugging Face model folder (weights, config, tokenizer) plus
``prm_info.json``: the layout (step tag, candidates, suffix), the settings, and the step accuracy,
AUC and first-wrong-step F1 (:mod:`grpokit.process.prm_metrics`) on held-out problems before and after
training. :func:`load_prm` turns the folder back into a ``TokenProbPRM``.

transformers is imported inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpokit.process.prm import StepLayout, TokenProbPRM, vocab_ids
from grpokit.process.prm_metrics import prm_metrics
from grpokit.utils.hf_trainer import atomic_folder, trainer_arguments
from grpokit.utils.outputs import check_output_dir

if TYPE_CHECKING:
    from grpokit.process.labels import StepLabels

__all__ = [
    "PRM_INFO",
    "PRMExample",
    "PRMSpec",
    "evaluate_prm",
    "load_prm",
    "prm_collate",
    "prm_examples",
    "prm_loss",
    "split_by_problem",
    "train_prm",
]

PRM_INFO = "prm_info.json"
LABEL_KINDS = ("hard", "soft")


@dataclass(frozen=True)
class PRMSpec:
    """What a trained PRM's rows look like: the step tag after each step, the two candidate next
    tokens read at it, and the text after the tag (as :class:`~grpokit.process.prm.TokenProbPRM`).
    The defaults are Math-Shepherd's."""

    step_tag: str = "ки"
    good_token: str = "+"
    bad_token: str = "-"
    step_suffix: str = "\n"

    def layout(self, tokenizer: Any) -> StepLayout:
        """The :class:`StepLayout` of this spec on ``tokenizer`` (ValueError: tag not in its vocabulary)."""
        return StepLayout(tokenizer, self.step_tag, "step_tag", self.step_suffix)

    def scorer(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 8,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_length: int | None = None,
    ) -> TokenProbPRM:
        """``model`` as a :class:`TokenProbPRM` with this spec (ValueError: its tokens not in the
        tokenizer's vocabulary)."""
        return TokenProbPRM(
            model,
            tokenizer,
            self.step_tag,
            self.good_token,
            self.bad_token,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            max_length=max_length,
            step_suffix=self.step_suffix,
        )

    def candidate_ids(self, tokenizer: Any) -> list[int]:
        """``[good_id, bad_id]`` (ValueError naming ``good_token``/``bad_token``: not exactly one
        token, or both the same token)."""
        ids = [
            vocab_ids(tokenizer, self.good_token, "good_token", single=True)[0],
            vocab_ids(tokenizer, self.bad_token, "bad_token", single=True)[0],
        ]
        if ids[0] == ids[1]:
            raise ValueError(f"good_token {self.good_token!r} and bad_token {self.bad_token!r} are the same token")
        return ids


@dataclass(frozen=True)
class PRMExample:
    """One training row: ``input_ids``, the positions of its step tags (the last id of each tag) and
    one target in [0, 1] per tag."""

    input_ids: list[int]
    tag_positions: list[int]
    targets: list[float]


def _problem_key(record: StepLabels) -> str:
    return json.dumps(record.question, sort_keys=True, default=str)


def split_by_problem(
    records: Sequence[StepLabels], eval_fraction: float, seed: int = 0
) -> tuple[list[StepLabels], list[StepLabels]]:
    """``(train, held_out)``: records split by problem (all solutions of one question on the same
    side), ``round(eval_fraction * problems)`` problems held out, chosen by a hash of ``seed`` and
    the question (the same choice whatever the records' order).

    Raises:
        ValueError: ``eval_fraction`` not in [0, 1).
    """
    if not 0 <= eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    keys = sorted({_problem_key(r) for r in records})
    ranked = sorted(keys, key=lambda k: hashlib.sha256(f"{seed}\0{k}".encode()).hexdigest())
    held = set(ranked[: round(eval_fraction * len(keys))])
    train = [r for r in records if _problem_key(r) not in held]
    return train, [r for r in records if _problem_key(r) in held]


def prm_examples(
    records: Sequence[StepLabels], layout: StepLayout, label: str = "hard", max_length: int | None = None
) -> tuple[list[PRMExample], int]:
    """Training rows from label records: ``layout.build(record.question, record.steps)`` with the
    record's ``hard`` or ``soft`` labels as targets.

    A record without steps gives no row. A row longer than ``max_length`` is cut there and keeps the
    tags that are left; a row with no tag left is dropped.

    Returns:
        ``(examples, dropped)``: the rows, and how many records with steps gave none (cut off).

    Raises:
        ValueError: ``label`` not ``hard``/``soft``; a record's question not a string (names its
            problem and sample).
    """
    if label not in LABEL_KINDS:
        raise ValueError(f"label must be one of {LABEL_KINDS}, got {label!r}")
    out, dropped = [], 0
    for r in records:
        if not r.steps:
            continue
        if not isinstance(r.question, str):
            raise ValueError(
                f"problem {r.problem} sample {r.sample}: question must be a string, got {type(r.question).__name__}"
            )
        ids, positions = layout.build(r.question, r.steps)
        targets = [float(v) for v in (r.hard if label == "hard" else r.soft)]
        if max_length is not None and len(ids) > max_length:
            ids = ids[:max_length]
            kept = [k for k, p in enumerate(positions) if p < max_length]
            positions, targets = [positions[k] for k in kept], [targets[k] for k in kept]
        if not positions:
            dropped += 1
            continue
        out.append(PRMExample(ids, positions, targets))
    return out, dropped


def prm_collate(features: Sequence[PRMExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """A right-padded batch: ``input_ids``/``attention_mask`` ``(B, L)`` int64, ``tag_positions``
    ``(B, S)`` int64 padded with -1, ``targets`` ``(B, S)`` float32 padded with 0 (``S``: the most
    tags of a row)."""
    n, length = len(features), max(len(f.input_ids) for f in features)
    tags = max(len(f.tag_positions) for f in features)
    ids = torch.full((n, length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.long)
    pos = torch.full((n, tags), -1, dtype=torch.long)
    tgt = torch.zeros((n, tags), dtype=torch.float32)
    for i, f in enumerate(features):
        ids[i, : len(f.input_ids)] = torch.tensor(f.input_ids)
        mask[i, : len(f.input_ids)] = 1
        pos[i, : len(f.tag_positions)] = torch.tensor(f.tag_positions)
        tgt[i, : len(f.targets)] = torch.tensor(f.targets)
    return {"input_ids": ids, "attention_mask": mask, "tag_positions": pos, "targets": tgt}


def prm_loss(
    logits: torch.Tensor, tag_positions: torch.Tensor, targets: torch.Tensor, candidate_ids: Sequence[int]
) -> torch.Tensor:
    """The two-candidate cross-entropy at the step tags (module docstring), averaged over the tags.

    Args:
        logits: ``(B, L, V)`` next-token logits of the rows (any float dtype; computed in float32).
        tag_positions: ``(B, S)`` int64 positions in ``[0, L)``, -1 for no tag.
        targets: ``(B, S)`` labels in [0, 1] (P(good)); ignored where ``tag_positions`` is -1.
        candidate_ids: ``[good_id, bad_id]``.

    Returns:
        A scalar tensor (nats per tag).

    Raises:
        ValueError: shapes that do not match, no tag in the batch, a target outside [0, 1].
    """
    if tag_positions.shape != targets.shape or tag_positions.dim() != 2 or logits.dim() != 3:
        raise ValueError(
            f"prm_loss: logits {tuple(logits.shape)} must be (B, L, V), tag_positions "
            f"{tuple(tag_positions.shape)} and targets {tuple(targets.shape)} the same (B, S)"
        )
    valid = tag_positions >= 0
    if not bool(valid.any()):
        raise ValueError("prm_loss: no step tag in the batch")
    t = targets[valid].float()
    if bool(((t < 0) | (t > 1)).any()):
        raise ValueError("prm_loss: targets must lie in [0, 1]")
    rows = torch.arange(logits.shape[0], device=logits.device).unsqueeze(1).expand_as(tag_positions)
    at_tags = logits[rows[valid], tag_positions[valid]]  # (K, V)
    logp = torch.log_softmax(at_tags[:, list(candidate_ids)].float(), dim=-1)  # (K, 2)
    return -(t * logp[:, 0] + (1 - t) * logp[:, 1]).mean()


def evaluate_prm(prm: Any, records: Sequence[StepLabels], threshold: float = 0.5) -> dict[str, Any]:
    """:func:`~grpokit.process.prm_metrics.prm_metrics` of ``prm``'s scores against the records' hard
    labels (records without steps left out). ``prm`` follows the process-reward protocol
    ``prm(prompts, completions, steps) -> scores``."""
    kept = [r for r in records if r.steps]
    if not kept:
        return prm_metrics([], [], threshold)
    scores = prm([r.question for r in kept], ["".join(r.steps) for r in kept], [r.steps for r in kept])
    return prm_metrics(scores, [r.hard for r in kept], threshold)


def _trainer_class() -> type:
    from transformers import Trainer

    class PRMTrainer(Trainer):
        """transformers' Trainer with :func:`prm_loss` as its loss."""

        def __init__(self, *args: Any, candidate_ids: Sequence[int], **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.candidate_ids = list(candidate_ids)

        def compute_loss(
            self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
            loss = prm_loss(out.logits, inputs["tag_positions"], inputs["targets"], self.candidate_ids)
            return (loss, out) if return_outputs else loss

    return PRMTrainer


def train_prm(
    model: torch.nn.Module,
    tokenizer: Any,
    records: Sequence[StepLabels],
    out: str | Path,
    *,
    spec: PRMSpec = PRMSpec(),
    label: str = "hard",
    eval_fraction: float = 0.1,
    epochs: float = 1.0,
    max_steps: int = -1,
    learning_rate: float = 1e-5,
    batch_size: int = 8,
    warmup_steps: int = 10,
    seed: int = 0,
    max_length: int | None = 512,
    threshold: float = 0.5,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``model`` (a causal LM, float32, trained in place) into a PRM on step-label
    ``records`` (:mod:`grpokit.process.labels`) and write it to ``out`` (module docstring).

    The records are split by problem (:func:`split_by_problem`); the held-out problems' solutions are
    scored before and after training (:func:`evaluate_prm`). AdamW (no weight decay) at
    ``learning_rate`` after ``warmup_steps`` of linear warm-up, decayed linearly to 0; ``max_steps >
    0`` overrides ``epochs``; gradient norm clipped at 1.

    Returns:
        The record written to ``out/prm_info.json``: the spec, the settings, ``rows``,
        ``rows_dropped`` (cut off by ``max_length``), ``problems_train``/``problems_eval``,
        ``steps``, ``seconds``, ``losses``, and ``eval_before``/``eval_after`` (None without held-out
        problems).

    Raises:
        FileExistsError / NotADirectoryError / PermissionError: ``out`` is a file or a folder that is
            not empty, is below a file, or cannot be written.
        ValueError: no training record with steps; a bad ``label``/``eval_fraction``; the spec's
            tokens not in the tokenizer's vocabulary (names ``step_tag``/``good_token``/``bad_token``).
    """
    out = check_output_dir(out, "OUT", empty=True)
    layout, candidates = spec.layout(tokenizer), spec.candidate_ids(tokenizer)
    train, held = split_by_problem(records, eval_fraction, seed)
    if not any(r.steps for r in train):
        raise ValueError("train_prm: no training record has steps")
    examples, dropped = prm_examples(train, layout, label, max_length)
    if not examples:
        raise ValueError(f"train_prm: every training row was cut off by max_length={max_length}")
    device = next(model.parameters()).device

    def scorer() -> TokenProbPRM:
        return spec.scorer(model, tokenizer, batch_size=batch_size, device=device, max_length=max_length)

    before = evaluate_prm(scorer(), held, threshold) if held else None
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
            logging_steps=1,
            on_cpu=device.type == "cpu",
        )
        model.train()
        trainer = _trainer_class()(
            model=model,
            args=args,
            train_dataset=examples,
            data_collator=lambda feats: prm_collate(feats, pad),
            candidate_ids=candidates,
        )
        start = time.time()
        result = trainer.train()
        seconds = round(time.time() - start, 1)
        after = evaluate_prm(scorer(), held, threshold) if held else None
        record = {
            **(info or {}),
            "spec": asdict(spec),
            "label": label,
            "eval_fraction": eval_fraction,
            "epochs": epochs,
            "max_steps": max_steps,
            "learning_rate": learning_rate,
            "batch_size": batch_size,
            "warmup_steps": warmup_steps,
            "seed": seed,
            "max_length": max_length,
            "threshold": threshold,
            "rows": len(examples),
            "rows_dropped": dropped,
            "problems_train": len({_problem_key(r) for r in train}),
            "problems_eval": len({_problem_key(r) for r in held}),
            "steps": result.global_step,
            "seconds": seconds,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "eval_before": before,
            "eval_after": after,
        }
        shutil.rmtree(tmp / "trainer", ignore_errors=True)
        model.save_pretrained(tmp)  # type: ignore[operator]  # a transformers model (typed nn.Module)
        tokenizer.save_pretrained(tmp)
        (tmp / PRM_INFO).write_text(json.dumps(record, indent=1, default=str))
    return record


def load_prm(
    folder: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
) -> TokenProbPRM:
    """The PRM :func:`train_prm` wrote to ``folder``, as a :class:`TokenProbPRM` with its spec.

    Raises:
        FileNotFoundError: ``folder`` has no ``prm_info.json`` (not a PRM folder).
        ValueError: ``prm_info.json`` has no valid ``spec``, or its tokens are not in the tokenizer.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    info_path = folder / PRM_INFO
    if not info_path.is_file():
        raise FileNotFoundError(f"{folder}: no {PRM_INFO}; not a folder written by grpokit's PRM training")
    try:
        spec = PRMSpec(**json.loads(info_path.read_text())["spec"])
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{info_path}: no valid 'spec' ({e})") from None
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    return spec.scorer(model, tokenizer, batch_size=batch_size, device=device, dtype=dtype, max_length=max_length)
