"""grpokit.utils.lora_shards without processes: which parameters belong to a LoRA layer, which layers
it folds in (and which it refuses). Folding from real shards is compared with one process end to end
in tests/trainer/test_distributed.py (LoRA under fsdp2 with vLLM and PPO)."""

import pytest
from peft import LoraConfig, get_peft_model

from grpokit.utils.lora_shards import _lora_layers, _merged, _part


def test_parameter_names_map_to_their_layer_and_part():
    q = "model.layers.0.self_attn.q_proj"
    assert _part(f"{q}.base_layer.weight") == (q, "base.weight")
    assert _part(f"{q}.base_layer.bias") == (q, "base.bias")
    assert _part(f"{q}.lora_A.default.weight") == (q, "A:default")
    assert _part(f"{q}.lora_B.other.weight") == (q, "B:other")
    assert _part("model.layers.0.input_layernorm.weight") is None


def test_lora_layers_found_with_their_scaling_and_dora_refused(tiny_model):
    model = get_peft_model(tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    layers = _lora_layers(model.base_model.model)  # the FSDP2 root of a LoRA run
    assert len(layers) == 2 * model.config.num_hidden_layers
    assert all(v == (["default"], {"default": 2.0}, False) for v in layers.values())  # alpha / r
    dora = get_peft_model(
        type(tiny_model)(tiny_model.config), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)
    )
    with pytest.raises(ValueError, match=r"merged_full_parameters: .*q_proj is not a plain linear LoRA layer"):
        _lora_layers(dora.base_model.model)


def test_merge_is_peft_merge(tiny_model):
    """W + s·B·A as peft's merge_and_unload computes it, bit for bit (B made non-zero first)."""
    import copy

    import torch

    model = get_peft_model(tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    torch.manual_seed(0)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_()
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    parts = {"base.weight": layer.base_layer.weight, "A:default": layer.lora_A["default"].weight}
    parts["B:default"] = layer.lora_B["default"].weight
    got = _merged(parts, ["default"], {"default": 2.0}, False)
    want = copy.deepcopy(model).merge_and_unload().model.layers[0].self_attn.q_proj.weight
    assert torch.equal(got, want) and not torch.equal(got, layer.base_layer.weight)
