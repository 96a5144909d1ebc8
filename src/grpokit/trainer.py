"""The GRPO loop (DeepSeekMath Algorithm 1), as numbered steps; all math lives in ``grpokit.algo``.

Per step:
  1. take B prompts (a seeded permutation per epoch; the position is checkpointed);
  2. sample G completions per prompt from π_old = the current policy (``rollout.hf``);
  3. score them (outcome: one reward per completion; process: one per reasoning step);
  4. advantages: ``group_advantages`` (outcome) or ``process_advantages`` (process);
  5. π_ref log-probs when β > 0; π_old log-probs only when μ > 1 (else π_old = π_θ by value);
  6. μ = ``train.num_iterations`` passes, each one optimizer step over micro-batches whose losses
     are normalized by the whole batch's counts (so accumulation equals one big batch);
  7. log metrics, samples, checkpoints.

Departures from the textbook: the model stays in ``eval()`` mode throughout (no dropout, so the
sampler and the trainer see the same π); the generation seed is ``seed + step`` so a resumed run
samples exactly what the uninterrupted run sampled.
"""

from __future__ import annotations

import json
import math
import random
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpokit import algo
from grpokit.checkpoint import find_resume_checkpoint, load_training_state, save_checkpoint, set_rng_state
from grpokit.config import Recipe
from grpokit.curves import plot_curves
from grpokit.memory import release_memory
from grpokit.metrics import TRUNCATED_WARN_FRAC, RunLogger, RunWarning
from grpokit.policy import Batch, batch_logprobs, completion_logprobs, micro_batches
from grpokit.rewards.guard import GuardedReward
from grpokit.setup import Setup, prepare


@dataclass
class TrainState:
    """What a checkpoint needs to continue the data order exactly."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    consecutive_skips: int = 0
    extra: dict = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def next_prompt_indices(state: TrainState, n_rows: int, b: int, seed: int) -> list[int]:
    """B row indices from the epoch's seeded permutation; advances ``state``."""
    out = []
    while len(out) < b:
        order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed * 1000 + state.epoch))
        take = order[state.position : state.position + b - len(out)].tolist()
        out += take
        state.position += len(take)
        if state.position >= n_rows:
            state.epoch, state.position = state.epoch + 1, 0
    return out


def make_optimizer(model: torch.nn.Module, recipe: Recipe):
    """AdamW (``train.optimizer``) and its learning-rate schedule.

    - ``adamw``: ``torch.optim.AdamW(fused=True)`` (one kernel per step: 1.1 s -> 0.15 s for 135M
      fp32 parameters on CPU). With bf16 parameters its round-to-nearest write-back drops updates
      smaller than half a bf16 ulp (~0.4 % of the weight): at lr 1e-6 most of them.
    - ``adamw_bf16_sr``: :class:`grpokit.optim.AdamWStochasticRounding`: the update is computed
      in float32 and written to bf16 weights (and second moments) rounded up or down at random,
      unbiased in expectation (the weight moves by the update on average), with bf16 states:
      8 bytes/parameter in all (weights, grads, m, v) instead of 16 for fp32 AdamW.
    - ``adamw_8bit``: torchao's AdamW8bit (block-wise 8-bit m and v; stochastic rounding when the
      parameters are bf16; ``torch.compile``-d per parameter shape on the first step: seconds).
    """
    t = recipe.train
    params = [p for p in model.parameters() if p.requires_grad]
    kw = dict(lr=t.learning_rate, betas=tuple(t.adam_betas), weight_decay=t.weight_decay)
    if t.optimizer == "adamw":
        opt = torch.optim.AdamW(params, **kw, fused=True)
    elif t.optimizer == "adamw_bf16_sr":
        from grpokit.optim import AdamWStochasticRounding

        opt = AdamWStochasticRounding(params, **kw)
    else:
        import torchao.optim  # its import-time warnings are quieted in grpokit/__init__.py

        bf16 = all(p.dtype == torch.bfloat16 for p in params)
        opt = torchao.optim.AdamW8bit(params, **kw, bf16_stochastic_round=bf16)
    total = max(t.max_steps * t.num_iterations, 1)

    def factor(i: int) -> float:
        if i < t.warmup_steps:
            return (i + 1) / (t.warmup_steps + 1)
        frac = (i - t.warmup_steps) / max(total - t.warmup_steps, 1)
        if t.lr_scheduler == "linear":
            return max(0.0, 1.0 - frac)
        if t.lr_scheduler == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0)))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


