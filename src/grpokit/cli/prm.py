"""``grpokit prm``: a process reward model trained from the policy's own rollouts (Math-Shepherd),
configured by a recipe's ``prm`` section (:class:`grpokit.config.PrmConfig`: defaults, help and checks).

- ``grpokit prm label RECIPE [section.key=value ...]``: sample ``prm.samples_per_problem`` solutions of
  the recipe's model to its training problems, cut them into steps (``algo.step_rule``), roll out
  ``prm.rollouts_per_step`` continuations from each step and label it by whether one reaches the
  answer (``prm.judge``); records appended to ``prm.labels`` (run it again to resume).
- ``grpokit prm train RECIPE [section.key=value ...]``: train ``prm.model`` (default the recipe's model)
  on those labels and write the PRM to ``prm.output_dir``, with its step accuracy, AUC and
  first-wrong-step F1 on held-out problems before and after; ``algo.process_reward: prm:FOLDER``
  then scores steps with it.

Called by :func:`grpokit.cli.main.main`; exit 1 for any error of the input or the run (argparse's
usage errors: 2).
"""

from __future__ import annotations

import argparse
import sys

from grpokit.cli.errors import USER_ERRORS
from grpokit.cli.errors import one_line as _one_line
from grpokit.cli.errors import show_traceback as _show_traceback
from grpokit.cli.recipe_args import command_recipe, find_recipe, split_overrides

ACTIONS = ("label", "train")


def _parser() -> argparse.ArgumentParser:
    from grpokit.config import help_text

    p = argparse.ArgumentParser(
        prog="grpokit prm",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A process reward model from the policy's own rollouts (Math-Shepherd).\n"
        "  grpokit prm label RECIPE [key=value ...]: step labels of the recipe's model on its training "
        "problems -> prm.labels (resumes)\n"
        "  grpokit prm train RECIPE [key=value ...]: a PRM trained on prm.labels -> prm.output_dir; "
        "then algo.process_reward=prm:FOLDER",
        epilog="recipe keys of grpokit prm (a recipe's prm: section; override any with prm.key=value):\n"
        + help_text(sections=("prm",)),
    )
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("words", nargs="+", metavar="RECIPE | section.key=value")
    return p


def _summary(action: str, record: dict, out: str | None) -> str:
    if action == "label":
        frac = "" if record["good_frac"] is None else f", {record['good_frac']:.2f} of steps good"
        return (
            f"-> {record['labels']} ({record['labelled']} problems labelled, {record['skipped']} done before; "
            f"{record['records']} solutions, {record['steps']} steps{frac}; {record['tokens']} tokens generated, "
            f"{record['seconds']:.0f} s)"
        )
    parts = []
    for when in ("before", "after"):
        e = record.get(f"eval_{when}")
        if e and e.get("auc") is not None:
            parts.append(f"held-out AUC {when} {e['auc']:.3f}")
    held = f"; {', '.join(parts)}" if parts else ""
    return f"-> {out} ({record['rows']} solutions, {record['steps']} steps, {record['seconds']:.0f} s{held})"


def prm_command(argv: list[str]) -> int:
    """``grpokit prm label|train RECIPE [key=value ...]``; one line per error."""
    from grpokit.trainer.prm import main_prm_label, main_prm_train

    ns = _parser().parse_intermixed_args(argv)
    try:
        positional, overrides = split_overrides(ns.words)
        if len(positional) != 1:
            raise ValueError(f"expected one RECIPE, got {len(positional)} ({' '.join(positional) or 'none'})")
        recipe = command_recipe(find_recipe(positional[0]), overrides, {})
        record = (main_prm_label if ns.action == "label" else main_prm_train)(recipe)
    except USER_ERRORS as e:
        if _show_traceback():
            raise
        print(f"grpokit prm {ns.action}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    print(_summary(ns.action, record, recipe.prm.output_dir))
    return 0
