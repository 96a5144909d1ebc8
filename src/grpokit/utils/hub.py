"""Names that reach the Hugging Face hub: a path refused at once, an unreachable hub in seconds.

Two faults this module exists for (both cost a user a minute of ``Retrying in 8s`` lines):

- a mistyped local path (``runs/nope``) has the shape of a hub id (``org/name``), so transformers
  asks the hub for it, five times with back-off, before it says the file is missing;
- a hub id with no network: the same five retries per file, for models, tokenizers and datasets.

:func:`looks_like_local_path` says when a name is meant as a path (and so is refused as a missing
path, never looked up); :func:`hub_access` is asked before any hub lookup: where ``HF_HUB_OFFLINE``
is set it does nothing (the libraries then read their caches and fail fast), where the hub answers
one probe (one ``HEAD`` of the endpoint, through the hub library's own HTTP session so proxies and
``HF_ENDPOINT`` hold, 5 s at most, once per process) it does nothing; where it does not, a name in
the local cache is loaded from the cache only and any other name fails with one line.

Standard library and ``huggingface_hub`` only (imported when first needed).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = ["from_pretrained_options", "hub_access", "hub_offline", "hub_probe", "looks_like_local_path"]

#: prefixes that make a name a local path whatever follows (``runs/`` is where grpokit writes runs)
PATH_PREFIXES = (".", "/", "~", "\\", "runs/")
PROBE_TIMEOUT_S = 5.0


def looks_like_local_path(name: str) -> bool:
    """True when ``name`` is meant as a local path, not a hub id.

    A path when it starts with one of :data:`PATH_PREFIXES` (``.``, ``/``, ``~``, ``runs/``), has
    more than one ``/``, ends with ``/`` or a weights suffix, or has a ``/`` and its first part
    exists here (``mymodels/typo`` when ``mymodels/`` is a folder in the working directory).
    """
    if name.startswith(PATH_PREFIXES) or name.count("/") > 1 or (os.sep != "/" and os.sep in name):
        return True
    if name.endswith(("/", ".gguf", ".safetensors", ".bin")):
        return True
    head, slash, _ = name.partition("/")
    return bool(slash) and bool(head) and Path(head).exists()


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set to a true value."""
    values = (os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(v.strip().lower() in ("1", "true", "yes", "on") for v in values)


@functools.lru_cache(maxsize=1)
def hub_probe() -> str | None:
    """None when the hub endpoint answers one ``HEAD`` within :data:`PROBE_TIMEOUT_S` seconds (any
    HTTP status counts: the server was reached), else the reason (``"ConnectError: ..."``). Asked
    once per process."""
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - every transport error means the same: not reachable
        text = str(e).splitlines()[0] if str(e) else ""
        return f"{type(e).__name__}: {text}"[:200]
    return None


def _in_cache(name: str, repo_type: str) -> bool:
    """``name`` has a snapshot in the local hub cache (``models--org--name/snapshots/*``; a dataset
    also: prepared in ``datasets``' cache, ``HF_DATASETS_CACHE/org___name``)."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{name.replace('/', '--')}" / "snapshots"
    if folder.is_dir() and any(folder.iterdir()):
        return True
    if repo_type == "dataset":  # datasets' own cache of prepared data (``org___name``)
        root = os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets"
        prepared = Path(root) / name.replace("/", "___")
        return prepared.is_dir() and any(prepared.iterdir())
    return False


def hub_access(what: str, name: str, *, repo_type: str = "model") -> bool:
    """Ask before looking ``name`` up on the hub; returns whether to read the local cache only.

    Args:
        what: what is being loaded, for the message (``"model"``, ``"tokenizer"``, ``"dataset"``).
        name: the hub id (``"org/name"``).
        repo_type: ``"model"`` or ``"dataset"`` (the cache folder's kind).

    Returns:
        False where ``HF_HUB_OFFLINE`` is set (the libraries read only their caches already) or
        the hub answers; True where the hub cannot be reached but ``name`` is in the local cache
        (pass ``local_files_only=True``).

    Raises:
        ConnectionError: the hub cannot be reached and ``name`` is not in the local cache; one
            line naming ``what``, ``name``, the endpoint and the transport error.
    """
    if hub_offline():
        return False
    reason = hub_probe()
    if reason is None:
        return False
    if _in_cache(name, repo_type):
        return True
    from huggingface_hub import constants

    raise ConnectionError(
        f"cannot load {what} {name!r}: it is not a local path nor in the local Hugging Face cache, "
        f"and the hub ({constants.ENDPOINT}) cannot be reached ({reason}); check the name, or set "
        "HF_HUB_OFFLINE=1 to use the cache only"
    )


def from_pretrained_options(what: str, name_or_path: str) -> dict[str, bool]:
    """``from_pretrained`` keywords for ``name_or_path``: none for an existing local path; for a hub
    id, what :func:`hub_access` says (``local_files_only`` where the hub cannot be reached but the
    id is cached).

    Raises:
        ConnectionError: as :func:`hub_access`.
    """
    if Path(name_or_path).expanduser().exists():
        return {}
    return {"local_files_only": True} if hub_access(what, name_or_path) else {}
