"""``grpokit train [RECIPE] [section.key=value ...]``, ``grpokit eval MODEL --dataset NAME`` and
``grpokit export CHECKPOINT OUT [--merge]`` and ``grpokit sft RECIPE`` (a supervised warm-up,
:mod:`grpokit.cli.sft`). ``grpokit sft`` and ``grpokit eval`` read a recipe too (its ``sft`` and
``eval`` sections): their flags are overrides of its keys.

RECIPE is a YAML file, or the name of a packaged recipe (``arith``, ``arith.yaml`` or
``recipes/arith.yaml`` from any folder; a file of that name in the working folder comes first;
:func:`grpokit.cli.recipe_args.find_recipe`). With no recipe, ``grpokit train`` runs the packaged demo
recipe and says so in its first line; then an override of ``data.dataset`` starts the data section, and one of
``rewards.functions`` the rewards section, from the defaults (the demo's split, ``data.skip``,
prompt template and reward weights belong to its own data). ``grpokit train --help`` shows each
key's default and, where it differs, the demo's value.

Exit status of ``grpokit train``:

- 0: the run ended, or had nothing to do (its checkpoint is already at ``train.max_steps``; then
  nothing is loaded or written);
- 1: an error of the run or of its input (bad data, output folder, reward function, a fault of the
  run such as non-finite updates, a missing model);
- 2: a recipe error (unknown or duplicate key, wrong type, value out of range, a recipe that is not
  found, a key that cannot change on resume);
- 128 + the signal: 130 for SIGINT (Ctrl-C), 143 for SIGTERM. The run finishes the step under way,
  writes its checkpoint, prints ``stopped at step 3 of 5; run the same command to continue``
  (``train.resume=auto`` continues it) and skips the evaluation after training. Under torchrun a
  signal to any rank stops every rank after the same step, and each exits with that status. A
  second signal stops at once (the step under way is not saved), with the same status.

``grpokit eval`` exits 2 for bad arguments or input (refused before any model loads) and 1 for a
fault while evaluating; ``grpokit export`` and ``grpokit sft`` exit 1 for either.

No traceback reaches a user for a fault in their input. Each command turns these exception types
into one line, ``grpokit CMD: error: MESSAGE`` (:data:`USER_ERRORS`; the message names the recipe
key, file, row or argument, and ``grpokit train`` adds where the recipe values it names came from:
the user's recipe file and line, an override on the command line, the demo recipe, or the default):

- ``grpokit.config.RecipeError`` (a ``ValueError``): the recipe (``grpokit train``: ``recipe error``, exit 2);
- ``ValueError`` (``UnicodeDecodeError``, ``json.JSONDecodeError`` included): data, reward and
  checkpoint contents, values;
- ``OSError``: files and folders (``FileNotFoundError``, ``FileExistsError``, ``IsADirectoryError``,
  ``NotADirectoryError``, ``PermissionError``; every output location is checked before any model
  loads, :mod:`grpokit.utils.outputs`);
- ``ImportError``: a reward module that cannot be imported, or a missing optional package (the
  message names its extra);
- ``RuntimeError``: a fault during the run (reward failures, non-finite updates);
- ``TypeError``: user code of the wrong form (a reward function's or rollout engine's signature);
- ``yaml.YAMLError``: a YAML value given on the command line (``grpokit eval --data-options``);
- ``KeyboardInterrupt``: Ctrl-C outside training's step-boundary stop (loading, evaluating): one line,
  exit 130.

``GRPOKIT_TRACEBACK=1`` in the environment shows the traceback instead (to report a bug of grpokit).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from grpokit.cli.errors import USER_ERRORS
from grpokit.cli.errors import one_line as _one_line
from grpokit.cli.errors import show_traceback as _show_traceback
from grpokit.cli.recipe_args import RecipeArgs, packaged_recipes
from grpokit.trainer.summary import RunSummary, StopReason
from grpokit.utils.threads import apply_threads, prepare_environment


def _train(argv: list[str]) -> int:
    from grpokit.cli.recipe_args import demo_raw, flag_answer, source_note
    from grpokit.config import RecipeError, help_text
    from grpokit.config.trl_names import trl_help

    p = argparse.ArgumentParser(
        prog="grpokit train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fine-tune a causal LM with GRPO. RECIPE: a YAML file, or a packaged recipe by name "
        f"({', '.join(packaged_recipes())}) from any folder.\nWith no recipe the packaged demo recipe runs "
        "(said in the first line of output): the keys below take the demo's value shown in parentheses; "
        "an override of data.dataset\n(or rewards.functions) then starts the data (rewards) section from "
        "the defaults instead. Exit status: 0 done, 1 error, 2 recipe error, 130/143 stopped by SIGINT/SIGTERM.",
        epilog="recipe keys (override any with section.key=value): the default of a recipe file, and in "
        "parentheses the demo recipe's value\nwhere it differs (what runs with no recipe):\n"
        + help_text(demo_raw(), label="demo")
        + "\n\n"
        + trl_help(),
    )
    p.add_argument("args", nargs="*", metavar="RECIPE | section.key=value")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (grpokit's, nor transformers' loading and saving ones): one line per step instead",
    )
    said = flag_answer(argv, ("--no-progress", "--help"))  # --max_steps=2, --num_generations 8: the grpokit form
    if said:
        print(f"grpokit train: recipe error: {said}", file=sys.stderr)
        return 2
    ns = p.parse_intermixed_args(argv)  # overrides may come after --no-progress
    if ns.no_progress:
        quiet_library_bars()
    recipe_arg = None
    overrides = []
    for a in ns.args:
        if "=" in a:
            overrides.append(a)
        elif recipe_arg is None:
            recipe_arg = a
        else:
            p.error(f"two recipe files given: {recipe_arg} and {a}")
    sources: dict = {}
    try:
        args = RecipeArgs.of(recipe_arg, overrides)
        if args.announcement and os.environ.get("RANK", "0") == "0":
            print(f"[grpokit] {args.announcement}", flush=True)  # the first line of output
        sources = args.sources()
        recipe = args.load()
    except RecipeError as e:
        print(f"grpokit train: recipe error: {_one_line(e)}{source_note(str(e), sources)}", file=sys.stderr)
        return 2
    from grpokit.api import train_recipe
    from grpokit.metrics import plain_warnings

    rank = f" (rank {os.environ.get('RANK')})" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    try:
        with plain_warnings(own_output=True):  # a RunWarning is one plain line, not a source location
            summary = train_recipe(recipe, progress=not ns.no_progress, step_lines=ns.no_progress)
    except RecipeError as e:  # found only once the run's folder is read (a key a checkpoint holds changed)
        print(
            f"grpokit train{rank}: recipe error: {_one_line(e)}{source_note(str(e), sources, recipe)}", file=sys.stderr
        )
        return 2
    except USER_ERRORS as e:
        if _show_traceback():
            raise
        print(f"grpokit train{rank}: error: {_one_line(e)}{source_note(str(e), sources, recipe)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C while loading, or a second signal during a step
        if _show_traceback():
            raise
        signum = getattr(e, "signum", int(signal.SIGINT))
        print(
            f"grpokit train{rank}: interrupted ({signal.Signals(signum).name}); the step under way was not saved "
            "(train.resume=auto continues from the newest checkpoint, if any)",
            file=sys.stderr,
        )
        return 128 + signum
    reason = summary.stop_reason
    if reason is StopReason.NOTHING_TO_DO:
        return 0
    if summary.rank == 0:  # data parallel: rank 0 reports
        print(_report(summary))
    if reason is StopReason.SIGNAL:
        return 128 + int(summary.stop_signal or signal.SIGTERM)
    return 0


def _report(summary: RunSummary) -> str:
    """What ``grpokit train`` prints at the end of a run (rank 0): the run folder, the held-out
    accuracy before and after training, the last step's reward and seconds, the checkpoint."""
    from grpokit.data import dataset_label

    lines = [f"output: {summary.output_dir}"]
    for when, e in (("before", summary.eval_before), ("after", summary.eval_after)):
        if e:
            lines.append(
                f"eval {when}: {dataset_label(e['dataset'], e['split'])} accuracy {e['accuracy']:.3f} "
                f"({e['correct']}/{e['total']})"
            )
    last = summary.last_metrics or {}
    if last:
        lines.append(f"last step {last['step']}: reward_mean {last['reward_mean']}, step_s {last['step_s']:.1f}")
    if summary.checkpoint:
        lines.append(f"checkpoint: {summary.checkpoint}")
    return "\n".join(lines)


