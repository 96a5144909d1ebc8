"""The catalog of named variants (verl's ``core_algos`` idea): one registry per axis of the loss and of
the outcome advantages, each mapping a recipe name to a plain function (torch only).

- :data:`SURROGATES` (``algo.policy_loss``): the per-token objective, see :class:`Surrogate`;
- :data:`IMPORTANCE_LEVELS` (``algo.importance_level``): the ratio the surrogate clips, see
  :class:`ImportanceLevel`;
- :data:`SAMPLER_CORRECTIONS` (``algo.is_correction``): the weights ``π_old/π_sampler``, see
  :class:`SamplerCorrection`;
- :data:`AGGREGATIONS` (``algo.loss_aggregation``): per-token losses to a scalar, see :class:`Aggregation`;
- :data:`ADVANTAGE_BASELINES` (``algo.advantage_baseline``, with the ``algo.advantage_scale`` values
  each takes, :data:`BASELINE_SCALES`): outcome advantages, see :class:`AdvantageBaseline`.

An entry is one function and one decorator (docs/loss_variants.md, "Adding a variant")::

    @register_surrogate("cispo", check=_cispo_only_per_token)
    def cispo_surrogate(log_ratio, logp, advantages, live, *, eps_low, eps_high, dual_clip_c, delta): ...

The built-in entries are registered where their math lives (:mod:`.surrogates`, :mod:`.loss`,
:mod:`.advantages`); importing :mod:`grpokit.algo` registers them all. A recipe key's choices are a
registry's names (:mod:`grpokit.config.schema` reads them when a recipe is checked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, TypeVar

import torch

if TYPE_CHECKING:
    from .loss_types import LossConfig

F = TypeVar("F", bound=Callable[..., object])
#: ``check(fn, config)``: raise ``ValueError`` naming ``fn`` for a :class:`LossConfig` the entry does
#: not define (run once, when the config is built)
Check = Callable[[str, "LossConfig"], None]


class Registry(Generic[F]):
    """``name -> function`` for one axis ``key`` (the :class:`LossConfig` field or keyword that
    chooses it), in registration order; each entry may carry a ``check`` of the config."""

    def __init__(self, key: str, *, companions: tuple[dict, ...] = ()) -> None:
        self.key = key
        self._fns: dict[str, F] = {}
        self._checks: dict[str, Check] = {}
        self._companions = companions  # dicts keyed by entry name that unregister() clears too

    def register(self, name: str, *, check: Check | None = None) -> Callable[[F], F]:
        """Decorator: ``fn`` is the entry ``name`` (the function is returned unchanged).

        Raises:
            ValueError: ``name`` is registered already.
        """

        def add(fn: F) -> F:
            if name in self._fns:
                raise ValueError(f"{self.key}: {name!r} is registered already ({self._fns[name].__qualname__})")
            self._fns[name] = fn
            if check is not None:
                self._checks[name] = check
            return fn

        return add

    def unregister(self, name: str) -> None:
        """Remove the entry ``name`` (a test's toy entry)."""
        self.lookup(name, "Registry.unregister")
        del self._fns[name]
        for table in (self._checks, *self._companions):
            table.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._fns)

    def lookup(self, name: str, fn: str) -> F:
        """The entry ``name``.

        Raises:
            ValueError: ``"{fn}: {key} must be one of (known names), got 'name'"``.
        """
        if name not in self._fns:
            raise ValueError(f"{fn}: {self.key} must be one of {self.names()}, got {name!r}")
        return self._fns[name]

    def check(self, name: str, fn: str, config: LossConfig) -> None:
        """:meth:`lookup` ``name``, then run its ``check`` (if any) on ``config``."""
        self.lookup(name, fn)
        if name in self._checks:
            self._checks[name](fn, config)

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._fns))

    def __len__(self) -> int:
        return len(self._fns)

    def __repr__(self) -> str:
        return f"Registry({self.key!r}: {', '.join(self._fns)})"


