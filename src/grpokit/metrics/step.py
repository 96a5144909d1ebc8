"""One step's metrics: :class:`StepMetrics`, the line the loop writes to ``metrics.jsonl`` and hands
to the callbacks (``on_step_end``) and trackers.

It is a ``dict`` (the keys in the order the line has them, ``json.dumps`` as it is: the file is
unchanged) with typed, read-only views of the keys a step line carries. Which keys exist depends on
the recipe (``rewards/<function>`` per reward function, ``eval/*`` on evaluation steps, the
algorithm's statistics); ``docs/guide.md`` lists them. Imports only the standard library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StepMetrics"]


class StepMetrics(dict[str, Any]):
    """A step's metrics line (a dict), with typed views of its keys.

    Always set by the training loop: ``step`` (int, 1-based), ``completion_len_mean`` (tokens),
    ``truncated_frac`` (share of completions that reached ``rollout.max_new_tokens``), ``step_s``,
    ``gen_s``, ``reward_s``, ``train_s`` (seconds), ``tokens_per_s``. Set when the step updated the
    policy (read as None otherwise): ``loss``, ``kl``, ``grad_norm``, ``lr``. Set when the step was
    scored: ``reward_mean``, ``reward_std``.

    >>> m = StepMetrics({"step": 3, "rewards/math_correct": 0.5, "loss": 0.1, "eval/greedy": 0.25})
    >>> m.step, m.loss, m.kl, m.rewards, m.evaluation
    (3, 0.1, None, {'math_correct': 0.5}, {'greedy': 0.25})
    """

    __slots__ = ()

    def _float(self, key: str) -> float | None:
        value = self.get(key)
        return None if value is None else float(value)

    @property
    def step(self) -> int:
        """The step (1-based; what ``train.max_steps`` counts). Raises KeyError if unset."""
        return int(self["step"])

    @property
    def loss(self) -> float | None:
        """The update's mean loss over its gradient passes (None: no update this step)."""
        return self._float("loss")

    @property
    def kl(self) -> float | None:
        """The mean k3 estimate of KL(π_θ ‖ π_ref) over the completion tokens (None: not computed)."""
        return self._float("kl")

    @property
    def grad_norm(self) -> float | None:
        """The gradient's L2 norm before clipping (None: no update)."""
        return self._float("grad_norm")

    @property
    def lr(self) -> float | None:
        """The learning rate of the step's update (None: no update)."""
        return self._float("lr")

    @property
    def reward_mean(self) -> float | None:
        """The mean weighted reward over the step's completions."""
        return self._float("reward_mean")

    @property
    def reward_std(self) -> float | None:
        """The standard deviation of the weighted rewards over the step's completions."""
        return self._float("reward_std")

    @property
    def completion_len_mean(self) -> float | None:
        """The mean completion length, in tokens."""
        return self._float("completion_len_mean")

    @property
    def step_s(self) -> float | None:
        """The step's wall-clock seconds (sampling, scoring and the update)."""
        return self._float("step_s")

    @property
    def rewards(self) -> dict[str, float]:
        """Each reward function's mean over the step's completions, by function name (``rewards/<name>``)."""
        return {k[len("rewards/") :]: v for k, v in self.items() if k.startswith("rewards/")}

    @property
    def evaluation(self) -> dict[str, float]:
        """The held-out metrics of an evaluation step (``eval/<name>``; {} on other steps)."""
        return {k[len("eval/") :]: v for k, v in self.items() if k.startswith("eval/")}
