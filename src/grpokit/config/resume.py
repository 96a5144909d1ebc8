"""Recipe keys on resume: which may change when a run resumes from a checkpoint, and which are refused.

A checkpoint's ``recipe.json`` is the recipe its run used. Resuming with a recipe whose values
differ is one of two cases, decided per key (the table in ``docs/resume.md``):

- **the recipe wins** (every key not in :data:`REFUSED_ON_RESUME`): the new value applies from the
  next step on, including keys whose value the checkpoint's state would otherwise bring back
  (``train.learning_rate``, ``weight_decay``, ``adam_betas``, the schedule, ``critic_learning_rate``:
  :func:`grpokit.trainer.optim.keep_hyperparameters`, :func:`grpokit.trainer.optim.load_schedule_state`); each
  change is said in one line and recorded in ``trainer_state.json`` (``extra.recipe_changes``:
  step, key, old, new), and the next checkpoint's ``recipe.json`` holds the values that ran since;
- **refused** (:data:`REFUSED_ON_RESUME`): the checkpoint's state only means something with the value
  it was written with (the data position indexes an order of these rows, the weights and moments
  are of this model, dtype and optimizer, ...). The run stops before any model loads with one
  :class:`~grpokit.config.RecipeError` naming each such key with its old and new value.

Imports the standard library only.
"""

from __future__ import annotations

import json
from typing import Any

from grpokit.config.fields import RecipeError
from grpokit.config.schema import Recipe

#: keys (a ``section.`` prefix: every key of the section) whose change a resume refuses -> why
REFUSED_ON_RESUME: dict[str, str] = {
    "model.name_or_path": "the checkpoint's weights (and the reference model) are of that model",
    "model.dtype": "the checkpoint's weights and optimizer moments are in that dtype",
    "model.lora": "the checkpoint holds the weights of that adapter (or of the full model)",
    "data.": "the data keys decide the rows (filters, prompt length) and their order, and the checkpoint's "
    "data position indexes that order",
    "train.seed": "the data order (a permutation seeded per epoch) and the sampling seeds follow it",
    "train.optimizer": "the checkpoint's optimizer state is that optimizer's",
    "train.num_iterations": "the learning-rate schedule counts optimizer steps (max_steps · num_iterations) and "
    "the checkpoint's position in it was counted with that value",
}

#: keys never compared: how the checkpoint is found, not what runs
NOT_COMPARED = ("train.resume",)


def flat(recipe: dict) -> dict[str, Any]:
    """A recipe's nested dicts (``Recipe.to_dict()``, a ``recipe.json``) as ``{"section.key": value}``,
    values as JSON gives them back (tuples are lists), so a saved and a live recipe compare equal."""
    out = {}
    for sec, values in json.loads(json.dumps(recipe, default=str)).items():
        for key, value in values.items() if isinstance(values, dict) else ():
            out[f"{sec}.{key}"] = value
    return out


def refusal_reason(key: str) -> str | None:
    """Why a change of ``key`` is refused on resume (:data:`REFUSED_ON_RESUME`), or None: the recipe wins."""
    for name, why in REFUSED_ON_RESUME.items():
        if key == name or (name.endswith(".") and key.startswith(name)):
            return why
    return None


def resume_changes(old: dict, new: Recipe | dict) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for each key whose value differs between the checkpoint's
    recipe ``old`` (its ``recipe.json``) and the recipe ``new``, in the schema's order. A key that
    ``old`` does not hold (a checkpoint of an earlier version) is not compared, nor
    :data:`NOT_COMPARED`."""
    before = flat(old)
    after = flat(new.to_dict() if isinstance(new, Recipe) else new)
    return [(k, before[k], v) for k, v in after.items() if k in before and k not in NOT_COMPARED and before[k] != v]


def check_resume(old: dict, new: Recipe, where: str) -> list[tuple[str, Any, Any]]:
    """The changes (:func:`resume_changes`) from checkpoint ``where``'s recipe ``old`` to ``new``
    when every one may be made on resume (the recipe wins); [] when nothing changed.

    Raises:
        RecipeError: one or more refused keys changed (:data:`REFUSED_ON_RESUME`); the one-line
            message names each with ``old -> new`` and why, and how to go on.
    """
    changes = resume_changes(old, new)
    refused = [(k, a, b, refusal_reason(k)) for k, a, b in changes if refusal_reason(k)]
    if refused:
        said = "; ".join(f"{k}: {a!r} -> {b!r} ({why})" for k, a, b, why in refused)
        raise RecipeError(
            f"train.resume: {where} cannot resume with changed keys: {said}. Set "
            f"{'it' if len(refused) == 1 else 'them'} back to the checkpoint's value, or start a "
            "new run (train.resume=none or another train.output_dir)"
        )
    return changes
