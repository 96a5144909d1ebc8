"""A LoRA checkpoint of the packaged SmolLM2 loads as its model card says, without grpokit.

The adapter names its base by the hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``), never grpokit's
alias, and the card's "How to load" code, run in a fresh process with grpokit not importable and the
hub offline, gives the logits grpokit's own ``load_model`` gives for the checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from grpokit.models.loading import load_model, load_tokenizer
from grpokit.models.lora import apply_lora
from grpokit.trainer.checkpoint import save_checkpoint
from support.helpers import tiny_recipe_dict

pytest.importorskip("peft")

PROBE = """
import sys, torch
sys.modules["grpokit"] = None  # the card's code must not need grpokit
{code}
ids = tokenizer("2 + 3 =", return_tensors="pt").input_ids
with torch.no_grad():
    torch.save(model(ids).logits, sys.argv[1])
"""


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_the_cards_code_loads_the_adapter_of_the_packaged_model_in_a_fresh_process(tmp_path):
    model = apply_lora(
        load_model("smollm2"),
        {"r": 2, "alpha": 4, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        announce=False,
    )
    with torch.no_grad():  # a trained-looking adapter: B = 0 would hide a base that is not applied
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(name)))
    recipe = tiny_recipe_dict("smollm2", tmp_path / "run", model={"lora": {"r": 2}})
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    ckpt = save_checkpoint(
        tmp_path / "run",
        1,
        model=model,
        tokenizer=load_tokenizer("smollm2"),
        optimizer=opt,
        scheduler=sched,
        trainer_state={},
        recipe=recipe,
        keep=1,
    )
    config = json.loads((ckpt / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"  # not the alias
    card = (ckpt / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct\n" in card.split("---\n", 2)[1]
    assert "smollm2-135m-instruct" not in card[card.index("## How to load") :]
    code = re.search(r"## How to load\n.*?```python\n(.*?)```", card, re.S).group(1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [sys.executable, "-c", PROBE.format(code=code), str(tmp_path / "theirs.pt")],
        cwd=tmp_path / "run",  # the card's path: "checkpoint-1", relative to the run folder
        env=env,
        check=True,
        timeout=300,
    )
    ours = load_model(ckpt)  # a Path, as a Python user passes it
    ids = load_tokenizer(ckpt)("2 + 3 =", return_tensors="pt").input_ids
    with torch.no_grad():
        want = ours(ids).logits
    # grpokit merges the adapter into the weights, peft adds it beside them: equal up to float32 rounding
    torch.testing.assert_close(torch.load(tmp_path / "theirs.pt"), want, atol=1e-4, rtol=1e-4)
    base = load_model("smollm2")
    with torch.no_grad():
        assert (base(ids).logits - want).abs().max() > 1e-3  # the adapter changes the logits
