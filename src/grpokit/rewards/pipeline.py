"""The reward seam: one object that scores a batch of experience, outcome and (optionally) process.

:class:`RewardPipeline` calls the recipe's reward functions (each wrapped with the time limit and
fault policy of :class:`~grpokit.rewards.guard.GuardedReward`), combines them with their weights
(:func:`~grpokit.rewards.base.compute_rewards`), and, with process supervision, asks its step
scorer for one score per reasoning step. It writes ``rewards`` (and ``step_rewards``/``step_ends``)
into the experience and returns the step's reward metrics.

Two shapings of the outcome reward happen here, where the functions' values are combined, so the
reward written is the one advantages, dynamic sampling and the reward metrics all see:
``rewards.normalize_each`` (each function z-scored in its group before the weighted sum,
:func:`grpokit.algo.normalized_reward_sum`) and DAPO's soft overlong penalty (``algo.overlong_buffer``,
:func:`grpokit.algo.overlong_penalty`, added after, weighted by ``algo.overlong_penalty_weight`` and
logged as ``rewards/overlong_penalty``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from grpokit.rewards.base import BUILTIN_REWARDS, compute_rewards, get_reward_function
from grpokit.rewards.calling import RewardSignatureError
from grpokit.rewards.guard import GuardedReward
from grpokit.rewards.remote import RemoteReward, is_remote
from grpokit.rewards.rm import RM_PREFIX
from grpokit.utils.dtypes import dtype_of

if TYPE_CHECKING:
    from grpokit.config import RewardsConfig


def reward_function(name: str, rc: RewardsConfig, device: torch.device | str = "cpu") -> Callable:
    """The reward function a ``rewards.functions`` entry names: ``http(s)://...`` a
    :class:`~grpokit.rewards.remote.RemoteReward` (``rc.timeout_s``, ``rc.remote_retries``,
    ``rc.remote_backoff_s``); ``rm:PATH`` a loaded :class:`~grpokit.rewards.rm.RewardModel`
    (``rc.rm_device`` — ``auto`` = ``device`` —, ``rc.rm_dtype``, ``rc.rm_batch_size``,
    ``rc.rm_normalize``, ``rc.rm_max_length``); else a built-in name or ``module:function``
    (:func:`~grpokit.rewards.base.get_reward_function`).

    Raises:
        ValueError: the name resolves to nothing, or the reward model cannot be loaded.
    """
    if is_remote(name):
        return RemoteReward(name, timeout_s=rc.timeout_s, retries=rc.remote_retries, backoff_s=rc.remote_backoff_s)
    if name.startswith(RM_PREFIX):
        from grpokit.rewards.rm import load_reward_model

        rm_device = device if rc.rm_device == "auto" else rc.rm_device
        return load_reward_model(
            name,
            device=rm_device,
            dtype=dtype_of(rc.rm_dtype, "rewards.rm_dtype"),
            batch_size=rc.rm_batch_size,
            normalize=rc.rm_normalize,
            max_length=rc.rm_max_length,
        )
    return get_reward_function(name)


class StepScorer(Protocol):
    """Process supervision's step scorer (``grpokit.process.ProcessScorer``)."""

    tokenizer: Any
    """The policy's tokenizer (maps step ends to tokens): set by the build once it is loaded."""

    @property
    def failures(self) -> int:
        """Rows scored None after the step reward raised or timed out."""
        ...

    def score(self, exp: Any, prompts: list[str], columns: dict[str, list]) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """``(step_rewards (N, T) float64, step_ends (N, T) bool, metrics)`` for ``exp``'s completions."""
        ...


