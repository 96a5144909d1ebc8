"""Helpers for trainer tests: tiny recipes pointing at the ``tiny_model_dir`` fixture."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from grpokit.config import Recipe, recipe_from_dict

#: A tiny, fast recipe: G=2, B=2, 8 new tokens, 8 packaged MAWPS rows, no eval, length reward.
TINY_RECIPE: dict[str, dict[str, Any]] = {
    "model": {},  # name_or_path filled in by tiny_recipe_dict
    "data": {"dataset": "mawps", "split": "singleop", "limit": 8},
    "rollout": {"group_size": 2, "max_new_tokens": 8},
    "rewards": {"functions": ["support.fake_rewards:length_reward"]},
    "algo": {"beta": 0.04},
    "train": {
        "prompts_per_step": 2,
        "max_steps": 2,
        "micro_batch_size": 4,
        "learning_rate": 1e-2,
        "sample_every": 1,
        "seed": 0,
    },
    "eval": {"dataset": None},
}


TESTS = Path(__file__).resolve().parents[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a ``python -m grpokit`` (or torchrun) started by a test: offline, one
    torch thread (as the in-process reference runs: the same float results), ``tests/`` on the
    path (recipes name ``support.fake_rewards:fn``), a Python stack from a rank that crashes in C."""
    py_path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=py_path,
        PYTHONFAULTHANDLER="1",
        **extra,
    )


def tiny_recipe_dict(model_dir: str, output_dir: str | Path, **sections: dict[str, Any]) -> dict:
    """``TINY_RECIPE`` with the model folder, the output folder and per-section updates."""
    raw = copy.deepcopy(TINY_RECIPE)
    raw["model"]["name_or_path"] = str(model_dir)
    raw["train"]["output_dir"] = str(output_dir)
    for sec, values in sections.items():
        raw.setdefault(sec, {}).update(values)
    return raw


def tiny_recipe(model_dir: str, output_dir: str | Path, **sections: dict[str, Any]) -> Recipe:
    return recipe_from_dict(tiny_recipe_dict(model_dir, output_dir, **sections))


def write_recipe(path: str | Path, raw: dict) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(raw))
    return path


def saved_bytes(fn, *inputs) -> int:
    """Bytes of the tensors autograd keeps for ``fn()``'s backward (each storage once), the
    storages of ``inputs`` (e.g. the parameters) not counted."""
    import torch

    skip = {a.untyped_storage().data_ptr() for a in inputs}
    seen, total = {}, 0

    def pack(t):
        # ``seen`` holds every counted storage until the end, so a storage freed during the forward
        # cannot hand its address to a later one (which would then not be counted)
        nonlocal total
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in seen and ptr not in skip:
            seen[ptr] = storage
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def true_runs(mask_row) -> list[list[int]]:
    """The positions of each run of True in a 1-D bool mask (a multi-turn row's model turns)."""
    runs, cur = [], []
    for i, v in enumerate(mask_row.tolist()):
        if v:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])
