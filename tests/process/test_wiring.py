"""Process supervision in the loop (grpokit.process.ProcessScorer, then the GRPO algorithm's process
advantages): a process reward that fails on one row, under
each ``rewards.on_error`` policy, on the real SmolLM2 tokenizer.

``on_error="none"``: the guard returns ``None`` for the failed row; that row is unscorable (NaN step
rewards, advantage 0 on every token, counted in ``process_unscorable_frac``), and the other rows get
exactly the advantages they would get if the failed row's steps had all been scored None.
``on_error="raise"``: a ``RewardError`` naming the row.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from grpokit import algo
from grpokit.config import AlgoConfig
from grpokit.estimators.base import GRPO
from grpokit.experience import Experience
from grpokit.metrics import read_metrics
from grpokit.process import ProcessScorer
from grpokit.process.steps import scatter_step_rewards, step_end_masks, step_texts
from grpokit.rewards.guard import GuardedReward, RewardError
from support.fake_rewards import BAD_ROW, FAIL_MARK, process_length_reward, raising_process_reward
from support.helpers import tiny_recipe

EOS = 2
G = 2
TEXTS = [  # two groups of G = 2; row 1 makes the process reward raise
    "2 + 2 = 4\nAnswer: 4",
    f"3 + 3 = 6\nso {FAIL_MARK} here\nAnswer: 6",
    "1 + 1 = 2\nok then\n",
    "5 - 1 = 4\nAnswer: 4 apples",
]
BAD = 1


@pytest.fixture(scope="module")
def rollout(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = [tok.encode(t, add_special_tokens=False) + [EOS] for t in TEXTS]
    width = max(len(r) for r in ids) + 2  # right padding past the EOS
    completion_ids = torch.full((len(ids), width), EOS, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.bool)
    for i, r in enumerate(ids):
        completion_ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    texts = [tok.decode(r, skip_special_tokens=True) for r in ids]
    return SimpleNamespace(completion_ids=completion_ids, completion_mask=mask, completions=texts)


def _setup(tok, on_error):
    reward = GuardedReward("process:fake", raising_process_reward, timeout_s=30, on_error=on_error)
    return ProcessScorer(reward, "lines", tok)


def _advantages(s, rollout):
    """The step scorer, then GRPO's process advantages: ``(advantages (N, T), metrics)``."""
    n, t = rollout.completion_ids.shape
    exp = _grouped(rollout)
    exp.step_rewards, exp.step_ends, metrics = s.score(exp, ["q"] * n, {})
    a = AlgoConfig(advantage_eps=1e-4, process_advantage="sum", beta=0.0)
    return GRPO(a, t).advantages(exp), metrics


def test_failed_row_is_unscorable_with_on_error_none(smollm2_tokenizer, rollout):
    s = _setup(smollm2_tokenizer, "none")
    try:
        adv, metrics = _advantages(s, rollout)
        assert s.failures == 1
    finally:
        s.reward.close()
    # reference: the process reward's scores for the good rows, None for every step of the bad one
    ends, spans = step_end_masks(
        rollout.completion_ids, rollout.completion_mask, rollout.completions, "lines", smollm2_tokenizer
    )
    steps = [step_texts(t, sp) for t, sp in zip(rollout.completions, spans)]
    scores = process_length_reward(None, rollout.completions, steps)
    scores[BAD] = [None] * len(steps[BAD])
    step_rewards, num_steps = scatter_step_rewards(scores, ends, dtype=torch.float64)
    want = algo.process_advantages(step_rewards, ends, rollout.completion_mask, G, eps=1e-4).float()
    torch.testing.assert_close(adv, want)
    assert (adv[BAD] == 0).all()  # unscorable: advantage 0 everywhere
    assert (adv[BAD - 1][rollout.completion_mask[BAD - 1]] != 0).any()  # its group mate still learns
    assert (adv[2:] != 0).any()
    n_bad = int(num_steps[BAD])
    assert n_bad == 3
    assert metrics["process_unscorable_frac"] == 1 / len(TEXTS)
    assert metrics["steps_scored_frac"] == (int(num_steps.sum()) - n_bad) / int(num_steps.sum())
    good = [v for i, row in enumerate(scores) if i != BAD for v in row]
    assert metrics["step_reward_mean"] == pytest.approx(sum(good) / len(good), rel=1e-12)
    assert metrics["step_reward_std"] == pytest.approx(torch.tensor(good, dtype=torch.float64).std().item(), rel=1e-12)
    assert metrics["step_count_mean"] == float(num_steps.float().mean())