OVERLONG = "overlong_penalty"
"""The name DAPO's length penalty is logged under (``rewards/overlong_penalty``, its mean ``R_len``
before the weight), as if it were one more reward function."""


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's soft overlong penalty (:func:`grpokit.algo.overlong_penalty`): ``max_length`` = L_max
    (the model's token limit of a row), ``buffer`` = L_cache (> 0), ``weight`` its weight in the reward."""

    max_length: int
    buffer: int
    weight: float = 1.0


class RewardPipeline:
    """Reward functions with weights, and an optional step scorer.

    Args:
        funcs: name -> reward function ``(prompts, completions, **columns) -> list[float | None]``.
        weights: name -> weight (missing names 1.0).
        step_scorer: process supervision's scorer, or None (outcome supervision).
        normalize_each: z-score each function's values within its group before the weighted sum
            (``rewards.normalize_each``; :func:`grpokit.algo.normalized_reward_sum`).
        overlong: DAPO's soft overlong penalty added to the reward, or None (off).

    Raises:
        ValueError: ``overlong`` given and a reward function is named ``overlong_penalty`` (its log name).
    """

    def __init__(
        self,
        funcs: Mapping[str, Callable],
        weights: Mapping[str, float],
        step_scorer: StepScorer | None = None,
        *,
        normalize_each: bool = False,
        overlong: OverlongPenalty | None = None,
    ):
        self.funcs, self.weights, self.step_scorer = dict(funcs), dict(weights), step_scorer
        self.normalize_each, self.overlong = normalize_each, overlong
        if overlong is not None and OVERLONG in self.funcs:
            raise ValueError(f"rewards.functions: {OVERLONG!r} is the name algo.overlong_buffer's penalty is logged as")

    @classmethod
    def from_config(
        cls,
        rc: Any,
        step_scorer: StepScorer | None = None,
        device: torch.device | str = "cpu",
        *,
        overlong: OverlongPenalty | None = None,
    ) -> RewardPipeline:
        """From the recipe's ``rewards`` section: each of ``rc.functions`` (a built-in name,
        ``module:function``, ``rm:PATH_OR_HUB_NAME`` or ``http(s)://...``; :func:`reward_function`)
        wrapped with ``rc.timeout_s``/``rc.on_error``/``rc.isolation`` (the user's own functions
        called in TRL's conversational form as ``rc.completions_as`` says), weights ``rc.weights``
        (default 1 each), each z-scored in its group first with ``rc.normalize_each``. Reward models
        and reward servers run in a thread of the trainer (a model in its memory; network I/O bounded
        by socket timeouts), and a failed server call is not searched row by row. ``device``: where
        ``rm:`` models run when ``rc.rm_device`` is ``auto``. ``overlong``: DAPO's length penalty
        (from the ``algo`` section: the builder makes it), or None.

        Raises:
            ValueError: an unknown name, unimportable function or unloadable reward model (the
                message starts with ``rewards.functions``).
            RewardSignatureError: a function whose signature cannot take
                ``(prompts, completions, **columns)`` in either call form (starts the same way).
        """
        funcs = {}
        for name in rc.functions:
            try:
                fn = reward_function(name, rc, device)
            except RewardSignatureError as e:
                raise RewardSignatureError(f"rewards.functions: {e}") from None
            except ValueError as e:
                raise ValueError(f"rewards.functions: {e}") from e
            own = name not in BUILTIN_REWARDS and not name.startswith(("rm:", "http://", "https://"))
            form = None if rc.completions_as == "auto" else rc.completions_as == "messages"  # None: per call
            funcs[name] = GuardedReward(
                name,
                fn,
                timeout_s=rc.timeout_s,
                on_error=rc.on_error,
                isolation=getattr(fn, "isolation", rc.isolation),
                find_row=not isinstance(fn, RemoteReward),
                as_messages=form if own else False,
            )
        weights = dict(zip(rc.functions, rc.weights)) if rc.weights else {n: 1.0 for n in rc.functions}
        return cls(funcs, weights, step_scorer, normalize_each=rc.normalize_each, overlong=overlong)

    def check_columns(self, columns: list[str]) -> None:
        """Check, before any model loads, that every reward function (and the step scorer's reward)
        can take its calls with the run's row ``columns`` as keywords
        (:meth:`GuardedReward.check_signature`).

        Raises:
            RewardSignatureError: one that cannot; the message starts with the recipe key
                (``rewards.functions`` / ``algo.process_reward``) and shows the expected forms.
        """
        step_reward = getattr(self.step_scorer, "reward", None)
        keyed = [("rewards.functions", f) for f in self.funcs.values()] + [("algo.process_reward", step_reward)]
        for key, f in keyed:
            if isinstance(f, GuardedReward):
                try:
                    f.check_signature(list(columns))
                except RewardSignatureError as e:
                    raise RewardSignatureError(f"{key}: {e}") from None

    def _failures(self) -> int:
        guards = [f for f in self.funcs.values() if isinstance(f, GuardedReward)]
        return sum(f.failures for f in guards) + (self.step_scorer.failures if self.step_scorer else 0)

    def score(self, exp: Any, rows: list[dict], columns: list[str]) -> dict[str, Any]:
        """Score ``exp``: the completions of group ``b`` (``exp.group_index == b``) answer ``rows[b]``.

        Sets ``exp.rewards`` ``(N,)`` float64 (None, NaN or ±inf from a function = NaN:
        unscorable) and, with a step scorer, ``exp.step_rewards``/``exp.step_ends`` ``(N, T)``.
        With ``normalize_each`` the reward is the sum of the weighted group z-scores of the
        functions; with ``overlong`` it has ``weight · R_len`` added (an unscorable row stays NaN),
        and ``rewards/overlong_penalty`` is the mean ``R_len``.

        Returns:
            metrics (:func:`reward_metrics`): ``rewards/<name>`` (mean of the function's finite
            values, None if none), ``unscorable_frac``, ``frac_zero_std`` (groups whose rewards are equal or
            have < 2 scorable values), ``reward_mean``/``reward_std`` (over the scorable rewards),
            the step scorer's metrics, and ``reward_failures`` (rows that raised or timed out in
            this call, scored None).
        """
        scored = self.score_rows(exp, rows, columns)
        return dict(reward_metrics(exp, scored.per_function), reward_failures=scored.failures)

    def score_rows(self, exp: Any, rows: list[dict], columns: list[str]) -> ScoredRows:
        """:meth:`score` without the metrics: sets ``exp.rewards`` (and the step rewards),
        ``exp.reward_parts`` (each function's value per row by its metric's label, NaN for None:
        what ``samples.jsonl`` shows), and returns each function's value per row and the failures
        of this call (a data-parallel loop gathers these from every rank and computes
        :func:`reward_metrics` over the batch)."""
        group = exp.group_index.tolist()
        prompts = [rows[b]["prompt"] for b in group]
        cols = {k: [rows[b].get(k) for b in group] for k in columns}
        failures_before = self._failures()
        total, per_fn = compute_rewards(self.funcs, self.weights, prompts, exp.completions, cols)
        rewards = _float64(total)
        if self.normalize_each:
            rewards = self._normalized_sum(per_fn, exp.group_size)
        if self.overlong is not None:
            rewards, penalty = self._with_overlong_penalty(rewards, exp.completion_mask)
            per_fn = {**per_fn, OVERLONG: list(penalty)}  # logged as rewards/overlong_penalty
        exp.rewards = rewards.to(exp.device)
        labels = reward_labels(list(per_fn))
        exp.reward_parts = {labels[k]: _float64(vals).to(exp.device) for k, vals in per_fn.items()}
        if self.step_scorer is not None:
            exp.step_rewards, exp.step_ends, _ = self.step_scorer.score(exp, prompts, cols)
        return ScoredRows({k: list(v) for k, v in per_fn.items()}, self._failures() - failures_before)

    def _normalized_sum(self, per_fn: Mapping[str, Sequence], group_size: int) -> torch.Tensor:
        """``(N,)`` float64: :func:`grpokit.algo.normalized_reward_sum` of the functions' values (None = NaN)."""
        from grpokit import algo

        names = list(self.funcs)
        values = torch.stack([_float64(per_fn[name]) for name in names], 1)  # (N, K)
        weights = torch.tensor([float(self.weights.get(name, 1.0)) for name in names], dtype=torch.float64)
        return algo.normalized_reward_sum(values, weights, group_size)

    def _with_overlong_penalty(
        self, rewards: torch.Tensor, completion_mask: torch.Tensor
    ) -> tuple[torch.Tensor, list[float]]:
        """``rewards + weight · R_len`` and ``R_len`` per row; ``|y|`` = the row's counted tokens
        (``completion_mask``: the model's own, environment tokens excluded)."""
        from grpokit import algo

        o = self.overlong
        assert o is not None
        pen = algo.overlong_penalty(completion_mask.sum(dim=1).cpu(), o.max_length, o.buffer)  # (N,) float64
        return rewards + o.weight * pen, pen.tolist()

    def close(self) -> None:
        """Stop the worker processes of the reward functions and of the step scorer's reward."""
        step_reward = getattr(self.step_scorer, "reward", None)
        for f in [*self.funcs.values(), step_reward]:
            if isinstance(f, GuardedReward):
                f.close()


@dataclass
class ScoredRows:
    """What :meth:`RewardPipeline.score_rows` returns besides the rewards it sets:
    ``per_function`` (name -> one value or None per row) and ``failures`` (rows that raised or
    timed out in the call)."""

    per_function: dict[str, list]
    failures: int


_MODULE_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _float64(values: Sequence) -> torch.Tensor:
    """``(N,)`` float64 of one value per row, None as NaN (unscorable)."""
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)


