"""grpokit as a Python library: a run from a recipe plus Python objects (:class:`Trainer`).

    import grpokit

    def exact(completions, answer, **kw):          # TRL's form, or (prompts, completions, **columns)
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    trainer = grpokit.Trainer("arith", rows=[{"prompt": "2+3=", "answer": "5"}, ...],
                              rewards=[exact], overrides={"train.max_steps": 2})
    out = trainer.train()            # a TrainResult: TRL's global_step, training_loss, metrics, and
    out["last_metrics"]              #   the summary `grpokit train` prints, read as a mapping
    trainer.save_model("my-model")   # the trained policy, for transformers (LoRA: the adapter, for peft)
    result = trainer.evaluate()      # the held-out numbers `grpokit eval --heldout-of` prints

The recipe is a packaged name (``arith``), a YAML path, a dict of sections (values may be the
Python objects below), a :class:`grpokit.Recipe`, or None (the packaged demo recipe, as ``grpokit
train`` with no recipe: then ``rows=`` starts the data section, and ``rewards=`` the rewards section,
from the defaults). ``overrides`` are ``"section.key=value"`` strings or a ``{"section.key": value}``
mapping, applied last.

Python objects take the place of the recipe's names (:mod:`grpokit.utils.given` keeps them for
this process under ``obj:NAME``, the name the recipe and the run folder hold):

- ``rows=`` / ``eval_rows=``: the training / held-out rows: a list of dicts, a ``datasets.Dataset``,
  a pandas ``DataFrame`` or any iterable of mappings, each with a prompt and an answer column
  (``data.prompt_field`` / ``data.answer_field`` name others) -> ``data.dataset`` / ``eval.dataset``;
- ``rewards=``: reward functions (plain functions, ``functools.partial``, bound methods, objects
  with ``__call__``, ``async`` ones; names of built-ins or ``module:function`` mixed in) ->
  ``rewards.functions``, ``reward_weights=`` -> ``rewards.weights``;
- ``process_reward=``: a step scorer -> ``algo.process_reward`` (and ``algo.supervision=process``);
- ``env=``: an environment class or instance (:class:`grpokit.envs.Environment`) -> ``rollout.env``;
  ``tools=``: tool functions ``str -> str`` (or built-in tool names) -> the ``tools`` environment.

A function that can be imported back by its module and name (defined in a module, not in a
notebook or inside another function) is recorded as ``module:function`` instead, so the run folder
resumes from the command line too.

Reward and tool functions run where ``rewards.isolation`` says. ``process`` (the default) calls them
in a worker process forked from this one: lambdas and closures work (nothing is pickled), but what a
call changes (a counter, a list it appends to) changes the worker's copy, not this process's; use
``rewards.isolation=thread`` for a function that must share this process's memory.

Callbacks (``callbacks=``): :mod:`grpokit.trainer.callbacks`. The command line (``grpokit train``)
runs through :func:`train_recipe`, so both give the same metrics for the same recipe and seed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.api.recipe import Objects, make_recipe
from grpokit.config import Recipe
from grpokit.trainer.callbacks import Callback, CallbackError, Callbacks
from grpokit.trainer.summary import RunSummary, StopReason

if TYPE_CHECKING:
    import torch

    from grpokit.eval.evaluate import EvalResult

__all__ = [
    "Callback",
    "CallbackError",
    "RunSummary",
    "StopReason",
    "TrainResult",
    "Trainer",
    "make_recipe",
    "train_recipe",
]


def train_recipe(
    recipe: Recipe,
    *,
    progress: bool = True,
    callbacks: Iterable[Any] = (),
    again: str = "run the same command",
    built: Callable[[Any], None] | None = None,
    step_lines: bool = False,
) -> RunSummary:
    """Run GRPO as ``recipe`` says (:func:`grpokit.trainer.loop.train`) with ``callbacks``; returns the
    run's summary (:class:`~grpokit.trainer.summary.RunSummary`, read as a mapping too). What
    ``grpokit train`` and :meth:`Trainer.train` call; ``again``: how a stopped run's last line says
    to continue it; ``built``: called with the run's parts once they exist;
    ``step_lines``: one line per step on stdout (``grpokit train --no-progress``).

    Raises:
        what :func:`grpokit.trainer.loop.train` raises; :class:`CallbackError` when a callback raised.
    """
    from grpokit.trainer.loop import train

    summary = train(
        recipe, progress=progress, callbacks=Callbacks(callbacks), again=again, built=built, step_lines=step_lines
    )
    # a stand-in train() (tests) may give the plain dict a summary was: read it as one
    return summary if isinstance(summary, RunSummary) else RunSummary.from_dict(summary)


@dataclasses.dataclass(frozen=True, eq=False)
class TrainResult(Mapping[str, Any]):
    """What :meth:`Trainer.train` returns: the fields of TRL's ``TrainOutput``, and the run's summary
    read as a mapping (``result["last_metrics"]``, ``"checkpoint" in result``, ``dict(result)``; its
    keys: :meth:`Trainer.train`), so code written for the summary dict keeps working.

    Attributes:
        global_step: the run's steps done (what ``train.max_steps`` counts: the ``step`` of the last
            ``metrics.jsonl`` line and of ``checkpoint-<step>``); each step is ``train.num_iterations``
            optimizer steps (one at the default μ = 1).
        training_loss: the mean ``loss`` of the steps this call ran (a resumed run: its new steps;
            a step whose loss was not finite is left out); NaN when it ran none.
        metrics: the last step's metrics (its ``metrics.jsonl`` line) with ``train_runtime`` (seconds
            this call took) and ``train_loss`` (= ``training_loss``), as TRL's.
        summary: the run's summary (:class:`~grpokit.trainer.summary.RunSummary`; ``summary.json``
            holds its ``to_dict()``).
    """

    global_step: int
    training_loss: float
    metrics: dict[str, Any]
    summary: RunSummary

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.summary)

    def __len__(self) -> int:
        return len(self.summary)


class _StepRecorder(Callback):
    """The steps a :meth:`Trainer.train` call runs: the last step seen and each step's ``loss``."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.losses: list[float] = []

    def on_train_begin(self, step: int, recipe: Any) -> None:
        self.step = step

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.step = step
        loss = metrics.get("loss")
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            self.losses.append(float(loss))

    def result(self, summary: RunSummary, seconds: float) -> TrainResult:
        """The :class:`TrainResult` of ``summary`` (a run that trained nothing: its ``step``)."""
        loss = sum(self.losses) / len(self.losses) if self.losses else math.nan
        step = self.step if self.step is not None else int(summary.step or 0)
        metrics = {**(summary.last_metrics or {}), "train_runtime": seconds, "train_loss": loss}
        return TrainResult(global_step=step, training_loss=loss, metrics=metrics, summary=summary)


