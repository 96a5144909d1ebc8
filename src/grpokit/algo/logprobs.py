"""Per-token log-probabilities and entropies from logits, with the sampling temperature applied
and, for a truncating sampler, renormalized over the tokens it drew from (:mod:`.support`)."""

from __future__ import annotations

from typing import Any

import torch

from ._checks import check_dim
from .support import contains, to_mask

#: rows of ``(rows, T, V)`` float32 work per chunk; bounds the temporary memory of the log-sum-exp.
_CHUNK_ROWS = 8


def token_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    support: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probability of each chosen token under ``softmax(logits / temperature)``.

    ``logp[n, t] = logits[n, t, id] / τ − logsumexp_v(logits[n, t, v] / τ)``. The temperature is the
    sampler's, so that the trainer's π matches the distribution the completions were drawn from
    (docs/design.md, "Temperature"). No full ``(N, T, V)`` float32 log-softmax is built: the log-sum-exp
    runs over chunks of rows, upcast to float32 one chunk at a time. The value is taken in the
    max-subtracted form ``u_id − log Σ exp(u)``, ``u = (logits − max logits) / τ`` (no rounding of
    ``logits / τ`` or of a log-sum-exp at the logits' magnitude: a few 1e-8 rather than ~2e-6
    absolute at logits of 40), and so is the softmax of its gradient ``(onehot − softmax) / τ``.

    Args:
        logits: ``(N, T, V)`` float (any float dtype), the logits that predict ``token_ids``
            (already shifted: ``logits[:, t]`` scores ``token_ids[:, t]``).
        token_ids: ``(N, T)`` integer ids.
        temperature: sampling temperature τ > 0.
        support: ``(N, T, W)`` the tokens a truncating sampler drew each token from
            (:mod:`grpokit.algo.support`; sampling replay), or None. Given, the softmax is taken
            over each position's kept set alone (the other logits set to ``-inf``): ``logp =
            z_id − logsumexp_{v ∈ S} z_v``, whose gradient w.r.t. a logit outside ``S`` is exactly
            0; an empty position is scored over the full vocabulary. None: nothing changes.

    Returns:
        ``(N, T)`` float32 log-probs (differentiable w.r.t. ``logits``).

    Raises:
        ValueError: wrong dimensions, ``(N, T)`` of the arguments disagree, or τ <= 0; a token
            outside its position's recorded support (its log-prob would be ``-inf``).

    Example:
        >>> logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]])
        >>> round(token_logprobs(logits, torch.tensor([[0]]), temperature=0.5).item(), 6)
        -0.145078
    """
    check_dim("token_logprobs", "logits", logits, 3)
    check_dim("token_logprobs", "token_ids", token_ids, 2)
    if logits.shape[:2] != token_ids.shape:
        raise ValueError(
            f"token_logprobs: logits (N, T, V) {tuple(logits.shape)} and token_ids (N, T) "
            f"{tuple(token_ids.shape)} disagree on (N, T)"
        )
    if not temperature > 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    if support is not None:
        check_support("token_logprobs", support, token_ids)
    out = []
    for start in range(0, logits.shape[0], _CHUNK_ROWS):
        raw = logits[start : start + _CHUNK_ROWS].float()  # (n, T, V)
        if support is not None:
            raw = _outside_support(raw, support[start : start + _CHUNK_ROWS])
        ids = token_ids[start : start + _CHUNK_ROWS].unsqueeze(-1)  # (n, T, 1)
        out.append(_ShiftedLogprob.apply(raw, ids, float(temperature)))
    return torch.cat(out, dim=0)


def check_support(fn: str, support: torch.Tensor, token_ids: torch.Tensor) -> None:
    """Raise ``ValueError`` naming ``fn`` unless ``support`` is ``(N, T, W)`` for ``token_ids``
    ``(N, T)`` and holds every token (a token outside its recorded set would score ``-inf``)."""
    if support.dim() != 3 or support.shape[:2] != token_ids.shape:
        raise ValueError(
            f"{fn}: support (N, T, W) {tuple(support.shape)} and token_ids (N, T) {tuple(token_ids.shape)} disagree"
        )
    inside = contains(support, token_ids)
    if not bool(inside.all()):
        n, t = (int(i) for i in (~inside).nonzero()[0])
        raise ValueError(
            f"{fn}: token {int(token_ids[n, t])} at row {n}, position {t} is outside the support recorded "
            "for it (the sampler could not have drawn it)"
        )


def _outside_support(raw: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """``raw`` ``(n, T, V)`` with the logits outside each position's kept set at ``-inf`` (a new
    tensor: the masked entries get no gradient)."""
    return raw.masked_fill(~to_mask(support, 0, raw.shape[-1]), float("-inf"))


def _shifted(raw: torch.Tensor, temperature: float) -> tuple[torch.Tensor, ...]:
    """The max-subtracted pieces of ``softmax(raw / τ)`` over the last dim: ``top = max raw``
    (keepdim), ``u = (raw − top) / τ``
    (<= 0; subtracted before the division, so that ``raw / τ`` is not rounded at the logits'
    magnitude), ``e = exp(u)`` with 0 at the maximum (where ``u = 0``), ``S − 1 = Σ e + ties − 1``
    and ``log S``. ``S − 1`` is summed without the max entry's exact 1 (ties at the max counted
    exactly), so ``log S = log1p(S − 1)`` keeps full relative precision for a peaked distribution,
    where ``S`` is 1 + a small tail. Two ``raw``-sized float temporaries."""
    top = raw.amax(dim=-1, keepdim=True)
    u = raw - top
    at_top = u == 0
    if temperature != 1.0:
        u.div_(temperature)
    e = u.exp().masked_fill_(at_top, 0.0)
    tail = e.sum(-1) + (at_top.sum(-1) - 1).to(e.dtype)
    return top, u, e, tail, torch.log1p(tail)


class _ShiftedLogprob(torch.autograd.Function):
    """``logp = u_id − log S`` with ``u = (raw − max raw) / τ`` (:func:`_shifted`); backward
    ``d logp / d raw = (onehot(id) − exp(u − log S)) / τ``, the softmax recomputed in the same
    form. ``z_id − logsumexp(z)`` rounds ``z = raw / τ`` and the log-sum-exp at the logits'
    magnitude (~2e-6 absolute at logits of 40 in float32, and as much in ``1 − p`` of the gradient
    of a peaked token); here both terms are small where the log-prob is. Keeps ``raw`` (what
    ``torch.logsumexp`` kept) and two ``(n, T)`` tensors for the backward."""

    @staticmethod
    def forward(  # raw (n, T, V) float, ids (n, T, 1)
        ctx: Any, raw: torch.Tensor, ids: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        top, u, _, _, log_s = _shifted(raw, temperature)
        ctx.save_for_backward(raw, ids, top, log_s)
        ctx.temperature = temperature
        return u.gather(-1, ids).squeeze(-1) - log_s

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        raw, ids, top, log_s = ctx.saved_tensors
        tau = ctx.temperature
        out = raw - top  # one (n, T, V) temporary, worked on in place
        if tau != 1.0:
            out.div_(tau)
        g = grad.unsqueeze(-1)  # (n, T, 1)
        out.sub_(log_s.unsqueeze(-1)).exp_().mul_(-g)  # −g · softmax
        out.scatter_add_(-1, ids, g)
        return (out.div_(tau) if tau != 1.0 else out), None, None


def token_entropy(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    differentiable: bool = False,
    support: torch.Tensor | None = None,
) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at every position: for logging, and with
    ``differentiable`` for the loss's entropy bonus (``algo.entropy_coef``).

    Args:
        logits: ``(N, T, V)`` float.
        temperature: τ > 0.
        differentiable: False (default): no gradient, one row at a time. True: differentiable
            w.r.t. ``logits`` (:class:`_ShiftedEntropy`, chunks of rows; the same values): with
            ``z = logits / τ``, ``dH/dz_v = −p_v · (log p_v + H)``, and ``dH/dlogits = dH/dz / τ``.
        support: ``(N, T, W)`` a truncating sampler's kept sets (:func:`token_logprobs`): the
            entropy of the distribution renormalized over each set (0 gradient outside it).

    Returns:
        ``(N, T)`` float32 entropies ``H = −Σ p·log p`` of ``p = softmax(z)``, ``z = logits / τ``,
        computed in the max-subtracted form ``H = log S − Σ e^u·u / S`` with ``u = z − max z``
        (taken as ``(logits − max logits) / τ``) and ``S = Σ e^u``: both terms are >= 0 and
        small where ``H`` is, so there is no cancellation
        (``logsumexp(z) − Σ p·z`` loses ~2e-5 absolute at logits of 30-40 in float32; this form is
        within ~1e-6 of float64). Vocabulary entries with ``z = −inf`` add 0 (not ``0·(−inf)``).

    Example:
        >>> round(token_entropy(torch.zeros(1, 1, 4)).item(), 6)  # uniform over 4: log 4
        1.386294
    """
    check_dim("token_entropy", "logits", logits, 3)
    if support is not None and (support.dim() != 3 or support.shape[:2] != logits.shape[:2]):
        raise ValueError(
            f"token_entropy: support (N, T, W) {tuple(support.shape)} and logits {tuple(logits.shape)} disagree"
        )

    def rows(s: int, n: int) -> torch.Tensor:  # (n, T, V) float32, masked to the support if any
        raw = logits[s : s + n].float()
        return raw if support is None else _outside_support(raw, support[s : s + n])

    if differentiable:
        chunks = range(0, logits.shape[0], _CHUNK_ROWS)
        return torch.cat([_ShiftedEntropy.apply(rows(s, _CHUNK_ROWS), float(temperature)) for s in chunks])
    out = []
    with torch.no_grad():
        for start in range(logits.shape[0]):  # one row at a time: three (T, V) float32 temporaries
            out.append(_entropy(*_shifted(rows(start, 1), temperature)[1:]))
    return torch.cat(out, dim=0)


