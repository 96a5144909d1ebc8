"""DAPO options (arXiv 2503.14476): overlong filtering (§3.4) and dynamic sampling (§3.2), on
hand-built groups."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

import grpokit.trainer.collect as collect
import grpokit.trainer.loop as trainer
from grpokit import algo
from grpokit.estimators.base import GRPO
from grpokit.experience import Experience
from grpokit.models.logprobs import LogprobScorer
from grpokit.rewards.pipeline import RewardPipeline
from grpokit.trainer.build import TrainData
from grpokit.trainer.collect import refill_groups_with_signal
from grpokit.trainer.state import TrainState
from grpokit.trainer.update import optimize
from grpokit.utils.distributed import SINGLE
from support.helpers import tiny_recipe

G = 2


def _setup(model, recipe):
    """The parts ``optimize`` reads (``grpokit.trainer.build.Run``'s names)."""
    # plain SGD: the update is the gradient itself (Adam's first step would hide a scale error)
    opt = torch.optim.SGD(model.parameters(), lr=recipe.train.learning_rate)
    logprobs = LogprobScorer(
        model, None, temperature=recipe.rollout.temperature, micro_batch_size=recipe.train.micro_batch_size
    )
    return SimpleNamespace(
        model=model,
        ref_model=None,
        optimizer=opt,
        algorithm=GRPO(recipe.algo, 5),
        scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0),
        state=TrainState(),
        engine=SimpleNamespace(sync_weights=lambda: None),
        ranks=SINGLE,
        recipe=recipe,
        logprobs=logprobs,
    )


def _optimize(run, recipe, tensors, advantages, keep_rows=None):
    exp = Experience.grouped(*tensors, group_size=1, advantages=advantages)
    return optimize(run, exp, keep_rows=keep_rows)


# -- overlong filtering ----------------------------------------------------------------------------


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_overlong_filter_trains_as_if_the_cut_rows_were_absent(tiny_model_v64, tmp_path, aggregation):
    recipe = tiny_recipe(
        "unused",
        tmp_path,
        algo={"beta": 0.0, "loss_aggregation": aggregation},
        train={"learning_rate": 1e-2, "micro_batch_size": 3, "max_grad_norm": 0.0},
    )
    gen = torch.Generator().manual_seed(0)
    n, p, t = 6, 3, 5
    prompt_ids = torch.randint(3, 64, (n, p), generator=gen)
    completion_ids = torch.randint(3, 64, (n, t), generator=gen)
    lengths = torch.tensor([5, 2, 5, 3, 5, 4])  # rows 0, 2, 4 ran to the limit: truncated
    completion_mask = torch.arange(t)[None, :] < lengths[:, None]
    tensors = (prompt_ids, torch.ones(n, p, dtype=torch.bool), completion_ids, completion_mask)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.3])
    keep = torch.tensor([False, True, False, True, False, True])

    filtered = _setup(copy.deepcopy(tiny_model_v64), recipe)
    _optimize(filtered, recipe, tensors, advantages, keep_rows=keep)
    only_kept = _setup(copy.deepcopy(tiny_model_v64), recipe)
    _optimize(only_kept, recipe, [x[keep] for x in tensors], advantages[keep])
    untouched = dict(tiny_model_v64.named_parameters())
    moved = False
    for (name, a), (_, b) in zip(filtered.model.named_parameters(), only_kept.model.named_parameters()):
        torch.testing.assert_close(a, b, msg=name)
        moved |= not torch.equal(a, untouched[name])
    assert moved


# -- dynamic sampling ------------------------------------------------------------------------------


def _fake_generate(seeds):
    def generate(prompts, group_size, sampling, seed, first_prompt=0):
        seeds.append(seed)
        n, t = len(prompts) * group_size, 2 + len(seeds)  # each round has another completion width
        p = 1 + len(prompts)
        return Experience.grouped(
            torch.full((n, p), 7),
            torch.ones(n, p, dtype=torch.bool),
            torch.full((n, t), 9),
            torch.ones(n, t, dtype=torch.bool),
            group_size,
            truncated=torch.zeros(n, dtype=torch.bool),
            completions=[f"{q}|{g}" for q in prompts for g in range(group_size)],
        )

    return generate


