"""train.optimizer: bf16 stochastic rounding keeps updates far below a bf16 ulp (round-to-nearest
drops them), recipe checks, and a bf16 run that checkpoints and resumes its optimizer state."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.config import RecipeError, recipe_from_dict
from grpokit.trainer.checkpoint import load_training_state
from grpokit.trainer.loop import train
from grpokit.trainer.optim import make_optimizer
from support.helpers import tiny_recipe


def _one_step(optimizer: str, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One AdamW step on a (200, 500) bf16 weight ~ N(0, 0.02²) with gradient +1 everywhere:
    the exact update is -lr (Adam's first step is lr·sign(g)); returns (before, after)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(500, 200, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        model.weight.normal_(0, 0.02)
    before = model.weight.detach().clone()
    recipe = recipe_from_dict(
        {
            "model": {"dtype": "bfloat16"},
            "train": {"optimizer": optimizer, "learning_rate": lr, "adam_betas": [0.9, 0.99]},
        }
    )
    opt, _ = make_optimizer(model, recipe.train)
    model.weight.grad = torch.ones_like(model.weight)
    opt.step()
    return before, model.weight.detach().clone()


def test_bf16_stochastic_rounding_is_unbiased_where_round_to_nearest_drops_the_update():
    lr = 1e-5  # ~0.1 ulp of a bf16 number near 0.02 (ulp 2^-13 ≈ 1.2e-4)
    before, after = _one_step("adamw_bf16_sr", lr)
    delta = (after.double() - before.double()).flatten()  # (100000,)
    # unbiased: the mean move is -lr within 5 standard errors
    se = float(delta.std()) / math.sqrt(delta.numel())
    assert abs(float(delta.mean()) + lr) < 5 * se, (float(delta.mean()), se)
    assert 0.01 < float((delta != 0).double().mean()) < 0.5  # only some weights flip by one ulp
    # the fused torch AdamW rounds to nearest: most updates are lost (all but those of weights
    # near 0, whose ulp is small), so the mean move falls far short of -lr
    before, after = _one_step("adamw", lr)
    assert float((after == before).double().mean()) > 0.7
    assert abs(float((after.double() - before.double()).mean())) < 0.5 * lr


def test_adamw_bf16_sr_states_are_bf16():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32).to(torch.bfloat16)
    recipe = recipe_from_dict({"model": {"dtype": "bfloat16"}, "train": {"optimizer": "adamw_bf16_sr"}})
    opt, _ = make_optimizer(model, recipe.train)
    model(torch.randn(4, 64, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    state = opt.state[model.weight]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"train": {"optimizer": "adamw_bf16_sr"}}, "train.optimizer"),  # needs model.dtype=bfloat16
        ({"train": {"optimizer": "sgd"}}, "train.optimizer"),
        ({"model": {"dtype": "bfloat16", "autocast_bf16": True}}, "model.autocast_bf16"),
    ],
)
def test_optimizer_recipe_errors_name_the_key(raw, key):
    with pytest.raises(RecipeError, match=key):
        recipe_from_dict(raw)


@pytest.mark.slow
def test_bf16_run_checkpoints_and_resumes_the_sr_optimizer(tiny_model_dir, tmp_path):
    sections = {
        "model": {"dtype": "bfloat16"},
        "train": {"optimizer": "adamw_bf16_sr", "max_steps": 1, "save_steps": 1},
    }
    train(tiny_recipe(tiny_model_dir, tmp_path, **sections), progress=False)
    _, blob = load_training_state(tmp_path / "checkpoint-1")
    states = blob["optimizer"]["state"]
    assert states and all(s["exp_avg"].dtype == torch.bfloat16 for s in states.values())
    # resume: step 2 starts from checkpoint-1's optimizer state and finishes
    sections["train"] = sections["train"] | {"max_steps": 2}
    summary = train(tiny_recipe(tiny_model_dir, tmp_path, **sections), progress=False)
    assert summary["last_metrics"]["step"] == 2
    _, blob2 = load_training_state(tmp_path / "checkpoint-2")
    steps = {float(s["step"]) for s in blob2["optimizer"]["state"].values()}
    assert steps == {2.0}


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_sr_on_float32_parameters_equals_torch_adamw(weight_decay):
    """Without rounding to do, the chunked update is AdamW itself (Loshchilov & Hutter 2019, Alg. 2):
    five steps with varying gradients on a tensor spanning several chunks and a small one."""
    import grpokit.trainer.optim as optim

    gen = torch.Generator().manual_seed(0)
    shapes = [(3, optim._CHUNK // 2 + 7), (5,)]  # the first spans two chunks
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    a, b = optim.AdamWStochasticRounding(ours, **kw), torch.optim.AdamW(ref, **kw)
    for _ in range(5):
        for p, q in zip(ours, ref):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q)
        torch.testing.assert_close(a.state[p]["exp_avg_sq"], b.state[q]["exp_avg_sq"])


def test_adamw_sr_takes_non_contiguous_parameters_and_gradients():
    import grpokit.trainer.optim as optim

    gen = torch.Generator().manual_seed(1)
    base = torch.randn(6, 4, generator=gen)
    ours = torch.nn.Parameter(base.t())  # (4, 6), not contiguous
    ref = torch.nn.Parameter(base.t().clone())
    a = optim.AdamWStochasticRounding([ours], lr=1e-2, weight_decay=0.1)
    b = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        g = torch.randn(6, 4, generator=gen).t()
        ours.grad, ref.grad = g, g.clone()
        a.step()
        b.step()
    torch.testing.assert_close(ours, ref)


def test_stochastic_rounding_of_second_moments_is_unbiased():
    """v = β₂·v: a 0.1 % decay, under half a bf16 ulp, vanishes when rounded to nearest; with
    stochastic rounding the mean stored value decays by (1 - β₂) within 5 standard errors."""
    from grpokit.trainer.optim import AdamWStochasticRounding

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(200_000, dtype=torch.bfloat16))
    opt = AdamWStochasticRounding([p], lr=0.0, betas=(0.9, 0.999))
    p.grad = torch.zeros_like(p)
    opt.step()  # creates the state; then set v = 1 and take one step with g = 0
    opt.state[p]["exp_avg_sq"].fill_(1.0)
    opt.step()
    v = opt.state[p]["exp_avg_sq"].double()
    se = float(v.std()) / math.sqrt(v.numel())
    assert abs(float(v.mean()) - 0.999) < 5 * se and float((v != 1).double().mean()) > 0.1


@pytest.mark.parametrize("n", [1, 7, 100_003])
def test_rounding_noise_is_uniform_16_bit_and_seeded_by_torch(n):
    """The CPU noise (four 16-bit values per raw PCG64 output): n values in [0, 2¹⁶) whose mean and
    bit frequencies are those of a uniform draw (5 standard errors); one seed, one sequence."""
    import numpy as np

    from grpokit.trainer.optim import _noise

    draw = lambda seed: _noise(n, torch.device("cpu"), np.random.Generator(np.random.PCG64(seed)))  # noqa: E731
    x = draw(3)
    assert x.shape == (n,) and x.dtype == torch.int32 and torch.equal(x, draw(3))
    assert int(x.min()) >= 0 and int(x.max()) < 1 << 16
    if n > 1000:
        assert not torch.equal(x, draw(4))
        mean_se = (2**32 / 12) ** 0.5 / n**0.5
        assert abs(float(x.double().mean()) - (2**16 - 1) / 2) < 5 * mean_se
        for bit in (0, 7, 15):  # each bit is set half of the time
            f = float(((x >> bit) & 1).double().mean())
            assert abs(f - 0.5) < 5 * 0.5 / n**0.5, bit


def test_sr_step_is_reproducible_from_the_torch_seed():
    from grpokit.trainer.optim import AdamWStochasticRounding

    def run(seed):
        torch.manual_seed(seed)
        p = torch.nn.Parameter(torch.ones(5000, dtype=torch.bfloat16))
        p.grad = torch.full_like(p, 0.3)
        AdamWStochasticRounding([p], lr=1e-4).step()
        return p.detach().clone()

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len(a.unique()) == 2  # 1 - 1e-4 lies between two bf16 values: both appear


def test_float32_steps_leave_torch_rng_alone():
    """Only steps that round stochastically draw from torch's generator (fp32 runs keep their draws)."""
    from grpokit.trainer.optim import AdamWStochasticRounding

    p = torch.nn.Parameter(torch.ones(10))
    p.grad = torch.ones(10)
    opt = AdamWStochasticRounding([p], lr=1e-3)
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    opt.step()
    assert torch.equal(torch.rand(3), want)
