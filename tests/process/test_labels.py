"""Automatic step labels (grpokit.process.labels, Math-Shepherd): labels worked out by hand on a stub
engine whose completions the test chooses, the calls the engine and the judge get, split batches,
the JSON-lines file and its resume rule, bad input; and one consistency run on the hf engine."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from grpokit.experience import Experience
from grpokit.process.labels import StepLabels, append_labels, label_steps, prefix_seed, read_labels
from grpokit.rollout.engine import SamplingParams, request_seed

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=8)
ROWS = [{"prompt": "What is (2 + 3) * 2?", "answer": "10"}, {"prompt": "What is 3 + 4?", "answer": "7"}]
PROMPTS = ["P0: ", "P1: "]
K, R, SEED = 2, 4, 11

# prompt -> the completions of its rows; row g of a call is TABLE[prompt][g]
TABLE = {
    # problem 0 (answer 10): sample 0 right, sample 1 wrong from its first step
    "P0: ": ["2 + 3 = 5\n5 * 2 = 10\nanswer 10", "2 + 3 = 6\n6 * 2 = 12\nanswer 12"],
    "P0: 2 + 3 = 5\n": ["5 * 2 = 10\nanswer 10", "5 * 2 = 11\nanswer 11", "answer 10", "answer ???"],
    "P0: 2 + 3 = 5\n5 * 2 = 10\n": ["answer 10", "answer 10", "answer 10", "answer 9"],
    "P0: 2 + 3 = 6\n": ["6 * 2 = 12\nanswer 12", "answer 10", "answer 12", "answer 12"],
    "P0: 2 + 3 = 6\n6 * 2 = 12\n": ["answer 12"] * 4,
    # problem 1 (answer 7): sample 0 right first step, wrong (and truncated) last step; sample 1 empty
    "P1: ": ["3 + 4 = 7\nanswer 8", ""],
    "P1: 3 + 4 = 7\n": ["answer 7"] * 4,
}
TRUNCATED = {("P1: ", 0)}


class StubEngine:
    """``generate`` returns ``table[prompt]``'s completions: row ``g`` when ``seeded`` is False, else
    the option ``request_seed(seed, first_prompt + b, g) % len(options)`` (what a real engine's
    per-row seeding makes of a batch split). Records every call."""

    def __init__(self, table, seeded=False):
        self.table, self.seeded, self.calls = table, seeded, []

    def _pick(self, prompt, b, g, seed):
        options = self.table[prompt]
        return options[request_seed(seed, b, g) % len(options)] if self.seeded else options[g]

    def generate(self, prompts, group_size, sampling, seed, first_prompt=0):
        self.calls.append((list(prompts), group_size, seed, first_prompt))
        texts = [self._pick(p, first_prompt + b, g, seed) for b, p in enumerate(prompts) for g in range(group_size)]
        truncated = [(p, g) in TRUNCATED for p in prompts for g in range(group_size)]
        ids = torch.zeros(len(texts), 1, dtype=torch.long)
        mask = torch.ones(len(texts), 1, dtype=torch.bool)
        return Experience.grouped(
            ids, mask, ids, mask, group_size, completions=texts, truncated=torch.tensor(truncated)
        )


class Judge:
    """TRL-form outcome judge: 1.0 when the last line is ``answer <answer>``, None for ``???``
    (cannot score), else 0.0. Records every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, completions, answer, **kwargs):
        self.calls.append(dict(completions=list(completions), answer=list(answer), **kwargs))
        last = [c.rstrip().split("\n")[-1] for c in completions]
        return [None if "???" in x else float(x == f"answer {a}") for x, a in zip(last, answer)]


def _label(engine=None, judge=None, prompts=PROMPTS, rows=ROWS, **kw):
    args = dict(judge=judge or Judge(), samples_per_problem=K, rollouts_per_step=R, sampling=SAMPLING, seed=SEED)
    return label_steps(engine or StubEngine(TABLE), prompts, rows, **{**args, **kw})


