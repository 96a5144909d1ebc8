"""grpokit's default GRPO step on one page, with torch and transformers only (DeepSeekMath, arXiv 2402.03300).

``tests/examples/test_grpo_one_file.py`` runs this file and ``grpokit.trainer.loop.run_step`` side by
side on a tiny model (``model.backend=plain``) and holds them equal bit for bit: completions,
metrics and every weight after 3 steps, at μ = 1 and μ = 2. Read top to bottom; a step is:

  1. B prompts from a seeded permutation of the rows per epoch;
  2. G completions per prompt from π_old (the current policy);
  3. one rule-based reward per completion;
  4. group-normalized advantages A_i = (r_i − mean) / (std + eps) (§4.1.2);
  5. π_ref's log-probs (β > 0) and π_old's (only when μ > 1; else π_old = π_θ by value);
  6. μ gradient passes, each one AdamW step, of the eq. 3 loss
     −1/G Σ_i 1/|o_i| Σ_t [min(ρ·A, clip(ρ, 1−ε, 1+ε)·A) − β·KL_k3], ρ = π_θ/π_old.

What grpokit's default adds to the paper (each marked ``grpokit:`` below): the model stays in
eval() (no dropout, so sampler and trainer see one π); sampling is by inverse CDF with one seeded
uniform stream per row (the same distribution as torch.multinomial); the group std is the sample
std (ddof = 1) in float64 and a constant group gets exactly 0; gradients are clipped at norm 1 and
an update whose gradient is exactly 0 or not finite is skipped; micro-batches are normalized by the
whole batch's counts; k3 and the log-softmax are computed in forms that keep float32 precision.
CPU only, fp32, no LoRA, no top-k/top-p: grpokit's defaults.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import math
import os
import re
from dataclasses import dataclass, field, fields

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM


def _arg(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    model: str = _arg("~/.cache/grpokit/models/smollm2-135m-instruct", "Hugging Face folder or hub id")
    tiny: bool = _arg(True, "swap the weights for a random 2-layer Llama of the same vocabulary (seconds on CPU)")
    steps: int = _arg(3, "GRPO steps")
    prompts_per_step: int = _arg(2, "B: prompts per step")
    group_size: int = _arg(4, "G: completions per prompt")
    max_new_tokens: int = _arg(16, "longest completion, in tokens")
    temperature: float = _arg(1.0, "τ: sampling temperature; every log-prob divides the logits by it too")
    beta: float = _arg(0.04, "β: weight of the k3 KL to the frozen reference")
    clip_eps_low: float = _arg(0.2, "ε_low: ratio clipped below at 1 − ε_low")
    clip_eps_high: float = _arg(0.2, "ε_high: ratio clipped above at 1 + ε_high")
    advantage_eps: float = _arg(1e-4, "eps added to the group std")
    num_iterations: int = _arg(1, "μ: gradient passes (optimizer steps) per batch")
    micro_batch_size: int = _arg(8, "rows per forward/backward (gradient accumulation)")
    learning_rate: float = _arg(1e-6, "AdamW learning rate (constant, no warm-up)")
    adam_betas: tuple[float, float] = _arg((0.9, 0.99), "AdamW betas")
    weight_decay: float = _arg(0.0, "AdamW weight decay")
    max_grad_norm: float = _arg(1.0, "gradient clipping norm (0 = off)")
    seed: int = _arg(0, "seed of the prompt order and of sampling")


def train(a: Args, policy, ref, tok, prompts: list[str], answers: list[str], reward_fn) -> list[dict]:
    """``a.steps`` GRPO steps on ``prompts`` (formatted for the model); one dict per step."""
    params = [p for p in policy.parameters() if p.requires_grad]
    # grpokit: fused AdamW, betas (0.9, 0.99), weight decay 0; its LambdaLR schedule is constant 1 by default
    opt = torch.optim.AdamW(params, lr=a.learning_rate, betas=a.adam_betas, weight_decay=a.weight_decay, fused=True)
    epoch, position, out = 0, 0, []
    for step in range(1, a.steps + 1):
        idx = []  # 1. B rows from the epoch's permutation, seeded seed·1000 + epoch
        while len(idx) < a.prompts_per_step:
            order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(a.seed * 1000 + epoch))
            take = order[position : position + a.prompts_per_step - len(idx)].tolist()
            idx, position = idx + take, position + len(take)
            if position >= len(prompts):
                epoch, position = epoch + 1, 0
        batch = ([prompts[i] for i in idx], [answers[i] for i in idx])
        out.append(grpo_step(a, policy, ref, tok, opt, *batch, reward_fn, seed=a.seed * 100003 + step))
    return out


def grpo_step(a: Args, policy, ref, tok, opt, prompts, answers, reward_fn, seed: int) -> dict:
    B, G, eos = len(prompts), a.group_size, eos_ids(policy, tok)
    # 2. G completions per prompt from π_old; rows b·G … b·G+G−1 are prompt b's group
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt")  # left-padded (B, P)
    prompt_ids = enc.input_ids.repeat_interleave(G, 0)  # (N, P)
    prompt_mask = enc.attention_mask.bool().repeat_interleave(G, 0)  # (N, P)
    # grpokit: row (b, g) draws one uniform per decode step from its own generator, seeded from
    # (seed, b, g) alone, and the next token is the inverse CDF of softmax(logits/τ) at it
    u = torch.stack([uniforms(seed, b, g, a.max_new_tokens) for b in range(B) for g in range(G)])  # (N, T_max)
    # grpokit: a greedy generate whose processor puts 0 at the drawn token and −inf elsewhere; every
    # field a hub generation_config could otherwise fill is stated (rollout/hf.py)
    config = GenerationConfig(do_sample=False, max_new_tokens=a.max_new_tokens, max_length=None, min_new_tokens=0,
                              num_beams=1, repetition_penalty=1.0, disable_compile=True, eos_token_id=eos,
                              pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)  # fmt: skip
    with torch.inference_mode():
        out = policy.generate(input_ids=prompt_ids, attention_mask=prompt_mask.long(), generation_config=config,
                              logits_processor=[InverseCDF(u, a.temperature)])  # fmt: skip
    ids = out[:, prompt_ids.shape[1] :].clone()  # (N, T), ended rows padded; a clone: not an inference tensor
    is_eos = torch.isin(ids, torch.tensor(eos)).int()
    mask = (is_eos.cumsum(1) - is_eos) == 0  # (N, T) True up to and including the first EOS
    ended = is_eos.any(1)  # (N,) False: truncated at max_new_tokens
    texts = tok.batch_decode(
        [r[:n].tolist() for r, n in zip(ids, (mask.sum(1) - ended.long()).tolist())], skip_special_tokens=True
    )
    # 3. rewards, one per completion
    rewards = torch.tensor(reward_fn(texts, [x for x in answers for _ in range(G)]), dtype=torch.float64)  # (N,)
    # 4. advantages within each group (§4.1.2); grpokit: float64, sample std, exactly 0 for a constant group
    r = rewards.view(B, G)
    mean = r.sum(1, keepdim=True) / G
    std = ((r - mean) ** 2).sum(1, keepdim=True).div(G - 1).sqrt()
    varies = r.amax(1) - r.amin(1) > 16 * torch.finfo(torch.float64).eps * r.abs().amax(1)  # equal up to rounding
    adv = torch.where(varies[:, None], (r - mean) / (std + a.advantage_eps), 0.0).view(-1).float()  # (N,)
    # 5. π_ref's and (μ > 1) π_old's log-probs, once, before any update
    batch = (prompt_ids, prompt_mask, ids, mask)
    ref_logp = batch_logprobs(ref, batch, a) if a.beta > 0 else None  # (N, T)
    old_logp = batch_logprobs(policy, batch, a) if a.num_iterations > 1 else None  # (N, T)
    # 6. μ passes; each micro-batch's loss is normalized by the whole batch's counts, so the summed
    # gradients are the one-big-batch gradient (grpokit: micro-batches cut columns that are padding in all their rows)
    n_seq, n_tok, passes = len(ids), int(mask.sum()), []
    for _ in range(a.num_iterations):
        opt.zero_grad(set_to_none=True)
        total, stats = 0.0, {}
        for sl, t1, mb in micro_batches(batch, a.micro_batch_size):
            m = mb[3]  # (n, t) completion mask
            logp = completion_logprobs(policy, mb, a.temperature)  # (n, t), with gradient
            old = logp.detach() if old_logp is None else old_logp[sl, :t1]  # μ = 1: ratio 1 by value, grad A·∇logπ
            A = torch.where(m, adv[sl, None].expand_as(logp), 0.0)  # (n, t)
            live = A != 0  # A = 0 or masked: no surrogate term, whatever the ratio
            log_ratio = torch.where(live, logp - old, 0.0)
            # grpokit: for A > 0 min() takes the clipped constant past 1 + ε_high; bounding log ρ there keeps exp finite
            log_ratio = torch.where(A > 0, log_ratio.clamp(max=math.log1p(a.clip_eps_high) + 1.0), log_ratio)
            ratio = torch.exp(log_ratio)
            clipped = torch.clamp(ratio, 1.0 - a.clip_eps_low, 1.0 + a.clip_eps_high)
            per_token = torch.where(live, -torch.minimum(ratio * A, clipped * A), 0.0)  # eq. 3's surrogate
            kl = torch.zeros_like(logp)
            if ref_logp is not None:  # eq. 4's k3 = π_ref/π − log(π_ref/π) − 1, masked tokens 0
                kl = k3(torch.where(m, logp, 0.0), torch.where(m, ref_logp[sl, :t1], 0.0))
                per_token = per_token + a.beta * kl
            per_seq = torch.where(m, per_token, 0.0).sum(-1) / m.float().sum(-1).clamp(min=1.0)  # 1/|o_i| Σ_t
            loss = per_seq.sum() / n_seq  # 1/G Σ_i over the batch's N = B·G sequences
            loss.backward()
            total += loss.item()
            with torch.no_grad():  # the logged stats: token means, weighted by the micro-batch's share of tokens
                true_ratio, n = (logp - old).exp(), m.float().sum().clamp(min=1.0)
                st = {
                    "clip_frac_high": (true_ratio > 1 + a.clip_eps_high) & (A > 0),
                    "clip_frac_low": (true_ratio < 1 - a.clip_eps_low) & (A < 0),
                    "kl": kl.detach(),
                    "ratio_mean": (logp - old).clamp(-20.0, 20.0).exp(),
                }
                w = m.float().sum().item() / max(n_tok, 1)
                for k, v in st.items():
                    stats[k] = stats.get(k, 0.0) + w * (torch.where(m, v.float(), 0.0).sum() / n).item()
        # grpokit: clip at max_grad_norm; skip the update when the gradient is exactly 0 (AdamW would still
        # move the weights by momentum) or the loss or norm is not finite
        gn = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), a.max_grad_norm or float("inf")))
        if gn != 0.0 and math.isfinite(gn) and math.isfinite(total):
            opt.step()
        passes.append((total, stats, gn))
    opt.zero_grad(set_to_none=True)
    # 7. the step's metrics, each the mean over the μ passes
    mu = len(passes)
    metrics = {"reward_mean": float(rewards.mean()), "loss": sum(p[0] for p in passes) / mu}
    metrics.update({k: sum(p[1][k] for p in passes) / mu for k in sorted(passes[0][1])})
    metrics["grad_norm"] = sum(p[2] for p in passes) / mu
    return {"completion_ids": ids, "completions": texts, "advantages": adv, "metrics": metrics}


def micro_batches(batch, size):
    """``(rows, completion columns, micro-batch)`` of consecutive ``size`` rows of ``batch`` = (prompt
    ids, prompt mask, completion ids, completion mask): grpokit cuts the prompt columns that are padding
    in all its rows and the completion columns after its last token."""
    prompt_ids, prompt_mask, ids, mask = batch
    for s in range(0, len(ids), size):
        sl = slice(s, s + size)
        p0, used = int(prompt_mask[sl].any(0).nonzero()[0]), mask[sl].any(0).nonzero()
        t1 = int(used[-1]) + 1 if len(used) else 1
        yield sl, t1, (prompt_ids[sl, p0:], prompt_mask[sl, p0:], ids[sl, :t1], mask[sl, :t1])


def completion_logprobs(model, mb, tau: float):
    """``(n, T)`` log π(o_t | q, o_<t) at temperature τ from one forward over [prompt ; completion]."""
    prompt_ids, prompt_mask, ids, mask = mb
    x, attn = torch.cat([prompt_ids, ids], 1), torch.cat([prompt_mask, mask], 1).long()
    positions = (attn.cumsum(1) - 1).clamp(min=0)  # counted over real tokens, as generate counts them
    T = ids.shape[1]
    out = model(input_ids=x, attention_mask=attn, position_ids=positions, use_cache=False, logits_to_keep=T + 1)
    return ShiftedLogprob.apply(out.logits[:, :-1].float(), ids.unsqueeze(-1), float(tau))  # (n, T, V) -> (n, T)


def batch_logprobs(model, batch, a: Args):
    """``(N, T)`` log-probs without gradient, in the same micro-batches as the gradient passes."""
    out = torch.zeros(batch[2].shape, dtype=torch.float32)
    with torch.inference_mode():
        for sl, t1, mb in micro_batches(batch, a.micro_batch_size):
            out[sl, :t1] = completion_logprobs(model, mb, a.temperature)
    return out


class ShiftedLogprob(torch.autograd.Function):
    """log softmax(z/τ) at the token, as ``u_id − log1p(Σ_{v≠max} e^u)`` with ``u = (z − max z)/τ``, and its
    gradient ``(onehot − softmax)/τ`` (grpokit.algo.token_logprobs: float32 precision at large logits)."""

    @staticmethod
    def forward(ctx, raw, ids, tau):  # raw (n, T, V) float32, ids (n, T, 1)
        top = raw.amax(-1, keepdim=True)
        u = raw - top
        at_top = u == 0
        u = u / tau if tau != 1.0 else u
        tail = u.exp().masked_fill_(at_top, 0.0).sum(-1) + (at_top.sum(-1) - 1).to(u.dtype)
        log_s = torch.log1p(tail)
        ctx.save_for_backward(raw, ids, top, log_s)
        ctx.tau = tau
        return u.gather(-1, ids).squeeze(-1) - log_s

    @staticmethod
    def backward(ctx, grad):
        raw, ids, top, log_s = ctx.saved_tensors
        out = raw - top
        if ctx.tau != 1.0:
            out.div_(ctx.tau)
        g = grad.unsqueeze(-1)
        out.sub_(log_s.unsqueeze(-1)).exp_().mul_(-g).scatter_add_(-1, ids, g)  # g·(onehot − softmax)
        return (out.div_(ctx.tau) if ctx.tau != 1.0 else out), None, None


def k3(logp, ref_logp):
    """k3 = e^d − d − 1, d = log π_ref − log π (eq. 4); for |d| < 0.1 its series (float32 loses d²/2 next to 1)."""
    d = ref_logp - logp
    small = d.abs() < 0.1
    ds = torch.where(small, d, torch.zeros_like(d))
    series = ds * ds * (0.5 + ds * (1 / 6 + ds * (1 / 24 + ds * (1 / 120 + ds * (1 / 720)))))
    return torch.where(small, series, torch.expm1(d) - d)


def uniforms(seed: int, b: int, g: int, steps: int) -> torch.Tensor:
    """Row (b, g)'s uniforms: a generator seeded by a hash of (seed, b, g), so nothing else changes them."""
    digest = hashlib.blake2b(f"grpokit:{seed}:{b}:{g}".encode(), digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
    return torch.rand(steps, dtype=torch.float64, generator=gen)


class InverseCDF:
    """A logits processor for a greedy ``generate``: draws each row's token at its next uniform."""

    def __init__(self, u, tau):
        self.u, self.tau, self.calls = u, tau, 0

    def __call__(self, input_ids, scores):  # (N, V)
        z = scores / self.tau if self.tau != 1.0 else scores
        u, self.calls = self.u[:, self.calls].reshape(-1, 1), self.calls + 1
        probs = torch.softmax(z.float(), -1)
        n, v, K = *probs.shape, 256
        if v <= 2 * K:  # the first token whose cumulative probability (float64) passes u
            cdf = probs.cumsum(-1, dtype=torch.float64)
            tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=v - 1)
        else:  # grpokit: in two levels for a large vocabulary (blocks of 256, then inside the block)
            blocks = torch.nn.functional.pad(probs, (0, -v % K)).view(n, -1, K)
            block_cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)
            target = u * block_cdf[:, -1:]
            b = torch.searchsorted(block_cdf, target, right=True).clamp_(max=blocks.shape[1] - 1)
            before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), 0.0)
            inside = blocks[torch.arange(n), b.squeeze(1)]
            j = torch.searchsorted(before + inside.cumsum(-1, dtype=torch.float64), target, right=True)
            j = torch.minimum(j, torch.where(inside > 0, torch.arange(K), -1).amax(-1, keepdim=True))
            tok = (b * K + j).clamp_(max=v - 1)
        return torch.full_like(scores, float("-inf")).scatter_(1, tok, 0.0)


