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


def rloo_advantages(rewards: list[float], group_size: int, rounding_eps: float = F64_EPS) -> list[float]:
    """RLOO: each scorable reward minus the mean of the *other* scorable rewards of its group."""
    out = []
    for g in range(0, len(rewards), group_size):
        group = rewards[g : g + group_size]
        valid = [r for r in group if math.isfinite(r)]
        for r in group:
            if not math.isfinite(r) or _constant(valid, rounding_eps):
                out.append(0.0)
                continue
            others = list(valid)
            others.remove(r)  # one copy of r left out (an equal reward of a sibling stays)
            out.append(r - sum(others) / len(others))
    return out


def reinforce_pp_advantages(
    rewards: list[float],
    group_size: int,
    lengths: list[int],
    scale: str = "batch",
    eps: float = 1e-4,
    rounding_eps: float = F64_EPS,
) -> list[float]:
    """REINFORCE++-baseline: c = r − group mean; then over every *token* of the scorable completions
    (each token of row i carries c_i): minus their mean, divided by max(population std, eps)."""
    centred = []  # (c_i or None for unscorable, signal)
    for g in range(0, len(rewards), group_size):
        group = rewards[g : g + group_size]
        valid = [r for r in group if math.isfinite(r)]
        const = _constant(valid, rounding_eps)
        m = sum(valid) / len(valid) if valid else 0.0
        for r in group:
            if not math.isfinite(r):
                centred.append((None, False))
            else:
                centred.append((0.0 if const else r - m, not const))
    tokens = [c for (c, _), n in zip(centred, lengths) if c is not None for _ in range(n)]
    if not tokens or not any(sig for _, sig in centred):
        return [0.0] * len(rewards)
    mu = sum(tokens) / len(tokens)
    std = math.sqrt(sum((t - mu) ** 2 for t in tokens) / len(tokens))
    denom = max(std, eps) if scale == "batch" else 1.0
    return [(c - mu) / denom if sig else 0.0 for c, sig in centred]


def normalized_reward_sum(rows: list[list[float]], weights: list[float], group_size: int, eps: float = 1e-4):
    """``rows[i][k]``: function k's reward of completion i (NaN = unscorable). A row with a NaN in a
    weighted column is unscorable (NaN) and out of every column's statistics; each weighted column
    is z-scored in the group over the scorable rows (sample std; constant -> 0); then Σ_k w_k z_k."""
    n = len(rows)
    live = [k for k, w in enumerate(weights) if w != 0]
    ok = [all(math.isfinite(rows[i][k]) for k in live) for i in range(n)]
    out = [0.0 if ok[i] else math.nan for i in range(n)]
    for k in live:
        col = [rows[i][k] if ok[i] else math.nan for i in range(n)]
        z = group_advantages(col, group_size, "group", eps)
        for i in range(n):
            if ok[i]:
                out[i] += weights[k] * z[i]
    return out


def overlong_penalty(lengths: list[int], max_length: int, buffer: int) -> list[float]:
    """DAPO eq. 13, case by case."""
    out = []
    for y in lengths:
        if buffer == 0 or y <= max_length - buffer:
            out.append(0.0)
        elif y <= max_length:
            out.append((max_length - buffer - y) / buffer)
        else:
            out.append(-1.0)
    return out