def test_labels_by_hand():
    recs = _label()
    assert [(r.problem, r.sample) for r in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r.steps for r in recs] == [
        ["2 + 3 = 5\n", "5 * 2 = 10\n", "answer 10"],
        ["2 + 3 = 6\n", "6 * 2 = 12\n", "answer 12"],
        ["3 + 4 = 7\n", "answer 8"],
        [],  # empty solution: a record with no steps
    ]
    # soft = reaching rollouts / R; the last step = the solution's own outcome (1 or 0)
    assert [r.soft for r in recs] == [
        [2 / 4, 3 / 4, 1.0],  # rollouts 1, 0, 1, None(=0); 1, 1, 1, 0; "answer 10" is right
        [1 / 4, 0.0, 0.0],  # a lucky "answer 10"; never; "answer 12" is wrong
        [1.0, 0.0],  # every rollout of "3 + 4 = 7\n" reaches 7, but the solution says 8
        [],
    ]
    assert [r.hard for r in recs] == [[1, 1, 1], [1, 0, 0], [1, 0], []]
    assert [r.truncated for r in recs] == [False, False, True, False]
    assert recs[0].question == "What is (2 + 3) * 2?" and recs[0].prompt == "P0: " and recs[0].answer == "10"
    assert (recs[3].answer, recs[3].samples_per_problem, recs[3].rollouts_per_step) == ("7", K, R)
    assert (recs[3].seed, recs[3].step_rule, recs[3].threshold) == (SEED, "lines", 1.0)


def test_last_step_is_the_solutions_outcome_not_a_rollout():
    # with answer 8, every rollout after "3 + 4 = 7\n" ("answer 7") misses, but the solution itself
    # ("answer 8") is right: the first step is 0, the last 1, from the solution's text alone
    recs = _label(rows=[ROWS[0], {**ROWS[1], "answer": "8"}])
    assert recs[2].soft == [0.0, 1.0] and recs[2].hard == [0, 1]


def test_threshold_is_inclusive():
    recs = _label(threshold=0.5)  # values are 0.0/1.0: the same labels as 1.0
    assert [r.soft for r in recs] == [r.soft for r in _label()]
    recs = _label(threshold=1.5)  # nothing reaches it
    assert all(x == 0.0 for r in recs for x in r.soft) and all(h == 0 for r in recs for h in r.hard)


def test_engine_and_judge_calls():
    engine, judge = StubEngine(TABLE), Judge()
    _label(engine, judge, first_problem=5)
    prefixes0 = ["2 + 3 = 5\n", "2 + 3 = 5\n5 * 2 = 10\n", "2 + 3 = 6\n", "2 + 3 = 6\n6 * 2 = 12\n"]
    assert engine.calls == [
        (PROMPTS, K, SEED, 5),  # the solutions: problem b is problem 5 + b
        (["P0: " + x for x in prefixes0], R, prefix_seed(SEED, 5), 0),  # problem 5: (sample, step) order
        (["P1: 3 + 4 = 7\n"], R, prefix_seed(SEED, 6), 0),  # problem 6: the empty sample has no prefix
    ]
    assert len(judge.calls) == 1  # one judge call: 4 solutions, then (4 + 1) prefixes × R rollouts
    call = judge.calls[0]
    assert call["completions"][:4] == TABLE["P0: "] + TABLE["P1: "]
    assert call["completions"][4:8] == ["2 + 3 = 5\n" + c for c in TABLE["P0: 2 + 3 = 5\n"]]
    assert len(call["completions"]) == 4 + 5 * R
    assert call["answer"] == ["10", "10", "7", "7"] + ["10"] * 4 * R + ["7"] * R
    q0, q1 = ROWS[0]["prompt"], ROWS[1]["prompt"]  # the rows' question, as the reward pipeline passes it
    assert call["prompts"] == [q0, q0, q1, q1] + [q0] * 4 * R + [q1] * R


def test_token_count_sums_what_the_engine_generated():
    """The stub gives each row one completion token: 4 solutions + (4 + 1) prefixes × R rollouts."""
    from grpokit.process import TokenCount

    engine = TokenCount(StubEngine(TABLE))
    _label(engine)
    assert engine.tokens == 4 + 5 * R and len(engine.calls) == 3  # other attributes are the engine's


