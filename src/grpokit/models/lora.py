"""LoRA adapters through peft (the optional extra ``grpokit[lora]``): ``model.lora``.

With ``model.lora`` set, :func:`apply_lora` wraps the loaded policy with peft's ``get_peft_model``
(a ``LoraConfig`` with ``task_type=CAUSAL_LM``): the base weights are frozen, only the adapters
train, and the optimizer holds state for the adapters alone. What changes elsewhere, each in one
place:

- **reference model** (π_ref): the policy itself with its adapters switched off
  (:func:`adapters_disabled`, ``PeftModel.disable_adapter``): the frozen base model, without a
  second copy in memory. :func:`grpokit.models.logprobs.reference_logprobs` picks it; the builder loads no
  reference model when LoRA is on.
- **dropout** (``model.lora.dropout``): the loop keeps the model in ``eval()`` (no dropout, so the
  sampler and the trainer see the same π); the adapters' dropout acts in the gradient passes only
  (:func:`adapter_dropout`), never in sampling or in the no-grad scoring of π_old and π_ref.
- **checkpoints**: ``save_pretrained`` of the peft model writes ``adapter_model.safetensors`` and
  ``adapter_config.json``; :func:`load_adapter_weights` reads them back (resume).
- **export**: :func:`merged_copy` folds the adapters into a *copy* of the weights (the training
  model is never merged or unmerged in place); :func:`export_checkpoint` writes a merged Hugging
  Face model or copies the adapter (``grpokit export``).
- the ``cpu`` speed backend steps aside under ``model.backend=auto`` and refuses under ``cpu``
  (:mod:`grpokit.backends`: peft's forward is the exact one).

peft is imported only here and only when asked for (:func:`require_peft`); a missing one raises an
``ImportError`` naming the extra.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from grpokit.utils.dtypes import DTYPES
from grpokit.utils.filemodes import honour_umask
from grpokit.utils.importing import require
from grpokit.utils.textio import read_utf8

if TYPE_CHECKING:  # for the casts: a model's static type is nn.Module, whose attributes are Tensor | Module
    from peft import PeftModel
    from transformers import PreTrainedModel

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "adapter_dropout",
    "adapters_disabled",
    "apply_lora",
    "base_recorded_as",
    "export_checkpoint",
    "merged_adapter",
    "is_adapter_checkpoint",
    "is_peft_model",
    "load_adapter_weights",
    "adapter_state_for_model",
    "merged_copy",
    "merged_state_dict",
    "recipe_model",
    "require_peft",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: what a copied adapter folder holds besides the adapter (the tokenizer, so that it is usable as is)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
)
#: a checkpoint's model card (grpokit.trainer.model_card), exported with it
_CARD = "README.md"
#: training state in a checkpoint folder, left out of an export
_TRAINING_FILES = ("training_state.pt", "trainer_state.json", "recipe.json")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """peft asks a transformers 5 model a deprecated question (``is_gradient_checkpointing``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def require_peft(why: str = "model.lora") -> Any:
    """Import peft, or raise ``ImportError`` naming the extra (``pip install 'grpokit[lora]'``)."""
    return require("peft", extra="lora", why=why)


def is_peft_model(model: Any) -> bool:
    """True if ``model`` is a peft ``PeftModel`` (looked up only if peft is already imported: a
    model cannot be one otherwise)."""
    peft = sys.modules.get("peft")
    cls = getattr(peft, "PeftModel", None)
    return cls is not None and isinstance(model, cls)


def apply_lora(model: torch.nn.Module, options: dict[str, Any], *, announce: bool = True) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (``options``: the checked ``model.lora`` mapping: ``r``,
    ``alpha``, ``target_modules``, ``dropout``); the base weights are frozen, the adapters trainable.
    Returned in eval mode (the loop's convention; :func:`adapter_dropout` turns the adapters'
    dropout on where it applies).

    Raises:
        ImportError: peft is missing (names the extra).
        ValueError: no module of ``model`` matches ``target_modules`` (peft's message, prefixed
            with ``model.lora.target_modules``).
    """
    peft = require_peft()
    tm = options["target_modules"]
    config = peft.LoraConfig(
        r=int(options["r"]),
        lora_alpha=options["alpha"],
        lora_dropout=float(options["dropout"]),
        target_modules=tm if isinstance(tm, str) else list(tm),
        task_type="CAUSAL_LM",
        bias="none",
    )
    try:
        with _quiet():
            wrapped = peft.get_peft_model(model, config)
    except ValueError as e:
        raise ValueError(f"model.lora.target_modules={tm!r}: {e}") from e
    wrapped.eval()  # peft's new modules (the wrapper, the dropout layers) start in training mode
    if announce:
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        total = sum(p.numel() for p in wrapped.parameters())
        n = sum(1 for m in wrapped.modules() if hasattr(m, "lora_A"))
        print(
            f"[grpokit] LoRA r={options['r']} alpha={options['alpha']} dropout={options['dropout']} on "
            f"{n} modules: {trainable:,} trainable parameters of {total:,} "
            f"({100 * trainable / max(total, 1):.2f}%); π_ref = the base model (adapters disabled)",
            flush=True,
        )
    return wrapped


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside the block ``model`` computes with its LoRA adapters off: the frozen base model, π_ref
    of a LoRA run. Nothing is merged or copied.

    Raises:
        ValueError: ``model`` has no adapters.
    """
    if not is_peft_model(model):
        raise ValueError(f"{type(model).__name__} has no LoRA adapters to disable (model.lora is off)")
    with cast("PeftModel", model).disable_adapter():
        yield model


def _dropout_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [
        m
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Dropout) and ".lora_dropout." in f".{name}." and m.p > 0
    ]


