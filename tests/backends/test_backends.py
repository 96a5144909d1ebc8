"""The backend hook (``grpokit.backends``): which backend ``auto`` picks and why, the refusals of an
explicit ``cpu``, dispatch of ``grpokit.models.logprobs`` through the installed backend, and the decode
attention's device check. Tiny random Llama on the CPU; other devices and process groups are
given to the decision function as arguments (no GPU, no process group needed)."""

from __future__ import annotations

import pytest
import torch
from tests.models.test_policy_fast import V, _grouped_batch

from grpokit.backends import backend_of, choose_backend, install_backend
from grpokit.models.logprobs import completion_logprobs


@pytest.fixture
def model(make_tiny_model):
    return make_tiny_model(vocab_size=V, pad_token_id=0)


class _LoraWrapper(torch.nn.Module):
    """Stands for peft's ``lora.Linear``: the base layer plus ``lora_A``/``lora_B``."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(base.in_features, 2, bias=False)})
        self.lora_B = torch.nn.ModuleDict({"default": torch.nn.Linear(2, base.out_features, bias=False)})

    def forward(self, x):
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))


def test_auto_picks_cpu_for_a_plain_model_on_the_cpu(model, capsys):
    name, why = choose_backend(model)
    assert name == "cpu" and "model on cpu" in why
    line = install_backend(model)
    assert line.startswith("backend cpu: ") and backend_of(model) == "cpu"
    assert capsys.readouterr().out.strip() == f"[grpokit] {line}"  # one line says which and why
    assert "forward" in vars(model.model.layers[0].mlp)  # the fused MLP is in


def test_auto_is_plain_off_the_cpu_and_cpu_refuses(model):
    assert choose_backend(model, device=torch.device("meta")) == ("plain", "model on meta")
    assert choose_backend(model, "auto", device="cuda:0") == ("plain", "model on cuda:0")
    with pytest.raises(ValueError, match=r"model\.backend=cpu cannot be exact here: model on cuda:0"):
        choose_backend(model, "cpu", device="cuda:0")
    line = install_backend(model, device="meta", announce=False)
    assert line == "backend plain: model on meta" and backend_of(model) == "plain"
    assert not any("forward" in vars(m) for m in model.modules())  # nothing switched


def test_auto_is_plain_in_a_process_group_and_cpu_refuses(model):
    name, why = choose_backend(model, world_size=2)
    assert name == "plain" and why == "torch.distributed world size 2 (grad aliases bypass DDP/FSDP hooks)"
    assert choose_backend(model, world_size=1)[0] == "cpu"
    with pytest.raises(ValueError, match=r"model\.backend=cpu .*world size 4"):
        install_backend(model, "cpu", world_size=4)
    assert backend_of(model) == "plain"


def test_lora_wrappers_make_auto_plain_and_cpu_refuse(model):
    mlp = model.model.layers[1].mlp
    mlp.gate_proj = _LoraWrapper(mlp.gate_proj)
    name, why = choose_backend(model)
    assert name == "plain" and why.startswith("LoRA modules found (model.layers.1.mlp.gate_proj")
    with pytest.raises(ValueError, match=r"model\.backend=cpu cannot be exact here: LoRA modules found"):
        install_backend(model, "cpu")
    assert install_backend(model, announce=False).startswith("backend plain: LoRA modules found")
    assert backend_of(model) == "plain"


def test_every_reason_is_named(model):
    mlp = model.model.layers[0].mlp
    mlp.up_proj = _LoraWrapper(mlp.up_proj)
    _, why = choose_backend(model, device="meta", world_size=2)
    assert why.split("; ")[0] == "model on meta" and "world size 2" in why and "LoRA modules found" in why


def test_plain_is_always_allowed_and_names_are_checked(model):
    assert choose_backend(model, "plain", device="meta", world_size=8) == ("plain", "model.backend=plain")
    with pytest.raises(ValueError, match=r"model\.backend: 'gpu' is not one of auto, cpu, plain"):
        install_backend(model, "gpu")
    with pytest.raises(TypeError, match="recompute_mpl"):
        install_backend(model, "cpu", recompute_mpl=False)
    # an option of the backend not chosen is accepted and ignored
    assert install_backend(model, "plain", recompute_mlp=False, announce=False) == "backend plain: model.backend=plain"


def test_policy_dispatches_through_the_installed_backend(model, monkeypatch):
    from grpokit.backends.base import PlainBackend
    from grpokit.backends.cpu import CpuBackend

    calls = []
    for cls in (PlainBackend, CpuBackend):
        orig = cls.logprobs
        monkeypatch.setattr(
            cls, "logprobs", lambda self, *a, _o=orig, **kw: calls.append(self.name) or _o(self, *a, **kw)
        )
    batch, _ = _grouped_batch(G=2)
    with torch.no_grad():
        plain, _ = completion_logprobs(model, batch, temperature=1.0)
        install_backend(model, "cpu", announce=False)
        fast, _ = completion_logprobs(model, batch, temperature=1.0)
    assert calls == ["plain", "cpu"]
    torch.testing.assert_close(fast, plain)


def test_a_model_whose_gradients_are_summed_after_the_backward_keeps_the_cpu_backend(model, monkeypatch):
    """grpokit's ddp sums ``param.grad`` after the backward (mark_grads_reduced_after_backward):
    auto picks cpu on 2 ranks, and the backward runs."""
    import grpokit.backends.cpu as cpu
    from grpokit.backends import mark_grads_reduced_after_backward

    mark_grads_reduced_after_backward(model)
    name, why = choose_backend(model, world_size=2)
    assert name == "cpu" and "2 ranks summing gradients after the backward" in why
    install_backend(model, "cpu", world_size=2, announce=False)
    monkeypatch.setattr(cpu, "world_size", lambda: 2)
    batch, _ = _grouped_batch(G=2)
    logp, _ = completion_logprobs(model, batch, temperature=1.0)
    logp.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_cpu_backend_refuses_a_backward_in_a_process_group(model, monkeypatch):
    """A process group made after the backend was installed: no silent bypass of DDP's hooks."""
    import grpokit.backends.cpu as cpu

    install_backend(model, "cpu", announce=False)
    monkeypatch.setattr(cpu, "world_size", lambda: 2)
    batch, _ = _grouped_batch(G=2)
    with torch.no_grad():  # no gradient, nothing to reduce: allowed
        completion_logprobs(model, batch, temperature=1.0)
    with pytest.raises(RuntimeError, match="backend cpu: torch.distributed world size 2"):
        completion_logprobs(model, batch, temperature=1.0)