def process_advantages(
    step_rewards, step_end_mask, completion_mask, group_size, eps=1e-4, rounding_eps=F64_EPS, mode="sum"
):
    """step_rewards etc. as nested lists (N x T); ``rounding_eps`` as in ``group_advantages``.
    ``mode``: for a token of step j of K scored steps with normalized rewards n_1..n_K (n_0 = 0):
    sum = n_j + ... + n_K; mean = that over K - j + 1; diff = n_K - n_{j-1}; change = n_j - n_{j-1}."""
    n, t = len(step_rewards), len(step_rewards[0])
    out = [[0.0] * t for _ in range(n)]
    for g in range(0, n, group_size):
        rows = range(g, g + group_size)

        def scored(i, k):
            r = step_rewards[i][k]
            return step_end_mask[i][k] and completion_mask[i][k] and not math.isnan(r)

        pooled = [step_rewards[i][j] for i in rows for j in range(t) if scored(i, j)]
        if _constant(pooled, rounding_eps):
            continue
        m, s = _mean_std(pooled)
        for i in rows:
            ends = [k for k in range(t) if scored(i, k)]
            norm = [(step_rewards[i][k] - m) / (s + eps) for k in ends]
            for j in range(t):
                own = [x for x, k in enumerate(ends) if k >= j]  # indices of this and the later steps
                if not completion_mask[i][j] or not own:
                    continue
                first, prev = own[0], (norm[own[0] - 1] if own[0] > 0 else 0.0)
                if mode == "sum":
                    out[i][j] = sum(norm[x] for x in own)
                elif mode == "mean":
                    out[i][j] = sum(norm[x] for x in own) / len(own)
                elif mode == "diff":
                    out[i][j] = norm[-1] - prev
                elif mode == "change":
                    out[i][j] = norm[first] - prev
                else:
                    raise ValueError(f"reference.process_advantages: unknown mode {mode!r}")
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


# -- policy-loss variants (grpokit.algo.surrogates; docs/loss_variants.md) ---------------------------


def _variant_terms(logp, old_logp, adv, mask, level, surrogate, eps_low, eps_high, dual_clip_c, delta):
    """Per counted token ``(i, t)``: ``(loss term l, d l / d logp_it through the token's own ratio
    or weight, the ratio used)`` of one variant, written piecewise from the papers' formulas.
    ``adv[i]`` is a float or a per-token list."""
    out = {}
    for i in range(len(logp)):
        counted = [t for t in range(len(logp[i])) if mask[i][t]]
        seq = math.exp(sum(logp[i][t] - old_logp[i][t] for t in counted) / len(counted)) if counted else 1.0
        for t in counted:
            a = adv[i][t] if isinstance(adv[i], list) else adv[i]
            r = seq if level != "token" else math.exp(logp[i][t] - old_logp[i][t])
            if a == 0:
                out[i, t] = (0.0, 0.0, r)
                continue
            if surrogate == "cispo":  # -sg(clip(r))·A·logp: the weight is a constant
                w = min(r, 1 + eps_high) if eps_low >= 1 else min(max(r, 1 - eps_low), 1 + eps_high)
                out[i, t] = (-w * a * logp[i][t], -w * a, r)
                continue
            rc = min(max(r, 1 - eps_low), 1 + eps_high)
            ru = min(r, delta) if delta > 0 else r
            obj = min(ru * a, rc * a)
            if dual_clip_c > 0 and a < 0:
                obj = max(obj, dual_clip_c * a)
            # d obj / d r: A where the objective is r·A near r (unclipped, below δ and c), else 0
            if a > 0:
                slope = a if r < 1 + eps_high else 0.0
            else:
                held = (delta > 0 and r >= delta) or (dual_clip_c > 0 and r >= dual_clip_c)  # at -bound·A
                slope = a if r > 1 - eps_low and not held else 0.0
            out[i, t] = (-obj, -slope * r, r)
    return out


def sampler_weights(old_logp, sampler_logp, mask, cap, mode):
    """Per counted token: the TIS / MIS weight (N x T nested lists, 0.0 where not counted)."""
    n, t_len = len(old_logp), len(old_logp[0])
    w = [[0.0] * t_len for _ in range(n)]
    for i in range(n):
        counted = [t for t in range(t_len) if mask[i][t]]
        rho = math.exp(sum(old_logp[i][t] - sampler_logp[i][t] for t in counted))  # the sequence's Π w_t
        for t in counted:
            wt = math.exp(old_logp[i][t] - sampler_logp[i][t])
            if mode == "tis":
                w[i][t] = min(wt, cap)
            elif mode == "mis_token":
                w[i][t] = wt if 1 / cap <= wt <= cap else 0.0
            else:
                w[i][t] = rho if 1 / cap <= rho <= cap else 0.0
    return w