# -- the signatures -----------------------------------------------------------------------------------


class Surrogate(Protocol):
    """``(N, T)`` objective per token, to maximize (the loss is its negative where ``live``).
    ``log_ratio`` ``(N, T)`` from the :class:`ImportanceLevel` (0 where not ``live``); ``logp``
    ``(N, T)`` with gradient; ``advantages`` ``(N, T)`` (0 where masked); ``live`` ``(N, T)`` bool
    (counted, ``A != 0``, not dropped by the sampler correction). Values where not ``live`` are
    discarded, but must keep the gradient finite (select before any ``exp``)."""

    def __call__(
        self,
        log_ratio: torch.Tensor,
        logp: torch.Tensor,
        advantages: torch.Tensor,
        live: torch.Tensor,
        *,
        eps_low: float,
        eps_high: float,
        dual_clip_c: float,
        delta: float,
    ) -> torch.Tensor: ...


class ClipFlags(Protocol):
    """``(low, high)`` ``(N, T)`` bool: the tokens whose term the surrogate's clip held, for the
    ``clip_frac_low/high`` stats. ``ratio`` ``(N, T)``: the true ratio (the row's ``s_i`` at
    sequence levels; may be inf), ``advantages`` ``(N, T)`` 0 where masked, ``live`` as above."""

    def __call__(
        self, ratio: torch.Tensor, advantages: torch.Tensor, live: torch.Tensor, *, eps_low: float, eps_high: float
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class ImportanceRatio(NamedTuple):
    """An :class:`ImportanceLevel`'s output: ``log_ratio`` ``(N, T)`` (0 where not live) and, at a
    sequence level, ``seq_log_ratio`` ``(N,)`` = ``log s_i`` (the stats then count sequences)."""

    log_ratio: torch.Tensor
    seq_log_ratio: torch.Tensor | None


class ImportanceLevel(Protocol):
    """The ratio each token's surrogate uses. ``advantages``: as the caller gave them, ``(N,)`` or
    ``(N, T)`` (a level that needs one per sequence refuses ``(N, T)``)."""

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        completion_mask: torch.Tensor,
        live: torch.Tensor,
    ) -> ImportanceRatio: ...


class Correction(NamedTuple):
    """A :class:`SamplerCorrection`'s output: ``weights`` ``(N, T)`` (no gradient) multiplying each
    token's surrogate term, ``dropped`` ``(N, T)`` bool (tokens given weight 0: they count for
    nothing), and ``logged``: ``LossStats`` field name -> ``(N, T)`` values whose masked token mean
    is that stat."""

    weights: torch.Tensor
    dropped: torch.Tensor
    logged: dict[str, torch.Tensor]


class SamplerCorrection(Protocol):
    """``w = π_old/π_sampler`` per token made a weight, with ``cap`` = C > 0 (``tis_cap``)."""

    def __call__(
        self, old_logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor, *, cap: float
    ) -> Correction: ...


class Aggregation(Protocol):
    """0-dim loss from ``masked`` ``(N, T)`` per-token losses (0 where masked) and ``mask`` ``(N, T)``
    float (1 = counted); ``num_sequences``/``num_tokens``: the whole batch's counts (micro-batching)."""

    def __call__(
        self,
        masked: torch.Tensor,
        mask: torch.Tensor,
        *,
        num_sequences: int,
        num_tokens: int | None,
        max_completion_length: int | None,
    ) -> torch.Tensor: ...


class AdvantageBaseline(Protocol):
    """``(N,)`` outcome advantages from ``rewards`` ``(N,)`` in groups of ``group_size``; ``scale``
    one of the baseline's :data:`BASELINE_SCALES`; ``lengths`` ``(N,)`` counted tokens or None."""

    def __call__(
        self,
        rewards: torch.Tensor,
        group_size: int,
        *,
        scale: str,
        eps: float,
        lengths: torch.Tensor | None,
    ) -> torch.Tensor: ...