def test_failed_row_raises_with_on_error_raise(smollm2_tokenizer, rollout):
    s = _setup(smollm2_tokenizer, "raise")
    try:
        with pytest.raises(RewardError, match=rf"'process:fake' failed on row {BAD} .*fake process-reward"):
            _advantages(s, rollout)
    finally:
        s.reward.close()


def test_all_rows_scored_metrics(smollm2_tokenizer, rollout):
    s = _setup(smollm2_tokenizer, "none")
    s.reward = process_length_reward  # no failure: nothing unscorable
    adv, metrics = _advantages(s, rollout)
    assert metrics["process_unscorable_frac"] == 0.0 and metrics["steps_scored_frac"] == 1.0
    assert torch.isfinite(adv).all() and (adv[BAD] != 0).any()


def test_wrong_length_row_is_named(smollm2_tokenizer, rollout):
    s = _setup(smollm2_tokenizer, "none")
    s.reward = lambda p, c, steps, **_: [[0.5] * len(r) for r in steps[:2]] + [[0.5], None]
    with pytest.raises(ValueError, match=r"row 2 has 1 scores but 2 steps"):
        _advantages(s, rollout)


@pytest.mark.slow
def test_training_step_survives_a_failing_process_reward_row(tiny_model_dir, tmp_path):
    """The whole loop, rewards.on_error=none: the failed row is logged as unscorable, the step trains."""
    from grpokit.trainer.loop import train

    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        rewards={"on_error": "none"},
        train={"max_steps": 1},
        algo={
            "supervision": "process",
            "step_rule": "regex:\\s",
            "process_reward": "support.fake_rewards:bad_row_process_reward",
        },
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the RunWarning about the failed row
        train(recipe, progress=False)
    (m,) = read_metrics(tmp_path / "metrics.jsonl")
    n = recipe.train.prompts_per_step * recipe.rollout.group_size
    assert BAD_ROW < n and m["reward_failures"] == 1
    assert m["process_unscorable_frac"] == 1 / n and 0 < m["steps_scored_frac"] < 1
    assert math.isfinite(m["loss"])


def _grouped(rollout, rewards=None):
    n = rollout.completion_ids.shape[0]
    exp = Experience.grouped(
        torch.ones(n, 1, dtype=torch.long),
        torch.ones(n, 1, dtype=torch.bool),
        rollout.completion_ids,
        rollout.completion_mask,
        G,
        completions=rollout.completions,
    )
    exp.rewards = rewards
    return exp


def test_last_step_outcome_replaces_the_scorers_last_score(smollm2_tokenizer, rollout):
    """algo.process_last_step=outcome: every step keeps the reward's score but the last, which holds
    the row's outcome reward (NaN stays unscored)."""
    n = len(TEXTS)
    outcome = torch.tensor([1.0, 0.0, math.nan, 1.0], dtype=torch.float64)
    plain = ProcessScorer(process_length_reward, "lines", smollm2_tokenizer)
    last = ProcessScorer(process_length_reward, "lines", smollm2_tokenizer, last_step="outcome")
    r0, ends0, m0 = plain.score(_grouped(rollout, outcome), ["q"] * n, {})
    r1, ends1, m1 = last.score(_grouped(rollout, outcome), ["q"] * n, {})
    assert torch.equal(ends0, ends1)
    for i in range(n):
        cols = ends0[i].nonzero().flatten().tolist()
        assert len(cols) >= 2  # every row has steps before its last
        assert r1[i, cols[:-1]].tolist() == r0[i, cols[:-1]].tolist()  # the scorer's scores
        last_value = r1[i, cols[-1]].item()
        assert (math.isnan(last_value) and i == 2) or last_value == outcome[i].item()
        assert r0[i, cols[-1]].item() != last_value  # the length score was replaced
    assert m1["steps_scored_frac"] < m0["steps_scored_frac"] == 1.0  # row 2's NaN outcome: its last step unscored


def test_last_step_outcome_needs_the_rewards_and_a_known_value(smollm2_tokenizer, rollout):
    last = ProcessScorer(process_length_reward, "lines", smollm2_tokenizer, last_step="outcome")
    with pytest.raises(ValueError, match="algo.process_last_step=outcome: the outcome rewards must be set"):
        last.score(_grouped(rollout), ["q"] * len(TEXTS), {})
    with pytest.raises(ValueError, match="algo.process_last_step: must be one of"):
        ProcessScorer(process_length_reward, "lines", smollm2_tokenizer, last_step="answer")


def test_last_step_key_reaches_the_scorer(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, algo={"supervision": "process", "process_last_step": "outcome"})
    assert ProcessScorer.from_config(recipe).last_step == "outcome"
    assert ProcessScorer.from_config(tiny_recipe(tiny_model_dir, tmp_path)).last_step == "scorer"