class _StopFlag:
    """SIGTERM/SIGINT: finish the step, checkpoint, stop. A second signal aborts at once."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt(f"second signal {signum}: aborting")
        self.requested = True
        print(f"\n[grpokit] signal {signum}: stopping after this step (checkpoint first); "
              "send again to abort", flush=True)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def score_rollout(s: Setup, rows: list[dict], rollout) -> dict[str, Any]:
    """Step 3-4: rewards and advantages. Returns tensors and metrics for the step."""
    recipe, g = s.recipe, s.recipe.rollout.group_size
    n = len(rollout)
    prompts = [rows[i // g]["prompt"] for i in range(n)]
    columns = {k: [rows[i // g].get(k) for i in range(n)] for k in s.row_columns}
    guards = [f for f in [*s.reward_funcs.values(), getattr(s, "process_reward", None)]
              if isinstance(f, GuardedReward)]
    failures_before = sum(f.failures for f in guards)
    total, per_fn = s.compute_rewards(prompts, rollout.completions, columns)
    rewards = torch.tensor([math.nan if r is None else r for r in total], dtype=torch.float64)
    metrics: dict[str, Any] = {}
    for name, vals in per_fn.items():
        ok = [v for v in vals if v is not None]
        metrics[f"rewards/{name}"] = sum(ok) / len(ok) if ok else None
    # None/NaN (and ±inf from a buggy reward) are unscorable: left out of the statistics, advantage 0
    metrics["unscorable_frac"] = float((~torch.isfinite(rewards)).float().mean())
    # groups whose rewards are equal up to rounding, or < 2 scorable: their advantages are exactly 0
    metrics["frac_zero_std"] = float(algo.constant_groups(rewards, g).float().mean())
    ok = rewards[torch.isfinite(rewards)]
    metrics["reward_mean"] = float(ok.mean()) if len(ok) else None
    metrics["reward_std"] = float(ok.std()) if len(ok) > 1 else 0.0
    if recipe.algo.supervision == "process":
        from grpokit.process import process_step_advantages

        advantages, pm = process_step_advantages(s, rows, rollout, prompts, columns)
        metrics.update(pm)
    else:
        advantages = algo.group_advantages(
            rewards, g, scale=recipe.algo.advantage_scale, eps=recipe.algo.advantage_eps
        ).float()
    # rows that raised or timed out this step (rewards.on_error=none scores them None)
    metrics["reward_failures"] = sum(f.failures for f in guards) - failures_before
    return {"rewards": rewards, "advantages": advantages, "metrics": metrics}


def optimize(s: Setup, batch: Batch, advantages: torch.Tensor, keep_rows: torch.Tensor | None = None) -> dict[str, Any]:
    """Steps 5-6: reference/old log-probs, then μ passes of clipped-surrogate updates.

    ``keep_rows`` ``(N,)`` bool (overlong filtering): rows False are left out of the loss (their
    tokens are masked, and the sequence and token counts are those of the kept rows); they are
    still fed to the model, so attention masks stay as sampled."""
    r, a, t = s.recipe, s.recipe.algo, s.recipe.train
    temp, mbs, ac = r.rollout.temperature, t.micro_batch_size, r.model.autocast_bf16
    t0 = time.perf_counter()
    ref_logp = (batch_logprobs(s.ref_model, batch, temperature=temp, micro_batch_size=mbs, autocast_bf16=ac)
                if s.ref_model is not None else None)
    old_logp = (batch_logprobs(s.model, batch, temperature=temp, micro_batch_size=mbs, autocast_bf16=ac)
                if t.num_iterations > 1 else None)
    release_memory()  # heap pages freed by the no-grad passes go back to the OS (grpokit.memory)
    ref_s = time.perf_counter() - t0
    loss_mask = batch.completion_mask if keep_rows is None else batch.completion_mask & keep_rows[:, None]
    n = len(batch) if keep_rows is None else max(int(keep_rows.sum()), 1)
    n_tok, n_all = int(loss_mask.sum()), int(batch.completion_mask.sum())
    sums: dict[str, float] = {}
    grad_norms, lrs, skipped, zero_grad = [], [], 0, 0
    for it in range(t.num_iterations):
        s.optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for sl in micro_batches(len(batch), mbs):
            sub = batch.rows(sl)
            tt = sub.completion_ids.shape[1]
            logp, ent = completion_logprobs(s.model, sub, temperature=temp, with_entropy=it == 0, autocast_bf16=ac)
            old = old_logp[sl, :tt] if old_logp is not None else logp.detach()
            adv = advantages[sl] if advantages.dim() == 1 else advantages[sl, :tt]
            loss, st = algo.policy_loss(
                logp, old, adv, loss_mask[sl, :tt], ref_logp=None if ref_logp is None else ref_logp[sl, :tt],
                beta=a.beta, clip_eps_low=a.clip_eps_low, clip_eps_high=a.clip_eps_high,
                kl_estimator=a.kl_estimator, aggregation=a.loss_aggregation,
                max_completion_length=r.rollout.max_new_tokens, num_sequences=n, num_tokens=n_tok,
            )
            loss.backward()
            release_memory()
            loss_total += loss.item()
            w = st["num_tokens"].item() / max(n_tok, 1)  # token-weighted means over the batch
            for k in ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean"):
                sums[f"{k}@{it}"] = sums.get(f"{k}@{it}", 0.0) + w * st[k].item()
            if ent is not None:
                m = sub.completion_mask.float()
                sums["entropy"] = sums.get("entropy", 0.0) + float((ent * m).sum()) / max(n_all, 1)
        sums[f"loss@{it}"] = loss_total
        clip = t.max_grad_norm if t.max_grad_norm > 0 else float("inf")
        gn = float(torch.nn.utils.clip_grad_norm_(s.model.parameters(), clip))
        grad_norms.append(gn)
        lrs.append(float(s.optimizer.param_groups[0]["lr"]))  # the rate this update uses (before the schedule moves)
        if gn == 0.0:  # nothing to learn from (no signal, or every row filtered): an optimizer step
            zero_grad += 1  # would move the weights by momentum and weight decay alone
            s.state.consecutive_skips = 0
        elif math.isfinite(gn) and math.isfinite(loss_total):
            s.optimizer.step()
            s.state.consecutive_skips = 0
        else:
            skipped += 1
            s.state.consecutive_skips += 1
        with warnings.catch_warnings():  # the schedule follows updates applied or not
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*optimizer.step")
            s.scheduler.step()
    s.optimizer.zero_grad(set_to_none=True)
    mu = t.num_iterations
    out = {k: sum(sums[f"{k}@{i}"] for i in range(mu)) / mu for k in ("loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean")}
    out.update(entropy=sums.get("entropy"), grad_norm=sum(grad_norms) / len(grad_norms),
               lr=sum(lrs) / len(lrs), skipped_updates=skipped, zero_grad_updates=zero_grad, ref_s=ref_s)
    return out


#: a kind of warning repeats at most once per this many steps (each step's metrics say it anyway)
WARN_EVERY_STEPS = 10


def warn_if_step_did_nothing(s: Setup, metrics: dict[str, Any], advantages: torch.Tensor) -> list[str]:
    """Warn (``RunWarning``) when a step carried no or little learning signal; returns the kinds.

    - ``truncated``: at least :data:`TRUNCATED_WARN_FRAC` of the completions hit
      ``rollout.max_new_tokens`` (their ends, and a final answer, were never seen);
    - ``no_signal``: every advantage is exactly 0 (every group's rewards equal, or unscorable):
      the policy-gradient term of the update is zero;
    - ``reward_failures``: reward rows raised or timed out and were scored unscorable;
    - ``skipped_update``: an update was skipped as non-finite.

    Each kind is said on its first step and then at most once every :data:`WARN_EVERY_STEPS`
    steps (the metrics line of every step has the numbers: ``truncated_frac``, ``frac_zero_std``,
    ``unscorable_frac``, ``reward_failures``, ``skipped_updates``).
    """
    step, r = metrics["step"], s.recipe
    found: dict[str, str] = {}
    if metrics["truncated_frac"] >= TRUNCATED_WARN_FRAC:
        found["truncated"] = (
            f"{metrics['truncated_frac']:.0%} of the completions reached rollout.max_new_tokens="
            f"{r.rollout.max_new_tokens} without an EOS; raise rollout.max_new_tokens (or ask for "
            "shorter answers) so that rewards see whole answers")
    if not bool(advantages.ne(0).any()):
        why = ("every reward was unscorable" if metrics["unscorable_frac"] == 1.0 else
               f"every group's rewards were equal (frac_zero_std={metrics['frac_zero_std']:.2f}, "
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
    last = getattr(s, "warned_at", None)
    if last is None:
        last = s.warned_at = {}  # kind -> step it was last said
    for kind, text in found.items():
        if kind not in last or step - last[kind] >= WARN_EVERY_STEPS:
            last[kind] = step
            warnings.warn(f"step {step}: {text}", RunWarning, stacklevel=2)
    return list(found)


def train(recipe: Recipe, *, progress: bool = True) -> dict[str, Any]:
    """Run GRPO as the recipe says; returns a summary (last metrics, eval results, paths)."""
    out = Path(recipe.train.output_dir)
    start = find_resume_checkpoint(out, recipe.train.resume)  # a bad train.resume fails first
    s = prepare(recipe)  # validates data and rewards before any model loads, then loads models
    logger = RunLogger(out)
    summary: dict[str, Any] = {"output_dir": str(out)}
    if start is not None:
        state, blob = load_training_state(start)
        s.load_weights(start)
        s.optimizer.load_state_dict(blob["optimizer"])
        s.scheduler.load_state_dict(blob["scheduler"])
        set_rng_state(blob["rng"])
        s.state = TrainState(step=state["step"], epoch=state["epoch"], position=state["position"],
                             consecutive_skips=state.get("consecutive_skips", 0),
                             extra=state.get("extra", {}))
        logger.truncate_after(s.state.step)
        summary["resumed_from"] = str(start)
        print(f"[grpokit] resumed from {start} at step {s.state.step}", flush=True)
    else:
        logger.truncate_after(0)  # a fresh run replaces the metrics of an earlier run in this folder
        if recipe.eval.dataset and recipe.eval.before:
            summary["eval_before"] = s.run_eval("before")
    bar = s.progress_bar(progress)
    last: dict[str, Any] = {}
    with _StopFlag() as stop:
        while s.state.step < recipe.train.max_steps:
            last = run_step(s, logger)
            bar.update(1)
            bar.set_postfix(reward=f"{last['reward_mean'] or 0:.3f}", step_s=f"{last['step_s']:.1f}")
            step = s.state.step
            if s.state.consecutive_skips >= recipe.train.max_consecutive_skips:
                raise RuntimeError(f"{s.state.consecutive_skips} consecutive non-finite updates "
                                   f"(loss or gradient norm) up to step {step}; stopping. See metrics.jsonl.")
            every = recipe.train.save_steps
            if (every and step % every == 0) or stop.requested or step == recipe.train.max_steps:
                s.checkpoint(logger)
            if stop.requested:
                summary["stopped_at"] = step
                break
    bar.close()
    summary["last_metrics"] = last
    if not stop.requested:
        if recipe.eval.dataset and recipe.eval.after:
            done = getattr(s, "last_eval", None)  # the last step's periodic evaluation is this one
            summary["eval_after"] = (s.save_eval(dict(done[1], when="after"), "after")
                                     if done is not None and done[0] == s.state.step else s.run_eval("after"))
        if logger.metrics_path.exists():
            before = out / "eval_before.json"  # also there when this process resumed the run
            plot_curves(logger.metrics_path, out / "curves.png", beta=recipe.algo.beta,
                        num_iterations=recipe.train.num_iterations,
                        before=json.loads(before.read_text()) if before.exists() else None)
    logger.close()
    s.write_summary(summary)
    return summary


def sample_and_score(s: Setup, step: int, n_prompts: int, *, round_: int):
    """Steps 1-4 for ``n_prompts`` new prompts: ``(rows, rollout, scored, reward_s)``. Round 0 is
    seeded ``seed·100003 + step`` (as always); dynamic sampling's extra rounds add ``1000003·round``."""
    seed = s.recipe.train.seed
    idx = next_prompt_indices(s.state, len(s.rows), n_prompts, seed)
    rows = [s.rows[i] for i in idx]
    rollout = s.generate([s.prompts[i] for i in idx], seed=seed * 100003 + step + 1000003 * round_)
    release_memory()
    t_reward = time.perf_counter()
    scored = score_rollout(s, rows, rollout)
    return rows, rollout, scored, time.perf_counter() - t_reward


def refill_groups_with_signal(s: Setup, step: int, rows: list[dict], rollout, scored: dict):
    """Dynamic sampling (DAPO, arXiv 2503.14476 §3.2): groups whose rewards are all equal
    (``algo.constant_groups``: advantage 0, no signal) are dropped and replaced by groups of new
    prompts, sampled in up to ``algo.max_sampling_rounds`` extra rounds, until B groups carry
    signal. If the rounds run out, the step trains on the groups with signal it has (fewer than
    B); if it has none, on round 0's batch as it is (the "no learning signal" warning says so).

    Advantages are recomputed over the kept groups (batch scaling sees the batch trained on); the
    reward metrics stay those of round 0 (the policy's own rate on fresh prompts), except
    ``reward_failures`` and the rollout's ``gen_s``, summed over every round; ``dynamic/rounds``,
    ``dynamic/groups_sampled``, ``dynamic/groups_kept`` are added.
    Returns ``(rows, rollout, scored, extra_reward_s)``.
    """
    from grpokit.rollout.hf import concat_rollouts

    a, g, b = s.recipe.algo, s.recipe.rollout.group_size, s.recipe.train.prompts_per_step
    kept_rows, parts, rewards, extra_s, rounds, sampled = [], [], [], 0.0, 0, len(rows)
    cur_rows, cur, cur_scored = rows, rollout, scored
    gen_s, failures = 0.0, 0  # over every round, dropped ones included
    while True:
        gen_s, failures = gen_s + cur.gen_s, failures + cur_scored["metrics"]["reward_failures"]
        signal_groups = (~algo.constant_groups(cur_scored["rewards"], g)).nonzero().flatten().tolist()
        take = signal_groups[: b - len(kept_rows)]
        if take:
            kept_rows += [cur_rows[i] for i in take]
            parts.append(cur.select_groups(take))
            rewards.append(cur_scored["rewards"].view(-1, g)[take].flatten())
        if len(kept_rows) >= b or rounds >= a.max_sampling_rounds:
            break
        rounds += 1
        cur_rows, cur, cur_scored, dt = sample_and_score(s, step, b - len(kept_rows), round_=rounds)
        extra_s, sampled = extra_s + dt, sampled + len(cur_rows)
    metrics = dict(scored["metrics"], reward_failures=failures,
                   **{"dynamic/rounds": rounds, "dynamic/groups_sampled": sampled, "dynamic/groups_kept": len(kept_rows)})
    if not kept_rows:
        rollout.gen_s = gen_s
        return rows, rollout, dict(scored, metrics=metrics), extra_s
    r = torch.cat(rewards)
    adv = algo.group_advantages(r, g, scale=a.advantage_scale, eps=a.advantage_eps).float()
    out = concat_rollouts(parts, s.tokenizer.pad_token_id)
    out.gen_s = gen_s
    return kept_rows, out, {"rewards": r, "advantages": adv, "metrics": metrics}, extra_s


def run_step(s: Setup, logger: RunLogger) -> dict[str, Any]:
    """One GRPO step (1-7 in the module docstring); returns its metrics line."""
    recipe = s.recipe
    t_start = time.perf_counter()
    step = s.state.step + 1
    rows, rollout, scored, reward_s = sample_and_score(s, step, recipe.train.prompts_per_step, round_=0)
    if recipe.algo.dynamic_sampling:
        rows, rollout, scored, extra_s = refill_groups_with_signal(s, step, rows, rollout, scored)
        reward_s += extra_s
    batch = Batch(rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
    keep = ~rollout.truncated if recipe.algo.overlong_filter else None  # DAPO overlong filtering
    if keep is not None:
        scored["metrics"]["overlong_filtered_frac"] = float(rollout.truncated.float().mean())
    t_train = time.perf_counter()
    opt = optimize(s, batch, scored["advantages"], keep_rows=keep)
    train_s = time.perf_counter() - t_train
    s.state.step = step
    lengths = rollout.completion_mask.sum(1).float()
    step_s = time.perf_counter() - t_start
    s.state.extra["train_s"] = s.state.extra.get("train_s", 0.0) + step_s  # checkpointed: resumes count on
    metrics = {
        "step": step, **scored["metrics"], **opt,
        "completion_len_mean": float(lengths.mean()),
        "truncated_frac": float(rollout.truncated.float().mean()),
        "step_s": step_s, "gen_s": rollout.gen_s, "reward_s": reward_s, "train_s": train_s,
        "tokens_per_s": float(lengths.sum()) / step_s,
    }
    metrics["train_minutes"] = s.state.extra["train_s"] / 60  # training wall-clock so far, evaluations excluded
    e = recipe.eval
    if e.dataset and e.every_steps and step % e.every_steps == 0:
        res = s.run_eval(f"step{step}")
        s.last_eval = (step, res)
        for name, m in (res["metrics"] or {}).get("metrics", {}).items():
            metrics.update({f"eval/{name}": m["value"], f"eval/{name}_lo": m["lo"], f"eval/{name}_hi": m["hi"]})
    logger.log(metrics)
    warn_if_step_did_nothing(s, metrics, scored["advantages"])
    every, g = recipe.train.sample_every, recipe.rollout.group_size
    if every and (step % every == 0 or step == 1):
        logger.log_samples(step, [
            {"prompt": rows[i // g]["prompt"], "answer": rows[i // g]["answer"],
             "completion": rollout.completions[i], "reward": float(r) if math.isfinite(r) else None}
            for i, r in enumerate(scored["rewards"].tolist())
        ])
    return metrics
