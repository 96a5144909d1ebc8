"""Slow, obviously-correct loop versions of the algorithm core (plain Python floats, float64).

The vectorized functions in ``grpokit.algo`` must equal these on random inputs.
"""

from __future__ import annotations

import math
import sys

ROUNDING_ULPS = 16  # as grpokit.algo.ROUNDING_ULPS
F64_EPS = sys.float_info.epsilon


def _constant(xs: list[float], rounding_eps: float) -> bool:
    """Fewer than two values, or all equal up to rounding: spread <= 16 ulps (of the input dtype,
    ``rounding_eps``) at the largest magnitude."""
    return len(xs) < 2 or max(xs) - min(xs) <= ROUNDING_ULPS * rounding_eps * max(abs(x) for x in xs)


def _mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var)


def group_advantages(
    rewards: list[float], group_size: int, scale: str = "group", eps: float = 1e-4, rounding_eps: float = F64_EPS
):
    """``rounding_eps``: ``finfo(dtype).eps`` of the rewards' dtype (float64 by default)."""
    out = []
    all_valid = [r for r in rewards if not math.isnan(r)]
    for g in range(0, len(rewards), group_size):
        group = rewards[g : g + group_size]
        valid = [r for r in group if not math.isnan(r)]
        if _constant(valid, rounding_eps):
            out += [0.0] * len(group)
            continue
        m, s = _mean_std(valid)
        if scale == "batch":
            bs = None if _constant(all_valid, rounding_eps) else _mean_std(all_valid)[1]
            denom = None if bs is None else bs + eps
        elif scale == "group":
            denom = s + eps
        else:
            denom = 1.0
        for r in group:
            out.append(0.0 if math.isnan(r) or denom is None else (r - m) / denom)
    return out


def process_advantages(step_rewards, step_end_mask, completion_mask, group_size, eps=1e-4, rounding_eps=F64_EPS):
    """step_rewards etc. as nested lists (N x T); ``rounding_eps`` as in ``group_advantages``."""
    n, t = len(step_rewards), len(step_rewards[0])
    out = [[0.0] * t for _ in range(n)]
    for g in range(0, n, group_size):
        rows = range(g, g + group_size)
        pooled = [
            step_rewards[i][j]
            for i in rows
            for j in range(t)
            if step_end_mask[i][j] and completion_mask[i][j] and not math.isnan(step_rewards[i][j])
        ]
        if _constant(pooled, rounding_eps):
            continue
        m, s = _mean_std(pooled)
        for i in rows:
            for j in range(t):
                if not completion_mask[i][j]:
                    continue
                total = 0.0
                for k in range(j, t):
                    r = step_rewards[i][k]
                    if step_end_mask[i][k] and completion_mask[i][k] and not math.isnan(r):
                        total += (r - m) / (s + eps)
                out[i][j] = total
    return out


def mask_completions(ids, eos_ids):
    out = []
    for row in ids:
        m, ended = [], False
        for tok in row:
            m.append(not ended)
            if tok in eos_ids:
                ended = True
        out.append(m)
    return out


def token_logprobs(logits, ids, temperature=1.0):
    """logits: N x T x V nested lists."""
    out = []
    for row_l, row_i in zip(logits, ids):
        r = []
        for vec, tok in zip(row_l, row_i):
            z = [v / temperature for v in vec]
            mx = max(z)
            lse = mx + math.log(sum(math.exp(x - mx) for x in z))
            r.append(z[tok] - lse)
        out.append(r)
    return out


def kl(logp: float, ref_logp: float, kind: str) -> float:
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    d = ref_logp - logp
    return math.exp(d) - d - 1


def policy_loss(
    logp,
    old_logp,
    adv,
    mask,
    ref_logp=None,
    beta=0.0,
    eps_low=0.2,
    eps_high=0.2,
    kind="k3",
    aggregation="seq_mean_token_mean",
    max_len=None,
):
    """adv: list per sequence (float) or per token (list). Returns the scalar loss."""
    n = len(logp)
    seq_terms, tok_sum, tok_count = [], 0.0, 0
    for i in range(n):
        s, c = 0.0, 0
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            a = adv[i][t] if isinstance(adv[i], list) else adv[i]
            r = math.exp(logp[i][t] - old_logp[i][t])
            rc = min(max(r, 1 - eps_low), 1 + eps_high)
            lt = -min(r * a, rc * a)
            if beta > 0:
                lt += beta * kl(logp[i][t], ref_logp[i][t], kind)
            s += lt
            c += 1
        seq_terms.append(s / c if c else 0.0)
        tok_sum += s
        tok_count += c
    if aggregation == "seq_mean_token_mean":
        return sum(seq_terms) / n
    if aggregation == "token_mean":
        return tok_sum / max(tok_count, 1)
    return tok_sum / (n * max_len)


def gae(rewards, values, mask, gamma, lam):
    n, t = len(rewards), len(rewards[0])
    adv = [[0.0] * t for _ in range(n)]
    for i in range(n):
        length = sum(1 for m in mask[i] if m)
        for s in range(length):
            total = 0.0
            for l in range(length - s):
                k = s + l
                v_next = values[i][k + 1] if k + 1 < length else 0.0
                delta = rewards[i][k] + gamma * v_next - values[i][k]
                total += (gamma * lam) ** l * delta
            adv[i][s] = total
    return adv
