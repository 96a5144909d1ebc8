"""Benchmark child: grpokit's own training loop (``grpokit.trainer.loop.run_step``) on the workload.

Run by ``bench_vs_trl.py`` in the main ``.venv``; writes one JSON ``Result``. Phases come from the
loop's own timers in each step's metrics (``gen_s``: generation, ``ref_s``: the no-grad log-prob
passes, ``reward_s``: rewards); the rest of the step is the policy forward with gradient, backward
and optimizer step. The settings compared (``--plain``, ``--bf16-sampler``) are set on the run's
parts (the engine's ``generate_options`` and ``sampler_dtype``, the log-prob scorer's
``share_prompt``); nothing in the trainer is replaced.

    python bench/run_grpokit.py --out r.json --precision bf16_autocast --steps 4 [--parity]
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

from _common import (  # noqa: E402
    MODEL_ALIAS,
    Result,
    StepRecord,
    Workload,
    load_avg,
    ordered_rows,
    peak_rss_gb,
    versions,
    workload_from_args,
    workload_parser,
)


def build_recipe(w: Workload, out_dir: str, recompute_mlp: bool | None = None, backend: str = "auto"):
    """The workload as a grpokit recipe. ``recompute_mlp`` None: off at fp32 (comparison (a) runs
    without recomputation, as it runs without gradient checkpointing: the fused MLP keeps gate(x)
    and up(x) for its backward), on at bf16 (its memory is what setting (b) is measured on).
    ``backend``: ``model.backend`` (auto = the cpu backend on this CPU-only benchmark)."""
    from grpokit.config import recipe_from_dict

    bf16 = w.precision == "bf16"  # bf16 parameters: AdamW with stochastic rounding, bf16 states
    model = {
        "name_or_path": MODEL_ALIAS,
        "dtype": "bfloat16" if bf16 else "float32",
        "autocast_bf16": w.precision == "bf16_autocast",
        "backend": backend,
        "recompute_mlp": w.precision != "fp32" if recompute_mlp is None else recompute_mlp,
    }
    return recipe_from_dict(
        {
            "model": model,
            "data": {"dataset": "gsm8k", "split": "train"},
            "rollout": {"group_size": w.G, "max_new_tokens": w.max_new_tokens, "temperature": w.temperature},
            "rewards": {"functions": ["math_correct"]},
            "algo": {"beta": w.beta},
            "train": {
                "prompts_per_step": w.B,
                "max_steps": w.steps,
                "micro_batch_size": w.micro_batch_size,
                "learning_rate": w.learning_rate,
                "seed": w.seed,
                "output_dir": out_dir,
                "optimizer": "adamw_bf16_sr" if bf16 else "adamw",
                "sample_every": 0,
                "save_steps": 0,
            },
        }
    )


def _processed_tokens(batch, share: bool) -> tuple[int, int]:
    """(non-padding, padded) tokens one ``completion_logprobs`` call runs through the model."""
    from grpokit.models.logprobs import distinct_rows

    n, p = batch.prompt_ids.shape
    t = batch.completion_ids.shape[1]
    pm, cm = batch.prompt_mask, batch.completion_mask
    if share and n > 1 and p > 1:
        first, _ = distinct_rows(batch.prompt_ids, pm)
        if len(first) < n:  # prefix once per distinct prompt, then T tokens per row
            real = int(pm[first, : p - 1].sum()) + n + int(cm[:, :-1].sum())
            return real, len(first) * (p - 1) + n * t
    return int(pm.sum() + cm.sum()), n * (p + t)


def _trained_tokens(batch, t, share: bool) -> dict[str, int]:
    """The tokens the gradient passes ran: every micro-batch of ``train.micro_batch_size`` rows (padding
    columns cut, as the loop cuts them), once per pass (μ = ``train.num_iterations``)."""
    out = {"train_tokens": 0, "train_tokens_padded": 0, "sequence_tokens": 0}
    for _, mb in batch.micro_batches(t.micro_batch_size):
        real, padded = _processed_tokens(mb, share)
        out["train_tokens"] += real * t.num_iterations
        out["train_tokens_padded"] += padded * t.num_iterations
        out["sequence_tokens"] += int(mb.prompt_mask.sum() + mb.completion_mask.sum()) * t.num_iterations
    return out


def main() -> None:
    ap = workload_parser(__doc__.splitlines()[0])
    ap.add_argument(
        "--plain",
        action="store_true",
        help="switch off the cpu backend's prompt sharing, static generation cache and packed weights "
        "(its fused ops stay; --backend plain drops the whole backend)",
    )
    ap.add_argument(
        "--backend",
        choices=("auto", "cpu", "plain"),
        default="auto",
        help="model.backend (auto: cpu here; plain: the stock transformers forward and generate)",
    )
    ap.add_argument(
        "--bf16-sampler",
        action="store_true",
        help="sample from a bf16 copy of the policy (generate_rollouts(sampler_dtype=torch.bfloat16))",
    )
    ap.add_argument(
        "--recompute-mlp",
        choices=("auto", "on", "off"),
        default="auto",
        help="model.recompute_mlp (auto: off at fp32, on otherwise)",
    )
    ap.add_argument(
        "--parity",
        action="store_true",
        help="after the steps: loss/grad of this setting vs the plain fp32 path on the last batch",
    )
    a = ap.parse_args()
    w = workload_from_args(a)
    setting = (
        a.precision
        + ("+plain" if a.plain else "")
        + ("+bf16sampler" if a.bf16_sampler else "")
        + ("" if a.backend == "auto" else f"+backend={a.backend}")
    )
    res = Result(
        peer="grpokit", setting=setting, workload=vars(w) | {"N": w.N}, load_avg_before=load_avg(), versions=versions()
    )

    from grpokit.metrics import RunLogger
    from grpokit.trainer.build import build_run
    from grpokit.trainer.loop import LoopMemory, run_step

    share = not a.plain
    with tempfile.TemporaryDirectory(prefix="grpokit-bench-") as tmp:
        recipe = build_recipe(w, tmp, {"auto": None, "on": True, "off": False}[a.recompute_mlp], a.backend)
        run = build_run(recipe)
        # the settings under test, on the run's parts (nothing in the trainer is replaced)
        run.engine.generate_options = {"share_prompt": share, "static_cache": share, "packed_weights": share}
        if a.bf16_sampler:
            run.engine.sampler_dtype = torch.bfloat16
        run.logprobs.share_prompt = share
        res.notes["recompute_mlp"] = recipe.model.recompute_mlp
        res.n_params = sum(p.numel() for p in run.model.parameters())
        expected = [r["prompt_text"] for r in ordered_rows(run.tokenizer, w)]
        seen: list[str] = []
        prompt_of = {id(row): prompt for row, prompt in zip(run.data.rows, run.data.prompts)}
        logger = RunLogger(tmp, tensorboard=False)
        memory = LoopMemory()
        for _ in range(w.steps):
            t0 = time.perf_counter()
            step = run_step(run, logger, memory)
            step_s = time.perf_counter() - t0
            m, batch = step.metrics, step.experience
            seen.extend(prompt_of[id(row)] for row in step.rows)  # what the engine was given
            counts = _trained_tokens(batch, recipe.train, share)
            cm = batch.completion_mask
            phases = m["gen_s"] + m["ref_s"] + m["reward_s"]  # the loop's own phase timers
            rec = StepRecord(
                step=m["step"],
                step_s=step_s,
                gen_s=m["gen_s"],
                logp_ref_s=m["ref_s"],
                train_s=step_s - phases,
                completion_tokens=int(cm.sum()),
                completion_len_mean=float(cm.sum(1).float().mean()),
                **counts,
                reward_mean=m.get("reward_mean"),
                loss=m.get("loss"),
            )
            res.steps.append(vars(rec))
            print(
                f"[grpokit {setting}] step {rec.step}: {rec.step_s:.1f}s (gen {rec.gen_s:.1f}, "
                f"logp/ref {rec.logp_ref_s:.1f}, train {rec.train_s:.1f}); len {rec.completion_len_mean:.1f}",
                flush=True,
            )
        logger.close()
        res.notes["same_prompts_as_workload"] = seen == expected[: len(seen)]
        res.peak_rss_gb = peak_rss_gb()  # before the parity check (which builds a second graph)
        if a.parity:
            res.notes["parity"] = parity(run, recipe, batch, batch.advantages, w, share=share)
            print(f"[grpokit {setting}] parity vs plain fp32: {res.notes['parity']}", flush=True)
    res.load_avg_after = load_avg()
    res.write(a.out)


def _loss_and_grad(s, r, batch, advantages, *, share: bool, autocast: bool):
    """The trainer's μ = 1 loss on ``batch`` (micro-batches, batch-wide normalization) and the
    flattened gradient, computed with the given path (``s``: model and ref_model; ``r``: the recipe)."""
    from grpokit import algo
    from grpokit.models.logprobs import batch_logprobs, completion_logprobs

    temp, mbs = r.rollout.temperature, r.train.micro_batch_size
    ref = batch_logprobs(
        s.ref_model, batch, temperature=temp, micro_batch_size=mbs, autocast_bf16=autocast, share_prompt=share
    )
    n, n_tok = len(batch), int(batch.completion_mask.sum())
    s.model.zero_grad(set_to_none=True)
    total, logps = 0.0, []
    for sl, sub in batch.micro_batches(mbs):
        tt = sub.completion_ids.shape[1]
        logp, _ = completion_logprobs(s.model, sub, temperature=temp, autocast_bf16=autocast, share_prompt=share)
        loss, _ = algo.policy_loss(
            logp,
            logp.detach(),
            advantages[sl],
            sub.completion_mask,
            algo.LossConfig(
                beta=r.algo.beta, aggregation=r.algo.loss_aggregation, max_completion_length=r.rollout.max_new_tokens
            ),
            ref_logp=ref[sl, :tt],
            num_sequences=n,
            num_tokens=n_tok,
        )
        loss.backward()
        total += loss.item()
        full = torch.zeros(sub.completion_ids.shape[0], batch.completion_ids.shape[1])
        full[:, :tt] = logp.detach().float() * sub.completion_mask
        logps.append(full)
    grad = torch.cat([p.grad.flatten().float() for p in s.model.parameters() if p.grad is not None])
    s.model.zero_grad(set_to_none=True)
    return total, torch.cat(logps), grad


def parity(s, recipe, batch, advantages, w: Workload, *, share: bool) -> dict:
    """This setting's loss, log-probs and gradient vs the plain fp32 path, same weights and batch."""
    note = "the step's advantages"
    if not bool(advantages.abs().gt(0).any()):  # every group had equal rewards: the loss is flat
        advantages = torch.randn(advantages.shape, generator=torch.Generator().manual_seed(0))
        note = "seeded N(0,1) advantages (the step's were all 0)"
    fast = _loss_and_grad(s, recipe, batch, advantages, share=share, autocast=w.precision == "bf16_autocast")
    # the plain path: fp32 copies of the same weights under the plain backend (stock forward)
    import copy
    import types

    from grpokit.backends import install_backend

    def plain_copy(m):
        if m is None:
            return None
        m = copy.deepcopy(m).float()
        install_backend(m, "plain", announce=False)
        return m

    s = types.SimpleNamespace(model=plain_copy(s.model), ref_model=plain_copy(s.ref_model))
    note += "; plain = fp32 copies of the weights under model.backend=plain"
    plain = _loss_and_grad(s, recipe, batch, advantages, share=False, autocast=False)
    g_fast, g_plain = fast[2].double(), plain[2].double()
    gd = (g_fast - g_plain).norm() / g_plain.norm().clamp(min=1e-300)
    cos = (g_fast @ g_plain) / (g_fast.norm() * g_plain.norm()).clamp(min=1e-300)
    return {
        "loss_fast": fast[0],
        "loss_plain_fp32": plain[0],
        "loss_abs_diff": abs(fast[0] - plain[0]),
        "logp_max_abs_diff": float((fast[1] - plain[1]).abs().max()),
        "grad_rel_l2_diff": float(gd),
        "grad_cosine": float(cos),
        "finite": all(math.isfinite(x) for x in (fast[0], plain[0])),
        "advantages": note,
    }


if __name__ == "__main__":
    main()
