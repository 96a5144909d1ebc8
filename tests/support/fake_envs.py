"""Environments for tests, named ``support.fake_envs:Class`` in recipes (``tests/`` is on the path)."""

from __future__ import annotations

from grpokit.envs.base import Observation

OBS = " <r>ok</r> "


class StopAtE:
    """Pauses a turn at the first "e" (a random model writes one within a few tokens) and answers
    :data:`OBS` (``text`` to change it), one tool call each; an EOS ends the row."""

    stop_strings = ("e",)

    def __init__(self, text: str = OBS):
        self.text = text

    def start(self, row):
        return _Episode(self.text)


class _Episode:
    def __init__(self, text: str):
        self.text = text

    def step(self, turn, *, ended_by_eos):
        if ended_by_eos:
            return Observation(done=True)
        return Observation(text=self.text, counts={"tool_calls": 1})


class Feedback:
    """docs/tools.md's example: a wrong answer is told to try again, ``tries`` turns in all."""

    stop_strings = ()

    def __init__(self, tries: int = 2):
        self.tries = tries

    def start(self, row):
        return _FeedbackEpisode(row["answer"], self.tries)


class _FeedbackEpisode:
    def __init__(self, answer, tries):
        self.answer, self.left = answer, tries

    def step(self, turn: str, *, ended_by_eos: bool) -> Observation:
        self.left -= 1
        if self.answer in turn or not self.left:
            return Observation(done=True)
        return Observation(text="That is not right, try again.", counts={"retries": 1})