def reward_labels(names: Sequence[str]) -> dict[str, str]:
    """The label of each reward function's metric ``rewards/<label>``: a Python object given to the
    library API (``obj:exact``) and an importable ``module:function`` (``mymod.rewards:exact``) are
    both ``exact``, the function's own name as TRL logs it; another name (a built-in, a file
    ``./r.py:f``, a URL, ``rm:FOLDER``) is itself. Two names that would share a label keep their whole
    names.

    >>> reward_labels(["obj:exact", "my.mod:fmt", "math_correct", "./r.py:f"])
    {'obj:exact': 'exact', 'my.mod:fmt': 'fmt', 'math_correct': 'math_correct', './r.py:f': './r.py:f'}
    >>> reward_labels(["a:exact", "b:exact"])
    {'a:exact': 'a:exact', 'b:exact': 'b:exact'}
    """
    from grpokit.utils.given import PREFIX, is_given

    short = {}
    for name in names:
        if is_given(name):
            short[name] = name[len(PREFIX) :]
        elif _MODULE_FUNCTION.fullmatch(name):
            short[name] = name.rpartition(":")[2].rpartition(".")[2]
        else:
            short[name] = name
    counts: dict[str, int] = {}
    for label in short.values():
        counts[label] = counts.get(label, 0) + 1
    return {name: label if counts[label] == 1 else name for name, label in short.items()}


