"""The GRPO loop (DeepSeekMath Algorithm 1), as numbered steps over the run's parts
(:class:`grpokit.trainer.build.Run`); all math lives in ``grpokit.algo``.

Per step:
  1. take B prompts (a seeded permutation per epoch; the position is checkpointed);
  2. sample G completions per prompt from π_old = the current policy (``run.engine``, a
     :class:`~grpokit.rollout.engine.RolloutEngine`): an :class:`~grpokit.experience.Experience`;
  3. score them (``run.rewards``: outcome, one reward per completion; process, one per step);
  4. advantages (``run.algorithm``, the :mod:`grpokit.estimators.base` seam);
  5. π_ref log-probs when β > 0 (with LoRA: the policy with its adapters disabled,
     :func:`grpokit.models.logprobs.reference_logprobs`); π_old log-probs only when μ > 1 (else π_old = π_θ
     by value);
  6. μ = ``train.num_iterations`` passes, each one optimizer step over micro-batches whose losses
     are normalized by the whole batch's counts (so accumulation equals one big batch); then the
     engine is told the weights changed;
  7. log metrics, samples, checkpoints.

Departures from the textbook: the model stays in ``eval()`` mode throughout (no dropout, so the
sampler and the trainer see the same π); the generation seed is ``seed·100003 + step`` (plus
``1000003·round`` for dynamic sampling's extra rounds) so a resumed run samples exactly what the
uninterrupted run sampled.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from grpokit.algo import LogprobGap
from grpokit.trainer.build import Run, build_run
from grpokit.trainer.checkpoint import (find_resume_checkpoint, load_model_weights, load_training_state, read_checkpoint_recipe,
                                read_model_state, rng_state, save_checkpoint, set_rng_state)
from grpokit.trainer.collect import refill_groups_with_signal, sample_and_score
from grpokit.config import AlgoConfig, EvalConfig, Recipe, RolloutConfig, TrainConfig
from grpokit.config.resume import check_resume
from grpokit.metrics import plot_curves
from grpokit.utils.distributed import (any_rank, barrier, full_state, gather_objects, gathered, is_sharded, load_full_state,
                                 reduce_gradients, shutdown, sum_over_ranks)
from grpokit.eval.evaluate import save_eval
from grpokit.experience import Experience
from grpokit.models.lora import adapter_dropout
from grpokit.utils.memory import release_memory
from grpokit.metrics import TRUNCATED_WARN_FRAC, NullLogger, RunLogger, RunWarning, sample_lines
from grpokit.utils.outputs import check_output_dir
from grpokit.models.logprobs import batch_logprobs, completion_logprobs, reference_logprobs
from grpokit.trainer.optim import hyperparameters, keep_hyperparameters, load_schedule_state
from grpokit.trainer.state import TrainState
from grpokit.trainer.stopping import StopFlag, nothing_to_do, stop_signal


def optimize(run: Run, exp: Experience, t: TrainConfig, *, temperature: float, autocast_bf16: bool = False,
             keep_rows: torch.Tensor | None = None) -> dict[str, Any]:
    """Steps 5-6 on ``exp`` (``advantages`` set): reference/old log-probs, then μ =
    ``t.num_iterations`` passes of ``run.algorithm``'s loss, each one optimizer step over
    micro-batches of ``t.micro_batch_size`` rows normalized by the whole batch's counts.

    ``t``: the recipe's ``train`` section. ``keep_rows`` ``(N,)`` bool (overlong filtering): rows
    False are left out of the loss (their tokens are masked, and the sequence and token counts are
    those of the kept rows); they are still fed to the model, so attention masks stay as sampled.
    The algorithm may hold the policy still this step (``updates_policy``: PPO's critic warm-up:
    no pass, ``policy_updated`` 0, loss and grad norm 0) and runs its own updates after the
    policy's (``update_auxiliary``: PPO's value model; its metrics are added).
    Returns the update's metrics (loss, kl, clip fractions, ratio, entropy, grad norm, lr, skipped
    and zero-gradient updates, ``ref_s``, ``policy_updated``)."""
    t0 = time.perf_counter()
    _score_old_and_reference(run, exp, t, temperature=temperature, autocast_bf16=autocast_bf16)
    release_memory()  # heap pages freed by the no-grad passes go back to the OS (grpokit.utils.memory)
    ref_s = time.perf_counter() - t0
    loss_mask = exp.completion_mask if keep_rows is None else exp.completion_mask & keep_rows[:, None]
    ranks = run.ranks  # with several ranks, exp is this rank's share and the counts are the batch's
    counts = sum_over_ranks([len(exp) if keep_rows is None else int(keep_rows.sum()), int(loss_mask.sum()),
                             int(exp.completion_mask.sum())], ranks)
    n, n_tok, n_all = max(int(counts[0]), 1), int(counts[1]), int(counts[2])
    sums: dict[str, float] = {}
    stat_keys: set[str] = set()  # the algorithm's loss stats (GRPO: kl, clip fractions, ratio_mean)
    grad_norms, lrs, skipped, zero_grad = [], [], 0, 0
    gap = LogprobGap()  # the sampler's log-probs against π_old's (engines that report them: vllm)
    passes = t.num_iterations if run.algorithm.updates_policy(run.state.step + 1) else 0  # 0: PPO's critic warm-up
    for it in range(passes):
        run.optimizer.zero_grad(set_to_none=True)
        loss_total = _gradient_pass(run, exp, loss_mask, it, counts=(n, n_tok, n_all), sums=sums,
                                    stat_keys=stat_keys, gap=gap, mbs=t.micro_batch_size, temperature=temperature,
                                    autocast_bf16=autocast_bf16)
        sums[f"loss@{it}"] = loss_total
        gn, outcome = _apply_update(run, t, loss_total)
        grad_norms.append(gn)
        lrs.append(float(run.optimizer.param_groups[0]["lr"]))  # the rate this update uses (before the schedule moves)
        skipped, zero_grad = skipped + (outcome == "skipped"), zero_grad + (outcome == "zero_grad")
        with warnings.catch_warnings():  # the schedule follows updates applied or not
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*optimizer.step")
            run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    if ranks.active:  # the stats are sums of this rank's share: add the other ranks'
        keys = sorted(sums)
        sums = dict(zip(keys, sum_over_ranks([sums[k] for k in keys], ranks)))
    aux = run.algorithm.update_auxiliary(exp, loss_mask, t)  # PPO: the value model
    run.engine.sync_weights()
    mu = max(passes, 1)
    out = {k: sum(sums.get(f"{k}@{i}", 0.0) for i in range(mu)) / mu for k in ("loss", *sorted(stat_keys))}
    out.update(entropy=sums.get("entropy"), grad_norm=sum(grad_norms) / mu,
               lr=sum(lrs) / len(lrs) if lrs else float(run.optimizer.param_groups[0]["lr"]),
               skipped_updates=skipped, zero_grad_updates=zero_grad, ref_s=ref_s, policy_updated=int(passes > 0),
               **aux, **gap.metrics())
    return out


def _score_old_and_reference(run: Run, exp: Experience, t: TrainConfig, *, temperature: float,
                             autocast_bf16: bool) -> None:
    """Step 5: π_ref's log-probs when the algorithm needs them (LoRA: the adapters disabled), π_old's
    when μ > 1; each left alone when already set (an algorithm may have set them)."""
    mbs = t.micro_batch_size
    if run.algorithm.needs_reference and exp.ref_logprobs is None:
        exp.ref_logprobs = reference_logprobs(run.model, run.ref_model, exp, temperature=temperature,
                                              micro_batch_size=mbs, autocast_bf16=autocast_bf16)
    if t.num_iterations > 1 and exp.old_logprobs is None:
        exp.old_logprobs = batch_logprobs(run.model, exp, temperature=temperature, micro_batch_size=mbs,
                                          autocast_bf16=autocast_bf16)


def _gradient_pass(run: Run, exp: Experience, loss_mask: torch.Tensor, it: int, *, counts: tuple[int, int, int],
                   sums: dict[str, float], stat_keys: set[str], gap: LogprobGap, mbs: int, temperature: float,
                   autocast_bf16: bool) -> float:
    """Pass ``it`` of step 6 over this rank's micro-batches: each loss normalized by the batch's
    ``counts`` = (sequences, loss tokens, completion tokens), backward into ``.grad``; adds the
    token-weighted stats (and, in pass 0, the entropy and the sampler gap) into ``sums``/``gap``.
    Returns this rank's share of the loss."""
    n, n_tok, n_all = counts
    loss_total = 0.0
    for sl, mb in exp.micro_batches(mbs):
        with adapter_dropout(run.model):  # model.lora.dropout: in the gradient passes only (grpokit.models.lora)
            logp, ent = completion_logprobs(run.model, mb, temperature=temperature, with_entropy=it == 0,
                                            autocast_bf16=autocast_bf16)
            loss, st = run.algorithm.loss(logp, mb, loss_mask[sl, : mb.completion_ids.shape[1]],
                                          num_sequences=n, num_tokens=n_tok)
            loss.backward()  # inside: a checkpointed layer recomputes with the same dropout
        if it == 0:  # before the first update logp is π_old's
            gap.add(mb.sampler_logprobs, logp, mb.completion_mask)
        release_memory()
        loss_total += loss.item()
        w = st["num_tokens"].item() / max(n_tok, 1)  # token-weighted means over the batch
        for k, v in st.items():
            if k != "num_tokens":
                stat_keys.add(k)
                sums[f"{k}@{it}"] = sums.get(f"{k}@{it}", 0.0) + w * v.item()
        if ent is not None:
            ent_sum = torch.where(mb.completion_mask, ent, torch.zeros_like(ent)).sum()  # not ent·mask: NaN·0
            sums["entropy"] = sums.get("entropy", 0.0) + float(ent_sum) / max(n_all, 1)
    return loss_total