class Trainer:
    """A GRPO run from a recipe and Python objects (the module docstring); :meth:`train` runs it.

    Args:
        recipe: a packaged recipe's name, a YAML path, a dict of sections, a :class:`grpokit.Recipe`,
            or None (the packaged demo recipe).
        model: a Hugging Face model folder or hub name (``model.name_or_path``).
        rows, eval_rows, rewards, reward_weights, process_reward, env, tools: Python objects in the
            recipe's keys (the module docstring).
        callbacks: hooks called during training (:class:`grpokit.Callback` objects or functions
            ``(step, metrics)``; :mod:`grpokit.trainer.callbacks`).
        overrides: ``"section.key=value"`` strings or ``{"section.key": value}``, applied last.
        progress: show the progress bar.
        peft_config: as TRL's: a ``peft.LoraConfig`` (or a mapping of its fields) becomes ``model.lora``
            (:func:`lora_from_peft`).

    Raises (when built, before any model loads):
        RecipeError: an unknown key or a value out of range (names the key).
        TypeError: rows that are not mappings, an object that is not callable where a function belongs,
            a callback with no hook; an argument of TRL's ``GRPOTrainer`` (``reward_funcs=``,
            ``train_dataset=``, ``args=``, ...): the message gives grpokit's for each.
        ValueError: a ``peft_config`` setting grpokit's LoRA does not have (names the field).
    """

    def __init__(
        self,
        recipe: Any = None,
        *,
        model: str | Path | None = None,
        rows: Any = None,
        eval_rows: Any = None,
        rewards: Sequence[Any] | None = None,
        reward_weights: Sequence[float] | None = None,
        process_reward: Any = None,
        env: Any = None,
        tools: Sequence[Any] | None = None,
        callbacks: Iterable[Any] = (),
        overrides: Mapping[str, Any] | Sequence[str] = (),
        progress: bool = True,
        peft_config: Any = None,
        **trl_arguments: Any,
    ):
        if trl_arguments:
            raise TypeError(_trl_arguments_answer(trl_arguments))
        if peft_config is not None:
            overrides = _with_lora(overrides, lora_from_peft(peft_config))
        self._objects = Objects()
        self.recipe: Recipe = make_recipe(
            recipe,
            model=model,
            rows=rows,
            eval_rows=eval_rows,
            rewards=rewards,
            reward_weights=reward_weights,
            process_reward=process_reward,
            env=env,
            tools=tools,
            overrides=overrides,
            _objects=self._objects,
        )
        self.callbacks = list(callbacks)
        Callbacks(self.callbacks)  # a callback with no hook is refused now, not mid-run
        self.progress = progress
        self.summary: RunSummary | None = None
        self._built: tuple[torch.nn.Module, Any] | None = None  # the run's policy and tokenizer, once built

    @property
    def output_dir(self) -> Path:
        """The run folder (``train.output_dir``)."""
        return Path(self.recipe.train.output_dir)

    @property
    def model(self) -> torch.nn.Module:
        """The policy (an ``nn.Module``; with LoRA the peft model), from when :meth:`train` has built
        the run (callbacks see it) on: after training, the trained model.

        Raises:
            AttributeError: :meth:`train` has not built it yet (the message says what to call).
        """
        return self._parts("model")[0]

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer, as :attr:`model` (TRL's name: :attr:`processing_class`).

        Raises:
            AttributeError: :meth:`train` has not loaded it yet.
        """
        return self._parts("tokenizer")[1]

    @property
    def processing_class(self) -> Any:
        """TRL's name of :attr:`tokenizer`."""
        return self._parts("processing_class")[1]

    def save_model(self, path: str | Path) -> Path:
        """Write :attr:`model` and its tokenizer to the folder ``path``, as TRL's ``save_model``: a
        full model that ``transformers.AutoModelForCausalLM.from_pretrained(path)`` loads, or with
        LoRA the adapter (``peft.PeftModel.from_pretrained(base, path)``). Written atomically as a
        checkpoint is (:func:`grpokit.trainer.checkpoint.save_model`: a model folder already there is
        replaced); returns the folder.

        Raises:
            AttributeError: before :meth:`train` built the model.
            FileExistsError: ``path`` is a file, or a folder with files that is not a model folder
                (the run folder is never replaced).
            ValueError: a weight is not finite (nothing written).
        """
        from grpokit.trainer.checkpoint import save_model

        model, tokenizer = self._parts("save_model")
        return save_model(path, model=model, tokenizer=tokenizer, base=self.recipe.model.name_or_path)

    def _parts(self, what: str) -> tuple[torch.nn.Module, Any]:
        """The run's policy and tokenizer; an AttributeError naming ``what`` when there are none."""
        if self._built is not None:
            return self._built
        summary = self.summary
        if summary is not None and summary.stop_reason is StopReason.NOTHING_TO_DO:
            raise AttributeError(
                f"Trainer.{what}: train() found {self.output_dir} already trained and loaded no model: its "
                f"trained model is {summary.checkpoint or self.output_dir}; "
                "trainer.train(resume_from_checkpoint=False) trains again"
            )
        raise AttributeError(f"Trainer.{what}: the policy is loaded when training starts: call trainer.train() first")

    def _keep(self, run: Any) -> None:
        self._built = (run.model, run.tokenizer)

    def train(self, resume_from_checkpoint: bool | str | Path | None = None) -> TrainResult:
        """Run the training; returns a :class:`TrainResult`: TRL's ``global_step``, ``training_loss``
        and ``metrics``, and the run's summary as a mapping: ``output_dir``, ``checkpoint`` (the trained
        model's folder), ``last_metrics`` (the last ``metrics.jsonl`` line), ``eval_before``/``eval_after``
        (held-out results, with an ``eval`` section), and ``early_stopped_at``/``stopped_by`` when a
        callback stopped it. :attr:`model` is the trained policy then (:meth:`save_model`).

        ``resume_from_checkpoint`` (TRL's argument): None follows ``train.resume`` (``auto``: a run
        folder that holds a checkpoint continues from its newest, and one already at
        ``train.max_steps`` trains nothing: it says so in a :class:`grpokit.RunWarning` and returns
        that run's summary with ``nothing_to_do``, naming the settings that differ from that run's, none
        of them used); True = resume from the newest checkpoint (a ``ValueError`` when there is
        none, as TRL raises); False = start over in
        ``train.output_dir`` (its earlier metrics replaced; checkpoints of the same steps written over);
        a path = that checkpoint.

        Raises:
            what ``grpokit train`` reports as errors (:mod:`grpokit.cli.main`): ``ValueError`` for bad
            data or rewards, ``OSError`` for files, ``ImportError`` for a missing extra,
            ``RuntimeError`` for a fault of the run; :class:`CallbackError` when a callback raised
            (the run stopped with its checkpoint).
        """
        import dataclasses
        import warnings

        from grpokit.metrics import RunWarning, plain_warnings
        from grpokit.trainer.stopping import said_changes

        recipe = self.recipe
        if resume_from_checkpoint is True:  # TRL's: a checkpoint must be there to resume from
            from grpokit.trainer.checkpoint import list_checkpoints

            if not (self.output_dir.is_dir() and list_checkpoints(self.output_dir)):
                raise ValueError(
                    f"resume_from_checkpoint=True: {self.output_dir} holds no checkpoint to resume from "
                    "(train.output_dir); train() without it starts a run"
                )
        if resume_from_checkpoint is not None:
            value = (
                "auto"
                if resume_from_checkpoint is True
                else "none"
                if resume_from_checkpoint is False
                else str(resume_from_checkpoint)
            )
            recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, resume=value))
        self._objects.give_all()
        recorder, t0 = _StepRecorder(), time.perf_counter()
        with plain_warnings():  # a RunWarning: one "[grpokit] warning: ..." line, not a source location
            self.summary = summary = train_recipe(
                recipe,
                progress=self.progress,
                callbacks=[*self.callbacks, recorder],
                again="call train() again",
                built=self._keep,
            )
            if summary.stop_reason is StopReason.NOTHING_TO_DO:
                changed = summary.recipe_changes or []
                unused = f" Your settings that differ from that run's were not used: {said_changes(changed, 6)}."
                unused = unused if changed else ""
                warnings.warn(
                    f"{self.output_dir} already holds a run at step {summary.step} (train.max_steps="
                    f"{recipe.train.max_steps}): nothing was trained; this is that run's summary.{unused} To train "
                    "again: trainer.train(resume_from_checkpoint=False) starts over in that folder, or give another "
                    "train.output_dir; a larger train.max_steps continues it",
                    RunWarning,
                    stacklevel=2,
                )
        return recorder.result(summary, time.perf_counter() - t0)

    def evaluate(self, model: str | Path | None = None, *, when: str = "api") -> EvalResult:
        """Held-out evaluation of ``model`` (None: the newest checkpoint of ``train.output_dir``, else
        ``model.name_or_path``) on the recipe's held-out rows, as ``grpokit eval MODEL --heldout-of
        RECIPE`` does: greedy accuracy with its interval, and ``eval.num_samples`` samples' metrics.
        Writes ``<output_dir>/eval_<when>.json`` and returns what it holds, with ``model``: an
        :class:`~grpokit.eval.evaluate.EvalResult` (read as a mapping too; ``to_dict()``: a dict).

        Raises:
            ValueError: no ``eval`` section (``eval.dataset`` or ``eval_rows=``); what
                :class:`grpokit.eval.evaluate.HeldOutEval` raises.
            OSError: a model that cannot be found.
        """
        from grpokit.api.evaluate import evaluate_heldout
        from grpokit.metrics import plain_warnings

        self._objects.give_all()
        with plain_warnings():  # a RunWarning: one "[grpokit] warning: ..." line, as in train()
            return evaluate_heldout(self.recipe, model, when=when)


