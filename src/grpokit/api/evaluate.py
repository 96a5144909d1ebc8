"""Held-out evaluation of a library run (:meth:`grpokit.api.Trainer.evaluate`): the recipe's held-out
rows (:class:`grpokit.eval.evaluate.HeldOutEval`, the rows ``grpokit eval --heldout-of`` scores), the
model's generation with the recipe's environment when it has one, the same numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpokit.config import Recipe


def newest_model(recipe: Recipe, model: str | Path | None) -> str:
    """``model``; else the newest complete checkpoint of ``train.output_dir``; else ``model.name_or_path``."""
    if model is not None:
        return str(model)
    from grpokit.trainer.checkpoint import list_checkpoints

    out = Path(recipe.train.output_dir)
    found = list_checkpoints(out) if out.is_dir() else []
    return str(found[-1]) if found else recipe.model.name_or_path


def evaluate_heldout(recipe: Recipe, model: str | Path | None = None, *, when: str = "api") -> dict[str, Any]:
    """Evaluate ``model`` (:func:`newest_model`) on ``recipe``'s held-out rows; writes
    ``<train.output_dir>/eval_<when>.json`` and returns its content (:meth:`HeldOutEval.run`).

    Raises:
        ValueError: no ``eval.dataset``; what :class:`~grpokit.eval.evaluate.HeldOutEval` raises.
        OSError: a model that cannot be found.
    """
    from grpokit.backends import install_backend
    from grpokit.data.rows import section_rows
    from grpokit.eval.evaluate import HeldOutEval
    from grpokit.models.loading import eos_token_ids, load_model, load_tokenizer, model_max_positions
    from grpokit.rollout.engine import load_engine
    from grpokit.rollout.multiturn import MultiTurnEngine, env_options
    from grpokit.trainer.build import resolve_device

    held = HeldOutEval(recipe, section_rows(recipe, "data"))  # bad data fails before the model loads
    env = env_options(recipe.rollout)
    name = newest_model(recipe, model)
    device = resolve_device(recipe.model.device)
    tokenizer = load_tokenizer(name, trust_remote_code=recipe.model.trust_remote_code)
    held.prepare(tokenizer, model_max_positions(name, trust_remote_code=recipe.model.trust_remote_code))
    net = load_model(name, device=device, trust_remote_code=recipe.model.trust_remote_code).eval()
    install_backend(net, "auto", announce=False)
    on_model = dict(model=net, tokenizer=tokenizer, eos_token_ids=eos_token_ids(net, tokenizer))
    engine = load_engine("hf", **on_model) if env is None else MultiTurnEngine(**on_model, **env)
    out = Path(recipe.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = held.run(engine, out, when)
    res["model"] = name
    return res