def test_a_split_batch_gives_the_records_of_one_call():
    # solutions and rollouts picked by per-row seeds: the split must pass the right indices and seeds
    table = {
        **{f"Q{b}: ": ["1 + 1 = 2\n2 + 2 = 4\nanswer 4", "1 + 1 = 3\nanswer 3", "answer 4"] for b in range(3)},
        **{f"Q{b}: 1 + 1 = 2\n": ["2 + 2 = 4\nanswer 4", "answer 5"] for b in range(3)},
        **{f"Q{b}: 1 + 1 = 2\n2 + 2 = 4\n": ["answer 4", "answer 6", "answer 7"] for b in range(3)},
        **{f"Q{b}: 1 + 1 = 3\n": ["answer 4", "answer 3", "answer 9"] for b in range(3)},
    }
    prompts, rows = [f"Q{b}: " for b in range(3)], [{"prompt": f"q{b}", "answer": "4"} for b in range(3)]
    kw = dict(samples_per_problem=3, rollouts_per_step=5)
    whole = _label(StubEngine(table, seeded=True), prompts=prompts, rows=rows, **kw)
    head = _label(StubEngine(table, seeded=True), prompts=prompts[:1], rows=rows[:1], **kw)
    tail = _label(StubEngine(table, seeded=True), prompts=prompts[1:], rows=rows[1:], first_problem=1, **kw)
    assert head + tail == whole
    assert [r.problem for r in tail] == [1, 1, 1, 2, 2, 2]
    assert any(0 < x < 1 for r in whole for x in r.soft)  # the draws mix: not a test that cannot fail
    assert len({tuple(r.steps) for r in whole}) > 1


def _records():
    return _label()


def test_jsonl_round_trip(tmp_path):
    recs, path = _records(), tmp_path / "labels.jsonl"
    assert StepLabels.from_json(recs[0].to_json()) == recs[0]
    assert append_labels(path, recs[:2]) == 2 and append_labels(path, recs[2:]) == 2
    got = read_labels(path)
    assert got.records == recs and got.complete == {0, 1} and (got.partial, got.replaced) == (0, 0)
    assert read_labels(tmp_path / "absent.jsonl").records == []
    # a record written before the policy field: read with policy None; the policy given is kept
    old = json.loads(recs[0].to_json())
    del old["policy"]
    assert StepLabels.from_json(json.dumps(old)) == recs[0]
    named = dataclasses.replace(recs[0], policy="runs/long-sft")
    assert StepLabels.from_json(named.to_json()).policy == "runs/long-sft"


def test_partial_last_line_is_ignored_and_cut_before_appending(tmp_path):
    recs, path = _records(), tmp_path / "labels.jsonl"
    rec = dataclasses.replace(recs[2], question="Была ли ошибка?")  # non-ASCII: cut inside a character
    line = rec.to_json().encode()
    cut = line.index("ш".encode()) + 1
    append_labels(path, recs[:2])
    with open(path, "ab") as f:  # a crash in the middle of problem 1's batch
        f.write(line[:cut])
    got = read_labels(path)
    assert got.partial == 1 and got.records == recs[:2] and got.complete == {0}
    append_labels(path, recs[2:])  # the resume relabels problem 1
    got = read_labels(path)
    assert got.partial == 0 and got.records == recs and got.complete == {0, 1}
    assert path.read_bytes().count(b"\n") == 4  # the cut line is gone, not glued to a new one


def test_problem_cut_between_lines_is_incomplete_and_relabelled(tmp_path):
    recs, path = _records(), tmp_path / "labels.jsonl"
    append_labels(path, recs[:3])  # problem 1 has sample 0 only
    with open(path, "ab") as f:  # a whole record without its newline still counts as cut short
        f.write(recs[3].to_json().encode())
    got = read_labels(path)
    assert got.complete == {0} and got.partial == 1 and len(got.records) == 3
    append_labels(path, recs[2:])
    got = read_labels(path)
    assert got.complete == {0, 1} and got.replaced == 1 and got.records == recs