def test_the_attention_function_hands_non_cpu_tensors_to_stock_sdpa(monkeypatch):
    """The decode attention (one query token, no gradient) acts on CPU tensors only: meta tensors
    (standing for any other device) go to transformers' ``sdpa_attention_forward``."""
    import transformers.integrations.sdpa_attention as sdpa

    from grpokit.backends.cpu.attention import acts_on, grpokit_sdpa_attention

    calls = []
    monkeypatch.setattr(
        sdpa, "sdpa_attention_forward", lambda *a, **kw: calls.append(a[1].device.type) or ("stock", None)
    )
    module = torch.nn.Module()
    module.num_key_value_groups = 3
    for device in ("meta", "cpu"):
        q = torch.zeros(2, 6, 1, 4, device=device)
        kv = torch.zeros(2, 2, 5, 4, device=device)
        with torch.no_grad():
            out, _ = grpokit_sdpa_attention(module, q, kv, kv, torch.ones(2, 1, 1, 5, dtype=torch.bool, device=device))
        assert acts_on(q) == (device == "cpu")
        assert (out == "stock") == (device == "meta")
    assert calls == ["meta"]


def test_recipe_default_is_auto_and_names_are_checked():
    from grpokit.config import RecipeError, recipe_from_dict
    from support.helpers import tiny_recipe_dict

    assert recipe_from_dict(tiny_recipe_dict("m", "out")).model.backend == "auto"
    assert recipe_from_dict(tiny_recipe_dict("m", "out", model={"backend": "plain"})).model.backend == "plain"
    with pytest.raises(RecipeError, match="model.backend"):
        recipe_from_dict(tiny_recipe_dict("m", "out", model={"backend": "fused"}))