def _apply_update(run: Run, t: TrainConfig, loss_total: float) -> tuple[float, str]:
    """The optimizer step of one pass: gradients summed over ranks (ddp), clipped at
    ``t.max_grad_norm``; not applied when the gradient is exactly zero (nothing to learn: AdamW
    would move the weights by momentum and weight decay alone) or the loss or norm is not finite
    (counted in ``run.state.consecutive_skips``). Returns ``(grad norm, "applied" | "zero_grad" |
    "skipped")``, the same on every rank."""
    ranks, state = run.ranks, run.state
    if ranks.parallel == "ddp":  # fsdp2 reduce-scatters in backward; then every rank has the same gradient
        reduce_gradients([p for p in run.model.parameters() if p.requires_grad], ranks)
    loss_total = sum_over_ranks([loss_total], ranks)[0]  # the same skip decision on every rank
    clip = t.max_grad_norm if t.max_grad_norm > 0 else float("inf")
    gn = _grad_norm(torch.nn.utils.clip_grad_norm_(run.model.parameters(), clip))
    if gn == 0.0:
        state.consecutive_skips = 0
        return gn, "zero_grad"
    if math.isfinite(gn) and math.isfinite(loss_total):
        run.optimizer.step()
        state.consecutive_skips = 0
        return gn, "applied"
    state.consecutive_skips += 1
    return gn, "skipped"


