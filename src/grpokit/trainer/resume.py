"""A run's checkpoints seen from the loop: :func:`save_run_checkpoint` writes ``checkpoint-<step>`` of
the run's parts, :func:`resume` loads one back into them, and :func:`check_resume_recipe` says what
a resumed recipe changed (before anything loads). The files themselves:
:mod:`grpokit.trainer.checkpoint`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.config import Recipe
from grpokit.config.resume import check_resume
from grpokit.models.lora import adapter_state_for_model, is_peft_model
from grpokit.trainer.build import Run
from grpokit.trainer.checkpoint import (
    load_model_weights,
    load_training_state,
    read_checkpoint_recipe,
    read_model_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from grpokit.trainer.optim import hyperparameters, keep_hyperparameters, load_schedule_state
from grpokit.trainer.state import TrainState
from grpokit.utils.distributed import full_state, gather_objects, is_sharded, load_full_state


def save_run_checkpoint(run: Run, recipe: Recipe) -> Path | None:
    """``checkpoint-<step>`` of the run (weights, tokenizer, optimizer, schedule, RNG, data position,
    the model card: :mod:`grpokit.trainer.model_card`).

    With several ranks every rank must call it: each rank's RNG state is gathered (and, under
    FSDP2, the full model and optimizer state); rank 0 writes and returns the path, the others
    return None."""
    st, ranks = run.state, run.ranks
    refresh = run.prm_refresh  # iterative RL's state (grpokit.trainer.prm_refresh)
    rng = gather_objects(rng_state(), ranks) if ranks.active else None
    model_state = optimizer_state = None
    if is_sharded(run.model):
        model_state, optimizer_state = full_state(run.model, run.optimizer)
    algorithm_state = run.algorithm.state_dict()  # on every rank: a sharded value model gathers (PPO)
    if not ranks.is_main:
        return None
    return save_checkpoint(
        run.out,
        st.step,
        model=run.model,
        tokenizer=run.tokenizer,
        optimizer=run.optimizer,
        scheduler=run.scheduler,
        trainer_state={**st.to_checkpoint(), "world_size": ranks.world_size},
        recipe=recipe.to_dict(),
        keep=recipe.train.save_total_limit,
        algorithm_state=algorithm_state,
        rng_ranks=rng,
        model_state=model_state,
        optimizer_state=optimizer_state,
        extra_state=None if refresh is None else {"prm_refresh": refresh.state_dict(run.ref_model)},
        num_prompts=len(run.data.prompts),
    )


def resume(run: Run, ckpt: Path, changes: Sequence[tuple[str, Any, Any]] = ()) -> None:
    """Load ``ckpt``'s weights, optimizer, schedule, RNG and loop state into ``run`` (on every rank:
    each reads the checkpoint and takes its own RNG state; a checkpoint of another world size
    resumes with rank 0's, and sampling, seeded per row, is unchanged).

    The optimizers' moments and step counts and the schedule's position come from the checkpoint;
    their settings (``lr``, ``betas``, ``weight_decay``, the schedule's base rate and shape, PPO's
    ``critic_learning_rate``) stay those of ``run``'s optimizers, built from the recipe, so a
    recipe that changed them runs at its own values from the next step (docs/resume.md).
    ``changes``: the recipe's changed keys as ``(key, old, new)``, from :func:`check_resume_recipe`
    (which :func:`train` calls before anything loads); each is said on rank 0 and appended to
    ``run.state.recipe_changes`` (``{"step", "key", "old", "new"}``, saved with every later
    checkpoint as ``trainer_state.json``'s ``extra.recipe_changes``).

    Raises:
        ValueError: a damaged checkpoint, or one that does not fit the run's model (names the file).
    """
    state, blob = load_training_state(ckpt)
    settings = hyperparameters(run.optimizer)  # the recipe's: load_state_dict brings the checkpoint's back
    if is_sharded(run.model):
        weights = read_model_state(ckpt)
        lora = is_peft_model(run.model)
        if lora:  # the checkpoint holds the adapter alone, under peft's file names
            weights = adapter_state_for_model(run.model, weights)
        load_full_state(run.model, run.optimizer, weights, blob["optimizer"], adapter_only=lora)
    else:
        load_model_weights(run.model, ckpt)
        run.optimizer.load_state_dict(blob["optimizer"])
    keep_hyperparameters(run.optimizer, settings)
    run.engine.sync_weights()  # an engine with its own copy of the weights (vllm) must not sample the old ones
    load_schedule_state(run.scheduler, blob["scheduler"])  # the position; the recipe's base rate and shape
    own = _algorithm_optimizers(run.algorithm)  # PPO's value-model AdamW: critic_learning_rate as above
    own_settings = [hyperparameters(o) for o in own]
    run.algorithm.load_state_dict(blob.get("algorithm", {}))
    for opt, kept in zip(own, own_settings, strict=True):
        keep_hyperparameters(opt, kept)
    refresh = run.prm_refresh  # iterative RL: the PRM, its optimizer, π_ref, the label file
    if refresh is not None:
        refresh.load_state_dict(blob.get("prm_refresh", {}), run.ref_model)
    per_rank = blob.get("rng_ranks")
    set_rng_state(per_rank[run.ranks.rank] if per_rank and len(per_rank) == run.ranks.world_size else blob["rng"])
    run.state = TrainState.from_checkpoint(state)  # an old checkpoint's extra.train_s/recipe_changes too
    if changes:
        run.state.recipe_changes += [
            {"step": run.state.step, "key": k, "old": old, "new": new} for k, old, new in changes
        ]
        if run.ranks.is_main:
            said = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in changes)
            print(
                f"[grpokit] resuming {ckpt} with changed keys (the recipe's values apply from step "
                f"{run.state.step + 1}): {said}",
                flush=True,
            )


def check_resume_recipe(ckpt: Path, recipe: Recipe) -> list[tuple[str, Any, Any]]:
    """The recipe keys that differ between checkpoint ``ckpt``'s ``recipe.json`` and ``recipe`` as
    ``(key, old, new)``, when each may change on resume (the recipe's value applies from the next
    step: :mod:`grpokit.config.resume`, docs/resume.md); [] for a checkpoint without
    ``recipe.json``. Reads one small file: :func:`train` calls it before any model loads.

    Raises:
        RecipeError: a key that cannot change on resume differs (each named, ``old -> new``).
        ValueError: ``recipe.json`` is damaged (:func:`grpokit.trainer.checkpoint.read_checkpoint_recipe`).
    """
    old = read_checkpoint_recipe(ckpt)
    return [] if old is None else check_resume(old, recipe, str(ckpt))


def _algorithm_optimizers(algorithm: Any) -> list[torch.optim.Optimizer]:
    """The optimizers an algorithm holds as attributes (PPO: ``critic_optimizer``), in a fixed order."""
    held = vars(algorithm) if hasattr(algorithm, "__dict__") else {}
    return [v for _, v in sorted(held.items()) if isinstance(v, torch.optim.Optimizer)]
