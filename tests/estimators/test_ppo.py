"""PPO through the algorithm seam on a tiny random Llama: warm-up, value learning, resume."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpokit.trainer.build
from grpokit import algo
from grpokit.estimators.ppo import PPO
from grpokit.estimators.value import ValueModel
from grpokit.metrics import read_metrics
from grpokit.trainer.checkpoint import load_training_state
from grpokit.trainer.collect import sample_and_score
from grpokit.trainer.loop import train
from support.helpers import tiny_recipe

PPO_SECTIONS = {"algo": {"estimator": "ppo", "beta": 0.0}, "train": {"critic_learning_rate": 1e-2}}


def sections(**extra):
    out = {k: dict(v) for k, v in PPO_SECTIONS.items()}
    for k, v in extra.items():
        out.setdefault(k, {}).update(v)
    return out


def initial_state(model_dir):
    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}


def test_value_model_reads_the_hidden_state_before_each_token(tiny_model):
    """V(s_t) = head(h) at the position whose logits predict completion token t (as the log-probs)."""
    from grpokit.experience import Experience

    critic = ValueModel.from_policy(tiny_model)
    assert critic.values is not None and torch.count_nonzero(critic.head.weight) == 0
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(0))
    prompt = torch.tensor([[0, 5, 6], [7, 8, 9]])
    pmask = torch.tensor([[False, True, True], [True, True, True]])
    comp = torch.tensor([[10, 11], [12, 13]])
    cmask = torch.tensor([[True, True], [True, False]])
    exp = Experience.grouped(prompt, pmask, comp, cmask, 1)
    with torch.no_grad():
        v = critic.values(exp)
        # row 0 alone, without the pad: positions 1,2 of [5, 6, 10] predict tokens 10 and 11
        h = critic.backbone(input_ids=torch.tensor([[5, 6, 10]])).last_hidden_state
        want = critic.head(h[0, 1:3]).squeeze(-1)
    torch.testing.assert_close(v[0], want, atol=1e-5, rtol=0)
    assert critic.backbone is not tiny_model.base_model  # a copy: training it leaves the policy alone
    assert all(p.requires_grad for p in critic.parameters())


@pytest.mark.slow
def test_critic_warmup_leaves_the_actor_bit_for_bit(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, **sections(train={"critic_warmup_steps": 2}))
    run = grpokit.trainer.build.build_run(recipe)
    critic0 = {k: v.clone() for k, v in run.algorithm.critic.state_dict().items()}
    train(recipe, progress=False, run=run)
    init = initial_state(tiny_model_dir)
    for k, v in run.model.state_dict().items():
        assert torch.equal(v, init[k]), k
    moved = [k for k, v in run.algorithm.critic.state_dict().items() if not torch.equal(v, critic0[k])]
    assert "head.weight" in moved and len(moved) > 4
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["policy_updated"] for m in lines] == [0, 0]
    assert all(math.isfinite(m["value_loss"]) and m["value_loss"] > 0 for m in lines)


@pytest.mark.slow
def test_two_ppo_steps_train_both_models(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, **sections(algo={"beta": 0.04, "kl_in_reward": True}))
    run = grpokit.trainer.build.build_run(recipe)
    assert isinstance(run.algorithm, PPO) and run.ref_model is not None
    train(recipe, progress=False, run=run)
    lines = read_metrics(tmp_path / "metrics.jsonl")
    for m in lines:
        assert m["policy_updated"] == 1
        for k in ("loss", "grad_norm", "value_loss", "critic_grad_norm"):
            assert math.isfinite(m[k]), k
    init = initial_state(tiny_model_dir)
    assert any(not torch.equal(v, init[k]) for k, v in run.model.state_dict().items())
    assert lines[1]["value_mean"] != 0.0  # the second step's values come from a trained value model


@pytest.mark.slow
def test_ppo_advantages_are_whitened_gae_of_the_rewards(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, **sections())
    run = grpokit.trainer.build.build_run(recipe)
    torch.nn.init.normal_(run.algorithm.critic.head.weight, std=0.5, generator=torch.Generator().manual_seed(1))
    exp = sample_and_score(run, 1, 2).experience
    exp.advantages = run.algorithm.advantages(exp)  # step 4 of run_step
    mask = exp.completion_mask
    values = run.algorithm.values(exp)
    torch.testing.assert_close(exp.old_values, values)
    r = algo.token_rewards(exp.rewards, mask)
    adv, ret = algo.gae_advantages(r, values.double(), mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(exp.returns, ret.float())
    torch.testing.assert_close(exp.advantages, algo.masked_whiten(adv, mask).float())
    assert abs(float(exp.advantages[mask].mean())) < 1e-5
    assert exp.old_logprobs is not None and exp.old_logprobs.shape == mask.shape


@pytest.mark.slow
def test_value_loss_falls_on_a_fixed_batch(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tiny_model_dir, tmp_path, **sections(algo={"value_clip_eps": 10.0}))
    run = grpokit.trainer.build.build_run(recipe)
    exp = sample_and_score(run, 1, 2).experience
    exp.advantages = run.algorithm.advantages(exp)  # step 4 of run_step
    exp.returns = torch.where(exp.completion_mask, torch.ones_like(exp.returns), 0.0)  # a target V can reach
    losses = [run.algorithm.update_auxiliary(exp, exp.completion_mask, recipe.train)["value_loss"] for _ in range(6)]
    assert losses[0] == pytest.approx(0.5)  # V = 0 (zero head), R = 1: 0.5 · 1²
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.slow
def test_ppo_checkpoint_resumes_exactly(tiny_model_dir, tmp_path):
    """Two steps in one go equal one step, a checkpoint, and a second process resuming from it:
    policy weights and value model bit for bit."""
    full, split = tmp_path / "full", tmp_path / "split"
    extra = sections(train={"max_steps": 2, "save_steps": 1})
    run_full = grpokit.trainer.build.build_run(tiny_recipe(tiny_model_dir, full, **extra))
    train(tiny_recipe(tiny_model_dir, full, **extra), progress=False, run=run_full)
    first = sections(train={"max_steps": 1, "save_steps": 1})
    train(tiny_recipe(tiny_model_dir, split, **first), progress=False)
    _, blob = load_training_state(split / "checkpoint-1")
    assert {"critic", "critic_optimizer"} <= set(blob["algorithm"])
    run_split = grpokit.trainer.build.build_run(tiny_recipe(tiny_model_dir, split, **extra))
    train(tiny_recipe(tiny_model_dir, split, **extra), progress=False, run=run_split)
    for name in ("model",):
        a, b = getattr(run_full, name).state_dict(), getattr(run_split, name).state_dict()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    a, b = run_full.algorithm.critic.state_dict(), run_split.algorithm.critic.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    m_full, m_split = read_metrics(full / "metrics.jsonl"), read_metrics(split / "metrics.jsonl")
    assert [m["value_loss"] for m in m_full] == [m["value_loss"] for m in m_split]


@pytest.mark.slow
def test_a_grpo_checkpoint_does_not_resume_a_ppo_run(tiny_model_dir, tmp_path):
    train(tiny_recipe(tiny_model_dir, tmp_path, train={"max_steps": 1, "save_steps": 1}), progress=False)
    with pytest.raises(ValueError, match="holds no value model"):
        train(tiny_recipe(tiny_model_dir, tmp_path, **sections(train={"max_steps": 2})), progress=False)


@pytest.mark.parametrize(
    "key, value, message",
    [("gamma", 1.5, "algo.gamma: must be in"), ("lam", -0.1, "algo.lam"), ("value_clip_eps", 0, "algo.value_clip_eps")],
)
def test_bad_ppo_keys(tiny_model_dir, tmp_path, key, value, message):
    from grpokit.config import RecipeError

    with pytest.raises(RecipeError, match=message):
        tiny_recipe(tiny_model_dir, tmp_path, algo={"estimator": "ppo", key: value})


@pytest.mark.slow
def test_ppo_with_an_environment_reads_its_tokens_and_skips_them_in_gae(tiny_model_dir, tmp_path):
    """A multi-turn row under PPO: the critic attends to the environment's tokens (each model
    token's value equals a forward over the row as one plain sequence), they get no value and no
    advantage, and GAE steps from a turn's last token to the next turn's first (a slow loop over
    the model's tokens alone); two steps train both models."""
    from support.fake_envs import OBS  # noqa: F401 - the environment of the recipe below

    env = {"env": "support.fake_envs:StopAtE", "max_turns": 3, "max_new_tokens": 6}
    recipe = tiny_recipe(tiny_model_dir, tmp_path / "a", rollout=env, **sections(algo={"lam": 0.9, "gamma": 0.95}))
    run = grpokit.trainer.build.build_run(recipe)
    critic = run.algorithm.critic
    torch.nn.init.normal_(critic.head.weight, std=0.5, generator=torch.Generator().manual_seed(1))
    exp = sample_and_score(run, 1, 2).experience
    assert exp.attention_mask is not None
    env_tok = exp.attention_mask & ~exp.completion_mask
    assert int(env_tok.sum()) > 0
    values = run.algorithm.values(exp)
    r = max(range(len(exp)), key=lambda i: int(env_tok[i].sum()))  # a row with environment tokens
    keep_p, keep_c = exp.prompt_mask[r], exp.attention_mask[r]
    seq = torch.cat([exp.prompt_ids[r][keep_p], exp.completion_ids[r][keep_c]])[None]
    with torch.no_grad():
        h = critic.backbone(input_ids=seq).last_hidden_state[0]
        v_plain = critic.head(h).squeeze(-1)
    p = int(keep_p.sum())
    pos = torch.nonzero(keep_c).squeeze(1)  # completion column -> its index among attended tokens
    model_cols = [int(c) for c in pos if exp.completion_mask[r, c]]
    want = torch.stack([v_plain[p - 1 + int((pos == c).nonzero())] for c in model_cols])
    torch.testing.assert_close(values[r, model_cols], want.float(), atol=1e-4, rtol=0)
    assert bool((values[env_tok] == 0).all())

    rewards = algo.token_rewards(exp.rewards, exp.completion_mask)
    adv, _ = algo.gae_advantages(rewards, values.double(), exp.completion_mask, gamma=0.95, lam=0.9)
    ref, nxt_v, nxt_a = {}, 0.0, 0.0  # the slow loop over row r's model tokens, last to first
    for c in reversed(model_cols):
        a = float(rewards[r, c]) + 0.95 * nxt_v - float(values[r, c]) + 0.95 * 0.9 * nxt_a
        ref[c], nxt_v, nxt_a = a, float(values[r, c]), a
    torch.testing.assert_close(adv[r, model_cols], torch.tensor([ref[c] for c in model_cols], dtype=adv.dtype))
    assert bool((adv[env_tok] == 0).all())

    train(tiny_recipe(tiny_model_dir, tmp_path / "b", rollout=env, **sections()), progress=False)
    lines = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert len(lines) == 2 and all(math.isfinite(m["value_loss"]) and m["env/turns"] > 1 for m in lines)
