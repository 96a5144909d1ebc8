"""``grpokit train [RECIPE.yaml] [section.key=value ...]`` and ``grpokit eval MODEL --dataset NAME``.

Exit status of ``grpokit train``: 0 when the run ends, including a run stopped by SIGTERM/SIGINT
(it finishes the step and writes a checkpoint first; ``train.resume=auto`` continues it); 1 for an
error of the run (bad data, reward function failure, non-finite updates, missing model);
2 for a recipe error (unknown key, wrong type, value out of range).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

DEFAULT_RECIPE = Path(__file__).resolve().parent / "recipes" / "demo.yaml"


def _train(argv: list[str]) -> int:
    from grpokit.config import RecipeError, help_text, load_recipe

    p = argparse.ArgumentParser(
        prog="grpokit train", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fine-tune a causal LM with GRPO. With no recipe: the default demo.",
        epilog="recipe keys (override any with section.key=value):\n" + help_text(),
    )
    p.add_argument("args", nargs="*", metavar="RECIPE.yaml | section.key=value")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    ns = p.parse_args(argv)
    recipe_path = None
    overrides = []
    for a in ns.args:
        if "=" in a:
            overrides.append(a)
        elif recipe_path is None:
            recipe_path = a
        else:
            p.error(f"two recipe files given: {recipe_path} and {a}")
    if recipe_path is None:
        recipe_path = DEFAULT_RECIPE
    try:
        recipe = load_recipe(recipe_path, overrides)
    except RecipeError as e:
        print(f"grpokit train: recipe error: {e}", file=sys.stderr)
        return 2
    from grpokit.trainer import train

    try:
        summary = train(recipe, progress=not ns.no_progress)
    except (ValueError, RuntimeError, FileNotFoundError, ImportError) as e:
        print(f"grpokit train: error: {e}", file=sys.stderr)
        return 1
    print(_report(summary))
    return 0


def _report(summary: dict) -> str:
    lines = [f"output: {summary['output_dir']}"]
    for when in ("before", "after"):
        e = summary.get(f"eval_{when}")
        if e:
            lines.append(f"eval {when}: {e['dataset']}/{e['split']} accuracy {e['accuracy']:.3f} "
                         f"({e['correct']}/{e['total']})")
    last = summary.get("last_metrics") or {}
    if last:
        lines.append(f"last step {last['step']}: reward_mean {last['reward_mean']}, "
                     f"step_s {last['step_s']:.1f}")
    return "\n".join(lines)


def _eval(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpokit eval", description="Greedy accuracy on a math dataset.")
    p.add_argument("model", help="model path, hub name or alias (smollm2-135m-instruct)")
    p.add_argument("--dataset", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--prompt-template", default=None, help="default: the demo recipe's")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--output", default=None, help="JSON file (default: eval_<dataset>_<split>.json)")
    ns = p.parse_args(argv)
    from grpokit.config import load_recipe
    from grpokit.evaluate import evaluate
    from grpokit.models import eos_token_ids, load_model, load_tokenizer
    from grpokit.setup import load_prompts

    recipe = load_recipe(DEFAULT_RECIPE)
    if ns.prompt_template is not None:
        recipe.data.prompt_template = ns.prompt_template
    if ns.system_prompt is not None:
        recipe.data.system_prompt = ns.system_prompt
    tok = load_tokenizer(ns.model)
    try:
        rows, prompts, _ = load_prompts(recipe, tok, dataset=ns.dataset, split=ns.split, limit=ns.limit)
    except ValueError as e:
        print(f"grpokit eval: error: {e}", file=sys.stderr)
        return 2
    model = load_model(ns.model).eval()
    res = evaluate(model, tok, prompts, rows, eos_token_ids=eos_token_ids(model, tok),
                   max_new_tokens=ns.max_new_tokens, batch_size=ns.batch_size)
    res.update(model=ns.model, dataset=ns.dataset, split=ns.split)
    out = Path(ns.output or f"eval_{ns.dataset}_{ns.split}.json")
    out.write_text(json.dumps(res, indent=1))
    print(f"{ns.dataset}/{ns.split}: accuracy {res['accuracy']:.3f} ({res['correct']}/{res['total']}, "
          f"greedy, {res['seconds']:.0f} s) -> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: grpokit {train,eval} ...\n  train [RECIPE.yaml] [key=value ...]  run GRPO "
              "(default: the demo)\n  eval MODEL --dataset NAME [--split test --limit N]")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return _train(rest)
    if cmd == "eval":
        return _eval(rest)
    print(f"grpokit: unknown command {cmd!r}; use train or eval", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
