"""The ``hf`` rollout engine: Hugging Face ``model.generate`` on the trained model itself
(:func:`grpokit.rollout.hf.generate_rollouts`), CPU or one GPU. With the inverse-CDF sampler (the
default) row ``(b, g)`` is seeded ``request_seed(seed, first_prompt + b, g)``, so a batch split across
calls or ranks samples what one call samples; ``sampler="multinomial"`` does not (its draws depend on
the batch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grpokit.experience import Experience
from grpokit.rollout import hf
from grpokit.rollout.engine import SamplingParams


class HFRolloutEngine:
    """Samples from ``model`` (the policy being trained), so there are no weights to sync.

    Args:
        model, tokenizer: the policy and its tokenizer (pad token set).
        eos_token_ids: every id that ends a completion.
        chunk_size: rows per ``generate`` call (None = all).
        sampler_dtype: sample from a copy of the weights in this dtype (bf16 with
            ``model.autocast_bf16``, so sampler and trainer see the same precision), or None.

    ``generate_options``: further keyword arguments of every
    :func:`~grpokit.rollout.hf.generate_rollouts` call (the cpu backend's ``share_prompt``,
    ``static_cache``, ``packed_weights``; all on by default; the benchmark switches them off).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        eos_token_ids: Sequence[int],
        chunk_size: int | None = None,
        sampler_dtype: torch.dtype | None = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.eos_token_ids, self.chunk_size, self.sampler_dtype = list(eos_token_ids), chunk_size, sampler_dtype
        self.generate_options: dict[str, Any] = {}

    def generate(
        self, prompts: list[str], group_size: int, sampling: SamplingParams, seed: int, first_prompt: int = 0
    ) -> Experience:
        """:func:`~grpokit.rollout.hf.generate_rollouts`: prompt ``b`` is prompt ``first_prompt + b`` of
        the step's batch, and with the inverse-CDF sampler row ``(b, g)`` draws from
        ``request_seed(seed, first_prompt + b, g)`` whatever ``chunk_size``
        (:class:`~grpokit.rollout.engine.RolloutEngine`; ``sampler="multinomial"``'s draws depend on
        the batch)."""
        return hf.generate_rollouts(
            self.model,
            self.tokenizer,
            prompts,
            group_size,
            sampling,
            eos_token_ids=self.eos_token_ids,
            chunk_size=self.chunk_size,
            seed=seed,
            first_prompt=first_prompt,
            sampler_dtype=self.sampler_dtype,
            **self.generate_options,
        )

    def sync_weights(self) -> None:
        """Nothing to do: ``generate`` runs the trained model (a bf16 sampler copy is refreshed per call)."""
