"""The algorithm seam: an advantage estimator and a policy loss, chosen by ``algo.estimator``.

The loop asks its :class:`Algorithm` for two things and never branches on which one it is:

- ``advantages(exp)``: from ``exp.rewards`` (outcome) or ``exp.step_rewards``/``exp.step_ends``
  (process), an ``(N,)`` or ``(N, T)`` float32 tensor on ``exp``'s device;
- ``loss(logp, mb, loss_mask, num_sequences, num_tokens, entropy)``: the loss of one micro-batch ``mb``
  (an :class:`~grpokit.experience.Experience` slice carrying ``advantages``, ``old_logprobs`` and,
  when ``needs_reference``, ``ref_logprobs``), normalized by the whole batch's counts; ``entropy``
  is the policy's per-token entropy, with gradient when ``needs_entropy`` (an entropy bonus).

:class:`grpokit.estimators.grpo.GRPO` is DeepSeekMath's (arXiv 2402.03300): group-normalized outcome advantages (§4.1.2)
or process advantages (§4.1.3), the clipped surrogate with β·KL (eq. 3); all math in
:mod:`grpokit.algo`. :class:`grpokit.estimators.ppo.PPO` (``algo.estimator=ppo``) is the baseline GRPO
replaces: a value model, GAE and a clipped value loss, through the same seam plus four hooks the
loop calls for every algorithm (``bind(logprobs, train_cfg)``, ``updates_policy``, ``update_auxiliary``,
``state_dict``/``load_state_dict``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from grpokit.estimators.grpo import GRPO

if TYPE_CHECKING:
    from grpokit.algo import LossOutput
    from grpokit.config import AlgoConfig, TrainConfig
    from grpokit.experience import Experience
    from grpokit.models.logprobs import LogprobScorer


class Algorithm(Protocol):
    """What the loop asks of an algorithm (module docstring)."""

    #: True when the loss needs π_ref's log-probs (``mb.ref_logprobs``)
    needs_reference: bool
    #: True when the loss needs the policy's per-token entropy with gradient (``loss(entropy=)``)
    needs_entropy: bool

    def advantages(self, exp: Experience) -> torch.Tensor:
        """``(N,)`` or ``(N, T)`` float32 advantages on ``exp``'s device, 0 where there is no signal."""
        ...

    def groups_with_signal(self, exp: Experience) -> list[int]:
        """The group numbers (``exp.group_index`` values) whose advantages can be non-zero: what
        dynamic sampling keeps."""
        ...

    def loss(
        self,
        logp: torch.Tensor,
        mb: Experience,
        loss_mask: torch.Tensor,
        *,
        num_sequences: int,
        num_tokens: int,
        entropy: torch.Tensor | None = None,
    ) -> LossOutput:
        """The micro-batch's scalar loss (normalized by the whole batch's ``num_sequences``/
        ``num_tokens``) and its typed stats (:class:`grpokit.algo.LossStats`): token-weighted means
        over the micro-batch's ``loss_mask`` tokens, and ``num_tokens`` (their weight); the loop
        logs every mean (:meth:`~grpokit.algo.LossStats.means`).
        ``entropy``: ``(n, T)`` per-token entropies of the policy (with gradient when
        ``needs_entropy``; else None or without gradient, and unused)."""
        ...

    def bind(self, logprobs: LogprobScorer, train_cfg: TrainConfig) -> None:
        """Called once the models are loaded (the builder), with the run's log-prob scorer (the
        policy, π_ref and the run's constants) and the ``train`` section: PPO builds its value
        model here."""
        ...

    def updates_policy(self, step: int) -> bool:
        """Whether step ``step`` (1-based) updates the policy (False during PPO's critic warm-up)."""
        ...

    def update_auxiliary(self, exp: Experience, loss_mask: torch.Tensor, train_cfg: TrainConfig) -> dict[str, float]:
        """The algorithm's own updates after the policy's (PPO: the value model); their metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep of the algorithm (PPO: value model and its optimizer)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (an empty dict: nothing to restore)."""
        ...


def _ppo() -> type:
    from grpokit.estimators.ppo import PPO

    return PPO


#: ``algo.estimator`` name -> class built with ``(algo section, max_completion_length)`` (or a
#: function returning the class: imported when chosen)
ALGORITHMS: dict[str, type | Callable[[], type]] = {"grpo": GRPO, "ppo": _ppo}


def load_algorithm(a: AlgoConfig, max_completion_length: int) -> Algorithm:
    """The algorithm ``a.estimator`` names.

    Raises:
        ValueError: unknown name (lists the known ones).
    """
    cls = ALGORITHMS.get(a.estimator)
    if cls is None:
        raise ValueError(f"algo.estimator: unknown {a.estimator!r}; known: {', '.join(ALGORITHMS)}")
    if not isinstance(cls, type):
        cls = cls()
    return cls(a, max_completion_length)