def _grad_norm(total: torch.Tensor) -> float:
    """The norm ``clip_grad_norm_`` returns, as a float (a DTensor under FSDP2: its full value)."""
    full = getattr(total, "full_tensor", None)
    return float(full() if callable(full) else total)


#: a kind of warning repeats at most once per this many steps (each step's metrics say it anyway)
WARN_EVERY_STEPS = 10


def warn_if_step_did_nothing(metrics: dict[str, Any], advantages: torch.Tensor, *, max_new_tokens: int,
                             warned_at: dict[str, int]) -> list[str]:
    """Warn (``RunWarning``) when a step carried no or little learning signal; returns the kinds.

    - ``truncated``: at least :data:`TRUNCATED_WARN_FRAC` of the completions hit
      ``rollout.max_new_tokens`` (their ends, and a final answer, were never seen);
    - ``no_signal``: every advantage is exactly 0 (every group's rewards equal, or unscorable):
      the policy-gradient term of the update is zero;
    - ``reward_failures``: reward rows raised or timed out and were scored unscorable;
    - ``skipped_update``: an update was skipped as non-finite.

    Each kind is said on its first step and then at most once every :data:`WARN_EVERY_STEPS`
    steps (``warned_at``: kind -> step it was last said, updated here; the metrics line of every
    step has the numbers: ``truncated_frac``, ``frac_zero_std``, ``unscorable_frac``,
    ``reward_failures``, ``skipped_updates``). Under process supervision ``no_signal`` quotes
    ``step_frac_zero_std``: the advantages come from the step rewards, so that is the fraction
    that explains them (``frac_zero_std`` of the outcome rewards follows it).
    """
    step = metrics["step"]
    found: dict[str, str] = {}
    if metrics["truncated_frac"] >= TRUNCATED_WARN_FRAC:
        found["truncated"] = (
            f"{metrics['truncated_frac']:.0%} of the completions reached rollout.max_new_tokens="
            f"{max_new_tokens} without an EOS; raise rollout.max_new_tokens (or ask for "
            "shorter answers) so that rewards see whole answers")
    if not bool(advantages.ne(0).any()):
        if metrics["unscorable_frac"] == 1.0:
            why = "every reward was unscorable"
        elif metrics.get("step_frac_zero_std") is not None:  # process supervision: the step rewards decide
            why = (f"every group's step rewards were equal (step_frac_zero_std={metrics['step_frac_zero_std']:.2f}; "
                   f"outcome rewards: frac_zero_std={metrics['frac_zero_std']:.2f}, "
                   f"unscorable_frac={metrics['unscorable_frac']:.2f})")
        else:
            why = (f"every group's rewards were equal (frac_zero_std={metrics['frac_zero_std']:.2f}, "
                   f"unscorable_frac={metrics['unscorable_frac']:.2f})")
        found["no_signal"] = (f"no learning signal: {why}, so every advantage is 0 and the policy-"
                              "gradient term of this update is zero" + (
                                  " (the optimizer step was skipped: zero gradient)" if metrics.get("zero_grad_updates")
                                  else ""))
    if metrics.get("reward_failures"):
        found["reward_failures"] = (f"{metrics['reward_failures']} reward rows raised or timed out and "
                                    "were scored unscorable (rewards.on_error=none)")
    if metrics.get("skipped_updates"):
        found["skipped_update"] = (f"{metrics['skipped_updates']} update(s) skipped: non-finite loss or "
                                   "gradient norm")
    for kind, text in found.items():
        if kind not in warned_at or step - warned_at[kind] >= WARN_EVERY_STEPS:
            warned_at[kind] = step
            warnings.warn(f"step {step}: {text}", RunWarning, stacklevel=2)
    return list(found)