def _export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="grpokit export",
        description="Write a checkpoint's model without its training state. A LoRA "
        "checkpoint (model.lora): --merge writes a full Hugging Face model (the base model with the adapter merged "
        "into a copy of its weights; AutoModelForCausalLM.from_pretrained(OUT) loads it); without --merge the "
        "adapter (adapter_model.safetensors, adapter_config.json) and the tokenizer are copied. A full checkpoint: "
        "its model and tokenizer files are copied.",
    )
    p.add_argument("checkpoint", help="a checkpoint-<step> folder")
    p.add_argument("out", help="the folder to write (must not exist, or be empty)")
    p.add_argument("--merge", action="store_true", help="merge the LoRA adapter into the base model's weights")
    ns = p.parse_args(argv)
    from grpokit.models.loading import load_model
    from grpokit.models.lora import export_checkpoint
    from grpokit.trainer.model_card import merged_export_card
    from grpokit.utils.outputs import check_output_dir

    def load_base(name: str, dtype: Any, trust_remote_code: bool) -> Any:
        return load_model(name, dtype=dtype, device="cpu", trust_remote_code=trust_remote_code)

    try:
        check_output_dir(ns.out, "OUT")  # a file, below a file, not writable; export_checkpoint: not empty
        card = merged_export_card  # the merged model's card (a full model's)
        print(export_checkpoint(ns.checkpoint, ns.out, merge=ns.merge, load_base=load_base, merged_card=card))
    except USER_ERRORS as e:
        if _show_traceback():
            raise
        print(f"grpokit export: error: {_one_line(e)}", file=sys.stderr)
        return 1
    return 0


