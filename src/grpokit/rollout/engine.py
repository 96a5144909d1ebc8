"""The rollout-engine seam: prompts in, grouped completions out as an :class:`~grpokit.experience.Experience`.

An engine is anything with ``generate(prompts, group_size, sampling, seed, first_prompt=0) ->
Experience`` (:class:`RolloutEngine`) plus ``sync_weights()``, called by the loop after every update (a
no-op for engines that sample from the trained model itself). Engines are named in ``rollout.engine``
and imported only when chosen (:func:`load_engine`), so a heavy engine's dependencies are never
imported by runs that do not use it.

Seeding: row ``(b, g)`` of a call (sample ``g`` of prompt ``b``) is row ``(first_prompt + b, g)`` of
the step's batch and draws its random numbers from :func:`request_seed` ``(seed, first_prompt + b,
g)`` alone, so a batch split across calls (chunks, or the ranks of a data-parallel run, each passing
the index of its first prompt) samples the same completions as one call over the whole batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from grpokit.config import RolloutConfig
    from grpokit.experience import Experience


#: the values of ``SamplingParams.sampler`` (and ``rollout.sampler``)
SAMPLERS = ("inverse_cdf", "multinomial")


@dataclass
class SamplingParams:
    """How completions are sampled. ``temperature == 0`` means greedy decoding (argmax at every
    step; no random numbers drawn, so the seed does not matter)."""

    temperature: float = 1.0
    """Softmax temperature; 0 = greedy (argmax). The trainer divides logits by the same value."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 = off."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 = off."""
    min_p: float = 0.0
    """Drop tokens with probability below min_p × the top token's probability; 0 = off."""
    max_new_tokens: int = 256
    """Completion length limit T_max (>= 1); a completion without EOS by then is truncated."""
    repetition_penalty: float = 1.0
    """CTRL repetition penalty (> 0); 1 = off."""
    sampler: str = "inverse_cdf"
    """How a token is drawn from the warped distribution: ``inverse_cdf`` (one uniform number per
    row, :mod:`grpokit.rollout.sampling`; with a seed, row ``(b, g)``'s numbers come from
    :func:`request_seed`, so they do not depend on the batch) or ``multinomial`` (``generate``'s own
    ``torch.multinomial`` on torch's global RNG seeded by ``seed``: a row's draws depend on which
    rows share the call, so they change when a batch is split). Same distribution; inverse_cdf is
    ~30 ms per decode step cheaper on CPU for a 49k vocabulary."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def truncates(self) -> bool:
        """True when the sampler draws from a truncated set (``top_k``, ``top_p`` or ``min_p`` on,
        temperature > 0): the hf engine then records each token's set (``Experience.sampler_support``)
        and the trainer scores every policy renormalized over it (sampling replay).

        >>> SamplingParams(top_p=0.9).truncates, SamplingParams(temperature=0.0, top_k=5).truncates
        (True, False)
        """
        return self.temperature > 0 and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)

    @classmethod
    def from_config(cls, r: RolloutConfig) -> SamplingParams:
        """From the recipe's ``rollout`` section ``r`` (``temperature``, ``top_p``, ``top_k``,
        ``min_p``, ``max_new_tokens``, ``sampler``; no repetition penalty).

        Raises:
            ValueError: a value out of range; the message names the recipe key (``rollout.top_p``).
        """
        fields: dict[str, Any] = dict(
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            min_p=r.min_p,
            max_new_tokens=r.max_new_tokens,
            sampler=r.sampler,
        )
        problem = _problem(fields)
        if problem is not None:
            raise ValueError(f"rollout.{problem}")
        return cls(**fields)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field out of range (``SamplingParams.top_p must be
        in (0, 1], got 2.0``)."""
        problem = _problem(vars(self))
        if problem is not None:
            raise ValueError(f"SamplingParams.{problem}")


def _problem(v: dict[str, Any]) -> str | None:
    """``"<field> must be <range>, got <value>"`` for the first of ``v``'s fields out of range, or None."""
    checks = [
        ("temperature", lambda x: x >= 0, ">= 0"),
        ("top_p", lambda x: 0 < x <= 1, "in (0, 1]"),
        ("top_k", lambda x: isinstance(x, int) and x >= 0, "an int >= 0"),
        ("min_p", lambda x: 0 <= x <= 1, "in [0, 1]"),
        ("max_new_tokens", lambda x: isinstance(x, int) and x >= 1, "an int >= 1"),
        ("repetition_penalty", lambda x: x > 0, "> 0"),
        ("sampler", lambda x: x in SAMPLERS, " or ".join(repr(n) for n in SAMPLERS)),
    ]
    for name, ok, want in checks:
        if name in v and not ok(v[name]):
            return f"{name} must be {want}, got {v[name]!r}"
    return None


