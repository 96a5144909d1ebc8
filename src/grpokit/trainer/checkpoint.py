"""Atomic checkpoints: HF-format model (safetensors), optimizer, scheduler, RNG and data position.

With LoRA (``model.lora``) the model part is the adapter alone (peft's ``save_pretrained``:
``adapter_model.safetensors`` + ``adapter_config.json``; the frozen base weights are the run's
``model.name_or_path``, which ``adapter_config.json`` and the model card name as the recipe does:
:func:`grpokit.models.lora.base_recorded_as`) and the optimizer state is that of the adapter parameters
(:mod:`grpokit.models.lora`).

Every file of a checkpoint has the mode a plain write gives (``0o666 & ~umask``; safetensors' own
temporary-file write would leave the weights ``0o600``): :func:`grpokit.utils.filemodes.honour_umask`.

A checkpoint is written to a hidden temporary folder in ``output_dir`` and renamed to
``checkpoint-<step>`` only when complete, so a crash mid-write leaves the previous one intact. Its
model card (``README.md``, :mod:`grpokit.trainer.model_card`) is written in that folder too, so it is
part of the atomic checkpoint.
Only complete checkpoints (named ``checkpoint-<step>`` with a ``trainer_state.json``) are ever read;
a failed write removes its temporary folder, and the next save removes those a killed run left.
Optimizer/RNG state is loaded with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from grpokit.models.lora import base_recorded_as, is_adapter_checkpoint, is_peft_model, load_adapter_weights
from grpokit.models.names import public_name
from grpokit.trainer.model_card import CARD_FILE, model_card, read_evals
from grpokit.utils.filemodes import honour_umask
from grpokit.utils.textio import NotUtf8Error, read_utf8

_NAME = re.compile(r"^checkpoint-(\d+)$")
_LEFTOVER = re.compile(r"^\.(tmp|old)-checkpoint-\d+-\d+$")


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states (and every CUDA device's, when CUDA is initialized: the
    bf16 optimizer's stochastic rounding draws from the parameters' device) in a form
    ``weights_only`` loading accepts."""
    # the legacy tuple (get_state's default; numpy's stubs pick the dict overload)
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state` (CUDA states restored where the checkpoint has them and CUDA is
    available)."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints in ``output_dir``, oldest first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in out.iterdir()
        if (m := _NAME.match(p.name)) and (p / "trainer_state.json").is_file()
    ]
    return [p for _, p in sorted(found)]


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    recipe: dict[str, Any],
    keep: int,
    algorithm_state: dict[str, Any] | None = None,
    rng_ranks: list[dict[str, Any]] | None = None,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    extra_state: dict[str, Any] | None = None,
    num_prompts: int | None = None,
) -> Path:
    """Write ``output_dir/checkpoint-<step>`` atomically, then keep only the newest ``keep``.

    ``algorithm_state``: the algorithm's own state (PPO: its value model and optimizer), saved in
    ``training_state.pt`` under ``"algorithm"``. ``rng_ranks``: every rank's :func:`rng_state`
    (data parallel), saved under ``"rng_ranks"`` beside this process's ``"rng"``.
    ``model_state``/``optimizer_state``: full state dicts to save instead of ``model``'s and
    ``optimizer``'s own (a sharded FSDP2 model, gathered by :func:`grpokit.utils.distributed.full_state`).
    ``extra_state``: more entries of ``training_state.pt`` (iterative RL's ``"prm_refresh"``).
    ``num_prompts``: the run's number of training prompts, said in the model card (``README.md``:
    :func:`grpokit.trainer.model_card.model_card`, with the held-out results in ``output_dir`` now).

    Raises:
        ValueError: a parameter is not finite (no checkpoint ever holds NaN weights).
    """
    _check_finite(model_state.items() if model_state is not None else model.named_parameters(), "save_checkpoint")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / f"checkpoint-{step}"
    tmp = out / f".tmp-checkpoint-{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_model(tmp, model, tokenizer, (recipe.get("model") or {}).get("name_or_path"), model_state)
        blob = {
            "optimizer": optimizer.state_dict() if optimizer_state is None else optimizer_state,
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "algorithm": algorithm_state or {},
        }
        if rng_ranks is not None:
            blob["rng_ranks"] = rng_ranks
        blob.update(extra_state or {})
        torch.save(blob, tmp / "training_state.pt")
        (tmp / "recipe.json").write_text(json.dumps(recipe, indent=1))
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}))
        card = model_card(recipe, step, read_evals(out, step), is_peft_model(model), num_prompts=num_prompts)
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")  # in place of peft's own card of an adapter
        _seal(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write leaves nothing behind
        raise
    _publish(tmp, final)
    for stale in list_checkpoints(out)[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)
    for leftover in out.glob(".*-checkpoint-*"):  # half-written by a killed run (one run per folder)
        if _LEFTOVER.match(leftover.name):
            shutil.rmtree(leftover, ignore_errors=True)
    return final


def save_model(path: str | Path, *, model: torch.nn.Module, tokenizer: Any, base: str | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` alone (no training state) to the folder ``path``, atomically
    as a checkpoint is written (a hidden temporary folder beside it, renamed when complete): a full
    model that ``transformers.AutoModelForCausalLM.from_pretrained(path)`` loads, or for a peft
    model its adapter (``peft.PeftModel.from_pretrained(base_model, path)``; ``base``: the base it
    names, the recipe's ``model.name_or_path``). A model folder already at ``path`` (``config.json``
    or ``adapter_config.json``, no subfolders) is replaced as a whole; any other folder with files in
    it (a run folder) is refused.

    Raises:
        FileExistsError: ``path`` is a file, or a folder that holds files and is not a model folder.
        NotADirectoryError, PermissionError: nothing can be written there
            (:func:`grpokit.utils.outputs.check_output_dir`).
        ValueError: a parameter is not finite (nothing written).
    """
    from grpokit.utils.outputs import check_output_dir

    final = Path(path).expanduser().absolute()
    check_output_dir(final, "save_model(path)", empty=not _is_model_folder(final))
    _check_finite(model.named_parameters(), "save_model")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_model(tmp, model, tokenizer, base)
        _seal(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _publish(tmp, final)
    return final


def _is_model_folder(path: Path) -> bool:
    """Whether ``path`` is a folder of model files (:func:`save_model` may replace it)."""
    if not path.is_dir():
        return False
    names = {p.name for p in path.iterdir()}
    return bool(names & {"config.json", "adapter_config.json"}) and not any(p.is_dir() for p in path.iterdir())


def _check_finite(named: Any, who: str) -> None:
    """Raise ValueError naming the first parameter of ``named`` (``(name, tensor)`` pairs) with a
    non-finite value: no saved model ever holds NaN weights."""
    for name, p in named:
        if p.is_floating_point() and not torch.isfinite(p).all():
            raise ValueError(f"{who}: parameter {name} has non-finite values; not saved")


def _write_model(
    folder: Path, model: torch.nn.Module, tokenizer: Any, base: str | None, model_state: dict | None = None
) -> None:
    """``model``'s weights and config (a peft model: its adapter alone) and ``tokenizer`` in ``folder``;
    ``model_state``: a full state dict to write instead of ``model``'s own (sharded FSDP2)."""
    # a peft model writes its adapter; the vocabulary is never resized, so no embedding layers
    # (peft's "auto" would look the base model up on the Hub at every save); the adapter names
    # its base as others load it (a packaged alias as its hub id, else the recipe's hub id or
    # path, never this machine's folder; grpokit reads the exact base from recipe.json)
    with base_recorded_as(model, public_name(base or "")):
        # transformers' or peft's save_pretrained (nn.Module types its attributes Tensor | Module)
        save_pretrained = cast(Callable[..., None], model.save_pretrained)
        save_pretrained(
            folder,
            safe_serialization=True,
            **({"save_embedding_layers": False} if is_peft_model(model) else {}),
            **({"state_dict": model_state} if model_state is not None else {}),
        )
    tokenizer.save_pretrained(folder)