def save_run_checkpoint(run: Run, recipe: Recipe) -> Path | None:
    """``checkpoint-<step>`` of the run (weights, tokenizer, optimizer, schedule, RNG, data position).

    With several ranks every rank must call it: each rank's RNG state is gathered (and, under
    FSDP2, the full model and optimizer state); rank 0 writes and returns the path, the others
    return None."""
    st, ranks = run.state, run.ranks
    rng = gather_objects(rng_state(), ranks) if ranks.active else None
    model_state = optimizer_state = None
    if is_sharded(run.model):
        model_state, optimizer_state = full_state(run.model, run.optimizer)
    if not ranks.is_main:
        return None
    return save_checkpoint(
        run.out, st.step, model=run.model, tokenizer=run.tokenizer, optimizer=run.optimizer, scheduler=run.scheduler,
        trainer_state={"epoch": st.epoch, "position": st.position, "consecutive_skips": st.consecutive_skips,
                       "extra": st.extra, "world_size": ranks.world_size},
        recipe=recipe.to_dict(), keep=recipe.train.save_total_limit, algorithm_state=run.algorithm.state_dict(),
        rng_ranks=rng, model_state=model_state, optimizer_state=optimizer_state,
    )


def resume(run: Run, ckpt: Path, changes: list[tuple[str, Any, Any]] = ()) -> None:
    """Load ``ckpt``'s weights, optimizer, schedule, RNG and loop state into ``run`` (on every rank:
    each reads the checkpoint and takes its own RNG state; a checkpoint of another world size
    resumes with rank 0's, and sampling, seeded per row, is unchanged).

    The optimizers' moments and step counts and the schedule's position come from the checkpoint;
    their settings (``lr``, ``betas``, ``weight_decay``, the schedule's base rate and shape, PPO's
    ``critic_learning_rate``) stay those of ``run``'s optimizers, built from the recipe, so a
    recipe that changed them runs at its own values from the next step (docs/resume.md).
    ``changes``: the recipe's changed keys as ``(key, old, new)``, from :func:`check_resume_recipe`
    (which :func:`train` calls before anything loads); each is said on rank 0 and appended to
    ``run.state.extra["recipe_changes"]`` (``{"step", "key", "old", "new"}``, saved with every
    later checkpoint).

    Raises:
        ValueError: a damaged checkpoint, or one that does not fit the run's model (names the file).
    """
    state, blob = load_training_state(ckpt)
    settings = hyperparameters(run.optimizer)  # the recipe's: load_state_dict brings the checkpoint's back
    if is_sharded(run.model):
        load_full_state(run.model, run.optimizer, read_model_state(ckpt), blob["optimizer"])
    else:
        load_model_weights(run.model, ckpt)
        run.optimizer.load_state_dict(blob["optimizer"])
    keep_hyperparameters(run.optimizer, settings)
    run.engine.sync_weights()  # an engine with its own copy of the weights (vllm) must not sample the old ones
    load_schedule_state(run.scheduler, blob["scheduler"])  # the position; the recipe's base rate and shape
    own = _algorithm_optimizers(run.algorithm)  # PPO's value-model AdamW: critic_learning_rate as above
    own_settings = [hyperparameters(o) for o in own]
    run.algorithm.load_state_dict(blob.get("algorithm", {}))
    for opt, kept in zip(own, own_settings, strict=True):
        keep_hyperparameters(opt, kept)
    per_rank = blob.get("rng_ranks")
    set_rng_state(per_rank[run.ranks.rank] if per_rank and len(per_rank) == run.ranks.world_size else blob["rng"])
    run.state = TrainState(step=state["step"], epoch=state["epoch"], position=state["position"],
                           consecutive_skips=state.get("consecutive_skips", 0), extra=state.get("extra", {}))
    if changes:
        run.state.extra["recipe_changes"] = list(run.state.extra.get("recipe_changes", [])) + [
            {"step": run.state.step, "key": k, "old": old, "new": new} for k, old, new in changes]
        if run.ranks.is_main:
            said = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in changes)
            print(f"[grpokit] resuming {ckpt} with changed keys (the recipe's values apply from step "
                  f"{run.state.step + 1}): {said}", flush=True)