def _sft(argv: list[str]) -> int:
    from grpokit.cli.sft import sft_command

    return sft_command(argv)


def _prm(argv: list[str]) -> int:
    from grpokit.cli.prm import prm_command

    return prm_command(argv)


def _eval(argv: list[str]) -> int:
    from grpokit.cli.eval import eval_command

    return eval_command(argv)


def quiet_library_bars() -> None:
    """Turn off the progress bars of transformers ("Loading weights", "Writing model shards", GGUF
    conversion), huggingface_hub and datasets (``grpokit train --no-progress``): their environment
    switches for libraries not imported yet, their own functions for those already imported."""
    for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        os.environ[var] = "1"
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        import transformers.utils.logging

        transformers.utils.logging.disable_progress_bar()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: grpokit {train,eval,export,sft,prm} ...\n  train [RECIPE] [key=value ...]  run GRPO "
            f"(RECIPE: a file or a packaged name: {', '.join(packaged_recipes())}; none: the demo)\n"
            "  eval MODEL --dataset NAME | --heldout-of RECIPE [--limit N] [eval.key=value ...]\n"
            "  export CHECKPOINT OUT [--merge]  the model of a checkpoint (LoRA: --merge = a full model)\n"
            "  sft RECIPE | MODEL OUT --dataset NAME --completion-template T  supervised warm-up before GRPO\n"
            "  prm label|train RECIPE [key=value ...]  step labels of the policy, a PRM trained on them"
        )
        return 0
    cmd, rest = argv[0], argv[1:]
    commands = {"train": _train, "eval": _eval, "export": _export, "sft": _sft, "prm": _prm}
    if cmd not in commands:
        print(f"grpokit: unknown command {cmd!r}; use train, eval, export, sft or prm", file=sys.stderr)
        return 2
    try:
        if cmd != "export" and not ({"-h", "--help"} & set(rest)):
            try:  # before torch loads: the threads, and the wait policy on a busy machine
                prepare_environment()
            except ValueError as e:  # GRPOKIT_THREADS of the wrong form
                print(f"grpokit {cmd}: error: {e}", file=sys.stderr)
                return 2
            if cmd != "train":  # train sets them and says so before it loads (grpokit.trainer.loop)
                apply_threads()
        return commands[cmd](rest)
    except KeyboardInterrupt:  # Ctrl-C while loading or evaluating (training handles its own)
        if _show_traceback():
            raise
        print(f"grpokit {cmd}: interrupted", file=sys.stderr)
        return 128 + int(signal.SIGINT)