def _seal(folder: Path) -> None:
    """Give ``folder``'s files the mode a plain write gives (safetensors writes its files private,
    0o600) and make them durable before the rename makes them visible."""
    honour_umask(folder)
    for f in folder.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def _publish(tmp: Path, final: Path) -> None:
    """Rename the complete folder ``tmp`` to ``final``, replacing a folder already there."""
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _gist(e: Exception) -> str:
    """One line of a (multi-line) torch error: the line saying "... error: <what>" if there is one
    (weights_only refusals: "Unsupported global: ..."), else the first line; colour codes removed."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", l).strip() for l in str(e).splitlines()]
    lines = [l for l in lines if l]
    return next((l.split("error:", 1)[1].strip() for l in lines if "error:" in l), lines[0] if lines else "")


_RESUME_HINT = "resume from an earlier checkpoint with train.resume=<folder>, or start over with train.resume=none"


def _read_json(f: Path) -> Any:
    """The JSON value of checkpoint file ``f``, read as UTF-8.

    Raises:
        ValueError: not UTF-8 or not valid JSON (one line naming ``f`` and how to resume from elsewhere).
    """
    try:
        return json.loads(read_utf8(f))
    except NotUtf8Error as e:
        raise ValueError(f"{e}; {_RESUME_HINT}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: not valid JSON ({e}); {_RESUME_HINT}") from None


def load_training_state(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(trainer_state, {"optimizer", "scheduler", "rng"})`` of a complete checkpoint.

    ``trainer_state`` (from ``trainer_state.json``, read as UTF-8) is an object with integer
    ``step``, ``epoch`` and ``position``; the blob (``training_state.pt``) a dict with those three keys.

    Raises:
        ValueError: either file is damaged: not UTF-8 (file, line, byte offset), not valid JSON,
            missing keys, or a ``training_state.pt`` torch cannot load. The one-line message names
            the file and says how to resume from elsewhere.
    """
    path = Path(path)
    state_file, blob_file = path / "trainer_state.json", path / "training_state.pt"
    state = _read_json(state_file)
    if not isinstance(state, dict) or not all(type(state.get(k)) is int for k in ("step", "epoch", "position")):
        raise ValueError(f"{state_file}: expected an object with integer step, epoch and position; {_RESUME_HINT}")
    try:
        blob = torch.load(blob_file, weights_only=True)
    except Exception as e:  # truncated zip, unpickling refused, ...: torch's messages run to many lines
        raise ValueError(f"{blob_file}: cannot load ({type(e).__name__}: {_gist(e)}); {_RESUME_HINT}") from None
    if not isinstance(blob, dict) or not {"optimizer", "scheduler", "rng"} <= set(blob):
        raise ValueError(f"{blob_file}: expected optimizer, scheduler and rng state; {_RESUME_HINT}")
    return state, blob


