"""Part ``multiturn`` of experiments/scripts/vllm_check.py: multi-turn rollouts on real vLLM
(grpokit.rollout.vllm_multiturn) against the hf multi-turn engine, on the check's tiny random Llama.

The environment pauses a turn at the first "e" (a random model writes one within a few tokens) and
answers a fixed observation; an EOS ends the row; 3 turns of at most 8 tokens.
  1. greedy: transcripts of both engines token for token (rate of identical rows, masks and
     environment tokens where the rows agree), with the stop tokens given to vLLM and with none
     (every turn cut after the fact);
  2. log-probs: ``sampler_logprobs`` against the trainer's on the model's tokens
     (``logprob_gap_*``), 0 on the environment's;
  3. seeds: the rows of a batch split in two calls (``first_prompt``) are the rows of the whole.
"""

from __future__ import annotations

import time

from grpokit.envs.base import Observation

OBS = " <r>ok</r> "


class StopAtE:
    """Pauses at the first "e" and answers :data:`OBS`; an EOS ends the row."""

    stop_strings = ("e",)

    def start(self, row):
        return _Episode()


class _Episode:
    def step(self, turn, *, ended_by_eos):
        return Observation(done=True) if ended_by_eos else Observation(text=OBS, counts={"tool_calls": 1})


def multiturn(out: dict, tiny_folder, prompts: list[str], row_agreement) -> bool:
    """Run the checks (module docstring) into ``out``; True when the log-prob gap is under 1e-3, the
    environment's tokens are never scored and the split batch gives the same rows."""
    import torch
    from transformers import AutoModelForCausalLM

    import grpokit.rollout.vllm_multiturn as vm
    from grpokit.models.loading import load_tokenizer
    from grpokit.models.logprobs import completion_logprobs
    from grpokit.rollout import SamplingParams
    from grpokit.rollout.multiturn import generate_multiturn

    ok = True
    tok = load_tokenizer("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(tiny_folder(tok)).eval()
    rows = [{} for _ in prompts]
    t0 = time.perf_counter()
    vl = vm.VLLMMultiTurnEngine(model, tok, env=StopAtE(), eos_token_ids=[2, 0], max_turns=3)
    out["llm_build_s"] = time.perf_counter() - t0
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)

    def hf(params, seed):
        return generate_multiturn(
            model, tok, prompts, 2, params, env=StopAtE(), rows=rows, eos_token_ids=[2, 0], max_turns=3, seed=seed
        )

    ref = hf(greedy, 0)
    real_stop_ids = vm.stop_token_ids
    for name, stop_ids in (("stop_tokens", real_stop_ids), ("no_stop_tokens", lambda tok, stops: [])):
        vm.stop_token_ids = stop_ids
        try:
            a = vl.generate(prompts, 2, greedy, 0, rows=rows)
        finally:
            vm.stop_token_ids = real_stop_ids
        same = [r for r in range(len(a)) if a.completion_ids[r][a.attention_mask[r]].tolist()
                == ref.completion_ids[r][ref.attention_mask[r]].tolist()]  # fmt: skip
        masks_ok = all(
            a.completion_mask[r][a.attention_mask[r]].tolist() == ref.completion_mask[r][ref.attention_mask[r]].tolist()
            for r in same
        )
        out[f"greedy_{name}"] = row_agreement(a, ref) | {
            "transcripts_identical": f"{len(same)}/{len(a)}",
            "masks_identical_where_rows_agree": masks_ok,
            "turns_max": int(a.env_counts["turns"].max()),
            "env_tokens": int(a.env_counts["env_tokens"].sum()),
        }
        ok &= masks_ok

    for tau in (0.7, 1.0):
        e = vl.generate(prompts, 4, SamplingParams(temperature=tau, max_new_tokens=8), 5, rows=rows)
        with torch.no_grad():
            logp, _ = completion_logprobs(model, e, temperature=tau)
        m = e.completion_mask
        gap = (e.sampler_logprobs[m] - logp[m]).abs()
        out[f"logprob_gap_tau{tau}"] = {
            "logprob_gap_mean": float(gap.mean()),
            "logprob_gap_max": float(gap.max()),
            "model_tokens": int(m.sum()),
            "env_tokens": int((e.attention_mask & ~m).sum()),
            "env_tokens_scored": int((e.sampler_logprobs[~m] != 0).sum()),
        }
        ok &= out[f"logprob_gap_tau{tau}"]["logprob_gap_max"] < 1e-3
        ok &= out[f"logprob_gap_tau{tau}"]["env_tokens_scored"] == 0

    p = SamplingParams(temperature=1.0, max_new_tokens=8)
    full = vl.generate(prompts, 4, p, 11, rows=rows)
    k = len(prompts) // 2
    halves = [
        vl.generate(prompts[:k], 4, p, 11, 0, rows=rows[:k]),
        vl.generate(prompts[k:], 4, p, 11, k, rows=rows[k:]),
    ]
    split = [r[m].tolist() for h in halves for r, m in zip(h.completion_ids, h.attention_mask)]
    whole = [r[m].tolist() for r, m in zip(full.completion_ids, full.attention_mask)]
    out["seeds_rows_identical_when_split"] = f"{sum(x == y for x, y in zip(split, whole))}/{len(whole)}"
    ok &= split == whole
    return ok
