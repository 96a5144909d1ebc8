"""``grpokit eval MODEL --dataset NAME``: held-out accuracy of one model, or two paired (``--against``).

Configured by a recipe's ``eval`` section (:class:`grpokit.config.EvalConfig`: defaults, help and
checks): ``--heldout-of RECIPE``'s, else the demo recipe's (its prompts; it has no ``eval`` section).
Each of :data:`FLAG_KEYS`' flags is an override of one recipe key (``--limit`` is ``eval.limit``,
``--samples`` ``eval.num_samples``), as are ``section.key=value`` words after MODEL: the schema's
defaults, then the recipe, then the overrides, then the flags. With ``--heldout-of`` the rows are the
recipe run's held-out problems (:class:`grpokit.eval.evaluate.HeldOutEval`, with the overrides); the
other flags (``--against``, ``--output``, ``--skip``, the seeds, ``--temperature``) belong to this
command alone.

Called by :func:`grpokit.cli.main.main`; its errors follow the rule of that module's docstring."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from grpokit.cli.errors import USER_ERRORS, finite_float
from grpokit.cli.errors import one_line as _one_line
from grpokit.cli.errors import show_traceback as _show_traceback
from grpokit.cli.recipe_args import DEFAULT_RECIPE, command_recipe, find_recipe, flag_values, split_overrides
from grpokit.data import dataset_label

if TYPE_CHECKING:
    from grpokit.config import Recipe
    from grpokit.eval.evaluate import HeldOutEval

#: flag (argparse dest) -> the recipe key it overrides
FLAG_KEYS = {
    "dataset": "eval.dataset",
    "split": "eval.split",
    "limit": "eval.limit",
    "samples": "eval.num_samples",
    "scorer": "eval.scorer",
    "max_new_tokens": "eval.max_new_tokens",
    "batch_size": "eval.batch_size",
    "data_options": "eval.options",
    "prompt_template": "data.prompt_template",
    "system_prompt": "data.system_prompt",
    "device": "model.device",
}

#: the longest completion without a recipe that sets one (eval.max_new_tokens)
DEFAULT_MAX_NEW_TOKENS = 256

#: the seed of generated data without --heldout-of: a run's held-out seed with train.seed=0 (train.seed + 10^9)
DEFAULT_DATA_SEED = 10**9


def _eval_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="grpokit eval",
        description="Held-out accuracy: greedy, and mean@k / pass@k / maj@k over k samples, "
        "each with a 95 % interval; --against compares two models on the same problems (exact McNemar test). "
        "Flags marked with a recipe key set that key of --heldout-of's recipe (else of the demo recipe), as a "
        "section.key=value word does.",
    )
    p.add_argument(
        "model",
        help="model path, hub name or alias (smollm2-135m-instruct), or a run's output folder "
        "(its newest complete checkpoint)",
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="recipe keys, e.g. eval.limit=50")
    p.add_argument(
        "--against",
        default=None,
        metavar="MODEL",
        help="a second model (e.g. a checkpoint or a run's "
        "output folder) scored on "
        "the same problems; prints the paired difference with its interval and the McNemar p-value",
    )
    p.add_argument("--dataset", default=None, help="eval.dataset (required unless --heldout-of names a recipe)")
    p.add_argument(
        "--heldout-of",
        default=None,
        metavar="RECIPE.yaml",
        help="the held-out problems of this "
        "recipe's run, exactly as its evaluations use them (eval section, its prompt template and "
        "scorer; training questions left out); the eval flags and overrides change its eval section",
    )
    p.add_argument("--split", default=None, help="eval.split (default test)")
    p.add_argument("--limit", type=int, default=None, help="eval.limit (default 100)")
    p.add_argument(
        "--skip",
        type=int,
        default=None,
        help="start at row N of the split (as data.skip does); the "
        "packaged recipes hold out rows 0-99 and train from row 100, so evaluate them with --limit 100 "
        "(not with --heldout-of)",
    )
    p.add_argument(
        "--data-options",
        default=None,
        help="eval.options, as YAML, e.g. reasoning_gym's '{size: 500, max_digits: 2}'",
    )
    p.add_argument(
        "--data-seed",
        type=int,
        default=None,
        help="seed of generated data (reasoning_gym); the default, 10^9, "
        "is the held-out seed of a run with train.seed=0 (train.seed + 10^9): never its training set "
        "(not with --heldout-of)",
    )
    p.add_argument(
        "--shuffle-seed",
        type=int,
        default=None,
        help="shuffle the rows with this seed before --skip "
        "and --limit, as a recipe's data.shuffle_seed does (the held-out rows of a run with "
        "data.shuffle_seed=S are --shuffle-seed S --limit <eval.limit>; not with --heldout-of)",
    )
    p.add_argument(
        "--scorer",
        default=None,
        help="eval.scorer: the reward function deciding correctness (default: reasoning_gym for "
        "reasoning_gym: data, else math_correct)",
    )
    p.add_argument("--samples", type=int, default=None, metavar="K", help="eval.num_samples: also sample K completions")
    p.add_argument("--temperature", type=finite_float, default=1.0, help="sampling temperature for --samples")
    p.add_argument("--seed", type=int, default=0, help="sampling seed for --samples")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"eval.max_new_tokens (default: the --heldout-of recipe's rollout.max_new_tokens, else "
        f"{DEFAULT_MAX_NEW_TOKENS})",
    )
    p.add_argument("--batch-size", type=int, default=None, help="eval.batch_size (default 16)")
    p.add_argument("--device", default=None, help="model.device: cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument("--prompt-template", default=None, help="data.prompt_template (default: the recipe's)")
    p.add_argument("--system-prompt", default=None, help="data.system_prompt")
    p.add_argument(
        "--output",
        default=None,
        help="JSON file (default: eval_<dataset>_<split>.json in the working "
        "folder, the dataset's file name without folders); an existing file is refused before any model "
        "loads unless --overwrite",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    return p.parse_intermixed_args(argv)


def _eval_recipe(ns: argparse.Namespace) -> tuple[Recipe, HeldOutEval | None]:
    """The recipe ``ns`` means (:func:`grpokit.cli.recipe_args.command_recipe`) and, with
    ``--heldout-of``, its held-out rows (:class:`grpokit.eval.evaluate.HeldOutEval`, or None); sets
    ``ns``'s eval fields (dataset, split, limit, samples, scorer, max_new_tokens, batch_size, device,
    skip, data_seed) to the values that run.

    Raises:
        RecipeError: a recipe not found or not valid, a flag or override out of range (named), a word
            after MODEL that is not ``section.key=value``, a row flag with ``--heldout-of``, neither
            ``--dataset`` nor ``--heldout-of``.
        ValueError: ``--data-options`` not a YAML mapping; what :class:`HeldOutEval` raises.
    """
    from grpokit.config import RecipeError
    from grpokit.data.rows import section_rows
    from grpokit.eval.evaluate import HeldOutEval

    words, overrides = split_overrides(ns.overrides)
    if words:
        raise RecipeError(f"unexpected argument {words[0]!r} after MODEL: recipe keys are written section.key=value")
    if ns.heldout_of:
        for flag, value in (("--skip", ns.skip), ("--data-seed", ns.data_seed), ("--shuffle-seed", ns.shuffle_seed)):
            if value is not None:
                raise RecipeError(
                    f"{flag}: not with --heldout-of, whose recipe decides the held-out rows (set eval.limit, "
                    "eval.dataset, data.shuffle_seed there or as overrides)"
                )
    options = _data_options(ns.data_options) if ns.data_options is not None else None
    flags = flag_values(ns, FLAG_KEYS, data_options=options)
    path = DEFAULT_RECIPE
    try:
        if ns.heldout_of:
            path = find_recipe(ns.heldout_of)
        recipe = command_recipe(path, overrides, flags)
        held = HeldOutEval(recipe, section_rows(recipe, "data")) if ns.heldout_of else None
    except (RecipeError, ValueError, OSError) as err:  # the recipe's own fault: named by the recipe
        if not ns.heldout_of or str(err).startswith("--"):  # a flag's value: the message names the flag
            raise
        raise RecipeError(f"--heldout-of {ns.heldout_of}: {err}") from None
    e = recipe.eval
    if held is not None:
        print(f"[grpokit] eval: {held.note}", flush=True)
    elif e.dataset is None:
        raise RecipeError("give --dataset NAME (eval.dataset) or --heldout-of RECIPE.yaml")
    ns.dataset, ns.split, ns.scorer, ns.batch_size = e.dataset, e.split, e.scorer, e.batch_size
    ns.limit = len(held.rows) if held else e.limit
    ns.samples = e.num_samples or None
    ns.max_new_tokens = held.max_new_tokens if held else (e.max_new_tokens or DEFAULT_MAX_NEW_TOKENS)
    ns.device, ns.data_options = recipe.model.device, e.options
    # the section.key=value words and the flags' keys, recorded with the settings (JSON is YAML)
    given = [f"{key}={json.dumps(value)}" for key, value in flags.values() if value is not None]
    ns.recipe_overrides = [*overrides, *given]
    if held is not None:  # the rows the recipe's held-out set is made of, as section_rows reads them
        from grpokit.data import heldout

        ns.skip, ns.data_seed, ns.shuffle_seed = 0, heldout.eval_seed(recipe), heldout.shuffle_seed(recipe, "eval")
    else:
        ns.skip = 0 if ns.skip is None else ns.skip
        ns.data_seed = DEFAULT_DATA_SEED if ns.data_seed is None else ns.data_seed
    return recipe, held


def _newest_checkpoint_of_run(model: str) -> str:
    """``model`` unchanged, unless it is a run's output folder (a folder without ``config.json`` that holds
    ``checkpoint-<step>`` folders): then its newest complete checkpoint (announced on stdout).

    Raises:
        ValueError: the folder holds checkpoint folders but none is complete (names the folder).
    """
    from grpokit.trainer.checkpoint import list_checkpoints

    path = Path(model).expanduser()
    if not path.is_dir() or (path / "config.json").exists() or not any(path.glob("checkpoint-*")):
        return model
    found = list_checkpoints(path)
    if not found:
        raise ValueError(
            f"model {model!r}: a run folder without a complete checkpoint (none of its checkpoint-<step> "
            "folders has trainer_state.json); name a model or a checkpoint folder"
        )
    print(f"[grpokit] {model}: the run's newest complete checkpoint, {found[-1]}", flush=True)
    return str(found[-1])


def eval_command(argv: list[str]) -> int:
    ns = _eval_args(argv)
    from grpokit.api.evaluate import evaluate_models, shortest_context
    from grpokit.config import RecipeError
    from grpokit.data.heldout import check_scorer, default_scorer
    from grpokit.data.rows import load_prompts
    from grpokit.eval.evaluate import default_output_name
    from grpokit.models.loading import load_tokenizer, resolve_model_paths
    from grpokit.rewards import get_reward_function
    from grpokit.trainer.build import resolve_device
    from grpokit.utils.outputs import check_output_file

    def fail(msg: str) -> int:
        print(f"grpokit eval: error: {msg}", file=sys.stderr)
        return 2

    # every check that needs no model comes first
    if ns.samples is not None and ns.samples < 1:
        return fail(f"--samples must be >= 1 (k completions per problem), got {ns.samples}")
    try:
        recipe, held = _eval_recipe(ns)
        from grpokit.rollout.multiturn import env_options

        env = env_options(recipe.rollout)  # the tools the models train with, checked before any model loads
    except (RecipeError, *USER_ERRORS) as e:
        return fail(_one_line(e))
    if ns.samples and ns.temperature <= 0:
        return fail(f"--temperature must be > 0 with --samples, got {ns.temperature}")
    scorer_name = ns.scorer or (held.scorer if held else default_scorer(ns.dataset))
    try:
        out_path = check_output_file(ns.output or default_output_name(ns.dataset, ns.split), "--output")
        if out_path.exists() and not ns.overwrite:  # never replaced silently
            return fail(
                f"--output {out_path}: exists{'' if ns.output else ' (the default output file)'}; name "
                "another file with --output, or pass --overwrite to replace it"
            )
        check_scorer(scorer_name, ns.dataset)
        scorer = get_reward_function(scorer_name)
        ns.model = _newest_checkpoint_of_run(ns.model)
        ns.against = ns.against and _newest_checkpoint_of_run(ns.against)
        models = [ns.model] + ([ns.against] if ns.against else [])
        for m in models:
            resolve_model_paths(m)  # a LoRA adapter's base model too
        device = resolve_device(ns.device)
        tok = load_tokenizer(ns.model)
        rows = held.rows if held else _skipped_rows(ns, recipe)
        if not rows:
            return fail(f"no rows of {dataset_label(ns.dataset, ns.split)} left after --skip {ns.skip}")
        rows, prompts, skipped = load_prompts(
            recipe,
            tok,
            dataset=ns.dataset,
            split=ns.split,
            limit=None,
            rows=rows,
            max_new_tokens=ns.max_new_tokens,
            max_positions=shortest_context(models),
            new_tokens_key="--max-new-tokens",
        )
        settings = _eval_settings(ns, recipe, tok, skipped)
    except USER_ERRORS as e:  # unknown data/scorer, missing model, file or optional package (the message names
        if _show_traceback():  # its extra), an output that cannot be written
            raise
        return fail(_one_line(e))
    try:
        out = evaluate_models(
            models,
            device,
            tok,
            prompts,
            rows,
            scorer,
            scorer_name,
            dataset=ns.dataset,
            split=ns.split,
            skip=ns.skip,
            max_new_tokens=ns.max_new_tokens,
            batch_size=ns.batch_size,
            samples=ns.samples or 0,
            temperature=ns.temperature,
            seed=ns.seed,
            settings=settings,
            env=env,
        )
        _write_results(out, models, out_path, ns.max_new_tokens)
        return 0
    except USER_ERRORS as e:  # a model that does not load, a fault while evaluating
        if _show_traceback():
            raise
        print(f"grpokit eval: error: {_one_line(e)}", file=sys.stderr)
        return 1


def _skipped_rows(ns: argparse.Namespace, recipe: Recipe) -> list[dict]:
    """The rows ``--dataset`` / ``--split`` name (``--limit`` of them after ``--skip``, with the data
    seeds and options), the first ``--skip`` left out."""
    from grpokit.data.rows import load_data_rows

    limit = None if ns.limit is None else ns.skip + ns.limit
    rows = load_data_rows(
        recipe,
        dataset=ns.dataset,
        split=ns.split,
        limit=limit,
        seed=ns.data_seed,
        options=ns.data_options or {},
        shuffle_seed=ns.shuffle_seed,
    )
    return rows[ns.skip :]


def _write_results(out: dict, models: list[str], out_path: Path, max_new_tokens: int) -> None:
    """Warn about a model measured on too little (:func:`grpokit.eval.evaluate.measured_little`),
    then write ``out`` to ``out_path`` as JSON and say where."""
    from grpokit.eval.evaluate import measured_little

    for m in models:
        for text in measured_little(out["models"][m], budget=f"--max-new-tokens={max_new_tokens}"):
            print(f"[grpokit] warning: {m}: {text}", file=sys.stderr, flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1, default=str))
    print(f"-> {out_path}")


def _eval_settings(ns: argparse.Namespace, recipe: Recipe, tok: Any, skipped: int) -> dict:
    """What decides ``grpokit eval``'s numbers besides the models, for its JSON: the prompts
    (:func:`grpokit.eval.evaluate.prompt_settings`), the token budget, greedy decoding and the sampling
    settings, the rows (skip, limit, seeds: with ``--heldout-of`` those its held-out rows were read
    with), the recipe and its ``section.key=value`` overrides: every value the one that was used, so
    that ``grpokit eval MODEL --heldout-of HELDOUT_OF OVERRIDES...`` (or ``--dataset`` with these rows'
    flags) gives the same problems again."""
    from grpokit.eval.evaluate import prompt_settings

    return {
        **prompt_settings(recipe.data, tok, skipped),
        "tokenizer_of": ns.model,
        "max_new_tokens": ns.max_new_tokens,
        "greedy": True,
        "samples": ns.samples or 0,
        "temperature": ns.temperature if ns.samples else None,
        "seed": ns.seed if ns.samples else None,
        "batch_size": ns.batch_size,
        "limit": ns.limit,
        "skip": ns.skip,
        "data_seed": ns.data_seed,
        "shuffle_seed": ns.shuffle_seed,
        "data_options": ns.data_options,
        "heldout_of": ns.heldout_of,
        "overrides": list(getattr(ns, "recipe_overrides", [])),
    }


def _data_options(text: str | None) -> dict:
    """``--data-options`` as a mapping ({} when not given).

    Raises:
        ValueError: not valid YAML, or not a mapping (names ``--data-options``).
    """
    from grpokit.config.yaml_io import load_yaml, yaml_problem

    if not text:
        return {}
    try:
        value = load_yaml(text)
    except yaml.YAMLError as e:
        raise ValueError(f"--data-options {text!r}: not valid YAML ({yaml_problem(e)})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--data-options {text!r}: expected a mapping such as '{{size: 500, max_digits: 2}}'")
    return value