def check_resume_recipe(ckpt: Path, recipe: Recipe) -> list[tuple[str, Any, Any]]:
    """The recipe keys that differ between checkpoint ``ckpt``'s ``recipe.json`` and ``recipe`` as
    ``(key, old, new)``, when each may change on resume (the recipe's value applies from the next
    step: :mod:`grpokit.config.resume`, docs/resume.md); [] for a checkpoint without
    ``recipe.json``. Reads one small file: :func:`train` calls it before any model loads.

    Raises:
        RecipeError: a key that cannot change on resume differs (each named, ``old -> new``).
        ValueError: ``recipe.json`` is damaged (:func:`grpokit.trainer.checkpoint.read_checkpoint_recipe`).
    """
    old = read_checkpoint_recipe(ckpt)
    return [] if old is None else check_resume(old, recipe, str(ckpt))


def _algorithm_optimizers(algorithm: Any) -> list[torch.optim.Optimizer]:
    """The optimizers an algorithm holds as attributes (PPO: ``critic_optimizer``), in a fixed order."""
    held = vars(algorithm) if hasattr(algorithm, "__dict__") else {}
    return [v for _, v in sorted(held.items()) if isinstance(v, torch.optim.Optimizer)]


def train(recipe: Recipe, *, progress: bool = True, run: Run | None = None) -> dict[str, Any]:
    """Run GRPO as the recipe says; returns a summary (last metrics, eval results, paths).

    ``run``: parts already built from ``recipe`` (:func:`grpokit.trainer.build.build_run`; tests pass
    their own, and close them), else built here after the checks below and its reward workers
    closed at the end.

    Before anything loads: ``train.output_dir`` must be a folder that can be written or made
    (:func:`grpokit.utils.outputs.check_output_dir`) and ``train.resume`` must resolve. A run whose resume
    checkpoint is already at (or past) ``train.max_steps`` has nothing to do: it says so, writes
    nothing and returns ``{"nothing_to_do": True, "step": ..., "resumed_from": ...}``.
    A run stopped by SIGTERM/SIGINT finishes its step, checkpoints it, says where it stopped and
    returns with ``stopped_at`` (the step) and ``stop_signal`` (the signal's number) in its summary.

    Raises:
        OSError: ``train.output_dir`` is a file, below a file, or not writable (the message names the key).
        ValueError: ``train.resume`` names no complete checkpoint; bad data, rewards or device
            (:func:`grpokit.trainer.build.build_run`); a ``RecipeError`` when the recipe changes a key that
            cannot change on resume (:func:`check_resume_recipe`, before anything loads).
        RuntimeError: a fault of the run (reward failures, non-finite updates).
    """
    out = check_output_dir(recipe.train.output_dir, "train.output_dir")
    start = find_resume_checkpoint(out, recipe.train.resume)
    finished = nothing_to_do(recipe, start)
    if finished is not None:
        return finished
    # keys that cannot change on resume: refused before anything loads; the others said on resume
    changes = check_resume_recipe(start, recipe) if start is not None else []
    if run is not None:
        return _train(recipe, run, start, progress, changes)
    run = build_run(recipe)  # validates data and rewards before any model loads, then loads models
    try:
        return _train(recipe, run, start, progress, changes)
    finally:
        run.rewards.close()  # the reward worker processes
        shutdown(run.ranks)  # the process group build_run joined (torchrun)


