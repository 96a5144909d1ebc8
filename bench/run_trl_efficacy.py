"""Efficacy child: TRL's ``GRPOTrainer`` (pinned ``trl==1.16.0``) trained on a grpokit recipe.

Run by ``efficacy_vs_trl.py`` with ``.venv-bench/bin/python`` (grpokit is installed there, editable):

    python bench/run_trl_efficacy.py --recipe recipes/arith.yaml --result OUT/trl_run.json \\
        train.seed=0 train.output_dir=OUT/trl-seed0

Saves the policy (weights only) every ``eval.every_steps`` optimizer steps and at the last one, as
``<train.output_dir>/checkpoint-<step>``; the parent then scores them with grpokit's own evaluation
by running this script again, with ``--evaluate``, in grpokit's venv (:func:`evaluate_checkpoints`).
Writes ``--result``: per checkpoint the cumulative training minutes (wall-clock from the start of
training, the time spent saving checkpoints left out), per step TRL's logged metrics.

What is matched to grpokit, and why:

- Work: the recipe's model folder, the training rows grpokit keeps (``grpokit.data.rows.section_rows``
  + ``load_prompts``: same chat template, same length filter) taken in grpokit's order
  (``grpokit.trainer.state.next_prompt_indices``, ``shuffle_dataset=False``); G = ``rollout.group_size``,
  B = ``train.prompts_per_step``; ``generation_batch_size = B·G`` with micro-batches of
  ``train.micro_batch_size``, so TRL generates once per optimizer step and μ = 1 (no π_old pass).
- Sampling: ``rollout.temperature``, top-p 1, top-k 0, no min-p, no repetition penalty (grpokit
  refuses truncated sampling), ``max_completion_length = rollout.max_new_tokens``.
- Reward: one TRL reward function that calls grpokit's ``compute_rewards`` with the recipe's
  functions and weights (``grpokit.rewards.pipeline.RewardPipeline``) on the same columns grpokit passes (the
  raw question as ``prompt``, ``answer``, ``rg_entry``, ...). One function rather than one per
  name: grpokit's rule that a None component makes the total None (unscorable: advantage 0) is kept;
  TRL's ``nansum`` over several functions would count it as 0.
- Objective: β = ``algo.beta``, ε = ``algo.clip_eps_low``, ε_high = ``algo.clip_eps_high``,
  ``scale_rewards`` = ``algo.advantage_scale`` (TRL's std is the sample std plus 1e-4, grpokit's
  ``advantage_eps`` default), and the loss aggregation:

      grpokit token_mean               -> TRL "dapo":    Σ_i Σ_t l_it / (completion tokens of the whole
                                          step's batch); TRL's ``num_items_in_batch`` spans the
                                          generation batch, which here is the optimizer step's batch.
                                          ("bnpo" divides by each micro-batch's own token count:
                                          equal only when every micro-batch has as many tokens.)
      grpokit seq_mean_token_mean      -> TRL "grpo"     (per-sequence token means, averaged)
      grpokit seq_mean_token_sum_norm  -> TRL "dr_grpo"  (Σ / (N · max_completion_length))

- Optimizer: TRL's own AdamW (``adamw_torch_fused``, as grpokit's ``torch.optim.AdamW(fused=True)``)
  with the recipe's lr, betas, weight decay, eps 1e-8, ``max_grad_norm = train.max_grad_norm``. The
  schedule is grpokit's own function (``make_optimizer``'s LambdaLR factor), installed by
  overriding ``create_scheduler``: HF's nearest built-in, ``constant_with_warmup`` with
  ``warmup_steps=W``, gives factors 0, 1/W, 2/W, ... where grpokit gives 1/(W+1), 2/(W+1), ...; its
  first update would run at lr 0, one step of training lost to TRL alone.
- Precision and memory: ``model.dtype`` / ``model.autocast_bf16`` / ``model.gradient_checkpointing``
  as the recipe says (fp32, no autocast, no checkpointing for arith); dropout off (grpokit keeps the
  model in ``eval()``); CPU.

Refused (no TRL equivalent in this setting, or not matched here): μ > 1, dynamic sampling, overlong
filtering, process supervision, a KL estimator other than k3 with β > 0.

Left unmatched (each peer's own behaviour, not a setting):
- the random draws: grpokit samples with its own seeded sampler (``rollout.sampler``), TRL with
  ``generate``'s ``torch.multinomial`` on the global RNG: same distribution, different completions;
- a step whose gradient is exactly zero (every group's rewards equal): grpokit skips the optimizer
  step (and non-finite ones), TRL's AdamW still steps and moves the weights by its momentum;
- weight decay: HF leaves biases and norm weights undecayed, grpokit decays every parameter (the
  same at ``train.weight_decay=0``, as in the arith recipe);
- group statistics in float64 (grpokit) vs float32 (TRL); the clock: TRL's counts everything
  between ``on_train_begin`` and the step's end (its logging included), grpokit's sums its steps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_mean_token_sum_norm": "dr_grpo"}
HF_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def check_supported(recipe) -> None:
    """Raise SystemExit naming the recipe key when a setting has no matched TRL counterpart here."""
    a, t = recipe.algo, recipe.train
    bad = []
    if t.num_iterations != 1:
        bad.append(f"train.num_iterations={t.num_iterations} (only μ = 1 is matched)")
    if a.dynamic_sampling:
        bad.append("algo.dynamic_sampling=true")
    if a.overlong_filter:
        bad.append("algo.overlong_filter=true")
    if a.supervision != "outcome":
        bad.append(f"algo.supervision={a.supervision}")
    if a.beta > 0 and a.kl_estimator != "k3":
        bad.append(f"algo.kl_estimator={a.kl_estimator} (TRL uses k3)")
    if t.optimizer != "adamw":
        bad.append(f"train.optimizer={t.optimizer}")
    n = t.prompts_per_step * recipe.rollout.group_size
    if n % t.micro_batch_size:
        bad.append(f"train.micro_batch_size={t.micro_batch_size} must divide B·G = {n}")
    if bad:
        raise SystemExit("run_trl_efficacy: not matched to TRL: " + "; ".join(bad))


def ordered_rows(recipe, tokenizer, max_positions: int | None) -> tuple[list[dict], list[str], list[int]]:
    """grpokit's training rows and chat prompts (as ``build_run`` builds them), and the row index of
    every prompt of every step, in the order grpokit's trainer takes them."""
    from grpokit.data.rows import load_prompts, section_rows
    from grpokit.trainer.state import TrainState, next_prompt_indices

    d, t = recipe.data, recipe.train
    rows, prompts, _ = load_prompts(
        recipe,
        tokenizer,
        dataset=d.dataset,
        split=d.split,
        limit=d.limit,
        rows=section_rows(recipe, "data"),
        max_new_tokens=recipe.rollout.max_new_tokens,
        max_positions=max_positions,
    )
    state, order = TrainState(), []
    for _ in range(t.max_steps):
        order += next_prompt_indices(state, len(rows), t.prompts_per_step, t.seed)
    return rows, prompts, order