def _by_name(prompts, completions, **_):
    """'c…' prompts: 1.0 for both samples (constant group); 'v…': the sample's index (varies)."""
    return [1.0 if c.startswith("c") else float(c.split("|")[1]) for c in completions]


def _fake_setup(names, tmp_path, **algo_kw):
    recipe = tiny_recipe(
        "unused",
        tmp_path,
        rollout={"group_size": G},
        train={"prompts_per_step": 2},
        algo={"dynamic_sampling": True, **algo_kw},
    )
    seeds = []
    rows = [{"prompt": q, "answer": "0"} for q in names]
    run = SimpleNamespace(
        data=TrainData(rows, list(names), ["answer"], 0),
        state=TrainState(),
        rewards=RewardPipeline({"r": _by_name}, {}),
        algorithm=GRPO(recipe.algo, 8),
        tokenizer=SimpleNamespace(pad_token_id=0),
        sampling=None,
        engine=SimpleNamespace(generate=_fake_generate(seeds)),
        ranks=SINGLE,
        recipe=recipe,
    )
    return (run, recipe), seeds


@pytest.fixture
def in_order(monkeypatch):
    """Prompts drawn in file order (the real order is a seeded permutation)."""

    def take(state, n_rows, b, seed):
        out = list(range(state.position, state.position + b))
        state.position += b
        return out

    monkeypatch.setattr(collect, "next_prompt_indices", take)


def _refill(s, step=1):
    """Steps 1-4 of ``run_step`` with dynamic sampling: ``(rows, experience, metrics, reward_s)``."""
    run, _ = s
    c = refill_groups_with_signal(run, step, collect.sample_and_score(run, step, 2))
    c.experience.advantages = run.algorithm.advantages(c.experience)
    return c.rows, c.experience, c.metrics, c.reward_s


def test_constant_groups_are_refilled_until_b_groups_carry_signal(tmp_path, in_order):
    s, seeds = _fake_setup(["c0", "v1", "c2", "c3", "v4", "v5"], tmp_path)
    rows, ro, m, _ = _refill(s)
    assert [r["prompt"] for r in rows] == ["v1", "v4"]  # c0 dropped; c2, c3 drawn and dropped
    assert ro.completions == ["v1|0", "v1|1", "v4|0", "v4|1"]
    base = s[1].train.seed * 100003 + 1
    assert seeds == [base, base + 1000003, base + 2 * 1000003, base + 3 * 1000003]
    assert (m["dynamic/rounds"], m["dynamic/groups_sampled"], m["dynamic/groups_kept"]) == (3, 5, 2)
    assert m["frac_zero_std"] == 0.5  # the metrics of round 0: c0 constant, v1 varies
    assert ro.rewards.tolist() == [0.0, 1.0, 0.0, 1.0] and ro.group_index.tolist() == [0, 0, 1, 1]
    torch.testing.assert_close(ro.advantages, algo.group_advantages(ro.rewards, G).float())
    # padding: round 0 had 3-wide prompts and 3 new tokens, round 3 2-wide prompts and 6
    assert (
        ro.prompt_mask.tolist()[2] == [False, True, True] and ro.completion_mask[0].tolist() == [True] * 3 + [False] * 3
    )


def test_the_round_cap_leaves_fewer_groups(tmp_path, in_order):
    s, seeds = _fake_setup(["c0", "v1", "c2", "c3", "v4"], tmp_path, max_sampling_rounds=2)
    rows, ro, m, _ = _refill(s)
    assert [r["prompt"] for r in rows] == ["v1"] and len(ro) == G and len(seeds) == 3
    assert m["dynamic/groups_kept"] == 1


