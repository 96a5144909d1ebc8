"""The GRPO loop (DeepSeekMath Algorithm 1), read top to bottom: :func:`train` runs
:func:`run_step` until ``train.max_steps``, and :func:`run_step` is the numbered steps below over
the run's parts (:class:`grpokit.trainer.build.Run`); all math lives in ``grpokit.algo``.

Per step:
  1. take B prompts (a seeded permutation per epoch; the position is checkpointed);
  2. sample G completions per prompt from π_old = the current policy (``run.engine``, a
     :class:`~grpokit.rollout.engine.RolloutEngine`): an :class:`~grpokit.experience.Experience`;
  3. score them (``run.rewards``: outcome, one reward per completion; process, one per step);
     steps 1-3 are :mod:`grpokit.trainer.collect`, with DAPO's dynamic sampling;
  4. advantages (``run.algorithm``, the :mod:`grpokit.estimators.base` seam);
  5. π_ref log-probs when β > 0 (with LoRA: the policy with its adapters disabled,
     :func:`grpokit.models.logprobs.reference_logprobs`); π_old log-probs only when μ > 1 (else
     π_old = π_θ by value);
  6. μ = ``train.num_iterations`` passes, each one optimizer step over micro-batches whose losses
     are normalized by the whole batch's counts (so accumulation equals one big batch); then the
     engine is told the weights changed (steps 5-6: :func:`grpokit.trainer.update.optimize`);
  7. log metrics (with the phases' seconds: ``gen_s``, ``reward_s``, ``ref_s``, ``train_s``,
     ``step_s``), samples, held-out evaluations, checkpoints.

The run's constants are bound once on its parts: the recipe on ``run.recipe``, temperature,
micro-batch size and autocast on ``run.logprobs`` (:class:`~grpokit.models.logprobs.LogprobScorer`),
the ranks on ``run.ranks``.

Departures from the textbook: the model stays in ``eval()`` mode throughout (no dropout, so the
sampler and the trainer see the same π); the generation seed is ``seed·100003 + step`` (plus
``1000003·round`` for dynamic sampling's extra rounds) so a resumed run samples exactly what the
uninterrupted run sampled.

The default step on one page, torch and transformers only: ``examples/grpo_one_file.py``, which
``tests/examples/test_grpo_one_file.py`` holds equal to :func:`run_step` bit for bit.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from grpokit.config import Recipe
from grpokit.eval.evaluate import EvalResult, save_eval
from grpokit.experience import Experience
from grpokit.metrics import NullLogger, RunLogger, sample_lines, warn_if_step_did_nothing
from grpokit.metrics.curves import plot_curves
from grpokit.metrics.step import StepMetrics
from grpokit.trainer.build import Run, build_run
from grpokit.trainer.callbacks import CallbackError, Callbacks
from grpokit.trainer.checkpoint import find_resume_checkpoint
from grpokit.trainer.collect import Collected, refill_groups_with_signal, sample_and_score
from grpokit.trainer.model_card import rewrite_card
from grpokit.trainer.resume import check_resume_recipe, resume, save_run_checkpoint
from grpokit.trainer.stopping import StopFlag, nothing_to_do, stop_signal
from grpokit.trainer.summary import RunSummary, StopReason
from grpokit.trainer.update import optimize
from grpokit.utils.distributed import (
    any_rank,
    barrier,
    gathered,
    shutdown,
)


@dataclass
class LoopMemory:
    """What the loop keeps across steps that is not checkpointed."""

    warned_at: dict[str, int] = field(default_factory=dict)
    """Warning kind -> the step it was last said (:func:`warn_if_step_did_nothing`)."""
    last_eval: tuple[int, EvalResult | None] | None = None
    """``(step, result)`` of the last periodic held-out evaluation (rank 0's result; None elsewhere)."""
    callbacks: Callbacks = field(default_factory=Callbacks)
    """The user's hooks (:mod:`grpokit.trainer.callbacks`)."""


@dataclass
class StepResult:
    """What :func:`run_step` returns: the step's metrics line, and the rows and experience (the
    whole batch, advantages set) it trained on."""

    metrics: StepMetrics
    rows: list[dict]
    experience: Experience


def train(
    recipe: Recipe,
    *,
    progress: bool = True,
    run: Run | None = None,
    callbacks: Callbacks | None = None,
    again: str = "run the same command",
    built: Callable[[Run], None] | None = None,
    step_lines: bool = False,
) -> RunSummary:
    """Run GRPO as the recipe says; returns its :class:`~grpokit.trainer.summary.RunSummary` (last
    metrics, eval results, paths; how it ended: ``summary.stop_reason``, a
    :class:`~grpokit.trainer.summary.StopReason`), which ``summary.json`` holds as a dict.

    ``again``: how the stop line tells the user to continue a stopped run (the CLI's default;
    :meth:`grpokit.Trainer.train` says ``call train() again``).

    ``callbacks``: the user's hooks (:mod:`grpokit.trainer.callbacks`); one that asks to stop ends
    the run after its step with ``early_stopped_at`` and ``stopped_by`` in the summary
    (``StopReason.EARLY_STOP``).

    ``run``: parts already built from ``recipe`` (:func:`grpokit.trainer.build.build_run`; tests pass
    their own, and close them), else built here after the checks below and its reward workers
    closed at the end. ``built``: called with the run's parts once they exist, before training
    (:class:`grpokit.Trainer` keeps the policy and tokenizer from them). ``step_lines``: print one
    line per step (:func:`step_line`; rank 0), what ``grpokit train --no-progress`` shows.

    Before anything loads: ``train.output_dir`` must be a folder that can be written or made
    (:func:`grpokit.utils.outputs.check_output_dir`) and ``train.resume`` must resolve. A run whose resume
    checkpoint is already at (or past) ``train.max_steps`` has nothing to do: it says so, writes
    nothing and returns a summary with ``nothing_to_do``, ``step`` and ``resumed_from``
    (``StopReason.NOTHING_TO_DO``). A run stopped by SIGTERM/SIGINT finishes its step, checkpoints it,
    says where it stopped and returns with ``stopped_at`` (the step) and ``stop_signal`` (the signal's
    number) in its summary (``StopReason.SIGNAL``).

    Before the parts are built, torch's CPU thread count is set and said (:func:`_say_threads`).

    Raises:
        OSError: ``train.output_dir`` is a file, below a file, or not writable (the message names the key).
        ValueError: ``train.resume`` names no complete checkpoint; bad data, rewards or device
            (:func:`grpokit.trainer.build.build_run`); a ``RecipeError`` when the recipe changes a key that
            cannot change on resume (:func:`check_resume_recipe`, before anything loads).
        RuntimeError: a fault of the run (reward failures, non-finite updates);
            :class:`~grpokit.trainer.callbacks.CallbackError` when a callback raised (the run stopped
            after that step, its checkpoint written).
    """
    from grpokit.utils.outputs import check_output_dir

    out = check_output_dir(recipe.train.output_dir, "train.output_dir")
    start = find_resume_checkpoint(out, recipe.train.resume)
    finished = nothing_to_do(recipe, start)
    if finished is not None:
        return finished
    # keys that cannot change on resume: refused before anything loads; the others said on resume
    changes = check_resume_recipe(start, recipe) if start is not None else []
    hooks = callbacks if callbacks is not None else Callbacks()
    if run is not None:
        if built is not None:
            built(run)
        return _train(run, start, progress, changes, hooks, again, step_lines)
    _say_threads()
    run = build_run(recipe)  # validates data and rewards before any model loads, then loads models
    try:
        if built is not None:
            built(run)
        return _train(run, start, progress, changes, hooks, again, step_lines)
    finally:
        run.rewards.close()  # the reward worker processes
        shutdown(run.ranks)  # the process group build_run joined (torchrun)


def _say_threads() -> None:
    """Set torch's CPU thread count (:func:`grpokit.utils.threads.apply_threads`: the cores other work
    leaves free) and say it in one ``[grpokit] threads: ...`` line (rank 0), before anything loads."""
    import os

    from grpokit.utils.threads import apply_threads

    choice = apply_threads()
    if os.environ.get("RANK", "0") == "0":
        print(f"[grpokit] {choice.line()}", flush=True)


def _train(
    run: Run,
    start: Path | None,
    progress: bool,
    changes: list[tuple[str, Any, Any]],
    callbacks: Callbacks,
    again: str = "run the same command",
    step_lines: bool = False,
) -> RunSummary:
    """:func:`train` once the run's parts exist: start (or resume), the steps, the end."""
    recipe, main = run.recipe, run.ranks.is_main  # with several ranks only rank 0 writes files and prints
    logger = (
        RunLogger(run.out, report_to=recipe.train.report_to, config=recipe.to_dict()) if main else NullLogger(run.out)
    )
    summary = RunSummary(
        output_dir=str(run.out), rank=run.ranks.rank, world_size=run.ranks.world_size, parallel=run.ranks.parallel
    )
    memory = LoopMemory(callbacks=callbacks)
    _begin(run, start, changes, logger, memory, summary)
    summary.last_metrics = _steps(run, logger, memory, summary, progress, step_lines)
    error = callbacks.error
    if error is not None:
        summary.callback_error = str(error)
    reason = summary.stop_reason
    if reason in (StopReason.COMPLETED, StopReason.EARLY_STOP):
        _after_training(run, logger, memory, summary)
    elif main and reason is StopReason.SIGNAL:
        _say_stopped(recipe, summary, again)
    logger.close()
    final = run.out / f"checkpoint-{run.state.step}"
    if (final / "trainer_state.json").exists():
        summary.checkpoint = str(final)  # the newest complete checkpoint: the trained model
    if main:
        (run.out / "summary.json").write_text(json.dumps(summary.to_dict(), indent=1, default=str))
    if reason in (StopReason.SIGNAL, StopReason.ERROR):  # a stopped rank exits non-zero and torchrun then ends
        barrier(run.ranks)  # the others: not before rank 0 has written everything
    callbacks.call("on_train_end", summary, step=run.state.step)
    if error is not None:
        raise CallbackError(f"{error}; the run stopped there with its checkpoint ({run.out})") from error.__cause__
    return summary


def _begin(
    run: Run,
    start: Path | None,
    changes: list[tuple[str, Any, Any]],
    logger: RunLogger | NullLogger,
    memory: LoopMemory,
    summary: RunSummary,
) -> None:
    """Resume from ``start``, or begin afresh (replacing an earlier run's metrics in the folder) with
    the held-out evaluation before training when the recipe asks for it; then ``on_train_begin``."""
    if start is not None:
        resume(run, start, changes)
        logger.truncate_after(run.state.step)
        summary.resumed_from = str(start)
        if run.ranks.is_main:
            print(f"[grpokit] resumed from {start} at step {run.state.step}", flush=True)
    else:
        logger.truncate_after(0)
        if run.evaluator is not None and run.recipe.eval.before:
            summary.eval_before = res = evaluate_on_main(run, "before")
            if res is not None:
                memory.callbacks.call("on_evaluate", 0, res, step=0)
    memory.callbacks.call("on_train_begin", run.state.step, run.recipe, step=run.state.step)


def _steps(
    run: Run,
    logger: RunLogger | NullLogger,
    memory: LoopMemory,
    summary: RunSummary,
    progress: bool,
    step_lines: bool = False,
) -> dict[str, Any]:
    """:func:`run_step` until ``train.max_steps`` or a stop signal, checkpointing every
    ``train.save_steps``, at a stop and at the end; returns the last step's metrics ({} if none ran).

    Raises:
        RuntimeError: ``train.max_consecutive_skips`` non-finite updates in a row."""
    from tqdm.auto import tqdm

    t = run.recipe.train
    bar = tqdm(
        total=t.max_steps,
        initial=run.state.step,
        disable=not (progress and run.ranks.is_main),
        desc="grpo",
        unit="step",
        dynamic_ncols=True,
    )
    last: dict[str, Any] = {}
    hooks = memory.callbacks
    with StopFlag() as stop:
        while run.state.step < t.max_steps and not hooks.stop_requested:  # on_train_begin may have raised
            last = run_step(run, logger, memory).metrics
            hooks.call("on_step_end", run.state.step, last, step=run.state.step, can_stop=True)
            bar.update(1)
            bar.set_postfix(reward=f"{last['reward_mean'] or 0:.3f}", step_s=f"{last['step_s']:.1f}")
            if step_lines and run.ranks.is_main:
                print(step_line(last, t.max_steps), flush=True)
            step = run.state.step
            if run.state.consecutive_skips >= t.max_consecutive_skips:
                raise RuntimeError(
                    f"{run.state.consecutive_skips} consecutive non-finite updates "
                    f"(loss or gradient norm) up to step {step}; stopping "
                    f"(train.max_consecutive_skips={t.max_consecutive_skips}). See metrics.jsonl."
                )
            signalled = any_rank(stop.requested, run.ranks)  # a signal to any rank stops all after this step
            asked = any_rank(hooks.stop_requested, run.ranks)  # so does a callback's stop (or fault)
            if (t.save_steps and step % t.save_steps == 0) or signalled or asked or step == t.max_steps:
                path = save_run_checkpoint(run, run.recipe)
                if path is not None:
                    hooks.call("on_save", step, str(path), step=step)
            if signalled:
                summary.stopped_at, summary.stop_signal = step, stop_signal(stop, run.ranks)
                break
            if asked:
                hooks.stop_requested = True
                if hooks.error is None:
                    summary.early_stopped_at, summary.stopped_by = step, hooks.stopped_by or "another rank"
                break
    bar.close()
    return last


def _say_stopped(recipe: Recipe, summary: RunSummary, again: str) -> None:
    """The line a run stopped by a signal ends with: where, and how to continue."""
    t, stopped_at = recipe.train, summary.stopped_at
    assert stopped_at is not None  # StopReason.SIGNAL
    again = (
        f"{again} to continue"
        if t.resume == "auto"
        else f"continue with train.resume=auto (this command has train.resume={t.resume})"
    )
    print(
        f"[grpokit] stopped at step {stopped_at} of {t.max_steps}; "
        + (again if stopped_at < t.max_steps else "the evaluation after training was not run"),
        flush=True,
    )


def _after_training(run: Run, logger: RunLogger | NullLogger, memory: LoopMemory, summary: RunSummary) -> None:
    """The held-out evaluation after training (the last step's periodic one when it is that step's),
    its result in the last checkpoint's model card, and ``curves.png``."""
    recipe, main = run.recipe, run.ranks.is_main
    if run.evaluator is not None and recipe.eval.after:
        done = memory.last_eval
        if done is not None and done[0] == run.state.step:
            res = done[1]  # rank 0's result (None on the other ranks)
            summary.eval_after = (
                save_eval(run.out, replace(res, when="after"), "after") if main and res is not None else None
            )
        else:
            summary.eval_after = evaluate_on_main(run, "after")
            if summary.eval_after is not None:
                memory.callbacks.call("on_evaluate", run.state.step, summary.eval_after, step=run.state.step)
    ckpt = run.out / f"checkpoint-{run.state.step}"
    if main and summary.eval_after and (ckpt / "trainer_state.json").exists():
        # the last checkpoint's model card, written before this evaluation, gets its result
        rewrite_card(ckpt, run.recipe.to_dict(), run.state.step, num_prompts=len(run.data.prompts))
    if main and logger.metrics_path.exists():
        before = run.out / "eval_before.json"  # also there when this process resumed the run
        plot_curves(
            logger.metrics_path,
            run.out / "curves.png",
            beta=recipe.algo.beta,
            num_iterations=recipe.train.num_iterations,
            before=json.loads(before.read_text()) if before.exists() else None,
            after=summary.eval_after,
        )
        logger.log_image("curves", run.out / "curves.png")  # to the trackers (nothing when it was not drawn)


def run_step(run: Run, logger: RunLogger | NullLogger, memory: LoopMemory) -> StepResult:
    """One GRPO step, 1-7 of the module docstring. Raises what sampling, scoring and the update raise."""
    recipe, ranks = run.recipe, run.ranks
    refreshed = {}  # iterative RL: the PRM retrained on the policy's labels before this step
    refresh = run.prm_refresh
    if refresh is not None and refresh.due(run.state.step):
        refreshed = refresh.refresh(
            run.model, run.ref_model, run.engine, run.sampling, run.data.rows, run.data.prompts, step=run.state.step
        )
    t_start = time.perf_counter()
    step = run.state.step + 1
    # 1-3. prompts, their groups, rewards (the whole batch on every rank)
    batch = sample_and_score(run, step, recipe.train.prompts_per_step)
    if recipe.algo.dynamic_sampling:
        batch = refill_groups_with_signal(run, step, batch)
    exp = batch.experience
    # 4. advantages, over the batch trained on
    exp.advantages = run.algorithm.advantages(exp)
    # 5-6. reference and old log-probs, μ gradient passes on this rank's share of the groups
    t_train = time.perf_counter()
    mine, keep = exp, None
    if ranks.world_size > 1 and ranks.parallel == "fsdp2":  # equal rows on every rank, copies out of the loss
        mine, keep = exp.padded_share(ranks.rank, ranks.world_size)
    elif ranks.world_size > 1:
        mine = exp.shard(ranks.rank, ranks.world_size)
    if recipe.algo.overlong_filter:  # DAPO overlong filtering
        assert mine.truncated is not None  # every engine's generate sets it
        keep = ~mine.truncated if keep is None else keep & ~mine.truncated
    update = optimize(run, mine, keep_rows=keep)
    train_s = time.perf_counter() - t_train
    run.state.step = step
    # 7. metrics, evaluation, warnings, samples
    step_s = time.perf_counter() - t_start
    run.state.train_s += step_s  # checkpointed: resumes count on
    metrics = _step_metrics(run, batch, update, step_s=step_s, train_s=train_s)
    metrics.update(refreshed)
    if run.evaluator is not None and recipe.eval.every_steps and step % recipe.eval.every_steps == 0:
        metrics.update(_periodic_eval(run, step, memory))
    logger.log(metrics)
    if ranks.is_main:
        warn_if_step_did_nothing(
            metrics, exp.advantages, max_new_tokens=recipe.rollout.max_new_tokens, warned_at=memory.warned_at
        )
        every = recipe.train.sample_every
        if every and (step % every == 0 or step == 1):
            logger.log_samples(step, sample_lines(batch.rows, exp, run.tokenizer))
    return StepResult(metrics, batch.rows, exp)


def step_line(metrics: dict[str, Any], max_steps: int) -> str:
    """One step as ``grpokit train --no-progress`` prints it, e.g.
    ``step 3/8  reward 0.181  loss -0.0123  19.4 s`` (``reward -``: no scorable reward; ``loss -``:
    the update was skipped as non-finite).

    >>> step_line({"step": 3, "reward_mean": 0.18125, "loss": -0.01234, "step_s": 19.42}, 8)
    'step 3/8  reward 0.181  loss -0.0123  19.4 s'
    """
    reward, loss = metrics.get("reward_mean"), metrics.get("loss")
    r = f"{reward:.3f}" if isinstance(reward, (int, float)) else "-"
    lo = f"{loss:.4f}" if isinstance(loss, (int, float)) and math.isfinite(loss) else "-"
    return f"step {metrics['step']}/{max_steps}  reward {r}  loss {lo}  {metrics['step_s']:.1f} s"


def _step_metrics(run: Run, batch: Collected, update: dict[str, Any], *, step_s: float, train_s: float) -> StepMetrics:
    """The step's metrics line: the reward metrics, the update's, lengths and the phases' seconds."""
    exp = batch.experience
    lengths = exp.completion_mask.sum(1).float()
    if exp.truncated is None:  # every RolloutEngine sets it (grpokit.rollout.engine)
        raise ValueError("step metrics: the rollout's Experience has no `truncated` flags")
    truncated = float(exp.truncated.float().mean())
    overlong = {"overlong_filtered_frac": truncated} if run.recipe.algo.overlong_filter else {}
    return StepMetrics(
        {
            "step": run.state.step,
            **batch.metrics,
            **overlong,
            **update,
            "completion_len_mean": float(lengths.mean()),
            "truncated_frac": truncated,
            "step_s": step_s,
            "gen_s": exp.gen_s,
            "reward_s": batch.reward_s,
            "train_s": train_s,
            "tokens_per_s": float(lengths.sum()) / step_s,
            "threads": torch.get_num_threads(),  # intra-op threads (grpokit.utils.threads): they set a sum's order
            "train_minutes": run.state.train_s / 60,  # training wall-clock so far, evaluations excluded
        }
    )


def _periodic_eval(run: Run, step: int, memory: LoopMemory) -> dict[str, float]:
    """The held-out evaluation of step ``step``, remembered in ``memory`` (and given to the callbacks'
    ``on_evaluate``); its ``eval/*`` metrics."""
    res = evaluate_on_main(run, f"step{step}")
    memory.last_eval = (step, res)
    if res is not None:
        memory.callbacks.call("on_evaluate", step, res, step=step, can_stop=True)
    out = {}
    for name, m in (res.metric_intervals if res is not None else {}).items():
        out.update({f"eval/{name}": m["value"], f"eval/{name}_lo": m["lo"], f"eval/{name}_hi": m["hi"]})
    return out


def evaluate_on_main(run: Run, when: str) -> EvalResult | None:
    """Held-out evaluation ``when`` (``before``, ``after``, ``step<k>``) on rank 0, written to the
    run folder; the other ranks return None (under FSDP2 they take part in gathering the model
    first, then wait at their next collective)."""
    with gathered(run.model):
        if not run.ranks.is_main:
            return None
        # the callers check run.evaluator; build_run makes eval_engine with it
        assert run.evaluator is not None and run.eval_engine is not None
        return run.evaluator.run(run.eval_engine, run.out, when)