@contextlib.contextmanager
def adapter_dropout(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block the adapters' dropout layers (``model.lora.dropout`` > 0) are in training
    mode, the rest of ``model`` stays as it is (eval); restored on exit. A no-op without them."""
    layers = [m for m in _dropout_layers(model) if not m.training] if is_peft_model(model) else []
    for m in layers:
        m.train(True)
    try:
        yield
    finally:
        for m in layers:
            m.train(False)


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain transformers model whose weights are ``model``'s with its adapters folded in
    (``W + scale·B·A``), made from a deep copy: ``model`` itself is left as it is (adapters kept,
    nothing merged in place). The copy has no speed backend installed (the stock forward). A model
    without adapters is deep-copied as it is."""
    with torch.inference_mode(False), torch.no_grad():
        dup = copy.deepcopy(model)
        return cast("PeftModel", dup).merge_and_unload() if is_peft_model(dup) else dup


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of ``model``'s base model with its active adapters folded in (``W + scale·B·A``,
    peft's ``get_delta_weight``), keyed as the plain transformers model's (``model.layers.0.…``):
    what a separate inference engine (vLLM) loads. Out of place: new tensors for the adapted weights,
    the base weights shared; ``model`` is never merged. A model without adapters: its own state dict.
    """
    if not is_peft_model(model):
        return dict(model.state_dict())
    base = cast("PeftModel", model).get_base_model()
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, t in base.state_dict().items():
            if ".lora_" in name or "lora_embedding" in name:
                continue
            out[name.replace(".base_layer.", ".")] = t.detach()
        for name, m in base.named_modules():
            if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer") and not getattr(m, "merged", False):
                key = f"{name}.weight"
                for adapter in getattr(m, "active_adapters", []):
                    if adapter in getattr(m, "lora_A", {}):
                        out[key] = out[key] + m.get_delta_weight(adapter).to(out[key].dtype)
    return out


@contextlib.contextmanager
def base_recorded_as(model: torch.nn.Module, name: str | None) -> Iterator[None]:
    """Inside the block peft's ``save_pretrained`` of ``model`` records ``name`` as the base model
    (``adapter_config.json``'s ``base_model_name_or_path``, the model card's ``base_model`` and its
    ``base_model:adapter:`` tag): the hub id or path the user gave (``model.name_or_path``), not the
    folder the base was loaded from (:func:`grpokit.models.loading.resolve_model_path`: an alias's cache
    folder, a local folder made absolute), so that the adapter names its base on any machine.
    Restored on exit; a no-op for a model without adapters or ``name`` None."""
    if not name or not is_peft_model(model):
        yield
        return
    peft_model = cast("PeftModel", model)
    base = cast("PreTrainedModel", peft_model.get_base_model())
    configs = list(peft_model.peft_config.values())
    old = [c.base_model_name_or_path for c in configs], base.__dict__.get("name_or_path"), base.config.name_or_path
    for c in configs:
        c.base_model_name_or_path = str(name)
    base.name_or_path = base.config.name_or_path = str(name)
    try:
        yield
    finally:
        for c, v in zip(configs, old[0]):
            c.base_model_name_or_path = v
        base.name_or_path, base.config.name_or_path = old[1], old[2]


def merged_adapter(base: torch.nn.Module, folder: str | Path) -> torch.nn.Module:
    """``base`` with the LoRA adapter of ``folder`` (``adapter_config.json``,
    ``adapter_model.safetensors``) folded into its weights (peft's ``merge_and_unload``,
    ``W + scale·B·A``): a plain transformers model in eval mode with every parameter trainable (as
    ``from_pretrained`` leaves one), the adapted model to float rounding.
    ``base`` is changed in place (use a model loaded for it).

    Raises:
        ImportError: peft is missing (names the extra).
    """
    peft = require_peft(f"the LoRA adapter {folder}")
    with _quiet():
        model = peft.PeftModel.from_pretrained(base, str(folder)).eval()
    merged = model.merge_and_unload().eval()
    for p in merged.parameters():  # peft froze the base weights; a plain model's are trainable
        p.requires_grad_(True)
    return merged


def is_adapter_checkpoint(folder: str | Path) -> bool:
    """True if ``folder`` holds a LoRA adapter (``adapter_config.json``)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def load_adapter_weights(model: torch.nn.Module, folder: str | Path) -> None:
    """Load the adapter of ``folder`` (``adapter_model.safetensors``) into peft model ``model``, in
    place, onto the parameters' devices; every adapter parameter must be in the file.

    Raises:
        ValueError: the file is missing or unreadable, or its keys do not match ``model``'s
            adapters (a different ``model.lora``); the message names the folder.
    """
    peft = require_peft("resuming a LoRA checkpoint")
    from peft.utils import load_peft_weights

    folder = Path(folder)
    hint = "resume with the model.lora of the run that wrote it, or start over (train.resume=none)"
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise ValueError(f"checkpoint {folder}: no {ADAPTER_WEIGHTS} (model.lora is on); {hint}")
    try:
        weights = load_peft_weights(str(folder), device=str(next(model.parameters()).device))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise ValueError(
            f"checkpoint {folder}: {ADAPTER_WEIGHTS} cannot be read ({type(e).__name__}: {e}); {hint}"
        ) from e
    want = peft.get_peft_model_state_dict(model)  # the keys and shapes the file must have
    missing, unexpected = sorted(set(want) - set(weights)), sorted(set(weights) - set(want))
    shapes = [k for k in sorted(set(want) & set(weights)) if weights[k].shape != want[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(
            f"checkpoint {folder}: the adapter does not fit model.lora: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}, other shapes {shapes[:3]}; {hint}"
        )
    result = peft.set_peft_model_state_dict(model, weights)
    if result.unexpected_keys:
        raise ValueError(f"checkpoint {folder}: adapter keys not loaded {result.unexpected_keys[:3]}; {hint}")


def adapter_state_for_model(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An adapter file's weights (``adapter_model.safetensors``: peft's names, without the adapter's
    name) under ``model``'s own state-dict names (``...lora_A.default.weight``), for loaders that
    take a model's state dict (a sharded model's, :func:`grpokit.utils.distributed.load_full_state`).

    Raises:
        ValueError: an adapter parameter of ``model`` the file lacks, or a file key that names none
            (a different ``model.lora``)."""
    names = [k for k in model.state_dict() if "lora_" in k]
    adapter = getattr(model, "active_adapter", "default")
    adapter = adapter if isinstance(adapter, str) else adapter[0]
    by_file = {k.replace(f".{adapter}.", "."): k for k in names}
    missing = sorted(set(by_file) - set(weights))
    unexpected = sorted(set(weights) - set(by_file))
    if missing or unexpected:
        raise ValueError(
            f"the adapter does not fit model.lora: missing {missing[:3]}, unexpected {unexpected[:3]}; resume with "
            "the model.lora of the run that wrote it, or start over (train.resume=none)"
        )
    return {by_file[k]: v for k, v in weights.items()}


def export_checkpoint(
    ckpt: str | Path,
    out: str | Path,
    *,
    merge: bool,
    load_base: Callable[[str, torch.dtype, bool], torch.nn.Module],
    merged_card: Callable[[Path], str | None] | None = None,
) -> str:
    """Write ``out`` from checkpoint folder ``ckpt`` without its training state; returns what was done.

    - LoRA checkpoint, ``merge``: the base model of the run (``model.name_or_path``,
      ``model.dtype`` and ``model.trust_remote_code`` of its ``recipe.json``, else the adapter's
      ``base_model_name_or_path``), loaded by ``load_base(name_or_path, dtype, trust_remote_code)``
      (:func:`grpokit.models.loading.load_model`: ``grpokit export`` passes it), with the adapter loaded and
      merged into its weights: a plain Hugging Face model folder (weights, config, generation
      config, tokenizer) that ``AutoModelForCausalLM.from_pretrained(out)`` loads.
    - LoRA checkpoint, no ``merge``: the adapter (``adapter_model.safetensors``,
      ``adapter_config.json``), the tokenizer and ``recipe.json`` (the exact base, for grpokit),
      copied (load with peft's ``PeftModel.from_pretrained(base, out)``).
    - full checkpoint: its model and tokenizer files, copied (they are already a full model).

    The model card (``README.md``) comes too: copied with a full checkpoint or an adapter; for a merge,
    ``merged_card(ckpt)`` writes it (``grpokit export`` passes
    :func:`grpokit.trainer.model_card.merged_export_card`: the card of a full model; None: no card).

    Every file written gets the mode of a new file (``0o666 & ~umask``, :mod:`grpokit.utils.filemodes`),
    and a copied ``adapter_config.json`` names the base as the run's ``recipe.json`` does.

    Raises:
        FileNotFoundError: ``ckpt`` is not a checkpoint folder.
        FileExistsError: ``out`` exists and is not empty.
        ImportError: ``merge`` without peft (names the extra).
    """
    ckpt, out = Path(ckpt), Path(out)
    if not ckpt.is_dir() or not any((ckpt / f).is_file() for f in (ADAPTER_CONFIG, "config.json")):
        raise FileNotFoundError(f"{ckpt}: not a checkpoint folder (no {ADAPTER_CONFIG} and no config.json)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not an empty folder")
    if not is_adapter_checkpoint(ckpt):
        _copy_files(ckpt, out, [f.name for f in ckpt.iterdir() if f.is_file() and f.name not in _TRAINING_FILES])
        return f"{ckpt} holds a full model (no LoRA adapter): copied its model and tokenizer files to {out}"
    if not merge:
        _copy_files(ckpt, out, [ADAPTER_CONFIG, ADAPTER_WEIGHTS, _CARD, "recipe.json", *_TOKENIZER_FILES])
        _record_base(ckpt, out / ADAPTER_CONFIG)
        return f"copied the LoRA adapter of {ckpt} to {out} (load it with peft: PeftModel.from_pretrained(base, out))"
    require_peft("grpokit export --merge")
    from transformers import AutoTokenizer

    name, dtype, trust = _base_of(ckpt)
    merged = merged_adapter(load_base(name, dtype, trust), ckpt)  # loaded for the export only
    tmp = out.parent / f".{out.name}.tmp-export"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        cast("PreTrainedModel", merged).save_pretrained(tmp, safe_serialization=True)
        if any((ckpt / f).is_file() for f in _TOKENIZER_FILES):
            AutoTokenizer.from_pretrained(str(ckpt), trust_remote_code=trust).save_pretrained(tmp)
        card = merged_card(ckpt) if merged_card is not None else None
        if card is not None:
            (tmp / _CARD).write_text(card, encoding="utf-8")
        honour_umask(tmp)  # safetensors writes the weights private (0o600)
        _move_into(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"merged the LoRA adapter of {ckpt} into {name} -> {out}"


def recipe_model(folder: str | Path) -> dict[str, Any]:
    """The ``model`` section of a checkpoint's or export's ``recipe.json`` ({} without one).

    Raises:
        ValueError: ``recipe.json`` is not UTF-8 or not a JSON object (names the file).
    """
    recipe_file = Path(folder) / "recipe.json"
    if not recipe_file.is_file():
        return {}
    try:
        model = json.loads(read_utf8(recipe_file)).get("model") or {}
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{recipe_file}: not a JSON object ({e})") from None
    return model if isinstance(model, dict) else {}


def _base_of(ckpt: Path) -> tuple[str, torch.dtype, bool]:
    """``(model name or path, dtype, trust_remote_code)`` of the base model a checkpoint was trained on."""
    m = recipe_model(ckpt)
    if m.get("name_or_path"):
        return m["name_or_path"], DTYPES.get(m.get("dtype", ""), torch.float32), bool(m.get("trust_remote_code"))
    name = json.loads(read_utf8(ckpt / ADAPTER_CONFIG)).get("base_model_name_or_path")
    if not name:
        raise ValueError(f"{ckpt}: neither recipe.json nor {ADAPTER_CONFIG} names the base model")
    return name, torch.float32, False


def _record_base(ckpt: Path, config_file: Path) -> None:
    """Name the base model in the copied ``adapter_config.json`` as others load it: the run's
    ``model.name_or_path`` (a packaged alias as its hub id, :func:`grpokit.models.names.public_name`);
    a checkpoint written before :func:`base_recorded_as` names this machine's folder. Left as it is
    without a ``recipe.json``."""
    from grpokit.models.names import public_name

    name = public_name(recipe_model(ckpt).get("name_or_path") or "")
    config = json.loads(read_utf8(config_file))
    if name and config.get("base_model_name_or_path") != name:
        config["base_model_name_or_path"] = name
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _copy_files(src: Path, out: Path, names: list[str]) -> None:
    """Copy the files ``names`` of ``src`` (those that exist) into ``out``, with the mode of a new
    file (a checkpoint's weights may have been written private, 0o600)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
            honour_umask(out / name)


def _move_into(tmp: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in tmp.iterdir():
        shutil.move(str(f), str(out / f.name))