def test_no_group_with_signal_keeps_round_0(tmp_path, in_order):
    s, _ = _fake_setup(["c0", "c1", "c2", "c3", "c4", "c5"], tmp_path, max_sampling_rounds=1)
    rows, ro, m, _ = _refill(s)
    assert [r["prompt"] for r in rows] == ["c0", "c1"] and not bool(ro.advantages.ne(0).any())
    assert m["dynamic/groups_kept"] == 0


def test_concat_pads_and_renumbers():
    a = _fake_generate([])(["x"], G, None, 0)
    b = _fake_generate([0])(["y", "z"], G, None, 0)
    out = Experience.concat([a, b], pad_id=0)
    assert out.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert out.prompt_ids.shape == (6, 3) and out.prompt_ids[0].tolist() == [0, 7, 7]
    assert out.completion_ids.shape == (6, 4) and out.completion_ids[0].tolist() == [9, 9, 9, 0]
    with pytest.raises(ValueError, match="no experience"):
        Experience.concat([], 0)


def test_process_groups_with_signal_are_those_with_varying_step_rewards(tmp_path):
    """Under process supervision a group's signal is in its step rewards: group 0's outcomes (last
    steps) agree but a middle step differs, so it is kept; group 1's steps all agree: dropped,
    though its outcome rewards differ."""
    recipe = tiny_recipe("unused", tmp_path, rollout={"group_size": G}, algo={"supervision": "process"})
    exp = Experience.grouped(
        torch.full((4, 1), 7),
        torch.ones(4, 1, dtype=torch.bool),
        torch.full((4, 2), 9),
        torch.ones(4, 2, dtype=torch.bool),
        G,
        rewards=torch.tensor([1.0, 1.0, 0.0, 1.0]),
    )
    exp.step_rewards = torch.tensor([[0.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    exp.step_ends = torch.ones(4, 2, dtype=torch.bool)
    assert GRPO(recipe.algo, 2).groups_with_signal(exp) == [0]
    exp.step_rewards = None  # outcome supervision: the outcome rewards decide
    assert GRPO(recipe.algo, 2).groups_with_signal(exp) == [1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "reward, kept, rounds, zero_std",
    [
        ("process_length_reward", 2, 0, 0.0),  # step lengths always vary
        ("process_constant_reward", 0, 1, 1.0),  # every step 1.0: no group has signal, the one extra round is spent
    ],
)
def test_dynamic_sampling_with_process_supervision_in_a_real_run(
    tiny_model_dir, tmp_path, reward, kept, rounds, zero_std
):
    from grpokit.metrics import read_metrics

    trainer.train(
        tiny_recipe(
            tiny_model_dir,
            tmp_path,
            train={"max_steps": 1},
            algo={
                "supervision": "process",
                "process_reward": f"support.fake_rewards:{reward}",
                "step_rule": "regex:\\s",
                "dynamic_sampling": True,
                "max_sampling_rounds": 1,
            },
        ),
        progress=False,
    )
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert (m["dynamic/groups_kept"], m["dynamic/rounds"], m["step_frac_zero_std"]) == (kept, rounds, zero_std)


def test_recipe_rules(tmp_path):
    from grpokit.config import RecipeError

    with pytest.raises(RecipeError, match="algo.max_sampling_rounds: must be >= 1"):
        tiny_recipe("m", tmp_path, algo={"max_sampling_rounds": 0})


@pytest.mark.slow
def test_both_options_in_a_real_run(tiny_model_dir, tmp_path):
    from grpokit.metrics import read_metrics

    trainer.train(
        tiny_recipe(
            tiny_model_dir, tmp_path, algo={"dynamic_sampling": True, "overlong_filter": True}, train={"max_steps": 1}
        ),
        progress=False,
    )
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert m["overlong_filtered_frac"] == 1.0  # a random tiny model never samples EOS in 8 tokens
    assert m["dynamic/groups_kept"] == 2 and m["dynamic/rounds"] == 0  # length rewards always vary
    assert m["grad_norm"] == 0.0 and m["zero_grad_updates"] == 1  # every row filtered: no optimizer step
