"""grpokit.backends.cpu.packed: linear layers on oneDNN-packed weights give F.linear's values (bf16
bit-identical, float32 to summation order), only without gradient, and leave nothing behind."""

from __future__ import annotations

import warnings

import pytest
import torch

import grpokit.backends.cpu.packed as packed_mod
from grpokit.backends import install_backend
from grpokit.backends.cpu.packed import packed_linear_weights, packing_works
from grpokit.rollout import SamplingParams, generate_rollouts

pytestmark = pytest.mark.skipif(not packing_works(torch.bfloat16), reason="torch built without oneDNN")


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def _outputs(model, x):
    """Every linear layer's output on its own random input (rows = x's rows)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for lin in _linears(model):
        xi = torch.randn(x.shape[0], 3, lin.in_features, generator=g).to(lin.weight.dtype)
        out.append(lin(xi))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_linear_matches_f_linear(make_tiny_model, dtype):
    model = make_tiny_model().to(dtype)
    model.model.layers[0].mlp.up_proj.bias = torch.nn.Parameter(torch.randn(model.config.intermediate_size).to(dtype))
    x = torch.zeros(5, 1)
    with torch.no_grad():
        want = _outputs(model, x)
        with packed_linear_weights(model, rows=5) as n:
            assert n == len(_linears(model)) > 0
            assert all(hasattr(m, "_grpokit_packed") for m in _linears(model))
            got = _outputs(model, x)
    for w, g in zip(want, got, strict=True):
        if dtype == torch.bfloat16:
            assert torch.equal(w, g)
        else:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert not any(hasattr(m, "_grpokit_packed") or "forward" in vars(m) for m in _linears(model))


def test_packed_path_is_the_one_taken(make_tiny_model, monkeypatch):
    """Inside the context the oneDNN op computes the layers (a wrong op shows in the outputs)."""
    model = make_tiny_model().to(torch.bfloat16)
    x = torch.zeros(4, 1)
    with torch.no_grad():
        want = _outputs(model, x)
        monkeypatch.setattr(packed_mod, "_packed_linear", lambda x, p, b: torch.zeros(*x.shape[:-1], p.shape[0]))
        with packed_linear_weights(model, rows=4):
            got = _outputs(model, x)
    assert all(float(g.abs().max()) == 0 for g in got) and any(float(w.abs().max()) > 0 for w in want)


def test_gradient_recording_uses_the_plain_forward(make_tiny_model):
    model = make_tiny_model()
    lin = model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, lin.in_features, requires_grad=True)
    y_plain = lin(x)
    g_plain = torch.autograd.grad(y_plain.square().sum(), x)[0]
    with packed_linear_weights(model, rows=3):
        y = lin(x)
        g = torch.autograd.grad(y.square().sum(), x)[0]
    assert torch.equal(y, y_plain) and torch.equal(g, g_plain)


def test_shared_weight_is_packed_once():
    a, b = torch.nn.Linear(8, 6, bias=False), torch.nn.Linear(8, 6, bias=False)
    b.weight = a.weight
    model = torch.nn.Sequential(a, b)
    with packed_linear_weights(model, rows=2) as n:
        assert n == 2 and a._grpokit_packed is b._grpokit_packed


def test_no_switch_when_the_check_fails(make_tiny_model, monkeypatch):
    model = make_tiny_model()
    monkeypatch.setattr(packed_mod, "packing_works", lambda dtype: False)
    with packed_linear_weights(model, rows=2) as n:
        assert n == 0 and not any("forward" in vars(m) for m in _linears(model))


def test_generation_with_packed_weights_samples_the_same_tokens(
    make_tiny_model, smollm2_tokenizer, smollm2_prompts, monkeypatch
):
    model = make_tiny_model().to(torch.bfloat16)
    install_backend(model, "cpu", announce=False)  # the backend that packs in generation
    calls = []
    orig = packed_mod._packed_linear
    monkeypatch.setattr(packed_mod, "_packed_linear", lambda *a: calls.append(1) or orig(*a))
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    run = lambda packed: generate_rollouts(
        model,
        smollm2_tokenizer,
        smollm2_prompts,
        3,
        params,  # noqa: E731
        eos_token_ids=[2, 0],
        seed=0,
        packed_weights=packed,
    )
    plain = run(False)
    assert not calls
    fast = run(True)
    assert calls  # the packed layers really ran
    assert torch.equal(fast.completion_ids, plain.completion_ids)
    assert not any("forward" in vars(m) for m in _linears(model))


def test_autocast_takes_the_plain_forward(make_tiny_model):
    """Under CPU bf16 autocast a float32 layer computes in bf16 as F.linear would (not in float32)."""
    model = make_tiny_model()
    lin = model.model.layers[0].mlp.up_proj
    x = torch.randn(4, lin.in_features)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = lin(x)
        with packed_linear_weights(model, rows=4):
            got = lin(x)
    assert want.dtype == got.dtype == torch.bfloat16 and torch.equal(want, got)


def test_views_with_one_start_and_empty_weights():
    """Two weights that start at one address but differ in shape get their own packed copies;
    an empty weight is left unpacked."""
    base = torch.randn(48, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "initializing zero-element tensors is a no-op"
        a, b, e = torch.nn.Linear(8, 48, bias=False), torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(8, 0)
    a.weight, b.weight = torch.nn.Parameter(base), torch.nn.Parameter(base[:16])
    model = torch.nn.Sequential(a, b, e)
    x = torch.randn(5, 8)
    with torch.no_grad(), packed_linear_weights(model, rows=5) as n:
        assert n == 2 and not hasattr(e, "_grpokit_packed")
        assert a(x).shape == (5, 48) and b(x).shape == (5, 16) and e(x).shape == (5, 0)
        torch.testing.assert_close(b(x), x @ base[:16].T)


def test_the_first_check_under_autocast_still_finds_float32_packing(monkeypatch):
    """The once-per-dtype check runs outside the caller's autocast: first asked under CPU bf16
    autocast (F.linear then computes in bf16) it still finds float32 packing exact."""
    monkeypatch.setattr(packed_mod, "_checked", {})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert packing_works(torch.float32)