def _train(recipe: Recipe, run: Run, start: Path | None, progress: bool,
           changes: list[tuple[str, Any, Any]]) -> dict[str, Any]:
    out = Path(recipe.train.output_dir)
    main = run.ranks.is_main  # with several ranks only rank 0 writes files and prints
    logger = RunLogger(out) if main else NullLogger(out)
    summary: dict[str, Any] = {"output_dir": str(out), "rank": run.ranks.rank, "world_size": run.ranks.world_size,
                               "parallel": run.ranks.parallel}
    memo: dict[str, Any] = {"warned_at": {}}  # warnings said, the last periodic evaluation
    ev = run.evaluator
    if start is not None:
        resume(run, start, changes)
        logger.truncate_after(run.state.step)
        summary["resumed_from"] = str(start)
        if main:
            print(f"[grpokit] resumed from {start} at step {run.state.step}", flush=True)
    else:
        logger.truncate_after(0)  # a fresh run replaces the metrics of an earlier run in this folder
        if ev is not None and recipe.eval.before:
            summary["eval_before"] = evaluate_on_main(run, "before")
    from tqdm.auto import tqdm

    bar = tqdm(total=recipe.train.max_steps, initial=run.state.step, disable=not (progress and main), desc="grpo",
               unit="step", dynamic_ncols=True)
    last: dict[str, Any] = {}
    with StopFlag() as stop:
        while run.state.step < recipe.train.max_steps:
            last = run_step(run, logger, memo, rollout_cfg=recipe.rollout, algo_cfg=recipe.algo,
                            train_cfg=recipe.train, eval_cfg=recipe.eval, autocast_bf16=recipe.model.autocast_bf16)
            bar.update(1)
            bar.set_postfix(reward=f"{last['reward_mean'] or 0:.3f}", step_s=f"{last['step_s']:.1f}")
            step = run.state.step
            if run.state.consecutive_skips >= recipe.train.max_consecutive_skips:
                raise RuntimeError(f"{run.state.consecutive_skips} consecutive non-finite updates "
                                   f"(loss or gradient norm) up to step {step}; stopping "
                                   f"(train.max_consecutive_skips={recipe.train.max_consecutive_skips}). "
                                   "See metrics.jsonl.")
            every = recipe.train.save_steps
            stopping = any_rank(stop.requested, run.ranks)  # a signal to any rank stops all after this step
            if (every and step % every == 0) or stopping or step == recipe.train.max_steps:
                save_run_checkpoint(run, recipe)
            if stopping:
                summary["stopped_at"], summary["stop_signal"] = step, stop_signal(stop, run.ranks)
                break
    bar.close()
    if "stopped_at" in summary and main:
        t = recipe.train
        again = ("run the same command to continue" if t.resume == "auto" else
                 f"continue with train.resume=auto (this command has train.resume={t.resume})")
        print(f"[grpokit] stopped at step {summary['stopped_at']} of {t.max_steps}; " + (
            again if summary["stopped_at"] < t.max_steps else "the evaluation after training was not run"),
            flush=True)
    summary["last_metrics"] = last
    if "stopped_at" not in summary:
        if ev is not None and recipe.eval.after:
            done = memo.get("last_eval")  # the last step's periodic evaluation is this one
            if done is not None and done[0] == run.state.step:
                summary["eval_after"] = save_eval(run.out, dict(done[1], when="after"), "after") if main else None
            else:
                summary["eval_after"] = evaluate_on_main(run, "after")
        if main and logger.metrics_path.exists():
            before = out / "eval_before.json"  # also there when this process resumed the run
            plot_curves(logger.metrics_path, out / "curves.png", beta=recipe.algo.beta,
                        num_iterations=recipe.train.num_iterations,
                        before=json.loads(before.read_text()) if before.exists() else None)
    logger.close()
    if main:
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if "stopped_at" in summary:  # a stopped rank exits non-zero and torchrun then ends the others: not before
        barrier(run.ranks)  # rank 0 has written everything
    return summary