def eos_ids(model, tok) -> list[int]:
    """Every id that ends a completion: the model's generation_config's, then the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = [*(ids if isinstance(ids, list) else [] if ids is None else [ids]), tok.eos_token_id]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def load(a: Args):
    """``(policy, reference, tokenizer)``: fp32, eval mode, the reference frozen; left padding."""
    path = os.path.expanduser(a.model)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.unk_token or tok.eos_token
    if a.tiny:
        size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
        ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        cfg = LlamaConfig(vocab_size=len(tok), num_key_value_heads=2, tie_word_embeddings=False, **size, **ids)
        torch.manual_seed(a.seed)
        models = [LlamaForCausalLM(cfg)]
        models.append(copy.deepcopy(models[0]))
    else:
        models = [AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) for _ in range(2)]
    policy, ref = (m.eval() for m in models)  # grpokit: eval() throughout, no dropout
    ref.requires_grad_(False)
    return policy, ref, tok


def answer_reward(completions: list[str], answers: list[str]) -> list[float]:
    """1 when the last number of the completion is the answer, else 0."""
    last = [re.findall(r"-?\d+(?:\.\d+)?", c)[-1:] for c in completions]
    return [float(bool(n) and float(n[0]) == float(x)) for n, x in zip(last, answers)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f in fields(Args):  # one option per field, its help from the field
        kw = dict(default=f.default, help=f.metadata["help"])
        if f.type == "bool":
            parser.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, **kw)
        else:
            nargs = len(f.default) if isinstance(f.default, tuple) else None
            parser.add_argument(f"--{f.name}", type={"int": int, "str": str}.get(f.type, float), nargs=nargs, **kw)
    a = Args(**vars(parser.parse_args(argv)))
    a.adam_betas = tuple(a.adam_betas)
    if not os.path.exists(os.path.expanduser(a.model)) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise SystemExit(f"no model folder at {a.model} (HF_HUB_OFFLINE=1): pass --model PATH; grpokit writes "
                         f"its packaged SmolLM2 at {Args.model} the first time it loads it (make demo)")  # fmt: skip
    policy, ref, tok = load(a)
    pairs = [(x, y, x + y) for x in (3, 12, 7, 20, 41) for y in (4, 9)]
    chats = [[{"role": "user", "content": f"What is {x} plus {y}?"}] for x, y, _ in pairs]
    prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    for step, res in enumerate(train(a, policy, ref, tok, prompts, [str(s) for *_, s in pairs], answer_reward), 1):
        print(f"step {step}: " + "  ".join(f"{k} {v:.4g}" for k, v in res["metrics"].items()), flush=True)
        if res["metrics"]["grad_norm"] == 0:  # all advantages 0 and π = π_ref
            hint = "; the random --tiny model never writes an answer (try --no-tiny)" if a.tiny else ""
            print(f"  no gradient: every group's rewards are equal, so the update was skipped{hint}")


if __name__ == "__main__":
    main()
