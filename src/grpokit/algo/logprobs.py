"""Per-token log-probabilities and entropies from logits, with the sampling temperature applied."""

from __future__ import annotations

import torch

from ._checks import check_dim

#: rows of ``(rows, T, V)`` float32 work per chunk; bounds the temporary memory of the log-sum-exp.
_CHUNK_ROWS = 8


def token_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of each chosen token under ``softmax(logits / temperature)``.

    ``logp[n, t] = logits[n, t, id] / τ − logsumexp_v(logits[n, t, v] / τ)``. The temperature is the
    sampler's, so that the trainer's π matches the distribution the completions were drawn from
    (docs/design.md, "Temperature"). No full ``(N, T, V)`` float32 log-softmax is built: the log-sum-exp
    runs over chunks of rows, upcast to float32 one chunk at a time.

    Args:
        logits: ``(N, T, V)`` float (any float dtype), the logits that predict ``token_ids``
            (already shifted: ``logits[:, t]`` scores ``token_ids[:, t]``).
        token_ids: ``(N, T)`` integer ids.
        temperature: sampling temperature τ > 0.

    Returns:
        ``(N, T)`` float32 log-probs (differentiable w.r.t. ``logits``).

    Raises:
        ValueError: wrong dimensions, ``(N, T)`` of the two arguments disagree, or τ <= 0.

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
    out = []
    for start in range(0, logits.shape[0], _CHUNK_ROWS):
        chunk = logits[start : start + _CHUNK_ROWS].float()  # (n, T, V)
        if temperature != 1.0:
            chunk = chunk / temperature
        ids = token_ids[start : start + _CHUNK_ROWS].unsqueeze(-1)
        picked = chunk.gather(-1, ids).squeeze(-1)  # (n, T)
        out.append(picked - torch.logsumexp(chunk, dim=-1))
    return torch.cat(out, dim=0)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at every position, for logging.

    Args:
        logits: ``(N, T, V)`` float.
        temperature: τ > 0.

    Returns:
        ``(N, T)`` float32 entropies, ``H = logsumexp(z) − Σ softmax(z)·z`` with ``z = logits / τ``.

    Example:
        >>> round(token_entropy(torch.zeros(1, 1, 4)).item(), 6)  # uniform over 4: log 4
        1.386294
    """
    check_dim("token_entropy", "logits", logits, 3)
    out = []
    for start in range(logits.shape[0]):  # one row at a time: three (T, V) float32 temporaries
        z = logits[start : start + 1].float() / temperature
        lse = torch.logsumexp(z, dim=-1, keepdim=True)
        p = (z - lse).exp()
        out.append(lse.squeeze(-1) - (p * z).sum(-1))
    return torch.cat(out, dim=0)