def test_read_labels_refuses_a_bad_line_before_the_last(tmp_path):
    path = tmp_path / "labels.jsonl"
    append_labels(path, _records()[:1])
    with open(path, "a") as f:
        f.write('{"problem": 1}\n')
    append_labels(path, _records()[1:2])
    with pytest.raises(ValueError, match=r"line 2 is not a StepLabels record: .*missing field"):
        read_labels(path)


def test_read_labels_refuses_a_problem_with_two_sample_counts(tmp_path):
    path, recs = tmp_path / "labels.jsonl", _records()
    append_labels(path, [recs[0], dataclasses.replace(recs[1], samples_per_problem=3)])
    with pytest.raises(ValueError, match=r"records of one problem disagree on samples_per_problem"):
        read_labels(path)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(samples_per_problem=0), r"samples_per_problem must be an int >= 1, got 0"),
        (dict(rollouts_per_step=0), r"rollouts_per_step must be an int >= 1, got 0"),
        (dict(first_problem=-1), r"first_problem must be an int >= 0, got -1"),
        (dict(rows=ROWS[:1]), r"rows must be a list of 2 dicts \(one per prompt\), got 1"),
        (dict(threshold=math.nan), r"threshold must be a finite number, got nan"),
        (dict(threshold=math.inf), r"threshold must be a finite number, got inf"),
        (dict(prompts=[]), r"prompts must be a non-empty list"),
        (dict(step_rule="words"), r"unknown rule 'words'"),
        (dict(judge=lambda completions, **kw: [1.0]), r"judge '<lambda>' returned 1 values for 24 texts"),
        (dict(judge=lambda completions, **kw: ["yes"] * len(completions)), r"judge '<lambda>' returned 'yes' at"),
    ],
)
def test_bad_input(kw, match):
    engine = StubEngine(TABLE)
    with pytest.raises(ValueError, match=match):
        _label(engine, **kw)
    if "judge" not in kw:
        assert engine.calls == []  # refused before anything is sampled


def test_engine_returning_too_few_completions():
    class Short(StubEngine):
        def generate(self, prompts, group_size, sampling, seed, first_prompt=0):
            return super().generate(prompts[:1], group_size, sampling, seed, first_prompt)

    with pytest.raises(ValueError, match=r"engine returned 2 completions for 2 prompts × 2"):
        _label(Short(TABLE))


def test_hf_engine_labels_are_consistent(tiny_model, smollm2_tokenizer):
    from grpokit.rollout.hf_engine import HFRolloutEngine

    engine = HFRolloutEngine(tiny_model, smollm2_tokenizer, eos_token_ids=[2])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=5)
    prompts, rows = ["The cat sat on", "A dog ran to"], [{"prompt": "cat", "answer": "a"}, {"prompt": "dog"}]

    def judge(completions, **kw):  # a substring check: some texts pass, some fail
        return [float(c.count("a") >= 2) for c in completions]

    rule, k, r = "regex: ", 2, 3  # a step at each space: random tokens give several steps
    recs = label_steps(engine, prompts, rows, judge=judge, step_rule=rule, samples_per_problem=k,
                       rollouts_per_step=r, sampling=sampling, seed=3)  # fmt: skip
    solutions = engine.generate(prompts, k, sampling, 3).completions
    assert [(x.problem, x.sample) for x in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ["".join(x.steps) for x in recs] == solutions
    assert sum(len(x.steps) > 1 for x in recs) >= 1  # some prefixes were rolled out
    assert len({s for x in recs for s in x.soft}) > 1  # and the judge told texts apart
    for x, text in zip(recs, solutions):
        assert len(x.hard) == len(x.soft) == len(x.steps)
        assert all(h in (0, 1) for h in x.hard) and all(0.0 <= s <= 1.0 for s in x.soft)
        assert x.hard == [int(s > 0) for s in x.soft]
        assert all(math.isclose(s * r, round(s * r)) for s in x.soft)  # a fraction of R rollouts
        if x.steps:
            assert x.soft[-1] == judge([text])[0]  # the last step: the solution's own outcome
    assert [x.answer for x in recs] == ["a", "a", None, None]