def _aggregation_weights(mask, aggregation, max_len):
    """Per counted token, its weight in the aggregated loss."""
    n = len(mask)
    total = sum(sum(1 for m in row if m) for row in mask)
    out = {}
    for i, row in enumerate(mask):
        count = sum(1 for m in row if m)
        for t, m in enumerate(row):
            if m:
                if aggregation == "seq_mean_token_mean":
                    out[i, t] = 1 / (n * count)
                elif aggregation == "token_mean":
                    out[i, t] = 1 / max(total, 1)
                else:
                    out[i, t] = 1 / (n * max_len)
    return out


def policy_loss_variant(
    logp,
    old_logp,
    adv,
    mask,
    *,
    level="token",
    surrogate="clip",
    eps_low=0.2,
    eps_high=0.2,
    dual_clip_c=0.0,
    delta=0.0,
    aggregation="seq_mean_token_mean",
    max_len=None,
    ref_logp=None,
    beta=0.0,
    kind="k3",
    sampler_logp=None,
    cap=0.0,
    is_correction="tis",
    entropy=None,
    entropy_coef=0.0,
):
    """The loss of :func:`grpokit.algo.policy_loss` with its variants, and its gradient w.r.t. ``logp``
    (N x T nested lists; the KL's and the entropy's gradients left out), by loops over tokens and
    sequences. At sequence level each counted token carries its row's loss ``l_i``, whose gradient
    w.r.t. ``logp_it`` is ``d l_i / d s_i · s_i / |o_i|`` at every counted token."""
    terms = _variant_terms(logp, old_logp, adv, mask, level, surrogate, eps_low, eps_high, dual_clip_c, delta)
    weights = sampler_weights(old_logp, sampler_logp, mask, cap, is_correction) if cap > 0 else None
    agg = _aggregation_weights(mask, aggregation, max_len)
    loss = 0.0
    grad = [[0.0] * len(row) for row in logp]
    for (i, t), (lt, dlt, _) in terms.items():
        w = weights[i][t] if weights is not None else 1.0
        kl_t = kl(logp[i][t], ref_logp[i][t], kind) if beta > 0 else 0.0
        loss += agg[i, t] * (w * lt + beta * kl_t)
        if level != "sequence":
            grad[i][t] += agg[i, t] * w * dlt
        else:  # l_i at each of the row's tokens, each depending on every logp of the row through s_i
            row = [u for u in range(len(logp[i])) if mask[i][u]]
            for u in row:
                grad[i][u] += agg[i, t] * w * dlt / len(row)
    if entropy_coef > 0:
        counted = [entropy[i][t] for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t]]
        loss -= entropy_coef * sum(counted) / max(len(counted), 1)
    return loss, grad


def sequence_clip_fraction(logp, old_logp, adv, mask, eps_low, eps_high, side):
    """Share of sequences (of all ``N``) with a counted token whose sequence-level term is clipped
    on ``side`` (``low``: s < 1 - ε_low and A < 0; ``high``: s > 1 + ε_high and A > 0)."""
    hits = 0
    for i in range(len(logp)):
        counted = [t for t in range(len(logp[i])) if mask[i][t]]
        if not counted:
            continue
        s = math.exp(sum(logp[i][t] - old_logp[i][t] for t in counted) / len(counted))
        signs = [adv[i][t] if isinstance(adv[i], list) else adv[i] for t in counted]
        if side == "low" and s < 1 - eps_low and any(a < 0 for a in signs):
            hits += 1
        if side == "high" and s > 1 + eps_high and any(a > 0 for a in signs):
            hits += 1
    return hits / len(logp)