#: TRL GRPOTrainer's arguments -> grpokit.Trainer's
_TRL_ARGUMENTS = {
    "reward_funcs": "rewards=[...]",
    "train_dataset": "rows=",
    "eval_dataset": "eval_rows=",
    "args": "overrides={...} (GRPOConfig's fields under grpokit's names: docs/from_trl.md; TRL names such as "
    "num_generations are answered with grpokit's key)",
    "processing_class": "nothing (the tokenizer is model='s)",
    "reward_processing_classes": "nothing (a reward model's tokenizer is its own: rewards=['rm:FOLDER'])",
}

#: ``peft.LoraConfig`` fields and the ``model.lora`` keys they become
_PEFT_LORA_KEYS = {"r": "r", "lora_alpha": "alpha", "target_modules": "target_modules", "lora_dropout": "dropout"}
#: ``peft.LoraConfig`` fields that say nothing about the adapters grpokit builds
_PEFT_IGNORED = {
    "task_type",
    "peft_type",
    "auto_mapping",
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
}


def lora_from_peft(config: Any) -> dict[str, Any]:
    """``model.lora`` from TRL's ``peft_config=``: a ``peft.LoraConfig`` or a mapping of its fields.
    ``r``, ``lora_alpha``, ``target_modules`` (a list, a set, one name, or ``"all-linear"``) and
    ``lora_dropout`` map to ``r``, ``alpha``, ``target_modules``, ``dropout``; ``task_type`` and the
    bookkeeping fields are ignored. A ``LoraConfig`` left at its own defaults gets peft's (``r`` 8,
    ``alpha`` 8), as TRL would build it; its ``target_modules=None`` (peft's per-architecture choice)
    becomes grpokit's ``all-linear``.

    Raises:
        ValueError: any other field set away from peft's default (``use_dora``, ``bias``,
            ``modules_to_save``, ...: grpokit's LoRA has none of them), or an unknown key in a mapping;
            the message names the field.
    """
    if isinstance(config, Mapping):
        given = dict(config)
        defaults: dict[str, Any] = {}
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        given = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        fresh = type(config)()  # peft's defaults
        defaults = {f.name: getattr(fresh, f.name) for f in dataclasses.fields(config)}
    else:
        raise TypeError(
            f"peft_config: expected a peft.LoraConfig or a mapping of its fields, got {type(config).__name__}"
        )
    for name, value in given.items():
        if name in _PEFT_LORA_KEYS or name in _PEFT_IGNORED:
            continue
        if name not in defaults or value != defaults[name]:
            raise ValueError(
                f"peft_config.{name}={value!r}: grpokit's LoRA (model.lora) takes r, lora_alpha, target_modules "
                "and lora_dropout only; leave the others at peft's defaults"
            )
    lora = {ours: given[theirs] for theirs, ours in _PEFT_LORA_KEYS.items() if given.get(theirs) is not None}
    tm = lora.get("target_modules")
    if isinstance(tm, str) and tm != "all-linear":
        lora["target_modules"] = [tm]
    elif isinstance(tm, (set, frozenset, tuple)):
        lora["target_modules"] = sorted(tm)
    return lora