def _entropy(u: torch.Tensor, e: torch.Tensor, tail: torch.Tensor, log_s: torch.Tensor) -> torch.Tensor:
    """``H = log S − Σ e^u·u / S`` from :func:`_shifted`'s pieces (``S = 1 + tail``)."""
    eu = torch.where(e > 0, e * u, torch.zeros_like(u)).sum(-1)  # e = 0 at u = -inf (and 0): add 0
    return log_s - eu / (1.0 + tail)


class _ShiftedEntropy(torch.autograd.Function):
    """:func:`token_entropy`'s value with a gradient: backward ``dH/draw = −p·(log p + H)·g / τ``
    with ``log p = u − log S`` recomputed in :func:`_shifted`'s max-subtracted form (``p = 0``
    entries, ``raw = −inf``, get 0, not ``0·(−inf)``). Keeps ``raw`` (the same tensor
    :func:`token_logprobs` keeps for float32 logits) and three ``(n, T)`` tensors."""

    @staticmethod
    def forward(ctx: Any, raw: torch.Tensor, temperature: float) -> torch.Tensor:  # raw (n, T, V) float
        top, u, e, tail, log_s = _shifted(raw, temperature)
        h = _entropy(u, e, tail, log_s)
        ctx.save_for_backward(raw, top, log_s, h)
        ctx.temperature = temperature
        return h

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        raw, top, log_s, h = ctx.saved_tensors
        tau = ctx.temperature
        logp = raw - top  # (n, T, V), worked on in place
        if tau != 1.0:
            logp.div_(tau)
        logp.sub_(log_s.unsqueeze(-1))
        out = (logp + h.unsqueeze(-1)).mul_(-grad.unsqueeze(-1))  # −g·(log p + H)
        p = logp.exp_()
        out.mul_(p).masked_fill_(p == 0, 0.0)
        return (out.div_(tau) if tau != 1.0 else out), None
