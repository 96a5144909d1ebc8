"""Drawing the next token by inverse-CDF sampling inside ``model.generate``.

``generate`` with ``do_sample=True`` draws with ``torch.multinomial``, which on CPU generates one
exponential random number per vocabulary entry: for 32 rows × 49,152 entries that is ~33 ms per
decode step, a quarter of a SmolLM2-135M decode step on 2 cores. Inverse-CDF sampling needs one
uniform number per row: with ``p`` the row's (warped) probabilities and ``c_j = Σ_{i≤j} p_i``,
draw ``u ~ U[0, 1)`` and take the first ``j`` with ``c_j > u · c_V``. ``P(j) = p_j / c_V``, the
same categorical distribution ``torch.multinomial`` samples (different random numbers, so
different draws for the same seed).

:class:`InverseCDFSampler` is a ``LogitsProcessor`` for ``generate`` run *greedily*
(``do_sample=False``): it applies the recipe's warpers (transformers' own ``Temperature``,
``TopK``, ``TopP``, ``MinP`` warpers, in the order ``generate`` applies them when sampling), draws
one token per row, and returns scores that are 0 at the drawn token and ``-inf`` elsewhere, so the
greedy ``argmax`` picks the drawn token. Everything else in ``generate`` (EOS handling, padding of
finished rows, caches, stopping) is unchanged.

Sampling replay (``record=True``, which the hf engine sets when a truncating warper is on): each
call also keeps, per row, the set of tokens the warpers left finite (the set the token is drawn
from: :func:`grpokit.algo.support.from_mask`) and the drawn token's log-prob under the warped
scores renormalized over it (``log_softmax`` of the warped scores); :meth:`InverseCDFSampler.recorded`
returns both per decode step, for ``Experience.sampler_support`` / ``sampler_logprobs``.

Where the uniform numbers come from: given a table ``uniforms`` ``(N, max_new_tokens)``, the
sampler's k-th call (``generate``'s k-th decode step, every row of the call at once, finished rows
included) uses column k, so each row draws from its own stream.
:func:`grpokit.rollout.hf.generate_rollouts` fills row ``(b, g)`` from a generator seeded
:func:`grpokit.rollout.engine.request_seed` ``(seed, first_prompt + b, g)``, which makes a row's
draws independent of the other rows of its call or chunk. Without a table the numbers come from
torch's global RNG (one per row per step, so a row's draws depend on the batch).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor

from grpokit.algo import support as _support
from grpokit.rollout.engine import request_seed


def sample_inverse_cdf(
    scores: torch.Tensor, generator: torch.Generator | None = None, u: torch.Tensor | None = None
) -> torch.Tensor:
    """One token per row of ``scores``, drawn from ``softmax(scores)``.

    Args:
        scores: ``(N, V)`` float logits (already temperature-scaled / filtered; ``-inf`` entries
            are never drawn). Each row needs at least one finite entry.
        generator: optional ``torch.Generator`` for the ``N`` uniform numbers (default: torch's
            global RNG, so ``torch.manual_seed`` makes draws reproducible). Unused with ``u``.
        u: optional precomputed uniform numbers in ``[0, 1)``, ``(N,)`` or ``(N, 1)``, one per row
            (used in float64); row ``i`` draws the first token whose cumulative probability
            exceeds ``u[i]``.

    Returns:
        ``(N,)`` long token ids.

    The softmax is taken in float32 (as ``generate`` does before ``torch.multinomial``); the
    cumulative sums in float64, so tokens with probability down to ~1e-15 keep their mass. For a
    large vocabulary the CDF is searched in two levels: blocks of 256 entries, then the entries of
    the chosen block.

    Raises:
        ValueError: ``scores`` is not 2-D, or a row has no finite entry or holds a NaN or +inf;
            ``u`` is not ``(N,)`` or ``(N, 1)``.

    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> sample_inverse_cdf(torch.tensor([[0.0, float("-inf")], [float("-inf"), 3.0]])).tolist()
    [0, 1]
    >>> sample_inverse_cdf(torch.zeros(2, 4), u=torch.tensor([0.3, 0.8])).tolist()  # 4 equal tokens
    [1, 3]
    """
    if scores.dim() != 2:
        raise ValueError(f"sample_inverse_cdf: scores must be (N, V), got shape {tuple(scores.shape)}")
    drawable = torch.isfinite(scores.amax(dim=1))  # -inf: nothing to draw; NaN or +inf: the softmax is NaN
    if not bool(drawable.all()):
        row = int((~drawable).nonzero()[0])
        raise ValueError(
            f"sample_inverse_cdf: row {row} of scores has no finite entry, a NaN or a +inf (nothing to draw)"
        )
    n, v = scores.shape
    if u is None:
        u = torch.rand(n, 1, dtype=torch.float64, device=scores.device, generator=generator)
    else:
        if tuple(u.shape) not in ((n,), (n, 1)):
            raise ValueError(
                f"sample_inverse_cdf: u must be ({n},) or ({n}, 1) for {n} rows of scores, got shape {tuple(u.shape)}"
            )
        u = u.to(device=scores.device, dtype=torch.float64).reshape(n, 1)
    probs = torch.softmax(scores.float(), dim=-1)  # (N, V) float32
    if v <= 2 * _BLOCK:
        cdf = probs.cumsum(dim=-1, dtype=torch.float64)  # (N, V)
        idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # (N, 1)
        return idx.clamp_(max=v - 1).squeeze(1)
    # Two levels (a cumulative sum over all V entries is sequential per row: ~6 ms for 32 × 49k):
    # the block of the drawn token from the blocks' cumulative masses, then the token inside it.
    nb = -(-v // _BLOCK)
    blocks = (probs if v % _BLOCK == 0 else torch.nn.functional.pad(probs, (0, nb * _BLOCK - v))).view(n, nb, _BLOCK)
    block_cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # (N, nb)
    target = u * block_cdf[:, -1:]  # (N, 1)
    b = torch.searchsorted(block_cdf, target, right=True).clamp_(max=nb - 1)  # (N, 1)
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), 0.0)  # mass of earlier blocks
    inside = blocks[torch.arange(n, device=probs.device), b.squeeze(1)]  # (N, BLOCK)
    cdf = before + inside.cumsum(-1, dtype=torch.float64)
    j = torch.searchsorted(cdf, target, right=True)
    # rounding (the block sums and the running sum add in other orders) can leave `target` past
    # the block's last entry: take the block's last token with mass then, never a zero-mass one
    last = torch.where(inside > 0, torch.arange(_BLOCK, device=probs.device), -1).amax(-1, keepdim=True)
    j = torch.minimum(j, last)
    return (b * _BLOCK + j).clamp_(max=v - 1).squeeze(1)


#: vocabulary entries per block of the two-level inverse CDF in :func:`sample_inverse_cdf`
_BLOCK = 256


def request_uniforms(seed: int, first_prompt: int, num_prompts: int, group_size: int, steps: int) -> torch.Tensor:
    """The uniform numbers of a call's ``N = num_prompts · group_size`` rows: ``(N, steps)`` float64 on
    the CPU, row ``b·G + g`` = ``torch.rand(steps, dtype=float64)`` from a ``torch.Generator`` seeded
    :func:`grpokit.rollout.engine.request_seed` ``(seed, first_prompt + b, g)``, so each row's
    numbers depend on nothing but ``(seed, first_prompt + b, g)``.

    >>> t = request_uniforms(5, 3, 2, 2, 4)
    >>> t.shape, bool(torch.equal(t[2:], request_uniforms(5, 4, 1, 2, 4)))  # prompt 1 here is prompt 4
    (torch.Size([4, 4]), True)
    """
    return row_uniforms(seed, [(first_prompt + b, g) for b in range(num_prompts) for g in range(group_size)], steps)


def row_uniforms(seed: int, rows: list[tuple[int, int]], steps: int) -> torch.Tensor:
    """``(len(rows), steps)`` float64 on the CPU: row ``i`` = ``torch.rand(steps)`` from a generator seeded
    :func:`grpokit.rollout.engine.request_seed` ``(seed, *rows[i])`` (``rows``: ``(prompt index, sample
    index)`` pairs; a multi-turn rollout passes the rows still going)."""
    return torch.stack(
        [
            torch.rand(steps, dtype=torch.float64, generator=torch.Generator().manual_seed(request_seed(seed, b, g)))
            for b, g in rows
        ]
    )


class InverseCDFSampler(LogitsProcessor):
    """``LogitsProcessor`` that samples the next token (see the module docstring).

    Args:
        temperature: > 0 (greedy decoding has no sampler).
        top_k: 0 = off. top_p: 1 = off. min_p: 0 = off (same meanings as ``SamplingParams``).
        uniforms: optional ``(N, max_new_tokens)`` float64 table of uniform numbers, one row per
            row of the ``generate`` call: the k-th call of the sampler (decode step k) draws with
            column k. None = torch's global RNG. One sampler per ``generate`` call (it counts calls).
        record: keep each call's kept sets and drawn tokens' log-probs (:meth:`recorded`).

    Raises:
        ValueError: ``temperature <= 0``; ``uniforms`` not 2-D. When called: the call's row count
            differs from the table's, or more calls than the table has columns.
    """

    def __init__(
        self,
        *,
        temperature: float,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        uniforms: torch.Tensor | None = None,
        record: bool = False,
    ):
        from transformers.generation.logits_process import (
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        if not temperature > 0:
            raise ValueError(f"InverseCDFSampler: temperature must be > 0, got {temperature!r}")
        self.warpers: list[Any] = []
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(float(temperature)))
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k=int(top_k)))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=float(top_p)))
        if min_p > 0.0:
            self.warpers.append(MinPLogitsWarper(min_p=float(min_p)))
        if uniforms is not None and uniforms.dim() != 2:
            raise ValueError(
                f"InverseCDFSampler: uniforms must be (N, max_new_tokens), got shape {tuple(uniforms.shape)}"
            )
        self.uniforms = uniforms
        self.calls = 0  # decode steps drawn so far: the column of `uniforms` the next call uses
        self.record = record
        self._supports: list[torch.Tensor] = []  # per call: (N, W) the rows' kept sets
        self._logprobs: list[torch.Tensor] = []  # per call: (N,) the drawn tokens' log-probs

    def warp(self, scores: torch.Tensor) -> torch.Tensor:
        """``(N, V)`` logits -> the warped scores the token is drawn from (``-inf`` outside the
        kept set): temperature, then top-k, top-p, min-p, each on the previous one's output."""
        for warp in self.warpers:
            scores = warp(None, scores)
        return scores

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``(N, V)`` scores -> ``(N, V)``: 0 at the drawn token, ``-inf`` elsewhere."""
        scores = self.warp(scores)
        u = None
        if self.uniforms is not None:
            rows, steps = self.uniforms.shape
            if scores.shape[0] != rows:
                raise ValueError(
                    f"InverseCDFSampler: called with {scores.shape[0]} rows, but its uniforms table "
                    f"has {rows} (one sampler per generate call, one table row per row)"
                )
            if self.calls >= steps:
                raise ValueError(
                    f"InverseCDFSampler: call {self.calls + 1} but the uniforms table has {steps} "
                    "columns (one per decode step: max_new_tokens)"
                )
            u = self.uniforms[:, self.calls]
        self.calls += 1
        tokens = sample_inverse_cdf(scores, u=u)
        if self.record:
            support, logp = drawn_from(scores, tokens)
            self._supports.append(support)
            self._logprobs.append(logp)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, tokens.unsqueeze(1), 0.0)

    def recorded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What a ``record=True`` sampler kept over its calls: ``(support, logprobs)``, ``(N, C, W)``
        (:mod:`grpokit.algo.support`) and ``(N, C)`` float32 for ``C`` calls (decode steps).

        Raises:
            ValueError: the sampler does not record, or was never called.
        """
        if not self.record or not self._supports:
            raise ValueError("InverseCDFSampler.recorded: nothing recorded (record=False, or no call yet)")
        return torch.stack(_support.unify(self._supports), 1), torch.stack(self._logprobs, 1)


def drawn_from(scores: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(support, logprobs)`` of tokens drawn from warped ``scores`` ``(N, V)`` (``-inf`` outside
    the kept set): each row's kept set (:func:`grpokit.algo.support.from_mask`, ``(N, W)``) and
    ``log_softmax(scores)`` at ``tokens`` ``(N,)``, float32 (the sampler's own log-prob of its draw,
    over the set it drew from)."""
    logp = torch.log_softmax(scores.float(), dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    return _support.from_mask(torch.isfinite(scores)), logp
