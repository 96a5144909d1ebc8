"""Benchmark child: TRL's ``GRPOTrainer`` (pinned ``trl==1.16.0``) on the same workload.

Run by ``bench_vs_trl.py`` with ``.venv-bench/bin/python``; writes one JSON ``Result``.

Matched to grpokit: the same cached model folder (policy and a reference model, β = 0.04), the same
chat prompts in grpokit's order (``shuffle_dataset=False``), G completions per prompt, one
generation of ``B·G`` completions per optimizer step (``generation_batch_size = B·G``,
``gradient_accumulation_steps = B·G / micro_batch_size``; so μ = 1 and no π_old pass, as in
grpokit), temperature 1, top-p 1, top-k off, the same reward (grpokit's ``math_correct``),
``loss_type="grpo"`` (grpokit's default sequence-mean-of-token-means), ε = 0.2, lr 1e-6.

Phases: generation = TRL's own ``transformers.generate`` profiling block; log-prob/ref =
``_get_per_token_logps_and_entropies`` calls without gradient; rewards = ``_calculate_rewards``;
the rest of the step (forward with gradient, backward, optimizer) is "train".
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

from _common import (  # noqa: E402
    Clock,
    Result,
    StepRecord,
    load_avg,
    model_path,
    ordered_rows,
    peak_rss_gb,
    versions,
    workload_from_args,
    workload_parser,
)


def main() -> None:
    ap = workload_parser(
        __doc__.splitlines()[0],
        "fp32; bf16_autocast = TrainingArguments(bf16=True) (accelerate autocast); "
        "bf16 = parameters loaded in bf16 as well",
    )
    a = ap.parse_args()
    w = workload_from_args(a)
    res = Result(
        peer="trl", setting=a.precision, workload=vars(w) | {"N": w.N}, load_avg_before=load_avg(), versions=versions()
    )

    import trl.extras.profiling as profiling
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpokit.rewards import math_correct

    path = model_path()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    rows = ordered_rows(tok, w)
    dataset = Dataset.from_list([{"prompt": r["prompt_text"], "answer": str(r["answer"])} for r in rows])

    def math_correct_reward(prompts, completions, answer, **_):
        return math_correct(prompts, completions, answer=answer)

    math_correct_reward.__name__ = "math_correct"
    clock = Clock()
    counts = {"train_tokens": 0, "train_tokens_padded": 0, "completion_tokens": 0, "rows": 0}
    # TRL feeds [prompt ; completion] per row, so the tokens it processes are the sequence tokens.

    # TRL times its blocks with ProfilingContext and only sends them to wandb/mlflow: collect them.
    orig_log = profiling.ProfilingContext._log_metrics

    def log_metrics(self, duration):
        clock.add(self.name.split(".", 1)[-1], duration)  # "GRPOTrainer.transformers.generate"
        return orig_log(self, duration)

    profiling.ProfilingContext._log_metrics = log_metrics

    if a.micro_batch_size > w.N or w.N % a.micro_batch_size:
        raise SystemExit(f"micro batch {a.micro_batch_size} must divide N = {w.N}")
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            seed=w.seed,
            data_seed=w.seed,
            bf16=a.precision in ("bf16_autocast", "bf16"),
            fp16=False,
            model_init_kwargs={"dtype": torch.bfloat16 if a.precision == "bf16" else torch.float32},
            per_device_train_batch_size=a.micro_batch_size,
            gradient_accumulation_steps=w.N // a.micro_batch_size,
            num_generations=w.G,
            max_completion_length=w.max_new_tokens,
            temperature=w.temperature,
            top_p=1.0,
            top_k=0,
            min_p=None,
            repetition_penalty=1.0,
            beta=w.beta,
            num_iterations=1,
            epsilon=0.2,
            loss_type="grpo",
            scale_rewards="group",
            learning_rate=w.learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            max_steps=w.steps,
            shuffle_dataset=False,
            disable_dropout=True,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            log_completions=False,
            dataloader_num_workers=0,
            gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(
            model=path, reward_funcs=[math_correct_reward], args=args, train_dataset=dataset, processing_class=tok
        )
        res.n_params = sum(p.numel() for p in trainer.model.parameters())
        orig_logps = trainer._get_per_token_logps_and_entropies

        def logps(model, input_ids, attention_mask, logits_to_keep, *args_, **kw):
            if torch.is_grad_enabled():  # the policy's training forward (compute_loss)
                counts["train_tokens"] += int(attention_mask.sum())
                counts["train_tokens_padded"] += input_ids.numel()
                counts["completion_tokens"] += int(attention_mask[:, -logits_to_keep:].sum())
                counts["rows"] += input_ids.shape[0]
                return orig_logps(model, input_ids, attention_mask, logits_to_keep, *args_, **kw)
            with clock.timed("logp_ref"):
                return orig_logps(model, input_ids, attention_mask, logits_to_keep, *args_, **kw)

        trainer._get_per_token_logps_and_entropies = logps

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                clock.pop()
                for k in counts:
                    counts[k] = 0
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                step_s = time.perf_counter() - self.t0
                ph = clock.pop()
                gen = ph.get("transformers.generate", 0.0)
                lr = ph.get("logp_ref", 0.0)
                reward = ph.get("_calculate_rewards", 0.0)
                n = max(counts["rows"], 1)
                rec = StepRecord(
                    step=state.global_step,
                    step_s=step_s,
                    gen_s=gen,
                    logp_ref_s=lr,
                    train_s=step_s - gen - lr - reward,
                    completion_tokens=counts["completion_tokens"],
                    completion_len_mean=counts["completion_tokens"] / n,
                    train_tokens=counts["train_tokens"],
                    train_tokens_padded=counts["train_tokens_padded"],
                    sequence_tokens=counts["train_tokens"],
                )
                res.steps.append(vars(rec))
                print(
                    f"[trl {a.precision}] step {rec.step}: {rec.step_s:.1f}s (gen {gen:.1f}, logp/ref {lr:.1f}, "
                    f"train {rec.train_s:.1f}); len {rec.completion_len_mean:.1f}",
                    flush=True,
                )

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and res.steps and "reward" in logs:
                    res.steps[-1]["reward_mean"] = logs.get("reward")
                    res.steps[-1]["loss"] = logs.get("loss")

        trainer.add_callback(StepTimer())
        trainer.train()
        res.notes["trl_generation_config"] = {
            k: v for k, v in trainer.generation_kwargs.items() if isinstance(v, (int, float, str, list, type(None)))
        }
    res.peak_rss_gb = peak_rss_gb()
    res.load_avg_after = load_avg()
    res.write(a.out)


if __name__ == "__main__":
    main()
