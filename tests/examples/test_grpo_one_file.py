"""``examples/grpo_one_file.py`` (grpokit's default step on one page, torch and transformers only)
equals ``grpokit.trainer.loop.run_step`` bit for bit: the same completions (token ids), metrics and
every weight after 3 steps on the tiny random Llama, at μ = 1 and μ = 2 (β > 0, so the k3 KL to the
reference counts; G = 4 and micro-batches of 3 rows, which cut through groups), and at μ = 2 with
completions that end early.

Under ``model.backend=plain``, the stock transformers forward that the one-file step runs: the
default ``auto`` picks the cpu backend on a CPU, whose fused ops sum in another order (measured here:
the same completions and rewards, kl and loss apart by 1e-10 to 1e-8 from the first update on).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import grpokit.trainer.build
from grpokit.config import Recipe
from grpokit.metrics import NullLogger
from grpokit.trainer.loop import LoopMemory, run_step
from support.fake_rewards import length_reward
from support.helpers import tiny_recipe

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_one_file.py"
STEPS = 3
#: the metrics both compute; each compared with ==
METRICS = ("reward_mean", "loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "grad_norm")


def load_example():
    """The example file as a module (``examples/`` is no package)."""
    spec = importlib.util.spec_from_file_location("grpo_one_file", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # @dataclass resolves the Args annotations through it
    spec.loader.exec_module(module)
    return module


def example_args(one, recipe: Recipe, model_dir: str):
    """The example's ``Args`` with the recipe's values."""
    r, a, t = recipe.rollout, recipe.algo, recipe.train
    return one.Args(
        model=model_dir,
        tiny=False,
        steps=STEPS,
        prompts_per_step=t.prompts_per_step,
        group_size=r.group_size,
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        beta=a.beta,
        clip_eps_low=a.clip_eps_low,
        clip_eps_high=a.clip_eps_high,
        advantage_eps=a.advantage_eps,
        num_iterations=t.num_iterations,
        micro_batch_size=t.micro_batch_size,
        learning_rate=t.learning_rate,
        adam_betas=tuple(t.adam_betas),
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        seed=t.seed,
    )


def written_out_choices(recipe: Recipe) -> dict:
    """The recipe's choices the example writes out as they are by default (it implements no other)."""
    r, a, t, m = recipe.rollout, recipe.algo, recipe.train, recipe.model
    return {
        "estimator": a.estimator,
        "kl_estimator": a.kl_estimator,
        "loss_aggregation": a.loss_aggregation,
        "policy_loss": a.policy_loss,
        "importance_level": a.importance_level,
        "advantage": (a.advantage_baseline, a.advantage_scale),
        "off": (a.dual_clip_c, a.delta, a.tis_cap, a.entropy_coef, a.dynamic_sampling, a.overlong_filter),
        "sampler": (r.engine, r.sampler, r.top_p, r.top_k, r.min_p, r.chunk_size, r.env),
        "optimizer": (t.optimizer, t.lr_scheduler, t.warmup_steps),
        "model": (m.dtype, m.autocast_bf16, m.lora, m.gradient_checkpointing),
    }


def test_example_defaults_are_grpokits():
    one, recipe = load_example(), Recipe()
    mine = example_args(one, recipe, one.Args().model)
    shown = {k: v for k, v in vars(one.Args()).items() if k not in ("model", "tiny", "steps")}
    # the sizes (B, G, tokens) are the example's own, a few seconds' worth; every algorithm setting is grpokit's
    sizes = ("prompts_per_step", "group_size", "max_new_tokens")
    assert {k: v for k, v in shown.items() if k not in sizes} == {
        k: v for k, v in vars(mine).items() if k in shown and k not in sizes
    }
    assert written_out_choices(recipe) == {
        "estimator": "grpo",
        "kl_estimator": "k3",
        "loss_aggregation": "seq_mean_token_mean",
        "policy_loss": "clip",
        "importance_level": "token",
        "advantage": ("group", "group"),
        "off": (0.0, 0.0, 0.0, 0.0, False, False),
        "sampler": ("hf", "inverse_cdf", 1.0, 0, 0.0, None, None),
        "optimizer": ("adamw", "constant", 0),
        "model": ("float32", False, None, False),
    }


@pytest.fixture
def early_eos_model_dir(tmp_path, make_tiny_model, smollm2_tokenizer) -> str:
    """The tiny model with ids 3 … 2999 also ending a completion (near-uniform logits: ~6% a token), so
    rows end early: EOS masks, decoding and micro-batches cut to their last token are exercised."""
    model = make_tiny_model()
    model.generation_config.eos_token_id = [2, 0, *range(3, 3000)]
    model.save_pretrained(tmp_path / "early_eos", safe_serialization=True)
    smollm2_tokenizer.save_pretrained(tmp_path / "early_eos")
    return str(tmp_path / "early_eos")


@pytest.mark.slow
@pytest.mark.parametrize("mu, early_eos", [(1, False), (2, False), (2, True)], ids=["mu1", "mu2", "mu2-early-eos"])
def test_one_file_step_equals_run_step_bit_for_bit(tiny_model_dir, tmp_path, mu, early_eos, request):
    model_dir = request.getfixturevalue("early_eos_model_dir") if early_eos else tiny_model_dir
    recipe = tiny_recipe(
        model_dir,
        tmp_path,
        model={"backend": "plain"},
        rollout={"group_size": 4, "max_new_tokens": 8},
        train={"num_iterations": mu, "micro_batch_size": 3, "max_steps": STEPS, "sample_every": 0},
    )
    assert recipe.algo.beta > 0  # the KL counts
    run = grpokit.trainer.build.build_run(recipe)
    try:
        theirs = [run_step(run, NullLogger(run.out), LoopMemory()) for _ in range(STEPS)]
    finally:
        run.rewards.close()

    one = load_example()
    policy, ref, tok = one.load(example_args(one, recipe, model_dir))
    answers = [row["answer"] for row in run.data.rows]
    ours = one.train(
        example_args(one, recipe, model_dir),
        policy,
        ref,
        tok,
        run.data.prompts,
        answers,
        lambda completions, answers: length_reward(None, completions),
    )

    for step, (t, o) in enumerate(zip(theirs, ours, strict=True), 1):
        assert torch.equal(t.experience.completion_ids, o["completion_ids"]), f"step {step}: completions"
        assert torch.equal(t.experience.advantages, o["advantages"]), f"step {step}: advantages"
        assert {k: t.metrics[k] for k in METRICS} == {k: o["metrics"][k] for k in METRICS}, f"step {step}"
    # not a trivial agreement: updates applied, the KL and (μ = 2) the clip at work, rows that end early
    ended = torch.cat([t.experience.truncated for t in theirs]).logical_not().float().mean()
    assert 0.2 < ended < 0.8 if early_eos else ended == 0
    assert all(t.metrics["skipped_updates"] == t.metrics["zero_grad_updates"] == 0 for t in theirs)
    assert all(t.metrics["kl"] > 0 for t in theirs[1:])
    if mu > 1:
        assert all(any(t.metrics[f"clip_frac_{side}"] > 0 for t in theirs) for side in ("low", "high"))
    trained, mine, start = run.model.state_dict(), policy.state_dict(), ref.state_dict()
    assert trained.keys() == mine.keys()
    assert [n for n in trained if not torch.equal(trained[n], mine[n])] == []
    assert all(not torch.equal(mine[n], start[n]) for n in mine)