def evaluate_on_main(run: Run, when: str) -> dict[str, Any] | None:
    """Held-out evaluation ``when`` (``before``, ``after``, ``step<k>``) on rank 0, written to the
    run folder; the other ranks return None (under FSDP2 they take part in gathering the model
    first, then wait at their next collective)."""
    with gathered(run.model):
        return run.evaluator.run(run.eval_engine, run.out, when) if run.ranks.is_main else None


def run_step(run: Run, logger: RunLogger, memo: dict[str, Any], *, rollout_cfg: RolloutConfig,
             algo_cfg: AlgoConfig, train_cfg: TrainConfig, eval_cfg: EvalConfig,
             autocast_bf16: bool = False) -> dict[str, Any]:
    """One GRPO step (1-7 in the module docstring); returns its metrics line. ``memo`` keeps what
    lives across steps and is not checkpointed: ``warned_at`` and ``last_eval``.

    ``rollout_cfg``/``algo_cfg``/``train_cfg``/``eval_cfg``: the recipe's ``rollout``, ``algo``,
    ``train`` and ``eval`` sections; ``autocast_bf16``: ``model.autocast_bf16``. Raises what
    sampling, scoring and the update raise."""
    t_start = time.perf_counter()
    step = run.state.step + 1
    rows, exp, scored, reward_s = sample_and_score(run, step, train_cfg.prompts_per_step, round_=0,
                                                   rollout_cfg=rollout_cfg, train_cfg=train_cfg)
    if algo_cfg.dynamic_sampling:
        rows, exp, scored, extra_s = refill_groups_with_signal(run, step, rows, exp, scored, algo_cfg=algo_cfg,
                                                               rollout_cfg=rollout_cfg, train_cfg=train_cfg)
        reward_s += extra_s
    if algo_cfg.overlong_filter:  # DAPO overlong filtering
        scored["overlong_filtered_frac"] = float(exp.truncated.float().mean())
    t_train = time.perf_counter()
    ranks = run.ranks  # this rank trains on its share of the whole batch's groups
    mine = exp.shard(ranks.rank, ranks.world_size) if ranks.world_size > 1 else exp
    opt = optimize(run, mine, train_cfg, temperature=rollout_cfg.temperature, autocast_bf16=autocast_bf16,
                   keep_rows=~mine.truncated if algo_cfg.overlong_filter else None)
    train_s = time.perf_counter() - t_train
    run.state.step = step
    lengths = exp.completion_mask.sum(1).float()
    step_s = time.perf_counter() - t_start
    run.state.extra["train_s"] = run.state.extra.get("train_s", 0.0) + step_s  # checkpointed: resumes count on
    metrics = {
        "step": step, **scored, **opt,
        "completion_len_mean": float(lengths.mean()),
        "truncated_frac": float(exp.truncated.float().mean()),
        "step_s": step_s, "gen_s": exp.gen_s, "reward_s": reward_s, "train_s": train_s,
        "tokens_per_s": float(lengths.sum()) / step_s,
    }
    metrics["train_minutes"] = run.state.extra["train_s"] / 60  # training wall-clock so far, evaluations excluded
    if run.evaluator is not None and eval_cfg.every_steps and step % eval_cfg.every_steps == 0:
        res = evaluate_on_main(run, f"step{step}")
        memo["last_eval"] = (step, res)
        for name, m in ((res or {}).get("metrics") or {}).get("metrics", {}).items():
            metrics.update({f"eval/{name}": m["value"], f"eval/{name}_lo": m["lo"], f"eval/{name}_hi": m["hi"]})
    logger.log(metrics)
    if not ranks.is_main:
        return metrics
    warn_if_step_did_nothing(metrics, exp.advantages, max_new_tokens=rollout_cfg.max_new_tokens,
                             warned_at=memo["warned_at"])
    every = train_cfg.sample_every
    if every and (step % every == 0 or step == 1):
        logger.log_samples(step, sample_lines(rows, exp, run.tokenizer))
    return metrics
