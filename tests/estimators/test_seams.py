"""The seams between the core and the loop: algorithm, rollout engine registry, reward pipeline,
device. Values against the algo functions they wrap, and the errors users see."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from grpokit import algo
from grpokit.estimators.base import GRPO, load_algorithm
from grpokit.experience import Experience
from grpokit.rewards.pipeline import RewardPipeline
from grpokit.rollout.engine import ENGINE_METHODS, ENGINES, RolloutEngine, SamplingParams, load_engine
from grpokit.trainer.build import resolve_device
from support.helpers import tiny_recipe

G = 4


def _exp(n=8, t=3, completions=None):
    return Experience.grouped(
        torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, 2, dtype=torch.bool),
        torch.ones(n, t, dtype=torch.long),
        torch.ones(n, t, dtype=torch.bool),
        G,
        completions=completions or [f"c{i}" for i in range(n)],
    )


# -- algorithm --------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_outcome_advantages_are_group_advantages(tmp_path, scale):
    a = tiny_recipe("m", tmp_path, algo={"advantage_scale": scale}).algo
    e = _exp()
    e.rewards = torch.tensor([0.0, 1, 1, 0, 3, 3, 3, 5], dtype=torch.float64)
    got = GRPO(a, 3).advantages(e)
    assert got.dtype == torch.float32 and got.shape == (8,)
    torch.testing.assert_close(got, algo.group_advantages(e.rewards, G, scale=scale, eps=a.advantage_eps).float())
    # hand value: group 0 = [0, 1, 1, 0], mean 0.5, sample std 1/sqrt(3)
    if scale == "group":
        assert got[1].item() == pytest.approx(0.5 / (1 / math.sqrt(3) + a.advantage_eps), rel=1e-6)


def test_grpo_process_advantages_use_the_step_rewards(tmp_path):
    a = tiny_recipe("m", tmp_path, algo={"supervision": "process", "process_advantage": "mean"}).algo
    e = _exp()
    gen = torch.Generator().manual_seed(0)
    e.step_ends = torch.rand(8, 3, generator=gen) > 0.5
    e.step_ends[:, -1] = True
    e.step_rewards = torch.where(e.step_ends, torch.rand(8, 3, generator=gen, dtype=torch.float64), math.nan)
    got = GRPO(a, 3).advantages(e)
    want = algo.process_advantages(e.step_rewards, e.step_ends, e.completion_mask, G, eps=a.advantage_eps, mode="mean")
    assert got.shape == (8, 3)
    torch.testing.assert_close(got, want.float())


def test_grpo_loss_is_policy_loss_with_the_recipe(tmp_path):
    a = tiny_recipe("m", tmp_path, algo={"beta": 0.1, "clip_eps_high": 0.28, "loss_aggregation": "token_mean"}).algo
    grpo = GRPO(a, 3)
    assert grpo.needs_reference
    gen = torch.Generator().manual_seed(1)
    mb = _exp().replace(
        advantages=torch.randn(8, generator=gen),
        old_logprobs=-torch.rand(8, 3, generator=gen),
        ref_logprobs=-torch.rand(8, 3, generator=gen),
    )
    logp = -torch.rand(8, 3, generator=gen)
    mask = mb.completion_mask.clone()
    mask[0, 2] = False
    got, _ = grpo.loss(logp, mb, mask, num_sequences=8, num_tokens=int(mask.sum()))
    want, _ = algo.policy_loss(
        logp,
        mb.old_logprobs,
        mb.advantages,
        mask,
        algo.LossConfig(
            beta=0.1, clip_eps_low=0.2, clip_eps_high=0.28, aggregation="token_mean", max_completion_length=3
        ),
        ref_logp=mb.ref_logprobs,
        num_sequences=8,
        num_tokens=int(mask.sum()),
    )
    torch.testing.assert_close(got, want)
    # without old log-probs (μ = 1) the ratio is 1 by value
    _, st = grpo.loss(logp, mb.replace(old_logprobs=None), mask, num_sequences=8, num_tokens=int(mask.sum()))
    assert st.ratio_mean.item() == pytest.approx(1.0)


def test_unknown_estimator_is_named():
    with pytest.raises(ValueError, match="algo.estimator: unknown 'a2c'; known: grpo, ppo"):
        load_algorithm(SimpleNamespace(estimator="a2c"), 3)


# -- rollout engine -----------------------------------------------------------------------------------


def test_engine_registry_is_lazy_and_errors_name_the_key():
    assert ENGINES["hf"].startswith("grpokit.rollout.hf_engine:")
    assert ENGINES["vllm"].startswith("grpokit.rollout.vllm_engine:")
    with pytest.raises(ValueError, match="rollout.engine: unknown engine 'sglang'; known: hf, vllm"):
        load_engine("sglang")
    eng = load_engine("hf", model=None, tokenizer=None, eos_token_ids=[2])
    assert isinstance(eng, RolloutEngine)


class _NoSync:
    """Registered by a test as an engine: generates, but cannot be told the weights changed."""

    def __init__(self, **kw):
        self.kw = kw

    def generate(self, prompts, group_size, sampling, seed, first_prompt=0):
        return None


class _Nothing:
    generate = None  # there, but not a method

    def __init__(self, **kw):
        pass


def test_load_engine_refuses_what_is_not_a_rollout_engine(monkeypatch):
    monkeypatch.setitem(ENGINES, "nosync", f"{__name__}:_NoSync")
    monkeypatch.setitem(ENGINES, "nothing", f"{__name__}:_Nothing")
    with pytest.raises(TypeError) as e:
        load_engine("nosync", model=None)
    assert str(e.value) == (
        f"rollout.engine='nosync': {__name__}:_NoSync is not a RolloutEngine: it has no method "
        "sync_weights() (grpokit.rollout.engine.RolloutEngine)"
    )
    with pytest.raises(TypeError, match=r"rollout.engine='nothing': .* no method generate\(\), sync_weights\(\) "):
        load_engine("nothing")
    # the methods checked are the protocol's
    assert set(ENGINE_METHODS) == {n for n, v in vars(RolloutEngine).items() if callable(v) and not n.startswith("_")}


def test_sampling_params_from_the_recipe_name_the_rollout_key(tmp_path):
    r = tiny_recipe("m", tmp_path, rollout={"temperature": 0.7, "max_new_tokens": 5}).rollout
    p = SamplingParams.from_config(r)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.max_new_tokens, p.sampler, p.repetition_penalty) == (
        0.7,
        1.0,
        0,
        0.0,
        5,
        "inverse_cdf",
        1.0,
    )
    r.top_p = 1.5  # set after validation (the recipe refuses it)
    with pytest.raises(ValueError) as e:
        SamplingParams.from_config(r)
    assert str(e.value) == "rollout.top_p must be in (0, 1], got 1.5"
    with pytest.raises(ValueError) as e:  # built directly, the message names the field
        SamplingParams(top_p=1.5)
    assert str(e.value) == "SamplingParams.top_p must be in (0, 1], got 1.5"


def test_hf_engine_returns_grouped_experience(tiny_model_dir, smollm2_tokenizer):
    from grpokit.models.loading import load_model
    from grpokit.rollout.engine import SamplingParams

    model = load_model(tiny_model_dir)
    eng = load_engine("hf", model=model, tokenizer=smollm2_tokenizer, eos_token_ids=[2])
    e = eng.generate(["a b", "c"], 3, SamplingParams(temperature=1.0, max_new_tokens=4), seed=5)
    assert isinstance(e, Experience) and len(e) == 6 and e.group_size == 3
    assert e.group_index.tolist() == [0, 0, 0, 1, 1, 1] and len(e.completions) == 6
    again = eng.generate(["a b", "c"], 3, SamplingParams(temperature=1.0, max_new_tokens=4), seed=5)
    assert torch.equal(e.completion_ids, again.completion_ids)


# -- reward pipeline ----------------------------------------------------------------------------------


def _first_char(prompts, completions, **_):
    return [None if c.endswith("7") else float(c[1]) for c in completions]


def _answer(prompts, completions, answer, **_):
    return [float(a) for a in answer]


def test_reward_pipeline_combines_weights_and_reports():
    pipe = RewardPipeline({"d": _first_char, "a": _answer}, {"a": 0.5})
    e = _exp(completions=["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"])
    rows = [{"prompt": "p0", "answer": "2"}, {"prompt": "p1", "answer": "4"}]
    m = pipe.score(e, rows, ["answer"])
    want = [0 + 1.0, 1 + 1.0, 2 + 1.0, 3 + 1.0, 4 + 2.0, 5 + 2.0, 6 + 2.0, math.nan]
    assert e.rewards.dtype == torch.float64
    torch.testing.assert_close(e.rewards, torch.tensor(want, dtype=torch.float64), equal_nan=True)
    # each function over the 7 rows the total scores (row 7: d gave None)
    assert m["rewards/d"] == pytest.approx(3.0) and m["rewards/a"] == pytest.approx(20 / 7)  # (4·2 + 3·4)/7
    assert m["unscorable_frac"] == 1 / 8 and m["frac_zero_std"] == 0.0 and m["reward_failures"] == 0
    assert m["reward_mean"] == pytest.approx(sum(want[:7]) / 7)


_EDGE = [1.0, math.inf, 0.0, -math.inf, 2.0, 4.0, 3.0, 2.0]


def _edge(prompts, completions, **_):  # ±inf on rows 1 and 3: unscorable, as None is
    return [_EDGE[int(c[1])] for c in completions]


def test_reward_metrics_leave_infinite_values_out_as_the_total_does():
    """A function returning ±inf for some completions: those rows are unscorable in the total, and
    each ``rewards/<name>`` is the mean over the rows the total scores (not NaN from inf + -inf)."""
    pipe = RewardPipeline({"edge": _edge, "a": _answer}, {"a": 0.5})
    e = _exp(completions=[f"c{i}" for i in range(8)])
    rows = [{"prompt": "p0", "answer": "2"}, {"prompt": "p1", "answer": "4"}]
    m = pipe.score(e, rows, ["answer"])
    # totals edge + 0.5·a: [2, inf, 1, -inf, 4, 6, 5, 4]; rows 1 and 3 unscorable
    assert m["unscorable_frac"] == 2 / 8
    assert m["reward_mean"] == pytest.approx((2 + 1 + 4 + 6 + 5 + 4) / 6)
    assert m["rewards/edge"] == pytest.approx((1 + 0 + 2 + 4 + 3 + 2) / 6)  # 12 / 6 = 2.0
    assert m["rewards/a"] == pytest.approx((2 * 2 + 4 * 4) / 6)  # rows 1 and 3 left out as in the total
    only = RewardPipeline({"edge": _edge}, {}).score(_exp(completions=[f"c{i}" for i in (1, 3, 1, 3)] * 2), rows, [])
    assert only["rewards/edge"] is None and only["unscorable_frac"] == 1.0  # no finite value: None, as reward_mean
    assert only["reward_mean"] is None


def test_reward_pipeline_from_config_names_the_key(tmp_path):
    rc = tiny_recipe("m", tmp_path).rewards
    rc.functions = ["no_such_reward"]
    with pytest.raises(ValueError, match="rewards.functions: "):
        RewardPipeline.from_config(rc)


# -- the run's parts --------------------------------------------------------------------------------


def test_the_runs_parts_are_typed():
    """Every field of ``Run`` names its part's type (imported for type checking only in build.py)."""
    import dataclasses
    import typing

    from transformers import PreTrainedTokenizerBase

    import grpokit.trainer.build as build
    from grpokit.config import Recipe
    from grpokit.estimators.base import Algorithm
    from grpokit.eval.evaluate import HeldOutEval
    from grpokit.models.logprobs import LogprobScorer
    from grpokit.trainer.prm_refresh import PRMRefresh
    from grpokit.trainer.state import TrainState

    names = dict(
        vars(build),
        PreTrainedTokenizerBase=PreTrainedTokenizerBase,
        Algorithm=Algorithm,
        HeldOutEval=HeldOutEval,
        RewardPipeline=RewardPipeline,
        RolloutEngine=RolloutEngine,
        SamplingParams=SamplingParams,
        TrainState=TrainState,
        LogprobScorer=LogprobScorer,
        PRMRefresh=PRMRefresh,
    )
    hints = typing.get_type_hints(build.Run, globalns=names)
    assert set(hints) == {f.name for f in dataclasses.fields(build.Run)}
    assert typing.Any not in hints.values()
    assert (hints["engine"], hints["sampling"], hints["rewards"], hints["algorithm"], hints["state"]) == (
        RolloutEngine,
        SamplingParams,
        RewardPipeline,
        Algorithm,
        TrainState,
    )
    assert hints["evaluator"] == HeldOutEval | None and hints["eval_engine"] == RolloutEngine | None
    assert hints["tokenizer"] is PreTrainedTokenizerBase and hints["optimizer"] is torch.optim.Optimizer
    assert hints["recipe"] is Recipe and hints["logprobs"] is LogprobScorer
    assert hints["prm_refresh"] == PRMRefresh | None


# -- device -------------------------------------------------------------------------------------------


def test_device_choices(tmp_path):
    from grpokit.config import RecipeError

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="model.device='cuda:1': torch sees no CUDA device"):
            resolve_device("cuda:1")
    with pytest.raises(RecipeError, match="model.device: 'gpu' is not cpu, cuda, cuda:N or auto"):
        tiny_recipe("m", tmp_path, model={"device": "gpu"})