def request_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The seed of row ``(prompt_index, sample_index)`` of a ``generate(…, seed)`` call: a 63-bit
    hash of the three numbers, so it depends on nothing else (not ``B``, ``G``, nor the batch the
    row is sampled in). ``prompt_index`` counts from the step's first prompt (``first_prompt + b``).

    Raises:
        ValueError: an index < 0.

    >>> request_seed(7, 0, 0) == request_seed(7, 0, 0) != request_seed(7, 0, 1)
    True
    >>> 0 <= request_seed(-3, 2, 5) < 2**63
    True
    """
    if prompt_index < 0 or sample_index < 0:
        raise ValueError(f"request_seed: indices must be >= 0, got ({prompt_index}, {sample_index})")
    digest = hashlib.blake2b(
        f"grpokit:{int(seed)}:{int(prompt_index)}:{int(sample_index)}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little") >> 1


#: ``rollout.engine`` name -> ``module:class``; the module is imported by :func:`load_engine`
ENGINES = {
    "hf": "grpokit.rollout.hf_engine:HFRolloutEngine",
    "vllm": "grpokit.rollout.vllm_engine:VLLMRolloutEngine",  # extra `vllm`; docs in the module
}


def check_prompts(prompts: Any, group_size: Any, first_prompt: Any = 0) -> None:
    """What every engine's ``generate`` needs of its arguments.

    Raises:
        ValueError: ``prompts`` not a list of strings, empty, or holding an empty/non-string entry
            (names its index); ``group_size`` not an int >= 1; ``first_prompt`` not an int >= 0.
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty; pass at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p:
            raise ValueError(f"prompts[{i}] must be a non-empty string, got {p!r}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    if not isinstance(first_prompt, int) or isinstance(first_prompt, bool) or first_prompt < 0:
        raise ValueError(f"first_prompt must be an int >= 0, got {first_prompt!r}")


@runtime_checkable
class RolloutEngine(Protocol):
    """What the loop needs from a generator."""

    def generate(
        self, prompts: list[str], group_size: int, sampling: SamplingParams, seed: int, first_prompt: int = 0
    ) -> Experience:
        """``group_size`` completions for each of the ``B`` formatted ``prompts``: an experience of
        ``B·group_size`` grouped rows on the trained model's device, ``gen_s`` set; the same
        ``seed`` gives the same completions. ``sampling.temperature == 0`` asks for greedy
        decoding (held-out evaluation, :func:`grpokit.eval.evaluate.evaluate`).

        Prompt ``b`` of this call is prompt ``first_prompt + b`` of the step's batch, and row
        ``(b, g)`` draws all its random numbers from :func:`request_seed` ``(seed, first_prompt + b,
        g)``: ``generate(P[:2], G, s, seed, first_prompt=0)`` followed by ``generate(P[2:], G, s,
        seed, first_prompt=2)`` gives the rows of ``generate(P, G, s, seed)``, whatever the engine's
        chunking. (Exception: the hf engine's ``sampler="multinomial"`` draws from torch's global RNG
        seeded by ``seed``, so its draws depend on the batch.)

        Raises:
            ValueError: ``first_prompt`` not an int >= 0 (and what :func:`check_prompts` refuses).
        """
        ...

    def sync_weights(self) -> None:
        """Make the next ``generate`` sample from the trained model's current weights."""
        ...


def rows_for(engine: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"rows": rows}`` for an engine whose ``generate`` also takes the prompts' dataset rows
    (``wants_rows = True``: a multi-turn engine, whose environment starts each episode from its
    row), else ``{}``: the keyword arguments to add to its ``generate`` call."""
    return {"rows": rows} if getattr(engine, "wants_rows", False) else {}


#: the methods of :class:`RolloutEngine`, each checked (present and callable) by :func:`load_engine`
ENGINE_METHODS = ("generate", "sync_weights")


def load_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """The engine registered as ``name`` in :data:`ENGINES`, built with ``kwargs``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the names).
        TypeError: what the registered class built is not a :class:`RolloutEngine` (the message
            names the engine and each missing method).
    """
    spec = ENGINES.get(name)
    if spec is None:
        raise ValueError(f"rollout.engine: unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}")
    module, cls = spec.split(":")
    engine = getattr(import_module(module), cls)(**kwargs)
    missing = [m for m in ENGINE_METHODS if not callable(getattr(engine, m, None))]
    if missing:
        raise TypeError(
            f"rollout.engine={name!r}: {spec} is not a RolloutEngine: it has no method "
            f"{', '.join(m + '()' for m in missing)} (grpokit.rollout.engine.RolloutEngine)"
        )
    return engine
