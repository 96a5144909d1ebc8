"""``grpokit sft``: the supervised warm-up before GRPO (:mod:`grpokit.trainer.sft`), configured by a
recipe's ``sft`` section (:class:`grpokit.config.SftConfig`: defaults, help and checks).

- ``grpokit sft RECIPE [section.key=value ...]``: fine-tune ``sft.model`` on ``sft.dataset`` and write
  it to the recipe's ``model.name_or_path``, the model ``grpokit train RECIPE`` then trains; the rows
  whose question is one of the recipe's held-out problems are left out, and the prompts are the
  recipe's (``data.prompt_template``, ``data.system_prompt``) unless ``sft.prompt_template`` and
  ``sft.system_prompt`` say otherwise.
- ``grpokit sft MODEL OUT [--heldout-of RECIPE] --dataset NAME --completion-template T``: the model
  and the output folder named; ``--heldout-of``'s recipe gives the ``sft`` section, the prompts and the
  held-out problems as above; without it the demo recipe's prompts are used and no row is left out.

Each flag is an override of one recipe key (``--epochs`` is ``sft.epochs``, ``--device`` is
``model.device``): the schema's defaults, then the recipe, then ``key=value`` overrides, then flags.
Called by :func:`grpokit.cli.main.main`; exit 1 for any error of the input or the run (argparse's
usage errors: 2).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from grpokit.cli.errors import USER_ERRORS, finite_float
from grpokit.cli.errors import one_line as _one_line
from grpokit.cli.errors import show_traceback as _show_traceback
from grpokit.cli.recipe_args import DEFAULT_RECIPE, command_recipe, find_recipe, flag_values, split_overrides
from grpokit.config import Recipe, RecipeError

#: flag (argparse dest) -> the recipe key it overrides
FLAG_KEYS = {
    "dataset": "sft.dataset",
    "split": "sft.split",
    "limit": "sft.limit",
    "shuffle_seed": "sft.shuffle_seed",
    "completion_template": "sft.completion_template",
    "prompt_template": "sft.prompt_template",
    "system_prompt": "sft.system_prompt",
    "epochs": "sft.epochs",
    "max_steps": "sft.max_steps",
    "learning_rate": "sft.learning_rate",
    "batch_size": "sft.batch_size",
    "warmup_steps": "sft.warmup_steps",
    "seed": "sft.seed",
    "device": "model.device",
}


@dataclass
class SftJob:
    """What a ``grpokit sft`` command line means: the ``recipe`` (its ``sft`` section filled in), the
    ``model`` fine-tuned, the ``out`` folder, and ``heldout_of``: the recipe file whose held-out problems
    are left out (None: none are)."""

    recipe: Recipe
    model: str
    out: str
    heldout_of: str | None


def _parser() -> argparse.ArgumentParser:
    from grpokit.config import help_text

    p = argparse.ArgumentParser(
        prog="grpokit sft",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Supervised warm-up before GRPO: fine-tune a model to write each row's completion template "
        "after its chat-templated prompt\n(the loss on completion tokens only; transformers' Trainer).\n"
        "  grpokit sft RECIPE [sft.key=value ...]: sft.model, written to the recipe's model.name_or_path "
        "(what `grpokit train RECIPE` trains)\n"
        "  grpokit sft MODEL OUT --dataset NAME --completion-template T [--heldout-of RECIPE]\n"
        "Rows whose question is one of the recipe's held-out problems are left out (MODEL OUT: with "
        "--heldout-of). Each flag sets one "
        "recipe key\n(--epochs = sft.epochs, --device = model.device), after the recipe and its key=value "
        "overrides.",
        epilog="recipe keys of grpokit sft (a recipe's sft: section; override any with sft.key=value):\n"
        + help_text(sections=("sft",)),
    )
    p.add_argument("words", nargs="*", metavar="RECIPE | MODEL OUT | section.key=value")
    p.add_argument("--dataset", default=None, help="sft.dataset")
    p.add_argument("--split", default=None, help="sft.split")
    p.add_argument("--limit", type=int, default=None, help="sft.limit: the first N rows (after --shuffle-seed)")
    p.add_argument("--shuffle-seed", type=int, default=None, help="sft.shuffle_seed")
    p.add_argument("--completion-template", default=None, help="sft.completion_template, e.g. '{equation}'")
    p.add_argument("--prompt-template", default=None, help="sft.prompt_template (default: the recipe's)")
    p.add_argument("--system-prompt", default=None, help="sft.system_prompt (default: the recipe's)")
    p.add_argument(
        "--heldout-of",
        default=None,
        metavar="RECIPE.yaml",
        help="with MODEL OUT: the recipe (its sft section and prompts); every row whose question is one of its "
        "held-out (eval) problems, compared without case and spaces, is left out",
    )
    p.add_argument("--epochs", type=finite_float, default=None, help="sft.epochs")
    p.add_argument("--max-steps", type=int, default=None, help="sft.max_steps (overrides --epochs when > 0)")
    p.add_argument("--learning-rate", type=finite_float, default=None, help="sft.learning_rate")
    p.add_argument("--batch-size", type=int, default=None, help="sft.batch_size")
    p.add_argument("--warmup-steps", type=int, default=None, help="sft.warmup_steps")
    p.add_argument("--seed", type=int, default=None, help="sft.seed")
    p.add_argument("--device", default=None, help="model.device: cpu, cuda, cuda:N or auto")
    return p


def sft_job(argv: list[str]) -> SftJob:
    """Parse a ``grpokit sft`` command line; nothing is loaded but the recipe.

    Raises:
        SystemExit: argparse's usage errors (exit 2), ``--help`` (0).
        RecipeError: a recipe that is not found or not valid, an override or flag out of range (the
            message names the flag), ``sft.model``/``sft.dataset``/``sft.completion_template`` not set,
            or a form of the command line that is neither ``RECIPE`` nor ``MODEL OUT``.
    """
    ns = _parser().parse_intermixed_args(argv)
    positional, overrides = split_overrides(ns.words)
    flags = flag_values(ns, FLAG_KEYS)
    heldout_of: str | None
    if len(positional) == 1:
        if ns.heldout_of:
            raise RecipeError("give the recipe once: grpokit sft RECIPE, or grpokit sft MODEL OUT --heldout-of RECIPE")
        try:
            path = find_recipe(positional[0])
        except RecipeError as e:
            raise RecipeError(f"{e}; or give MODEL OUT (grpokit sft MODEL OUT --dataset ...)") from None
        recipe = command_recipe(path, overrides, flags)
        if recipe.sft.model is None:
            raise RecipeError(
                f"sft.model: not set in {path}; the model to fine-tune (its result is written to "
                f"model.name_or_path, {recipe.model.name_or_path})"
            )
        model, out, heldout_of = recipe.sft.model, recipe.model.name_or_path, str(path)
        if Path(model).expanduser().resolve() == Path(out).expanduser().resolve():
            raise RecipeError(
                f"sft.model and model.name_or_path are both {model}: the warm-up would be written over its start"
            )
    elif len(positional) == 2:
        heldout_of = str(find_recipe(ns.heldout_of)) if ns.heldout_of else None
        recipe = command_recipe(Path(heldout_of or DEFAULT_RECIPE), overrides, flags)
        model, out = positional
    else:
        raise RecipeError(
            f"expected RECIPE or MODEL OUT, got {len(positional)} arguments ({' '.join(positional) or 'none'}); "
            "see grpokit sft --help"
        )
    for key, flag in (("dataset", "--dataset NAME"), ("completion_template", "--completion-template T")):
        if getattr(recipe.sft, key) is None:
            raise RecipeError(f"sft.{key}: not set; give {flag} or set sft.{key} in the recipe")
    return SftJob(recipe, model, out, heldout_of)


def sft_command(argv: list[str]) -> int:
    """``grpokit sft``: :func:`sft_job`, then :func:`grpokit.trainer.sft.main_sft`; one line per error."""
    from grpokit.trainer.sft import main_sft

    try:
        job = sft_job(argv)
        record = main_sft(job.recipe, model=job.model, out=job.out, heldout_of=job.heldout_of)
    except USER_ERRORS as e:
        if _show_traceback():
            raise
        print(f"grpokit sft: error: {_one_line(e)}", file=sys.stderr)
        return 1
    print(
        f"-> {job.out} ({record['rows']} rows, {record['steps']} steps, {record['seconds']:.0f} s, "
        f"mean loss {record['train_loss']:.4f})"
    )
    return 0
