"""Memory-lean autograd functions for the training forward: the same values as the plain PyTorch
ops, fewer tensors kept for the backward. Imports torch only.

What autograd keeps for a decoder layer, per token (SmolLM2-135M: hidden 576, MLP 1536, bf16),
and what these functions keep instead (``tests/backends/cpu/test_ops.py`` checks values and
gradients against plain autograd, and the saved bytes):

- RMSNorm ``w · cast(x · rsqrt(mean(x²) + eps))``: a float32 copy of the input and the bf16
  normalized values (6 bytes per value, 3.4 KB/token/norm) → the input as it is (2 bytes per
  value) and one float32 ``rstd`` per token; the backward recomputes ``x̂``.
- SwiGLU MLP ``down(silu(gate(x)) · up(x))``: ``gate``, ``silu(gate)``, ``up`` and their product
  (4 × 1536 values per token) → nothing but ``x``; the backward runs the ``gate`` and ``up``
  matmuls again (-90 MB of an 8-row bf16 micro-batch, ~20 % more MLP forward + backward time);
  with ``recompute=False``, ``gate(x)`` and ``up(x)`` are kept and only the elementwise part is
  recomputed.
- LM head + log-softmax + gather (the per-token log-prob): the ``(N, T, V)`` logits and their
  float32 copy (V = 49,152: 0.3 MB/token) → the ``(N, T)`` maximum and log-normalizer of the
  max-subtracted log-sum-exp (8 bytes/token); the backward recomputes the logits chunk by chunk
  (one more head matmul).

And one for time: the token embedding's weight gradient as a sparse tensor over the distinct ids
(:func:`embedding`) instead of a dense ``(V, H)`` tensor per call.

Imports torch and :mod:`grpokit.algo.support` (a truncating sampler's kept sets, which the LM-head
log-probs renormalize over, block by block).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from grpokit.algo.support import check as _check_support_shape
from grpokit.algo.support import contains, restricted, to_mask

#: float32 logits per vocabulary block in :func:`linear_token_logprobs` (4 MB): bounds its temporaries.
_CHUNK_ELEMENTS = 1 << 20
_MIN_BLOCK = 256  # columns: narrower blocks make the head matmul inefficient


def _f32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or float64 if it is already (so ``gradcheck`` can run in double)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(_f32(x).pow(2).mean(-1, keepdim=True) + eps)  # (..., 1) float32
        ctx.save_for_backward(x, weight, rstd)
        return weight * (_f32(x) * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        xhat = _f32(x) * rstd  # (..., H) float32, recomputed
        grad_w = None
        if ctx.needs_input_grad[1]:
            prod = _f32(grad_out) * _f32(xhat.to(x.dtype))
            grad_w = prod.reshape(-1, prod.shape[-1]).sum(0).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            g = _f32(grad_out * weight)  # dL/dx̂
            grad_x = (rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_w, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Llama-family models compute it (Zhang & Sennrich 2019, eq. 4), with float32
    statistics: ``y = weight · cast_x(x · rsqrt(mean(x², -1) + eps))``.

    Args:
        x: ``(..., H)`` float (any float dtype); the output has ``x``'s and ``weight``'s
            promoted dtype, as in the plain expression.
        weight: ``(H,)`` gain.
        eps: added to the mean square.

    Returns:
        ``(..., H)``. For the backward it keeps ``x`` and a float32 ``rstd`` ``(..., 1)`` only.

    Raises:
        RuntimeError: from torch, if ``weight`` does not broadcast against ``x``.
    """
    return _RMSNorm.apply(x, weight, eps)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, recompute: bool
    ) -> torch.Tensor:
        gate, up = F.linear(x, w_gate), F.linear(x, w_up)
        ctx.recompute = recompute
        if recompute:
            ctx.save_for_backward(x, w_gate, w_up, w_down)
        else:
            ctx.save_for_backward(x, w_gate, w_up, w_down, gate, up)
        return F.linear(F.silu(gate) * up, w_down)

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None]:
        if ctx.recompute:
            x, w_gate, w_up, w_down = ctx.saved_tensors
            gate, up = F.linear(x, w_gate), F.linear(x, w_up)  # (..., I), recomputed
        else:
            x, w_gate, w_up, w_down, gate, up = ctx.saved_tensors
        act = F.silu(gate)
        h = act * up  # exactly as in the forward
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_down = g2.t() @ h.reshape(-1, h.shape[-1]) if ctx.needs_input_grad[3] else None
        del h
        dh = grad_out @ w_down  # (..., I); the same ops, in the same dtype, as plain autograd's
        d_up = dh * act
        d_gate = torch.ops.aten.silu_backward(dh * up, gate)
        del dh, act
        x2 = x.reshape(-1, x.shape[-1])
        grad_gate = d_gate.reshape(-1, d_gate.shape[-1]).t() @ x2 if ctx.needs_input_grad[1] else None
        grad_up = d_up.reshape(-1, d_up.shape[-1]).t() @ x2 if ctx.needs_input_grad[2] else None
        grad_x = d_gate @ w_gate + d_up @ w_up if ctx.needs_input_grad[0] else None
        return grad_x, grad_gate, grad_up, grad_down, None