# -- the registries -------------------------------------------------------------------------------------

#: the clip flags of each surrogate (:func:`register_surrogate`'s ``clip_flags``)
SURROGATE_CLIP_FLAGS: dict[str, ClipFlags] = {}
SURROGATES: Registry[Surrogate] = Registry("surrogate", companions=(SURROGATE_CLIP_FLAGS,))
IMPORTANCE_LEVELS: Registry[ImportanceLevel] = Registry("importance_level")
SAMPLER_CORRECTIONS: Registry[SamplerCorrection] = Registry("is_correction")
AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")
#: ``baseline -> the scale values it takes`` (:func:`register_advantage_baseline`'s ``scales``)
BASELINE_SCALES: dict[str, tuple[str, ...]] = {}
ADVANTAGE_BASELINES: Registry[AdvantageBaseline] = Registry("baseline", companions=(BASELINE_SCALES,))


class _ScaleNames:
    """Every scale some baseline takes, in order of first registration (``algo.advantage_scale``'s choices)."""

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(s for scales in BASELINE_SCALES.values() for s in scales))

    def __repr__(self) -> str:
        return repr(tuple(self))


ADVANTAGE_SCALES = _ScaleNames()


def clipped_by_sign(
    ratio: torch.Tensor, advantages: torch.Tensor, live: torch.Tensor, *, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped surrogate's :class:`ClipFlags`: ``r < 1 − ε_low`` with ``A < 0`` (low), ``r > 1 +
    ε_high`` with ``A > 0`` (high): the tokens ``min()`` gave the clipped constant, no gradient."""
    return (ratio < 1.0 - eps_low) & (advantages < 0), (ratio > 1.0 + eps_high) & (advantages > 0)


def register_surrogate(
    name: str, *, check: Check | None = None, clip_flags: ClipFlags = clipped_by_sign
) -> Callable[[Surrogate], Surrogate]:
    """Decorator: a :class:`Surrogate` named ``name`` (``LossConfig(surrogate=name)``), its
    :class:`ClipFlags` (default :func:`clipped_by_sign`) and optional config ``check``."""
    add = SURROGATES.register(name, check=check)

    def both(fn: Surrogate) -> Surrogate:
        add(fn)
        SURROGATE_CLIP_FLAGS[name] = clip_flags
        return fn

    return both


def register_importance_level(name: str, *, check: Check | None = None) -> Callable[[ImportanceLevel], ImportanceLevel]:
    """Decorator: an :class:`ImportanceLevel` named ``name`` (``LossConfig(importance_level=name)``)."""
    return IMPORTANCE_LEVELS.register(name, check=check)


def register_sampler_correction(
    name: str, *, check: Check | None = None
) -> Callable[[SamplerCorrection], SamplerCorrection]:
    """Decorator: a :class:`SamplerCorrection` named ``name`` (``LossConfig(is_correction=name)``)."""
    return SAMPLER_CORRECTIONS.register(name, check=check)


def register_aggregation(name: str, *, check: Check | None = None) -> Callable[[Aggregation], Aggregation]:
    """Decorator: an :class:`Aggregation` named ``name`` (``LossConfig(aggregation=name)``)."""
    return AGGREGATIONS.register(name, check=check)


def register_advantage_baseline(
    name: str, *, scales: tuple[str, ...]
) -> Callable[[AdvantageBaseline], AdvantageBaseline]:
    """Decorator: an :class:`AdvantageBaseline` named ``name`` (``outcome_advantages(baseline=name)``)
    taking the ``scale`` values ``scales``."""
    add = ADVANTAGE_BASELINES.register(name)

    def both(fn: AdvantageBaseline) -> AdvantageBaseline:
        add(fn)
        BASELINE_SCALES[name] = scales
        return fn

    return both
