"""Held-out evaluation of a library run (:meth:`grpokit.api.Trainer.evaluate`): the recipe's held-out
rows (:class:`grpokit.eval.evaluate.HeldOutEval`, the rows ``grpokit eval --heldout-of`` scores), the
model's generation with the recipe's environment when it has one, the same numbers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.config import Recipe

if TYPE_CHECKING:
    from grpokit.eval.evaluate import EvalResult


def newest_model(recipe: Recipe, model: str | Path | None) -> str:
    """``model``; else the newest complete checkpoint of ``train.output_dir``; else ``model.name_or_path``."""
    if model is not None:
        return str(model)
    from grpokit.trainer.checkpoint import list_checkpoints

    out = Path(recipe.train.output_dir)
    found = list_checkpoints(out) if out.is_dir() else []
    return str(found[-1]) if found else recipe.model.name_or_path


def evaluate_heldout(recipe: Recipe, model: str | Path | None = None, *, when: str = "api") -> EvalResult:
    """Evaluate ``model`` (:func:`newest_model`) on ``recipe``'s held-out rows; writes
    ``<train.output_dir>/eval_<when>.json`` and returns its content (:meth:`HeldOutEval.run`'s
    :class:`~grpokit.eval.evaluate.EvalResult`) with ``model`` set (the file does not hold it).

    Raises:
        ValueError: no ``eval.dataset``; what :class:`~grpokit.eval.evaluate.HeldOutEval` raises.
        OSError: a model that cannot be found.
    """
    from grpokit.data.rows import section_rows
    from grpokit.eval.evaluate import HeldOutEval
    from grpokit.models.loading import load_tokenizer, model_max_positions
    from grpokit.rollout.multiturn import env_options
    from grpokit.trainer.build import resolve_device

    held = HeldOutEval(recipe, section_rows(recipe, "data"))  # bad data fails before the model loads
    env = env_options(recipe.rollout)
    name = newest_model(recipe, model)
    device = resolve_device(recipe.model.device)
    tokenizer = load_tokenizer(name, trust_remote_code=recipe.model.trust_remote_code)
    held.prepare(tokenizer, model_max_positions(name, trust_remote_code=recipe.model.trust_remote_code))
    engine = evaluation_engine(name, device, tokenizer, env, trust_remote_code=recipe.model.trust_remote_code)
    out = Path(recipe.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = held.run(engine, out, when)
    res.model = name
    return res


def evaluation_engine(
    name: str, device: Any, tokenizer: Any, env: dict[str, Any] | None, *, trust_remote_code: bool = False
) -> Any:
    """Model ``name`` loaded on ``device`` for evaluation (``eval()``, the fast generation backend where
    it is exact) in the hf rollout engine, or with ``env`` (:func:`grpokit.rollout.multiturn.env_options`)
    the multi-turn engine. Raises OSError/ValueError: a model that cannot be loaded."""
    from grpokit.backends import install_backend
    from grpokit.models.loading import eos_token_ids, load_model
    from grpokit.rollout.engine import load_engine
    from grpokit.rollout.multiturn import MultiTurnEngine

    model = load_model(name, device=device, trust_remote_code=trust_remote_code).eval()
    install_backend(model, "auto", announce=False)
    on_model = dict(model=model, tokenizer=tokenizer, eos_token_ids=eos_token_ids(model, tokenizer))
    return load_engine("hf", **on_model) if env is None else MultiTurnEngine(**on_model, **env)


def shortest_context(models: list[str]) -> int | None:
    """The fewest positions (prompt + new tokens) of ``models``' configs (None: none states any), so
    that every prompt kept fits each model compared."""
    from grpokit.models.loading import model_max_positions

    sizes = [n for n in (model_max_positions(m) for m in models) if n is not None]
    return min(sizes) if sizes else None


def evaluate_models(
    models: list[str],
    device: Any,
    tokenizer: Any,
    prompts: list[str],
    rows: list[dict],
    scorer: Any,
    scorer_name: str,
    *,
    dataset: str,
    split: str,
    skip: int = 0,
    max_new_tokens: int,
    batch_size: int,
    samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    settings: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``grpokit eval`` measures once its input is checked: each of ``models`` (one, or two to
    pair) loaded and scored on the same ``prompts``/``rows`` (greedy, and ``samples`` completions at
    ``temperature`` with ``seed``; with ``env``, :func:`grpokit.rollout.multiturn.env_options`'s
    environment between turns), its summary printed; with two, the paired comparison (exact McNemar)
    printed and added. Returns the dict ``grpokit eval`` writes to its JSON file (``models``: each
    model's :func:`grpokit.eval.evaluate.evaluate` result, as its ``to_dict()``).

    Raises:
        OSError, ValueError: a model that cannot be loaded; RuntimeError: a fault while evaluating.
    """
    from grpokit.data import dataset_label
    from grpokit.data.heldout import answer_extractor
    from grpokit.eval.compare import compare
    from grpokit.eval.evaluate import evaluate
    from grpokit.eval.stats import format_summary

    results: dict[str, EvalResult] = {}
    for m in models:
        engine = evaluation_engine(m, device, tokenizer, env)
        results[m] = r = evaluate(
            engine,
            prompts,
            rows,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            scorer=scorer,
            num_samples=samples,
            temperature=temperature,
            seed=seed,
            extract_answer=answer_extractor(scorer_name),
        )
        print(
            f"{m} on {dataset_label(dataset, split)} ({r.total} problems, scorer {scorer_name}, "
            f"{r.seconds:.0f} s):\n{format_summary(r.metrics or {})}",
            flush=True,
        )
    out: dict[str, Any] = {
        "dataset": dataset,
        "split": split,
        "skip": skip,
        "scorer": scorer_name,
        "settings": settings or {},
        "models": {m: r.to_dict() for m, r in results.items()},
    }
    if len(models) == 2:
        paired, lines = compare(results[models[0]], results[models[1]], models[0], models[1], samples)
        out.update(paired)
        print("\n".join(lines))
    return out