def _with_lora(overrides: Mapping[str, Any] | Sequence[str], lora: dict[str, Any]) -> Mapping[str, Any] | list[str]:
    """``overrides`` with ``model.lora`` set to ``lora`` (peft_config=)."""
    if isinstance(overrides, Mapping):
        return {**overrides, "model.lora": lora}
    return [*overrides, "model.lora=" + json.dumps(lora)]


def _trl_arguments_answer(given: Mapping[str, Any]) -> str:
    """The TypeError message for keyword arguments grpokit.Trainer does not take: grpokit's form of
    each TRL one, Python's words for the others."""
    said = [f"{k}= is TRL's; grpokit: {_TRL_ARGUMENTS[k]}" for k in given if k in _TRL_ARGUMENTS]
    other = [k for k in given if k not in _TRL_ARGUMENTS]
    if other:
        said.append("unexpected keyword argument(s) " + ", ".join(repr(k) for k in other))
    return "grpokit.Trainer: " + "; ".join(said)


def sft(recipe: Any, *, model: str | None = None, out: str | Path | None = None, **objects: Any) -> dict[str, Any]:
    """The supervised warm-up of ``recipe``'s ``sft`` section, as ``grpokit sft RECIPE`` runs it:
    ``model`` (default ``sft.model``) trained on ``sft.dataset``'s rows and written to ``out`` (default
    ``model.name_or_path``, the model GRPO then starts from); with an ``eval`` section its held-out
    questions are left out. ``objects``: as :func:`make_recipe` (``overrides=`` included). Returns
    the record ``grpokit sft`` prints.

    Raises:
        RecipeError: ``sft.model`` not set and no ``model``; the warm-up would be written over its start.
        ValueError: ``sft.dataset``/``sft.completion_template`` not set; bad data.
        OSError: ``out`` not empty or not writable.
    """
    from grpokit.config import RecipeError
    from grpokit.trainer.sft import main_sft

    r = make_recipe(recipe, **objects)
    start, target = model or r.sft.model, out if out is not None else r.model.name_or_path
    if start is None:
        raise RecipeError("sft.model: not set; the model to fine-tune (or give model=)")
    if Path(start).expanduser().resolve() == Path(target).expanduser().resolve():
        raise RecipeError(f"sft.model and the output are both {start}: the warm-up would be written over its start")
    label = str(recipe) if isinstance(recipe, (str, Path)) else "the recipe"
    return main_sft(r, model=start, out=target, heldout_of=label if r.eval.dataset else None)


def prm_label(recipe: Any, **objects: Any) -> dict[str, Any]:
    """``grpokit prm label RECIPE``: the policy's step labels (:func:`grpokit.trainer.prm.main_prm_label`)."""
    from grpokit.trainer.prm import main_prm_label

    return main_prm_label(make_recipe(recipe, **objects))


def prm_train(recipe: Any, **objects: Any) -> dict[str, Any]:
    """``grpokit prm train RECIPE``: a PRM trained on those labels (:func:`grpokit.trainer.prm.main_prm_train`)."""
    from grpokit.trainer.prm import main_prm_train

    return main_prm_train(make_recipe(recipe, **objects))


__all__ += ["sft", "prm_label", "prm_train"]
