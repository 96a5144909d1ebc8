"""The step scorer of the reward pipeline: completions -> steps -> one score per step, placed on
each step's last token (the ``(N, T)`` layout of docs/design.md, "Step rewards").

DeepSeekMath §4.1.3: the score of step k judges the solution up to and including step k. Turning
the step scores into token advantages is the algorithm's job (``grpokit.estimators.base.GRPO``, with
``grpokit.algo.process_advantages``), not this module's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from grpokit import algo
from grpokit.process.steps import scatter_step_rewards, split_steps, step_end_masks, step_texts
from grpokit.rewards.pipeline import step_metrics

if TYPE_CHECKING:
    from grpokit.config import Recipe


#: ``algo.process_last_step`` values: what scores each completion's last step
LAST_STEP = ("scorer", "outcome")

#: ``algo.step_rule`` whose steps are the model turns of a multi-turn rollout
TURNS = "turns"


def turn_steps(exp: Any, tokenizer: Any) -> tuple[torch.Tensor, list[list[str]]]:
    """Steps of a multi-turn experience: each model turn (a run of ``completion_mask``) is a step,
    ending on its last token. Returns ``(step_ends (N, T) bool on the CPU, the turns' texts per row)``
    (decoded without special tokens); a single-turn row is one step.

    >>> import torch
    >>> from types import SimpleNamespace
    >>> tok = SimpleNamespace(decode=lambda ids, **k: "".join(map(str, ids)))
    >>> exp = SimpleNamespace(completion_ids=torch.tensor([[1, 2, 7, 3, 0]]),
    ...                       completion_mask=torch.tensor([[1, 1, 0, 1, 0]]).bool())
    >>> ends, steps = turn_steps(exp, tok)
    >>> ends.int().tolist(), steps
    ([[0, 1, 0, 1, 0]], [['12', '3']])
    """
    mask = exp.completion_mask.cpu().bool()
    ids = exp.completion_ids.cpu()
    nxt = torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)
    ends = mask & ~nxt  # the last token of each run of model tokens
    steps: list[list[str]] = []
    for r in range(mask.shape[0]):
        row, start, texts = mask[r].tolist(), None, []
        for i, on in enumerate(row + [False]):
            if on and start is None:
                start = i
            elif not on and start is not None:
                texts.append(tokenizer.decode(ids[r, start:i].tolist(), skip_special_tokens=True))
                start = None
        steps.append(texts)
    return ends, steps


class ProcessScorer:
    """Split each completion with ``step_rule`` and score the steps with ``reward``.

    Args:
        reward: ``(prompts, completions, steps, **columns) -> list[list[float | None] | None]``,
            usually guarded (:func:`grpokit.process.wiring.resolve_process_reward`).
        step_rule: ``lines``, ``paragraphs``, ``regex:PATTERN``, ``tag:STRING``, or ``turns`` (the model
            turns of a multi-turn rollout: :func:`turn_steps`).
        tokenizer: the policy's tokenizer (maps step ends to tokens); may be set after construction.
        last_step: ``scorer`` (``reward`` scores every step) or ``outcome`` (each completion's last
            step takes its outcome reward ``exp.rewards``: :func:`grpokit.algo.outcome_at_last_step`).

    Raises:
        ValueError: an unknown ``last_step`` (names ``algo.process_last_step``).
    """

    def __init__(self, reward: Callable, step_rule: str, tokenizer: Any = None, *, last_step: str = "scorer"):
        if last_step not in LAST_STEP:
            raise ValueError(f"algo.process_last_step: must be one of {LAST_STEP}, got {last_step!r}")
        self.reward, self.step_rule, self.tokenizer, self.last_step = reward, step_rule, tokenizer, last_step

    @classmethod
    def from_config(cls, recipe: Recipe) -> ProcessScorer:
        """From ``algo.process_reward``/``algo.step_rule`` and the ``rewards`` section's time limit and
        fault policy.

        Raises:
            ValueError: an unknown process reward or a bad step rule (names the key).
        """
        from grpokit.process.wiring import resolve_process_reward

        reward = resolve_process_reward(recipe)
        if recipe.algo.step_rule != TURNS:
            try:
                split_steps("a\nb", recipe.algo.step_rule)
            except ValueError as e:
                raise ValueError(f"algo.step_rule: {e}") from None
        return cls(reward, recipe.algo.step_rule, last_step=recipe.algo.process_last_step)

    @property
    def failures(self) -> int:
        """Rows the guarded reward scored None after raising or timing out (0 when not guarded)."""
        return getattr(self.reward, "failures", 0)

    def score(self, exp: Any, prompts: list[str], columns: dict[str, list]) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Step rewards of ``exp``'s completions.

        A row the reward cannot score (``None`` instead of its list of step scores: the guard's
        ``rewards.on_error=none`` gives that for a row whose call raised or timed out) has every step
        unscored (NaN); it is counted in ``process_unscorable_frac``.

        Returns:
            ``(step_rewards (N, T) float64, step_ends (N, T) bool, metrics)`` on ``exp``'s device;
            step rewards are 0 off step ends and NaN on unscored steps. Metrics: ``step_count_mean``
            (steps per completion), ``step_reward_mean``/``step_reward_std`` (over the scored steps;
            None / 0.0 when fewer than 1 / 2), ``steps_scored_frac`` (scored steps / steps),
            ``process_unscorable_frac`` (completions with no scored step / N).

        With ``last_step="outcome"`` each completion's last step holds ``exp.rewards`` (set by the
        reward pipeline before it calls this) instead of the reward's score.

        Raises:
            ValueError: a row of scores is not None and not one score per step (names the row);
                ``last_step="outcome"`` and ``exp.rewards`` not set.
        """
        ids, mask = exp.completion_ids.cpu(), exp.completion_mask.cpu()
        if self.step_rule == TURNS:
            ends, steps = turn_steps(exp, self.tokenizer)
        else:
            ends, spans = step_end_masks(ids, mask, exp.completions, self.step_rule, self.tokenizer)
            steps = [step_texts(text, sp) for text, sp in zip(exp.completions, spans)]
        scores = self.reward(prompts, exp.completions, steps=steps, **columns)
        step_rewards, _ = scatter_step_rewards(scores, ends, dtype=torch.float64)
        if self.last_step == "outcome":
            if getattr(exp, "rewards", None) is None:
                raise ValueError(
                    "algo.process_last_step=outcome: the outcome rewards must be set before the steps are scored"
                )
            step_rewards = algo.outcome_at_last_step(step_rewards, ends.bool(), mask.bool(), exp.rewards.cpu().double())
        metrics = step_metrics(step_rewards, ends)
        return step_rewards.to(exp.device), ends.bool().to(exp.device), metrics