def swiglu_mlp(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *, recompute: bool = True
) -> torch.Tensor:
    """The gated MLP of Llama-family models, ``down(silu(gate(x)) · up(x))`` (Shazeer 2020,
    "GLU Variants Improve Transformer", eq. 6), without biases.

    Args:
        x: ``(..., H)``; w_gate, w_up: ``(I, H)``; w_down: ``(H, I)``, all one float dtype.
        recompute: keep only ``x`` for the backward and run the ``gate`` and ``up`` matmuls again
            there (the plain ops keep ``gate(x)``, ``silu(gate)``, ``up(x)`` and the product: four
            ``(..., I)`` tensors). False keeps ``gate(x)`` and ``up(x)`` (two ``(..., I)``
            tensors) and recomputes only the elementwise ``silu`` and product: a third less
            backward FLOPs for the MLP (SmolLM2-135M, 8 × 64 tokens, 2 cores: 65 → 53 ms per
            layer forward + backward in float32, 28 → 23 ms in bf16).

    Returns:
        ``(..., H)``.

    Raises:
        RuntimeError: from torch, on mismatched shapes or dtypes.
    """
    return _SwiGLU.apply(x, w_gate, w_up, w_down, recompute)


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, token_ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(token_ids)
        ctx.weight_shape, ctx.padding_idx = weight.shape, padding_idx
        return F.embedding(token_ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[None, torch.Tensor | None, None]:
        if not ctx.needs_input_grad[1]:
            return None, None, None
        (token_ids,) = ctx.saved_tensors
        ids, g = token_ids.reshape(-1), grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.padding_idx is not None:  # as F.embedding: the padding row gets no gradient
            keep = ids != ctx.padding_idx
            ids, g = ids[keep], g[keep]
        rows, inverse = torch.unique(ids, return_inverse=True)  # sorted, distinct
        sums = torch.zeros(len(rows), g.shape[1], dtype=_f32(g[:0]).dtype, device=g.device)
        sums.index_add_(0, inverse, _f32(g))
        grad_w = torch.sparse_coo_tensor(
            rows[None], sums.to(grad_out.dtype), ctx.weight_shape, is_coalesced=True, check_invariants=False
        )
        return None, grad_w, None


def embedding(token_ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """``weight[token_ids]`` (``F.embedding``) whose weight gradient is a sparse COO tensor over
    the distinct ids only, each row summed in float32 (float64 for float64 weights).

    ``F.embedding``'s dense backward allocates and zeroes a ``(V, H)`` gradient for every call
    (SmolLM2-135M: 113 MB in float32, ~40 ms on 2 cores per micro-batch, mostly page faults) and
    then adds it into the weight's; autograd adds a sparse gradient into a dense one row by row
    (~1 ms). ``nn.Embedding(sparse=True)`` is the same idea but sums the duplicates of a bf16
    gradient in bf16.

    Args:
        token_ids: ``(...)`` int64 ids in ``[0, V)``.
        weight: ``(V, H)`` float.
        padding_idx: a row that gets no gradient (``nn.Embedding``'s), or None.

    Returns:
        ``(..., H)``, ``weight``'s dtype. The backward gives ``weight`` a coalesced sparse
        ``(V, H)`` gradient; where nothing else makes the accumulated ``.grad`` dense, the caller
        densifies it (:func:`grpokit.backends.cpu.fused.apply_fused_ops` registers a hook).

    Raises:
        IndexError: from torch, for an id outside ``[0, V)``.
    """
    return _Embedding.apply(token_ids, weight, padding_idx)


def _vocab_block(rows: int, vocab: int) -> int:
    """Vocabulary columns per block: ``rows × block`` float32 logits of about ``_CHUNK_ELEMENTS``."""
    return min(vocab, max(_MIN_BLOCK, _CHUNK_ELEMENTS // max(rows, 1)))


def _block_logits(hidden: torch.Tensor, weight_block: torch.Tensor) -> torch.Tensor:
    """``(M, b)`` float32 logits of one vocabulary block (not yet over the temperature), computed
    as the model's ``logits.float()`` would be (matmul in the weights' dtype, then upcast)."""
    return _f32(F.linear(hidden, weight_block))


class _LinearTokenLogprobs(torch.autograd.Function):
    """Blocks run over the vocabulary, so each block of the head weight is read once per pass
    (blocks over positions would re-read the whole 57 MB head for every block); the log-sum-exp
    (and the entropy) are accumulated online with a running maximum (Milakov & Gimelshein 2018),
    in the max-subtracted form of :func:`grpokit.algo.token_logprobs` and
    :func:`grpokit.algo.token_entropy` (the same values to float32 rounding). With
    ``entropy_grad`` the entropy is an output with a gradient: the backward adds
    ``−p·(log p + H)·g_H`` (``z = logits / τ``) to the log-probs' ``(onehot − p)·g`` per block.
    With ``support`` (``(M, W)``, a sampler's kept sets) each block's logits outside a row's set
    are ``-inf`` in both passes: they add nothing and get no gradient; a row's block may hold none
    of its set (its running maximum then stays ``-inf`` and the block adds 0)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        token_ids: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = False,
        support: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h2, ids = hidden.reshape(-1, hidden.shape[-1]), token_ids.reshape(-1)
        m, vocab = h2.shape[0], weight.shape[0]
        s2 = None if support is None else support.reshape(m, support.shape[-1])
        cut = None if s2 is None else restricted(s2)  # (M,) rows with a kept set
        acc = torch.promote_types(hidden.dtype, torch.float32)
        # Max-subtracted accumulators over the running maximum M of the raw logits x (no
        # cancellation where the distribution is peaked, see grpokit.algo.token_entropy), with
        # u = (x − M) / τ: S = ties + tail with ties the count of logits equal to M (exact) and
        # tail = Σ_{x<M} e^u; eu = Σ e^u·u <= 0. Subtracting before dividing by τ keeps x / τ from
        # being rounded at the logits' magnitude.
        run_max = torch.full((m,), float("-inf"), dtype=acc, device=hidden.device)
        ties = torch.zeros(m, dtype=acc, device=hidden.device)
        tail = torch.zeros(m, dtype=acc, device=hidden.device)
        eu = torch.zeros(m if with_entropy else 0, dtype=acc, device=hidden.device)
        picked = torch.zeros(m, dtype=acc, device=hidden.device)
        block = _vocab_block(m, vocab)
        for v0 in range(0, vocab, block):
            z = _block_logits(h2, weight[v0 : v0 + block])  # (M, b) raw logits
            if s2 is not None:  # outside the kept sets: -inf (adds nothing, no gradient)
                z.masked_fill_(~to_mask(s2, v0, v0 + z.shape[1], truncated=cut), float("-inf"))
            local = ids - v0
            here = (local >= 0) & (local < z.shape[1])
            picked += torch.where(here, z.gather(1, local.clamp(0, z.shape[1] - 1)[:, None]).squeeze(1), 0.0)
            new_max = torch.maximum(run_max, z.amax(-1))
            moved = new_max > run_max  # the old terms now sit below the maximum, scaled by r
            seen = ties > 0  # False before the first finite maximum: nothing to rescale (-inf − M)
            shift = torch.where(moved & seen, run_max - new_max, torch.zeros_like(run_max)) / temperature  # <= 0
            r = shift.exp()
            if s2 is None:
                u = z - new_max[:, None]  # (M, b) <= 0
            else:  # a row with nothing finite yet: u = -inf, not (-inf) − (-inf) = NaN
                u = z - torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))[:, None]
            top = u == 0
            if temperature != 1.0:
                u = u / temperature
            e = u.exp()
            if with_entropy:
                old_s = ties + tail
                eu = torch.where(moved & seen, r * (eu + shift * old_s), eu)
                eu += torch.where(e > 0, e * u, torch.zeros_like(e)).sum(-1)  # e = 0 at z = −inf: add 0
            tail = torch.where(moved & seen, r * (tail + ties), tail)
            ties = torch.where(moved, torch.zeros_like(ties), ties)
            tail += torch.where(top, torch.zeros_like(e), e).sum(-1)
            ties += top.sum(-1).to(acc)
            run_max = new_max
        log_s = torch.log1p((ties - 1.0) + tail)  # log S, precise when S = 1 + a small tail
        entropy = (log_s - eu / (ties + tail)) if with_entropy else eu
        ctx.entropy_grad = bool(with_entropy and entropy_grad)
        saved: tuple[torch.Tensor, ...] = (entropy,) if ctx.entropy_grad else ()
        ctx.has_support = s2 is not None
        saved += (s2,) if s2 is not None else ()
        ctx.save_for_backward(hidden, weight, token_ids, run_max, log_s, *saved)  # the backward's softmax, same form
        ctx.temperature = temperature
        entropy = entropy.view(token_ids.shape if with_entropy else (0,))
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        picked_u = picked - run_max
        if temperature != 1.0:
            picked_u = picked_u / temperature
        return (picked_u - log_s).view(token_ids.shape), entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None, None]:
        hidden, weight, token_ids, run_max, log_s, *saved = ctx.saved_tensors
        s2 = saved.pop() if ctx.has_support else None
        cut = None if s2 is None else restricted(s2)
        tau = ctx.temperature
        h2, ids, g = hidden.reshape(-1, hidden.shape[-1]), token_ids.reshape(-1), _f32(grad_logp.reshape(-1))
        g_h = _f32(grad_entropy.reshape(-1)) if ctx.entropy_grad and grad_entropy is not None else None
        m, vocab = h2.shape[0], weight.shape[0]
        grad_h = torch.zeros(h2.shape, dtype=log_s.dtype, device=h2.device) if ctx.needs_input_grad[0] else None
        grad_w = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        rows = torch.arange(m, device=h2.device)
        block = _vocab_block(m, vocab)
        for v0 in range(0, vocab, block):
            w_b = weight[v0 : v0 + block]
            gz = _block_logits(h2, w_b).sub_(run_max[:, None])  # raw logits − M, in place
            if s2 is not None:  # outside the kept sets: p = 0, no gradient
                gz.masked_fill_(~to_mask(s2, v0, v0 + gz.shape[1], truncated=cut), float("-inf"))
            if tau != 1.0:
                gz.div_(tau)
            # d logp / d z = onehot(id) − softmax(z), softmax = exp((x − M) / τ − log S); then d z / d x = 1 / τ
            gz.sub_(log_s[:, None])
            if g_h is None:
                gz.exp_().mul_(-g[:, None])
            else:  # + d H / d z = −p·(log p + H), gz holding log p; p = 0 entries (x = −inf) get 0
                t = (gz + saved[0][:, None]).mul_(g_h[:, None]).add_(g[:, None])
                p = gz.exp_()
                gz = t.mul_(p).neg_().masked_fill_(p == 0, 0.0)
            local = ids - v0
            here = (local >= 0) & (local < gz.shape[1])
            gz[rows[here], local[here]] += g[here]
            if tau != 1.0:
                gz = gz / tau
            gz = gz.to(hidden.dtype)
            if grad_h is not None:
                grad_h += gz @ w_b
            if grad_w is not None:
                torch.mm(gz.t(), h2, out=grad_w[v0 : v0 + block])
        if grad_h is not None:
            grad_h = grad_h.to(hidden.dtype).view(hidden.shape)
        return grad_h, grad_w, None, None, None, None, None


def linear_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    support: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each chosen token under ``softmax(hidden @ weightᵀ / τ)``, without keeping the
    ``(N, T, V)`` logits: the LM head, the temperature and :func:`grpokit.algo.token_logprobs` in
    one step, over blocks of the vocabulary (``2²⁰`` logits at a time; the fused linear +
    cross-entropy idea of Liger-Kernel, written for log-probs and CPU).

    ``logp[n, t] = z[id] − logsumexp(z)`` with ``z = cast_f32(hidden[n, t] @ weightᵀ) / τ``: the
    logits are computed in ``hidden``'s dtype and upcast, as ``model(...).logits.float()`` would be.

    Args:
        hidden: ``(N, T, H)`` final hidden states (after the model's last norm).
        weight: ``(V, H)`` LM-head weight (no bias), same dtype as ``hidden``.
        token_ids: ``(N, T)`` int64 ids to score.
        temperature: τ > 0, the sampler's.
        with_entropy: also return the entropy (nats) of each position's distribution.
        entropy_grad: the entropy with a gradient (w.r.t. ``hidden`` and ``weight``; the entropy
            bonus of the loss), else none.
        support: ``(N, T, W)`` a truncating sampler's kept sets (:mod:`grpokit.algo.support`), or
            None: given, log-probs and entropy are those of the softmax renormalized over each
            position's set, as :func:`grpokit.algo.token_logprobs` takes them (sampling replay).

    Returns:
        ``logp`` ``(N, T)`` float32 (differentiable w.r.t. ``hidden`` and ``weight``) and the entropy
        ``(N, T)`` float32 or None. The backward keeps ``hidden``, ``weight`` and two ``(N, T)``
        tensors (the logits' maximum and ``log Σ exp((z − max) / τ)``), and runs the head matmul
        again per chunk. Values and gradient in the max-subtracted form (float64 to ~1e-7 for
        peaked distributions at logits of 40; ``tests/backends/cpu/test_ops_precision.py``).

    Raises:
        ValueError: wrong dimensions or dtypes, or τ <= 0; a token outside its recorded support.
    """
    if hidden.dim() != 3 or token_ids.shape != hidden.shape[:2]:
        raise ValueError(
            f"linear_token_logprobs: hidden (N, T, H) {tuple(hidden.shape)} and token_ids "
            f"(N, T) {tuple(token_ids.shape)} disagree"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[2] or weight.dtype != hidden.dtype:
        raise ValueError(
            f"linear_token_logprobs: weight (V, H) {tuple(weight.shape)} {weight.dtype} does not "
            f"match hidden {tuple(hidden.shape)} {hidden.dtype}"
        )
    if not temperature > 0:
        raise ValueError(f"linear_token_logprobs: temperature must be > 0, got {temperature}")
    if support is not None:
        _check_support_shape(support, *token_ids.shape)
        if not bool(contains(support, token_ids).all()):
            raise ValueError("linear_token_logprobs: a token lies outside the support recorded for it")
    logp, entropy = _LinearTokenLogprobs.apply(
        hidden, weight, token_ids, float(temperature), with_entropy, entropy_grad, support
    )
    return logp, (entropy if with_entropy else None)
