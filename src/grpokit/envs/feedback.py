"""The ``feedback`` environment: a wrong answer is told so and the model tries again.

Each model turn that ends at its EOS is judged with a reward function (``reward``, a name of
:data:`grpokit.rewards.base.BUILTIN_REWARDS` such as ``math_correct`` or ``reasoning_gym``, or
``module:function``) called on that turn's text alone with the row's columns: a score of at least
``threshold`` ends the episode; otherwise ``message`` is appended (context, never trained on) and
the model writes another turn, up to ``rollout.max_turns``. The training reward is the recipe's own,
computed on the whole transcript; rewards that take the last answer in the text (every built-in
does) therefore score the last answer.

``message`` is appended as it is (tokenized once, without added special tokens), or with ``role``
(``user``) as a message of that role in the tokenizer's chat template
(``Observation.role``; ``recipes/feedback.yaml`` does). A reward that raises, or returns no score
(None), ends the episode, counted in ``check_errors``.

Counts per row (``env/<name>`` metrics): ``wrong_answers`` (turns judged wrong), ``first_correct`` (the
first turn was judged right: the first answer's accuracy over the rows of a step).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpokit.envs.base import Observation

__all__ = ["FEEDBACK_MESSAGE", "FeedbackEnv"]

#: the default text appended after a wrong answer
FEEDBACK_MESSAGE = "\nThat is not right, try again.\n"


class FeedbackEnv:
    """Retry after a wrong answer (module docstring).

    Args:
        reward: the reward function that judges one turn (built-in name or ``module:function``).
        message: appended after a turn judged wrong.
        threshold: a turn whose score is at least this is right.
        role: None (``message`` as plain text) or the chat role it is appended as (``user``;
            the message is then stripped of surrounding whitespace).

    Raises:
        ValueError: ``message`` empty or not a string, ``threshold`` not a number, an unknown
            ``reward`` (each message names ``rollout.env_options``).
        ImportError: the reward's optional package is missing.
    """

    stop_strings: tuple[str, ...] = ()

    def __init__(
        self,
        reward: str = "math_correct",
        message: str = FEEDBACK_MESSAGE,
        threshold: float = 1.0,
        role: str | None = None,
    ):
        from grpokit.rewards.base import get_reward_function
        from grpokit.rewards.calling import RewardCall

        if not isinstance(message, str) or not message:
            raise ValueError(f"rollout.env_options.message: a non-empty text, got {message!r}")
        if role is not None and (not isinstance(role, str) or not role.strip()):
            raise ValueError(f"rollout.env_options.role: a chat role such as user, or null; got {role!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError(f"rollout.env_options.threshold: a number, got {threshold!r}")
        try:
            fn = get_reward_function(reward)
        except ValueError as e:
            raise ValueError(f"rollout.env_options.reward: {e}") from None
        self.reward, self.threshold, self.role = reward, float(threshold), role
        self.message = message if role is None else message.strip()
        self._call = RewardCall(fn, reward)

    def start(self, row: Mapping[str, Any]) -> _FeedbackEpisode:
        return _FeedbackEpisode(self, row)

    def judge(self, turn: str, row: Mapping[str, Any]) -> bool | None:
        """Whether ``turn`` is right for ``row`` (score >= threshold); None when the reward raises or
        gives no score."""
        columns = {k: [v] for k, v in row.items() if k != "prompt"}
        try:
            scores = self._call([str(row.get("prompt", ""))], [turn], **columns)
            score = scores[0]
        except Exception:  # a fault of the judge ends the episode (counted), never the rollout
            return None
        if score is None:
            return None
        try:
            return float(score) >= self.threshold
        except (TypeError, ValueError):
            return None


class _FeedbackEpisode:
    def __init__(self, env: FeedbackEnv, row: Mapping[str, Any]):
        self.env, self.row, self.turns = env, row, 0

    def step(self, turn: str, *, ended_by_eos: bool) -> Observation:
        self.turns += 1
        verdict = self.env.judge(turn, self.row)
        counts = {"first_correct": int(self.turns == 1 and verdict is True)}
        if verdict is None:
            return Observation(done=True, counts={**counts, "check_errors": 1})
        if verdict:
            return Observation(done=True, counts=counts)
        return Observation(text=self.env.message, counts={**counts, "wrong_answers": 1}, role=self.env.role)
