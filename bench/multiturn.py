"""Multi-turn rollouts against one-turn rollouts of the same rows: what a turn boundary costs.

    python bench/multiturn.py                 # 8 GSM8K prompts x 4, 3 turns of <= 32 tokens, 3 repeats
    python bench/multiturn.py --quick         # 2 prompts x 2, 1 repeat: checks the script

The rollouts run the packaged SmolLM2-135M-Instruct on the same chat-formatted GSM8K prompts with
the same seed, in this process, in this order in each repeat:

- **3-turn**: :func:`grpokit.rollout.multiturn.generate_multiturn` with an environment that pauses
  every turn at a sentence's end (``"."``) and appends an 8-token observation, ``max_turns`` 3,
  ``max_new_tokens`` per turn, ``turn_batching="continuous"`` (the default: one decode loop, KV
  cache kept across turns);
- **3-turn lockstep**: the same with ``turn_batching="lockstep"`` (one ``generate`` per turn; the
  same tokens);
- **1-turn**: :func:`grpokit.rollout.hf.generate_rollouts` with as many new tokens as the 3-turn
  rollout's mean transcript (model + environment tokens) just before, and no EOS (an id outside
  the vocabulary), so both have the same rows and the same total length.

Reported (``<out>/multiturn.json`` and markdown): model tokens per second of each (tokens in
``completion_mask`` / wall seconds), their ratio, the mean transcript length (model + environment
tokens), and **the re-reading cost** of lockstep: it keeps no KV cache between turns, so every turn
after the first re-reads the whole context of each row still going; the bench times one forward
pass over those contexts against one over the appended tokens alone (what the continuous loop
prefills).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from grpokit.envs.base import Observation  # noqa: E402

OBS = " <result>noted, go on</result> "


class PauseAtSentences:
    """Pauses each turn at a ".", appends :data:`OBS`; the rollout's max_turns ends the row."""

    stop_strings = (".",)

    def start(self, row):
        return self

    def step(self, turn, *, ended_by_eos):
        return Observation(done=True) if ended_by_eos else Observation(text=OBS, counts={"tool_calls": 1})


def _prompts(tokenizer, n: int) -> list[str]:
    from grpokit.data import load_rows

    rows = load_rows("gsm8k", split="train", limit=n)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        for r in rows
    ]


def _prefill_cost(model, tokenizer, prompts, exp, G: int) -> dict[str, float]:
    """Seconds of one no-grad forward over each later turn's contexts (re-read now) and over the
    tokens appended since the turn before (with a kept KV cache), summed over the turns."""
    from grpokit.rollout.hf import left_padded

    ids_all, mask = exp.completion_ids, exp.completion_mask
    plists = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    full, appended = 0.0, 0.0
    turns = [[] for _ in range(len(exp))]
    for r in range(len(exp)):  # the start of each model turn after the first
        m = mask[r].tolist()
        turns[r] = [i for i in range(1, len(m)) if m[i] and not m[i - 1]]
    for k in range(max(len(t) for t in turns)):
        ctx, new = [], []
        for r, starts in enumerate(turns):
            if k < len(starts):
                s = starts[k]
                ctx.append(plists[r // G] + ids_all[r, :s].tolist())
                prev = starts[k - 1] if k else 0
                new.append(ids_all[r, prev:s].tolist())
        for rows, acc in ((ctx, "full"), (new, "appended")):
            x, am = left_padded(rows, tokenizer.pad_token_id)
            with torch.inference_mode():
                t0 = time.perf_counter()
                model(input_ids=x, attention_mask=am)
                dt = time.perf_counter() - t0
            if acc == "full":
                full += dt
            else:
                appended += dt
    return {"reread_s": full, "appended_only_s": appended}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32, help="per turn of the 3-turn rollout")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/bench-multiturn")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.prompts, a.group_size, a.max_new_tokens, a.repeats = 2, 2, 8, 1
    torch.set_num_threads(a.threads)
    from grpokit.backends import install_backend
    from grpokit.models.loading import eos_token_ids, load_model, load_tokenizer
    from grpokit.rollout import SamplingParams, generate_rollouts
    from grpokit.rollout.multiturn import generate_multiturn

    tok = load_tokenizer("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct")
    model.eval()
    install_backend(model, "auto", announce=False)
    prompts, G, L = _prompts(tok, a.prompts), a.group_size, a.max_new_tokens
    eos = eos_token_ids(model, tok)
    never = [len(tok) + 7]  # an id the model's softmax never reaches: every 1-turn row runs to its limit
    rows = [{} for _ in prompts]
    runs: dict[str, list[dict]] = {"3-turn": [], "3-turn lockstep": [], "1-turn": []}
    for rep in range(a.repeats):
        for name in runs:
            t0 = time.perf_counter()
            if name.startswith("3-turn"):
                params = SamplingParams(temperature=1.0, max_new_tokens=L)
                batching = "lockstep" if name.endswith("lockstep") else "continuous"
                exp = generate_multiturn(
                    model,
                    tok,
                    prompts,
                    G,
                    params,
                    env=PauseAtSentences(),
                    rows=rows,
                    eos_token_ids=eos,
                    max_turns=3,
                    seed=rep,
                    turn_batching=batching,
                )
            else:
                same = max(1, round(runs["3-turn"][-1]["mean_length"]))
                params = SamplingParams(temperature=1.0, max_new_tokens=same)
                exp = generate_rollouts(model, tok, prompts, G, params, eos_token_ids=never, seed=rep)
            s = time.perf_counter() - t0
            model_tokens = int(exp.completion_mask.sum())
            length = exp.attention_mask.sum(1) if exp.attention_mask is not None else exp.completion_mask.sum(1)
            rec = {
                "seconds": s,
                "model_tokens": model_tokens,
                "tokens_per_s": model_tokens / s,
                "mean_length": float(length.float().mean()),
            }
            if name.startswith("3-turn"):
                rec["turns_mean"] = float(exp.env_counts["turns"].float().mean())
                if name.endswith("lockstep"):
                    rec.update(_prefill_cost(model, tok, prompts, exp, G))
            runs[name].append(rec)
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}
    report = {
        "settings": vars(a),
        "runs": runs,
        "median": med,
        "ratio_tokens_per_s": med["3-turn"]["tokens_per_s"] / med["1-turn"]["tokens_per_s"],
        "ratio_lockstep_tokens_per_s": med["3-turn lockstep"]["tokens_per_s"] / med["1-turn"]["tokens_per_s"],
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "multiturn.json").write_text(json.dumps(report, indent=1))
    m3, lock = med["3-turn"], med["3-turn lockstep"]
    print("| rollout | model tokens/s | mean length (tokens) | seconds |\n| --- | --- | --- | --- |")
    for k, m in med.items():
        print(f"| {k} | {m['tokens_per_s']:.1f} | {m['mean_length']:.1f} | {m['seconds']:.2f} |")
    print(
        f"\n3-turn / 1-turn tokens/s: continuous {report['ratio_tokens_per_s']:.3f}, lockstep "
        f"{report['ratio_lockstep_tokens_per_s']:.3f} (turns per row {m3['turns_mean']:.2f}); lockstep re-reads "
        f"the context at the turn boundaries: {lock['reread_s']:.2f} s of {lock['seconds']:.2f} s "
        f"(the appended tokens alone: {lock['appended_only_s']:.2f} s)",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