def read_checkpoint_recipe(ckpt: str | Path) -> dict[str, Any] | None:
    """The recipe checkpoint ``ckpt`` was trained with (its ``recipe.json``, read as UTF-8), or None
    when it has none (written by hand or by an early version: nothing to compare on resume;
    :func:`grpokit.trainer.resume.check_resume_recipe` compares it).

    Raises:
        ValueError: ``recipe.json`` is not UTF-8, not valid JSON or not an object (names the file
            and how to go on).
    """
    f = Path(ckpt) / "recipe.json"
    if not f.is_file():
        return None
    recipe = _read_json(f)
    if not isinstance(recipe, dict):
        raise ValueError(f"{f}: expected an object of recipe sections; {_RESUME_HINT}")
    return recipe


def find_resume_checkpoint(output_dir: str | Path, resume: str) -> Path | None:
    """Resolve ``train.resume``: ``auto`` (newest complete checkpoint or None), ``none``, or a path.

    Raises:
        ValueError: a given path is not a complete checkpoint.
    """
    if resume == "none":
        return None
    if resume == "auto":
        found = list_checkpoints(output_dir)
        return found[-1] if found else None
    p = Path(resume)
    if not (p / "trainer_state.json").is_file():
        raise ValueError(
            f"train.resume: {resume!r} is not a complete checkpoint folder "
            "(no trainer_state.json); use auto, none or a checkpoint-<step> folder"
        )
    return p


def read_model_state(ckpt: str | Path) -> dict[str, torch.Tensor]:
    """The weights of checkpoint folder ``ckpt`` (its ``*.safetensors``) as one state dict on the CPU.

    Raises:
        ValueError: a weight file cannot be read (names it and how to go on).
    """
    from safetensors.torch import load_file

    ckpt = Path(ckpt)
    state = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        try:
            state.update(load_file(f))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(
                f"checkpoint {ckpt}: {f.name} cannot be read ({type(e).__name__}: {e}); "
                "resume from another checkpoint (train.resume=<folder>) or start over "
                "(train.resume=none)"
            ) from e
    return state


def load_model_weights(model: torch.nn.Module, ckpt: str | Path) -> None:
    """Load the ``*.safetensors`` weights of checkpoint folder ``ckpt`` into ``model`` (in place,
    onto the parameters' devices). A missing ``lm_head.weight`` is accepted (tied embeddings).
    A LoRA (peft) model loads the checkpoint's adapter (:func:`grpokit.models.lora.load_adapter_weights`).

    Raises:
        ValueError: a weight file cannot be read, or keys are missing/unexpected (names the file
            or the first keys, and how to go on); an adapter checkpoint for a model without LoRA
            or the other way round.
    """
    ckpt = Path(ckpt)
    if is_peft_model(model):
        load_adapter_weights(model, ckpt)
        return
    if is_adapter_checkpoint(ckpt):
        raise ValueError(
            f"checkpoint {ckpt}: holds a LoRA adapter (adapter_config.json) but model.lora is off; "
            "resume with the run's model.lora, or start over (train.resume=none)"
        )
    state = read_model_state(ckpt)
    missing, unexpected = model.load_state_dict(state, strict=False)
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied embeddings
    if real_missing or unexpected:
        raise ValueError(f"checkpoint {ckpt}: missing {real_missing[:5]}, unexpected {unexpected[:5]}")
