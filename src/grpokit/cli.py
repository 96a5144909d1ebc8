"""``grpokit train [RECIPE.yaml] [section.key=value ...]``, ``grpokit eval MODEL --dataset NAME`` and
``grpokit export CHECKPOINT OUT [--merge]`` and ``grpokit sft MODEL OUT --dataset NAME
--completion-template T`` (a supervised warm-up, :mod:`grpokit.sft`).

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
    ns = p.parse_intermixed_args(argv)  # overrides may come after --no-progress
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
    import warnings

    from grpokit.importing import MissingExtraWarning
    from grpokit.metrics import RunWarning
    from grpokit.trainer import train

    show = warnings.showwarning

    def say(message, category, *a, **k):  # a RunWarning is one plain line, not a source location
        if issubclass(category, (RunWarning, MissingExtraWarning)):
            print(f"[grpokit] warning: {message}", file=sys.stderr, flush=True)
        else:
            show(message, category, *a, **k)

    warnings.showwarning = say
    try:
        summary = train(recipe, progress=not ns.no_progress)
    except (ValueError, RuntimeError, FileNotFoundError, ImportError) as e:
        rank = f" (rank {os.environ.get('RANK')})" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
        print(f"grpokit train{rank}: error: {e}", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = show
    if summary.get("rank", 0) == 0:  # data parallel: rank 0 reports
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


def _eval_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="grpokit eval", description="Held-out accuracy: greedy, and mean@k / pass@k / maj@k over k samples, "
        "each with a 95 % interval; --against compares two models on the same problems (exact McNemar test).")
    p.add_argument("model", help="model path, hub name or alias (smollm2-135m-instruct), or a run's output folder "
                   "(its newest complete checkpoint)")
    p.add_argument("--against", default=None, metavar="MODEL", help="a second model (e.g. a checkpoint or a run's "
                   "output folder) scored on "
                   "the same problems; prints the paired difference with its interval and the McNemar p-value")
    p.add_argument("--dataset", default=None, help="required unless --heldout-of names a recipe")
    p.add_argument("--heldout-of", default=None, metavar="RECIPE.yaml", help="the held-out problems of this "
                   "recipe's run, exactly as its evaluations use them (eval section, its prompt template and "
                   "scorer; training questions left out); replaces --dataset/--split/--limit/--skip/--shuffle-seed")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--skip", type=int, default=0, help="start at row N of the split (as data.skip does); the "
                   "packaged recipes hold out rows 0-99 and train from row 100, so evaluate them with --limit 100")
    p.add_argument("--data-options", default=None, help="dataset options as YAML, e.g. reasoning_gym's "
                   "'{size: 500, max_digits: 2}'")
    p.add_argument("--data-seed", type=int, default=10**9, help="seed of generated data (reasoning_gym); the "
                   "default is the held-out seed of a run with train.seed=0 (train.seed + 10^9): never its training set")
    p.add_argument("--shuffle-seed", type=int, default=None, help="shuffle the rows with this seed before --skip "
                   "and --limit, as a recipe's data.shuffle_seed does (the held-out rows of a run with "
                   "data.shuffle_seed=S are --shuffle-seed S --limit <eval.limit>)")
    p.add_argument("--scorer", default=None, help="reward function deciding correctness (default: reasoning_gym "
                   "for reasoning_gym: data, else math_correct)")
    p.add_argument("--samples", type=int, default=None, metavar="K", help="also sample K completions per problem")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for --samples")
    p.add_argument("--seed", type=int, default=0, help="sampling seed for --samples")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 256, or the --heldout-of recipe's")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (as model.device)")
    p.add_argument("--prompt-template", default=None, help="default: the demo recipe's")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--output", default=None, help="JSON file (default: eval_<dataset>_<split>.json)")
    return p.parse_args(argv)


def _heldout_of(ns: argparse.Namespace):
    """The held-out rows of the recipe ``ns.heldout_of`` (:class:`grpokit.evaluator.HeldOutEval`);
    sets ``ns.dataset``/``ns.split``/``ns.skip``/``ns.limit`` to what they came from."""
    from grpokit.config import load_recipe
    from grpokit.evaluator import HeldOutEval
    from grpokit.rows import section_rows

    recipe = load_recipe(ns.heldout_of)
    held = HeldOutEval(recipe, section_rows(recipe, "data"))
    ns.dataset, ns.split, ns.skip, ns.limit = recipe.eval.dataset, recipe.eval.split, 0, len(held.rows)
    print(f"[grpokit] eval: {held.note}", flush=True)
    return held


def _newest_checkpoint_of_run(model: str) -> str:
    """``model`` unchanged, unless it is a run's output folder (a folder without ``config.json`` that holds
    ``checkpoint-<step>`` folders): then its newest complete checkpoint (announced on stdout).

    Raises:
        ValueError: the folder holds checkpoint folders but none is complete (names the folder).
    """
    from grpokit.checkpoint import list_checkpoints

    path = Path(model).expanduser()
    if not path.is_dir() or (path / "config.json").exists() or not any(path.glob("checkpoint-*")):
        return model
    found = list_checkpoints(path)
    if not found:
        raise ValueError(f"model {model!r}: a run folder without a complete checkpoint (none of its checkpoint-<step> "
                         "folders has trainer_state.json); name a model or a checkpoint folder")
    print(f"[grpokit] {model}: the run's newest complete checkpoint, {found[-1]}", flush=True)
    return str(found[-1])


def _eval(argv: list[str]) -> int:
    ns = _eval_args(argv)
    from grpokit.config import RecipeError, _yaml_load, load_recipe
    from grpokit.evalstats import format_summary, paired_comparison
    from grpokit.evaluate import evaluate
    from grpokit.heldout import answer_extractor, check_scorer, default_scorer
    from grpokit.models import eos_token_ids, load_model, load_tokenizer, model_max_positions, resolve_model_path
    from grpokit.rewards import get_reward_function
    from grpokit.build import resolve_device
    from grpokit.rows import load_data_rows, load_prompts

    def fail(msg: str) -> int:
        print(f"grpokit eval: error: {msg}", file=sys.stderr)
        return 2

    # every check that needs no model comes first
    if ns.samples is not None and ns.samples < 1:
        return fail(f"--samples must be >= 1 (k completions per problem), got {ns.samples}")
    if ns.samples and ns.temperature <= 0:
        return fail(f"--temperature must be > 0 with --samples, got {ns.temperature}")
    if (ns.dataset is None) == (ns.heldout_of is None):
        return fail("give --dataset NAME or --heldout-of RECIPE.yaml (one of them)")
    try:
        held = _heldout_of(ns) if ns.heldout_of else None
    except (RecipeError, ValueError, FileNotFoundError, ImportError) as e:
        return fail(f"--heldout-of {ns.heldout_of}: {e}")
    ns.max_new_tokens = ns.max_new_tokens or (held.max_new_tokens if held else 256)
    scorer_name = ns.scorer or (held.scorer if held else default_scorer(ns.dataset))
    try:
        check_scorer(scorer_name, ns.dataset)
        scorer = get_reward_function(scorer_name)
        ns.model = _newest_checkpoint_of_run(ns.model)
        ns.against = ns.against and _newest_checkpoint_of_run(ns.against)
        models = [ns.model] + ([ns.against] if ns.against else [])
        for m in models:
            resolve_model_path(m)
        recipe = held.recipe if held else load_recipe(DEFAULT_RECIPE)
        options = dict(_yaml_load(ns.data_options) or {}) if ns.data_options else {}
        if ns.prompt_template is not None:
            recipe.data.prompt_template = ns.prompt_template
        if ns.system_prompt is not None:
            recipe.data.system_prompt = ns.system_prompt
        device = resolve_device(ns.device)
        tok = load_tokenizer(ns.model)
        limit = None if ns.limit is None else ns.skip + ns.limit
        rows = held.rows if held else load_data_rows(recipe, dataset=ns.dataset, split=ns.split, limit=limit,
                                                     seed=ns.data_seed, options=options,
                                                     shuffle_seed=ns.shuffle_seed)[ns.skip:]
        if not rows:
            return fail(f"no rows of {ns.dataset}/{ns.split} left after --skip {ns.skip}")
        rows, prompts, _ = load_prompts(recipe, tok, dataset=ns.dataset, split=ns.split, limit=None, rows=rows,
                                        max_new_tokens=ns.max_new_tokens, max_positions=model_max_positions(ns.model),
                                        new_tokens_key="--max-new-tokens")
    except (ValueError, FileNotFoundError, TypeError, ImportError) as e:  # unknown data/scorer, missing
        return fail(str(e))  # model, file or optional package (the message names its extra)
    results = {}
    from grpokit.backends import install_backend
    from grpokit.rollout.engine import load_engine

    for m in models:
        model = load_model(m, device=device).eval()
        install_backend(model, "auto", announce=False)  # the fast generation path where it is exact
        engine = load_engine("hf", model=model, tokenizer=tok, eos_token_ids=eos_token_ids(model, tok))
        results[m] = evaluate(engine, prompts, rows, max_new_tokens=ns.max_new_tokens, batch_size=ns.batch_size,
                              scorer=scorer, num_samples=ns.samples or 0, temperature=ns.temperature, seed=ns.seed,
                              extract_answer=answer_extractor(scorer_name))
        r = results[m]
        print(f"{m} on {ns.dataset}/{ns.split} ({r['total']} problems, scorer {scorer_name}, "
              f"{r['seconds']:.0f} s):\n{format_summary(r['metrics'])}", flush=True)
    out = {"dataset": ns.dataset, "split": ns.split, "skip": ns.skip, "scorer": scorer_name,
           "models": results}
    if ns.against:
        pc = paired_comparison(results[ns.model]["outcomes"], results[ns.against]["outcomes"])
        out["paired"] = pc
        print(_paired_line(ns.against, ns.model, "greedy", pc))
        if ns.samples:
            out["paired_sampled"] = _print_paired_sampled(results[ns.model], results[ns.against], ns.samples,
                                                          ns.against, ns.model)
    path = Path(ns.output or f"eval_{ns.dataset}_{ns.split}.json")
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"-> {path}")
    return 0


def _print_paired_sampled(a: dict, b: dict, k: int, name_b: str, name_a: str) -> dict:
    """The paired mean@k (sign test) and maj@k (McNemar) comparisons of two ``evaluate`` results
    with samples, printed; returns ``{"mean@k": ..., "maj@k": ...}`` for the output JSON."""
    from grpokit.evalstats import paired_comparison, paired_sampled_comparison

    ms = paired_sampled_comparison(a["sampled_correct"], b["sampled_correct"], k)
    mj = paired_comparison(a["maj_outcomes"], b["maj_outcomes"])
    print(f"paired ({name_b} - {name_a}), mean@{k}: {ms['diff']:+.3f} [{ms['diff_lo']:+.3f}, {ms['diff_hi']:+.3f}] "
          f"(95 %, {ms['interval']}); problems where the second is better {ms['b_better']}, the first "
          f"{ms['a_better']}; exact sign test p = {ms['p_value']:.3g}")
    print(_paired_line(name_b, name_a, f"maj@{k}", mj))
    return {f"mean@{k}": ms, f"maj@{k}": mj}


def _paired_line(name_b: str, name_a: str, metric: str, pc: dict) -> str:
    """One printed line of a :func:`grpokit.evalstats.paired_comparison` result ``pc`` for ``metric``."""
    return (f"paired ({name_b} - {name_a}), {metric}: {pc['diff']:+.3f} [{pc['diff_lo']:+.3f}, {pc['diff_hi']:+.3f}] "
            f"(95 %, {pc['interval']}); only the second right {pc['b_only']}, only the first {pc['a_only']}; "
            f"exact McNemar p = {pc['p_value']:.3g}")


def _export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="grpokit export", description="Write a checkpoint's model without its training state. A LoRA "
        "checkpoint (model.lora): --merge writes a full Hugging Face model (the base model with the adapter merged "
        "into a copy of its weights; AutoModelForCausalLM.from_pretrained(OUT) loads it); without --merge the "
        "adapter (adapter_model.safetensors, adapter_config.json) and the tokenizer are copied. A full checkpoint: "
        "its model and tokenizer files are copied.")
    p.add_argument("checkpoint", help="a checkpoint-<step> folder")
    p.add_argument("out", help="the folder to write (must not exist, or be empty)")
    p.add_argument("--merge", action="store_true", help="merge the LoRA adapter into the base model's weights")
    ns = p.parse_args(argv)
    from grpokit.lora import export_checkpoint
    from grpokit.models import load_model

    def load_base(name: str, dtype, trust_remote_code: bool):
        return load_model(name, dtype=dtype, device="cpu", trust_remote_code=trust_remote_code)

    try:
        print(export_checkpoint(ns.checkpoint, ns.out, merge=ns.merge, load_base=load_base))
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as e:
        print(f"grpokit export: error: {e}", file=sys.stderr)
        return 1
    return 0


def _sft(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="grpokit sft", description="Supervised warm-up before GRPO: fine-tune MODEL to write each row's "
        "--completion-template after its chat-templated prompt (the loss on completion tokens only; transformers' "
        "Trainer), and write it to OUT, a folder that a recipe's model.name_or_path can name.")
    p.add_argument("model", help="model path, hub name or alias (smollm2-135m-instruct)")
    p.add_argument("out", help="the folder to write (must not exist, or be empty)")
    p.add_argument("--dataset", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, default=None, help="the first N rows (after --shuffle-seed)")
    p.add_argument("--shuffle-seed", type=int, default=None, help="shuffle the rows with this seed first")
    p.add_argument("--completion-template", required=True, help="the text to learn, from the row's columns, e.g. "
                   "'{equation}' (asdiv) or '{solution}' (gsm8k); rows missing a field are left out")
    p.add_argument("--prompt-template", default=None, help="default: the --heldout-of recipe's, else the demo's")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--heldout-of", default=None, metavar="RECIPE.yaml", help="leave out every row whose question "
                   "is one of this recipe's held-out (eval) problems, compared without case and spaces")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (overrides --epochs when > 0)")
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (as model.device)")
    ns = p.parse_args(argv)
    from grpokit.sft import main_sft

    try:
        record = main_sft(ns, default_recipe=DEFAULT_RECIPE)
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as e:
        print(f"grpokit sft: error: {e}", file=sys.stderr)
        return 1
    print(f"-> {ns.out} ({record['rows']} rows, {record['steps']} steps, {record['seconds']:.0f} s, "
          f"mean loss {record['train_loss']:.4f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: grpokit {train,eval,export,sft} ...\n  train [RECIPE.yaml] [key=value ...]  run GRPO "
              "(default: the demo)\n  eval MODEL --dataset NAME [--split test --limit N]\n"
              "  export CHECKPOINT OUT [--merge]  the model of a checkpoint (LoRA: --merge = a full model)\n"
              "  sft MODEL OUT --dataset NAME --completion-template T  supervised warm-up before GRPO")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return _train(rest)
    if cmd == "eval":
        return _eval(rest)
    if cmd == "export":
        return _export(rest)
    if cmd == "sft":
        return _sft(rest)
    print(f"grpokit: unknown command {cmd!r}; use train, eval, export or sft", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