def reward_metrics(exp: Any, per_function: Mapping[str, Sequence]) -> dict[str, Any]:
    """The reward metrics of a scored experience (``exp.rewards`` set; ``exp.step_rewards`` and
    ``exp.step_ends`` with process supervision): ``rewards/<label>`` (mean of the function's
    values on the rows whose total is scorable, the rows ``reward_mean`` averages; None if none: a
    None, NaN or ±inf from any function makes its row unscorable; labels: :func:`reward_labels`),
    ``unscorable_frac``,
    ``frac_zero_std``, ``reward_mean`` /
    ``reward_std`` (over the finite rewards; None / 0.0 with fewer than 1 / 2), and with step
    rewards :func:`step_metrics` and ``step_frac_zero_std`` (groups whose pooled step rewards are
    equal: no process signal, ``algo.process_constant_groups``)."""
    from grpokit import algo

    metrics: dict[str, Any] = {}
    labels = reward_labels(list(per_function))
    rewards = exp.rewards.double().cpu()
    scorable = torch.isfinite(rewards).tolist()
    for name, vals in per_function.items():  # over the rows the total counts (±inf, None: unscorable)
        ok = [v for v, s in zip(vals, scorable) if s and v is not None and math.isfinite(v)]
        metrics[f"rewards/{labels[name]}"] = sum(ok) / len(ok) if ok else None
    metrics["unscorable_frac"] = float((~torch.isfinite(rewards)).float().mean())
    metrics["frac_zero_std"] = float(algo.constant_groups(rewards, exp.group_size).float().mean())
    ok = rewards[torch.isfinite(rewards)]
    metrics["reward_mean"] = float(ok.mean()) if len(ok) else None
    metrics["reward_std"] = float(ok.std()) if len(ok) > 1 else 0.0
    if exp.step_rewards is not None:
        metrics.update(step_metrics(exp.step_rewards.cpu(), exp.step_ends.cpu()))
        metrics["step_frac_zero_std"] = float(
            algo.process_constant_groups(
                exp.step_rewards.cpu(), exp.step_ends.cpu(), exp.completion_mask.cpu(), exp.group_size
            )
            .float()
            .mean()
        )
    return metrics


def step_metrics(step_rewards: torch.Tensor, step_ends: torch.Tensor) -> dict[str, Any]:
    """Metrics of a batch's step rewards ``(N, T)`` float (NaN: unscored) at ``step_ends``
    ``(N, T)`` bool: ``step_count_mean`` (steps per completion), ``step_reward_mean`` /
    ``step_reward_std`` (over the scored steps; None / 0.0 when fewer than 1 / 2; sample std),
    ``steps_scored_frac`` (scored steps / steps), ``process_unscorable_frac`` (completions with no
    scored step / N)."""
    ends = step_ends.bool()
    num_steps = ends.sum(dim=1)
    scored_mask = ends & torch.isfinite(step_rewards)  # (N, T)
    scored = step_rewards[scored_mask]  # (S,)
    total = int(num_steps.sum())
    return {
        "step_count_mean": float(num_steps.float().mean()),
        "step_reward_mean": float(scored.mean()) if len(scored) else None,
        "step_reward_std": float(scored.std()) if len(scored) > 1 else 0.0,  # sample std (ddof=1)
        "steps_scored_frac": len(scored) / total if total else 0.0,
        "process_unscorable_frac": float((scored_mask.sum(dim=1) == 0).double().mean()),
    }