def grpokit_schedule(recipe):
    """The learning-rate factor function of grpokit's ``make_optimizer`` (its LambdaLR's lambda)."""
    import torch

    from grpokit.trainer.optim import make_optimizer

    _, sched = make_optimizer(torch.nn.Linear(1, 1), recipe.train)
    return sched.lr_lambdas[0]


def evaluate_checkpoints(recipe_path: str, overrides: list[str], result_path: Path) -> None:
    """``--evaluate`` (run with grpokit's own venv): score the base model and every checkpoint listed
    in ``result_path`` with grpokit's held-out evaluation (``build_run(recipe).evaluator``): the held-out
    rows it gives for this recipe and seed, greedy, ``eval.max_new_tokens``, the recipe's scorer, the
    model prepared as grpokit prepares its own (``build_run``: speed backend, eval mode, EOS ids), the
    weights read by ``grpokit.trainer.checkpoint.load_model_weights``. Writes ``eval_before.json`` and
    ``eval_step<N>.json`` next to the checkpoints (``train.output_dir``)."""
    import warnings

    from grpokit.config import load_recipe
    from grpokit.metrics import RunWarning
    from grpokit.trainer.build import build_run
    from grpokit.trainer.checkpoint import load_model_weights

    result = json.loads(result_path.read_text())
    show = warnings.showwarning  # a RunWarning is one line, as `grpokit train` prints it
    warnings.showwarning = lambda msg, cat, *a, **k: (
        print(f"[grpokit] warning: {msg}", file=sys.stderr) if issubclass(cat, RunWarning) else show(msg, cat, *a, **k)
    )
    run = build_run(load_recipe(recipe_path, overrides))

    def evaluate(when: str) -> None:
        run.evaluator.run(run.eval_engine, run.out, when)

    evaluate("before")
    for c in sorted(result["checkpoints"], key=lambda c: c["step"]):
        load_model_weights(run.model, Path(c["path"]))
        evaluate(f"step{c['step']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--result", required=True, help="JSON written at the end (read with --evaluate)")
    ap.add_argument(
        "--evaluate",
        action="store_true",
        help="score the checkpoints of --result with grpokit's "
        "evaluation instead of training (run it with grpokit's own venv)",
    )
    ap.add_argument(
        "overrides", nargs="*", help="section.key=value recipe overrides (train.seed, train.output_dir, ...)"
    )
    a = ap.parse_args()
    if a.evaluate:
        return evaluate_checkpoints(a.recipe, a.overrides, Path(a.result))

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpokit.config import load_recipe
    from grpokit.models.loading import encode_prompts, load_tokenizer, model_max_positions, resolve_model_path
    from grpokit.rewards import compute_rewards
    from grpokit.rewards.pipeline import RewardPipeline

    recipe = load_recipe(a.recipe, a.overrides)
    check_supported(recipe)
    m, r, al, t, e = recipe.model, recipe.rollout, recipe.algo, recipe.train, recipe.eval
    out = Path(t.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(t.seed)
    path = resolve_model_path(m.name_or_path)
    tok = load_tokenizer(m.name_or_path, trust_remote_code=m.trust_remote_code)
    rows, prompts, order = ordered_rows(
        recipe, tok, model_max_positions(m.name_or_path, trust_remote_code=m.trust_remote_code)
    )
    row_columns = sorted({k for row in rows for k in row} - {"prompt"})
    dataset = Dataset.from_list([{"prompt": prompts[i], "row_id": i} for i in order])
    # TRL tokenizes string prompts with the tokenizer's special tokens; grpokit adds exactly one BOS
    used = sorted(set(order))
    same_ids = encode_prompts(tok, [prompts[i] for i in used]) == tok(text=[prompts[i] for i in used])["input_ids"]
    if not same_ids:
        print("[trl efficacy] warning: TRL's prompt token ids differ from grpokit's (BOS handling)", flush=True)

    pipeline = RewardPipeline.from_config(recipe.rewards)
    funcs, weights = pipeline.funcs, pipeline.weights

    def grpokit_reward(prompts, completions, row_id, **_):
        rs = [rows[i] for i in row_id]
        cols = {k: [row.get(k) for row in rs] for k in row_columns}
        total, _ = compute_rewards(funcs, weights, [row["prompt"] for row in rs], list(completions), cols)
        result["questions"].append([row["prompt"] for row in rs])  # one call per step: the parent checks the order
        return total

    every = e.every_steps or t.max_steps
    n = t.prompts_per_step * r.group_size
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        seed=t.seed,
        data_seed=t.seed,
        report_to="none",
        bf16=m.autocast_bf16,
        fp16=False,
        gradient_checkpointing=m.gradient_checkpointing,
        model_init_kwargs={"dtype": torch.bfloat16 if m.dtype == "bfloat16" else torch.float32},
        trust_remote_code=m.trust_remote_code,
        disable_tqdm=True,
        per_device_train_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=n // t.micro_batch_size,
        generation_batch_size=n,
        num_generations=r.group_size,
        num_iterations=1,
        shuffle_dataset=False,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        beta=al.beta,
        epsilon=al.clip_eps_low,
        epsilon_high=al.clip_eps_high,
        loss_type=LOSS_TYPES[al.loss_aggregation],
        scale_rewards=al.advantage_scale,
        mask_truncated_completions=False,
        learning_rate=t.learning_rate,
        lr_scheduler_type=HF_SCHEDULES[t.lr_scheduler],
        warmup_steps=t.warmup_steps,
        optim="adamw_torch_fused",
        adam_beta1=t.adam_betas[0],
        adam_beta2=t.adam_betas[1],
        adam_epsilon=1e-8,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        max_steps=t.max_steps,
        disable_dropout=True,
        logging_steps=1,
        log_completions=False,
        dataloader_num_workers=0,
        save_strategy="steps",
        save_steps=every,
        save_only_model=True,
        save_total_limit=None,
    )
    if args.steps_per_generation != args.gradient_accumulation_steps:
        raise SystemExit(
            f"run_trl_efficacy: {args.steps_per_generation} generations per optimizer step's "
            f"{args.gradient_accumulation_steps} micro-batches; expected one generation per step"
        )
    factor = grpokit_schedule(recipe)

    class Trainer(GRPOTrainer):
        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:  # grpokit's schedule (module docstring)
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, factor)
                self._created_lr_scheduler = True
            return self.lr_scheduler

    result = {
        "peer": "trl",
        "recipe": a.recipe,
        "overrides": a.overrides,
        "checkpoints": [],
        "steps": [],
        "questions": [],
        "notes": {"loss_type": args.loss_type, "prompt_ids_match_grpokit": same_ids},
    }

    class Clock(TrainerCallback):
        """Training wall-clock since ``on_train_begin``, the seconds spent saving checkpoints left out."""

        def on_train_begin(self, args, state, control, **kw):
            self.t0, self.saving, self.t_end, self.minutes = time.perf_counter(), 0.0, None, 0.0

        def on_step_end(self, args, state, control, **kw):
            self.t_end = time.perf_counter()
            self.minutes = (self.t_end - self.t0 - self.saving) / 60
            result["steps"].append({"step": state.global_step, "train_minutes": self.minutes})
            if state.global_step >= state.max_steps:
                control.should_save = True  # the last step is evaluated too
            print(
                f"[trl efficacy] step {state.global_step}/{state.max_steps}: {self.minutes:.2f} training minutes",
                flush=True,
            )

        def on_save(self, args, state, control, **kw):
            now = time.perf_counter()
            self.saving += now - self.t_end
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not any(c["step"] == state.global_step for c in result["checkpoints"]):
                result["checkpoints"].append(
                    {
                        "step": state.global_step,
                        "train_minutes": self.minutes,
                        "path": str(ckpt),
                        "save_s": now - self.t_end,
                    }
                )
            self.t_end = now

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and result["steps"] and result["steps"][-1]["step"] == state.global_step:
                result["steps"][-1].update({k: v for k, v in logs.items() if isinstance(v, (int, float))})

    trainer = Trainer(
        model=path,
        reward_funcs=[grpokit_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Clock()],
    )
    result["notes"]["generation_kwargs"] = {
        k: v for k, v in trainer.generation_kwargs.items() if isinstance(v, (int, float, str, list, type(None)))
    }
    result["notes"]["eos_token_ids"] = list(trainer.eos_token_ids)
    try:
        trainer.train()
    finally:
        for f in funcs.values():
            f.close()
    import transformers
    import trl

    result["versions"] = {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    Path(a.result).write_text(json.dumps(result, indent=1))
    print(f"[trl efficacy] done: {len(result['checkpoints'])} checkpoints in {out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
