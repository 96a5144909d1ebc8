"""What ``grpokit sft`` and PRM training (:mod:`grpokit.process.prm_train`) share around
transformers' :class:`~transformers.Trainer`: one set of ``TrainingArguments`` and the model folder
written atomically.

transformers is imported inside :func:`trainer_arguments`; the rest imports the standard library
and :mod:`grpokit.utils.filemodes` only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpokit.utils.filemodes import honour_umask

__all__ = ["atomic_folder", "trainer_arguments"]


def trainer_arguments(
    work_dir: str | Path,
    *,
    batch_size: int,
    epochs: float,
    max_steps: int,
    learning_rate: float,
    warmup_steps: int,
    seed: int,
    logging_steps: int,
    on_cpu: bool,
) -> Any:
    """``TrainingArguments`` for a quiet in-process run: AdamW with no weight decay, ``learning_rate``
    reached after ``warmup_steps`` of linear warm-up and decayed linearly to 0, gradient norm clipped
    at 1, ``seed`` for the initialisation and the row order, a loss logged every ``logging_steps``
    optimizer steps; nothing saved, reported or shown as a progress bar; the batches' extra columns
    kept (the collator builds them); ``max_steps > 0`` overrides ``epochs``. ``work_dir``: Trainer's
    own scratch folder."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(work_dir),
        per_device_train_batch_size=batch_size,
        num_train_epochs=epochs,
        max_steps=max_steps,
        learning_rate=learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=warmup_steps,
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=seed,
        data_seed=seed,
        logging_steps=logging_steps,
        save_strategy="no",
        report_to="none",
        use_cpu=on_cpu,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` (which must not exist or be empty) to write into; when the
    block ends without an exception it gets the umask's modes (:func:`honour_umask`) and is renamed
    to ``out``, so ``out`` is never seen half-written; on an exception it is removed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        honour_umask(tmp)  # mkdtemp made it 0o700 and safetensors the weights 0o600
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
