"""LoRA through peft (``model.lora``, ``grpokit.models.lora``) on the tiny random Llama (``tiny_model_dir``).

What is pinned: π_ref is the policy with its adapters disabled, bit for bit the base model (no
second model loaded); a run trains the adapters and leaves the base weights bit for bit; the cpu
speed backend steps aside (auto) or refuses (cpu); checkpoints hold the adapter and its optimizer
state and resume exactly; ``grpokit export --merge`` writes a full model with the adapted logits;
PPO's value model from a LoRA policy; the adapters' dropout; bad ``model.lora`` values.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpokit.trainer.build
from grpokit.backends import backend_of, install_backend, lora_modules
from grpokit.cli.main import main
from grpokit.config import RecipeError, load_recipe
from grpokit.metrics import read_metrics
from grpokit.models.logprobs import batch_logprobs, completion_logprobs, reference_logprobs
from grpokit.models.lora import adapter_dropout, is_peft_model, merged_copy
from grpokit.trainer.checkpoint import load_model_weights, load_training_state
from grpokit.trainer.collect import sample_and_score
from grpokit.trainer.loop import train
from grpokit.trainer.update import optimize
from support.helpers import tiny_recipe, tiny_recipe_dict, write_recipe

pytest.importorskip("peft")

LORA = {"r": 4, "alpha": 8}


def lora_recipe(model_dir, out, lora=None, **sections):
    model = {"lora": dict(LORA if lora is None else lora), **sections.pop("model", {})}
    return tiny_recipe(model_dir, out, model=model, **sections)


def adapter_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def base_state(model) -> dict[str, torch.Tensor]:
    """The base weights of a peft model under the plain model's names (``.base_layer`` dropped)."""
    sd = model.get_base_model().state_dict()
    return {k.replace(".base_layer", ""): v.clone() for k, v in sd.items() if "lora_" not in k}


def plain_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def sampled(run, recipe, step=2):
    exp = sample_and_score(run, step, recipe.train.prompts_per_step).experience
    exp.advantages = run.algorithm.advantages(exp)
    return exp


def trained_run(model_dir, out, steps=1, **kw):
    """A LoRA run trained ``steps`` steps (lr 1e-2: the adapters move)."""
    recipe = lora_recipe(model_dir, out, train={"max_steps": steps}, **kw)
    run = grpokit.trainer.build.build_run(recipe)
    train(recipe, progress=False, run=run)
    return recipe, run


# -- the reference -------------------------------------------------------------------------------


@pytest.mark.slow
def test_reference_is_the_policy_with_adapters_disabled_bit_for_bit(tiny_model_dir, tmp_path):
    recipe, run = trained_run(tiny_model_dir, tmp_path)
    assert is_peft_model(run.model) and run.ref_model is None  # no second model loaded with β > 0
    assert run.algorithm.needs_reference
    assert any(v.abs().max() > 0 for k, v in adapter_state(run.model).items() if "lora_B" in k)  # moved
    exp = sampled(run, recipe)
    kw = dict(temperature=recipe.rollout.temperature, micro_batch_size=recipe.train.micro_batch_size)
    base = batch_logprobs(plain_model(tiny_model_dir), exp, **kw)  # a separate base copy, plain forward
    adapted = batch_logprobs(run.model, exp, **kw)
    assert not torch.equal(adapted, base)  # the adapters change π_θ ...
    ref = reference_logprobs(run.model, None, exp, **kw)
    assert torch.equal(ref, base)  # ... and π_ref is the base model bit for bit
    assert torch.equal(batch_logprobs(run.model, exp, **kw), adapted)  # adapters back on afterwards
    # the loop's own π_ref (trainer.optimize) is that one too
    optimize(run, exp)
    assert torch.equal(exp.ref_logprobs, base)


@pytest.mark.slow
def test_no_reference_and_no_adapters_is_an_error(tiny_model, tiny_model_dir, tmp_path):
    recipe, run = trained_run(tiny_model_dir, tmp_path)
    exp = sampled(run, recipe)
    with pytest.raises(ValueError, match="no reference model was loaded and the policy has no LoRA adapters"):
        reference_logprobs(tiny_model, None, exp, temperature=1.0, micro_batch_size=4)


# -- training ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_steps_move_the_adapters_and_leave_the_base_weights(tiny_model_dir, tmp_path):
    recipe = lora_recipe(tiny_model_dir, tmp_path)
    run = grpokit.trainer.build.build_run(recipe)
    adapters0 = adapter_state(run.model)
    trainable = {id(p) for p in run.model.parameters() if p.requires_grad}
    assert trainable == {id(p) for g in run.optimizer.param_groups for p in g["params"]}  # adapters only
    assert len(trainable) == len(adapters0) == 2 * 2 * 7  # A and B, 2 layers x 7 linear layers (all-linear)
    summary = train(recipe, progress=False, run=run)
    assert summary["last_metrics"]["step"] == 2
    init = plain_model(tiny_model_dir).state_dict()
    after = base_state(run.model)
    assert after.keys() == init.keys()
    for k in init:
        assert torch.equal(after[k], init[k]), k
    moved = adapter_state(run.model)
    changed = [k for k in moved if not torch.equal(moved[k], adapters0[k])]
    assert len(changed) == len(moved), sorted(set(moved) - set(changed))
    m = read_metrics(tmp_path / "metrics.jsonl")
    assert m[0]["kl"] == 0.0 and m[1]["kl"] > 0  # π_θ = π_ref at step 1 (B = 0), not after an update


# -- speed backend ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_backend_auto_steps_aside_and_cpu_refuses(tiny_model_dir, tmp_path, capsys):
    recipe = lora_recipe(tiny_model_dir, tmp_path)
    run = grpokit.trainer.build.build_run(recipe)
    assert backend_of(run.model) == "plain"
    assert "backend plain: LoRA modules found" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"model\.backend=cpu cannot be exact here: LoRA modules found"):
        grpokit.trainer.build.build_run(lora_recipe(tiny_model_dir, tmp_path, model={"backend": "cpu"}))
    # where the cpu backend does run (the base model), it agrees with the LoRA policy at B = 0
    exp = sampled(run, recipe, step=1)
    base = plain_model(tiny_model_dir)
    assert install_backend(base, "cpu", announce=False).startswith("backend cpu")
    kw = dict(temperature=recipe.rollout.temperature, micro_batch_size=recipe.train.micro_batch_size)
    torch.testing.assert_close(batch_logprobs(run.model, exp, **kw), batch_logprobs(base, exp, **kw), atol=1e-5, rtol=0)


# -- checkpoints ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_checkpoint_holds_the_adapter_and_resumes_exactly(tiny_model_dir, tmp_path):
    """Two steps in one go == one step, a checkpoint, and a fresh build resuming from it: adapter
    weights and optimizer moments bit for bit, same metrics."""
    full, split = tmp_path / "full", tmp_path / "split"
    two = {"train": {"max_steps": 2, "save_steps": 1}}
    run_full = grpokit.trainer.build.build_run(lora_recipe(tiny_model_dir, full, **two))
    train(lora_recipe(tiny_model_dir, full, **two), progress=False, run=run_full)
    train(lora_recipe(tiny_model_dir, split, train={"max_steps": 1, "save_steps": 1}), progress=False)

    ckpt = split / "checkpoint-1"
    assert (ckpt / "adapter_model.safetensors").is_file() and (ckpt / "adapter_config.json").is_file()
    assert not list(ckpt.glob("model*.safetensors"))  # the base weights are not copied into checkpoints
    config = json.loads((ckpt / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["task_type"] == "CAUSAL_LM"
    _, blob = load_training_state(ckpt)
    assert len(blob["optimizer"]["state"]) == 28  # AdamW moments of the 28 adapter tensors only

    run_split = grpokit.trainer.build.build_run(lora_recipe(tiny_model_dir, split, **two))
    fresh = adapter_state(run_split.model)
    load_model_weights(run_split.model, ckpt)  # the round trip alone: the file holds what step 1 left
    loaded = adapter_state(run_split.model)
    assert any(not torch.equal(loaded[k], fresh[k]) for k in loaded)
    train(lora_recipe(tiny_model_dir, split, **two), progress=False, run=run_split)  # resumes from checkpoint-1

    a, b = adapter_state(run_full.model), adapter_state(run_split.model)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa, sb = run_full.optimizer.state_dict()["state"], run_split.optimizer.state_dict()["state"]
    for i in sa:
        assert torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) and torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"])
    m_full, m_split = read_metrics(full / "metrics.jsonl"), read_metrics(split / "metrics.jsonl")
    assert [(m["loss"], m["kl"]) for m in m_full] == [(m["loss"], m["kl"]) for m in m_split]


@pytest.mark.slow
def test_a_checkpoint_and_a_model_of_the_other_kind_do_not_mix(tiny_model_dir, tmp_path):
    lora_out, full_out = tmp_path / "lora", tmp_path / "full"
    trained_run(tiny_model_dir, lora_out)
    plain = plain_model(tiny_model_dir)
    with pytest.raises(ValueError, match="holds a LoRA adapter .* but model.lora is off"):
        load_model_weights(plain, lora_out / "checkpoint-1")
    train(tiny_recipe(tiny_model_dir, full_out, train={"max_steps": 1}), progress=False)
    run = grpokit.trainer.build.build_run(lora_recipe(tiny_model_dir, full_out))
    with pytest.raises(ValueError, match="no adapter_model.safetensors"):
        load_model_weights(run.model, full_out / "checkpoint-1")
    with pytest.raises(ValueError, match="does not fit model.lora"):  # another rank
        load_model_weights(
            grpokit.trainer.build.build_run(lora_recipe(tiny_model_dir, tmp_path / "r8", {"r": 8})).model,
            lora_out / "checkpoint-1",
        )


# -- export --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")  # peft's own question
def test_merged_export_gives_the_adapted_logits(tiny_model_dir, tmp_path, capsys):
    recipe, run = trained_run(tiny_model_dir, tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoint-1"
    ids = torch.randint(3, 49152, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = run.model(input_ids=ids).logits
    assert main(["export", str(ckpt), str(tmp_path / "merged"), "--merge"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not lora_modules(merged) and not (tmp_path / "merged" / "training_state.pt").exists()
    assert (tmp_path / "merged" / "tokenizer.json").is_file()
    with torch.no_grad():
        got = merged(input_ids=ids).logits
        base = plain_model(tiny_model_dir)(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-3  # the adapters matter ...
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)  # ... and the merged model has them
    # the in-process merge works on a copy: the training model keeps its adapters, unmerged
    with torch.no_grad():
        torch.testing.assert_close(merged_copy(run.model)(input_ids=ids).logits, want, atol=1e-5, rtol=0)
        assert torch.equal(run.model(input_ids=ids).logits, want)
    assert is_peft_model(run.model) and lora_modules(run.model)
    # grpokit eval (and any load_model) takes a LoRA checkpoint as a model: the base with the adapter merged,
    # a plain model (trainable, fine-tunable) with the adapted logits to float rounding, as the export's
    from grpokit.models.loading import load_model

    loaded = load_model(str(ckpt))
    assert not lora_modules(loaded) and not is_peft_model(loaded) and not loaded.training
    assert all(p.requires_grad for p in loaded.parameters())  # peft's frozen base: trainable again
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, atol=1e-5, rtol=0)

    # without --merge: the adapter (and the tokenizer), which peft loads onto the base model
    from peft import PeftModel

    assert main(["export", str(ckpt), str(tmp_path / "adapter")]) == 0
    files = {f.name for f in (tmp_path / "adapter").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= files
    assert not files & {"training_state.pt", "trainer_state.json", "model.safetensors"}
    with torch.no_grad():
        again = (
            PeftModel.from_pretrained(plain_model(tiny_model_dir), tmp_path / "adapter").eval()(input_ids=ids).logits
        )
    assert torch.equal(again, want)
    assert main(["export", str(ckpt), str(tmp_path / "adapter")]) == 1  # not empty: refused
    assert "exists and is not an empty folder" in capsys.readouterr().err


@pytest.mark.slow
def test_export_of_a_full_checkpoint_copies_the_model(tiny_model_dir, tmp_path):
    train(tiny_recipe(tiny_model_dir, tmp_path / "run", train={"max_steps": 1}, algo={"beta": 0.0}), progress=False)
    assert main(["export", str(tmp_path / "run" / "checkpoint-1"), str(tmp_path / "out"), "--merge"]) == 0
    files = {f.name for f in (tmp_path / "out").iterdir()}
    assert "model.safetensors" in files and not files & {"training_state.pt", "trainer_state.json", "recipe.json"}
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-1").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


# -- PPO's value model -----------------------------------------------------------------------------


@pytest.mark.slow
def test_value_model_of_a_lora_policy_is_a_merged_decoder_copy(tiny_model_dir, tmp_path):
    from grpokit.estimators.value import ValueModel

    recipe, run = trained_run(tiny_model_dir, tmp_path)
    exp = sampled(run, recipe)
    before = batch_logprobs(run.model, exp, temperature=1.0, micro_batch_size=4)
    critic = ValueModel.from_policy(run.model)
    assert not lora_modules(critic) and all(p.requires_grad for p in critic.parameters())
    want = merged_copy(run.model).base_model.state_dict()  # base weights + the adapters' current delta
    got = critic.backbone.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    plain_want = plain_model(tiny_model_dir).base_model.state_dict()
    assert any(not torch.equal(got[k], plain_want[k]) for k in want)  # not the bare base model
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(0))
    other = ValueModel.from_policy(merged_copy(run.model))
    other.head.load_state_dict(critic.head.state_dict())
    with torch.no_grad():
        assert torch.equal(critic.values(exp), other.values(exp))
    # the policy keeps its adapters, unmerged
    assert lora_modules(run.model)
    assert torch.equal(batch_logprobs(run.model, exp, temperature=1.0, micro_batch_size=4), before)


@pytest.mark.slow
def test_ppo_with_lora_takes_pi_ref_from_the_disabled_adapters(tiny_model_dir, tmp_path):
    sections = {
        "algo": {"estimator": "ppo", "beta": 0.1, "kl_in_reward": True},
        "train": {"critic_learning_rate": 1e-2, "max_steps": 1},
    }
    recipe = lora_recipe(tiny_model_dir, tmp_path, **sections)
    run = grpokit.trainer.build.build_run(recipe)
    assert run.ref_model is None
    train(recipe, progress=False, run=run)  # moves the adapters
    exp = sampled(run, recipe)  # PPO's advantages set exp.ref_logprobs (the KL is in the reward)
    base = batch_logprobs(plain_model(tiny_model_dir), exp, temperature=1.0, micro_batch_size=4)
    assert torch.equal(exp.ref_logprobs, base)
    assert not torch.equal(exp.old_logprobs, base)


# -- dropout -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_adapter_dropout_acts_in_the_gradient_passes_only(tiny_model_dir, tmp_path):
    recipe, run = trained_run(tiny_model_dir, tmp_path, lora={**LORA, "dropout": 0.5})
    drops = [m for n, m in run.model.named_modules() if isinstance(m, torch.nn.Dropout) and "lora_dropout" in n]
    assert len(drops) == 14 and not any(m.training for m in drops)  # eval between the passes
    exp = sampled(run, recipe)
    kw = dict(temperature=1.0, micro_batch_size=4)
    assert torch.equal(batch_logprobs(run.model, exp, **kw), batch_logprobs(run.model, exp, **kw))
    with adapter_dropout(run.model):
        training = [m for m in run.model.modules() if m.training]
        assert len(training) == len(drops) and all(any(m is d for d in drops) for m in training)  # those only
        lp1, _ = completion_logprobs(run.model, exp, temperature=1.0)
        lp2, _ = completion_logprobs(run.model, exp, temperature=1.0)
        assert not torch.equal(lp1, lp2)
    assert not any(m.training for m in drops)


@pytest.mark.slow
def test_adapter_dropout_with_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir, tmp_path):
    """The dropout masks a checkpointed layer redraws in backward are those of the forward."""
    grads = []
    for ckpt in (False, True):
        recipe = lora_recipe(
            tiny_model_dir, tmp_path / str(ckpt), {**LORA, "dropout": 0.5}, model={"gradient_checkpointing": ckpt}
        )
        run = grpokit.trainer.build.build_run(recipe)
        with torch.no_grad():
            for k, p in run.model.named_parameters():
                if "lora_B" in k:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
        exp = sampled(run, recipe, step=1)
        torch.manual_seed(7)
        with adapter_dropout(run.model):
            logp, _ = completion_logprobs(run.model, exp, temperature=1.0)
            (logp * exp.completion_mask).sum().backward()
        grads.append({k: p.grad.clone() for k, p in run.model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    assert any(g.abs().max() > 0 for g in grads[0].values())
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], atol=1e-6, rtol=1e-5)


# -- the recipe ----------------------------------------------------------------------------------


def test_lora_keys_are_completed_with_their_defaults(tiny_model_dir, tmp_path):
    assert tiny_recipe(tiny_model_dir, tmp_path).model.lora is None
    r = lora_recipe(tiny_model_dir, tmp_path, {"r": 2, "target_modules": ["q_proj", "v_proj"]})
    assert r.model.lora == {"r": 2, "alpha": 32, "target_modules": ["q_proj", "v_proj"], "dropout": 0.0}
    raw = tiny_recipe_dict(tiny_model_dir, tmp_path)
    over = load_recipe(write_recipe(tmp_path / "r.yaml", raw), ["model.lora={r: 8, dropout: 0.1}"])
    assert over.model.lora == {"r": 8, "alpha": 32, "target_modules": "all-linear", "dropout": 0.1}
    assert over.to_dict()["model"]["lora"]["r"] == 8  # recipe.json records every value


@pytest.mark.parametrize(
    "lora, message",
    [
        ({"r": 0}, r"model\.lora\.r: the adapter rank must be an integer >= 1, got 0"),
        ({"r": 2.5}, r"model\.lora\.r: .* got 2\.5"),
        ({"r": True}, r"model\.lora\.r:"),
        ({"alpha": 0}, r"model\.lora\.alpha: must be a number > 0"),
        ({"alpha": -1.0}, r"model\.lora\.alpha:"),
        ({"alpha": "big"}, r"model\.lora\.alpha:"),
        ({"dropout": 1.0}, r"model\.lora\.dropout: must be in \[0, 1\), got 1\.0"),
        ({"dropout": -0.1}, r"model\.lora\.dropout:"),
        ({"target_modules": []}, r"model\.lora\.target_modules: a non-empty list"),
        ({"target_modules": "q_proj"}, r"model\.lora\.target_modules: .* or all-linear, got 'q_proj'"),
        ({"target_modules": ["q_proj", ""]}, r"model\.lora\.target_modules\[1\]: expected a module name"),
        (
            {"rank": 4},
            r"unknown recipe key model\.lora\.rank; allowed in model\.lora: r, alpha, target_modules, dropout",
        ),
        (8, r"model\.lora: expected dict, got int 8"),
    ],
)
def test_bad_lora_values_name_the_key(tiny_model_dir, tmp_path, lora, message):
    raw = tiny_recipe_dict(tiny_model_dir, tmp_path, model={"lora": lora})
    with pytest.raises(RecipeError, match=message):
        load_recipe(write_recipe(tmp_path / "r.yaml", raw))


def test_target_modules_that_match_nothing_name_the_key(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"model\.lora\.target_modules=\['no_such_proj'\]"):
        grpokit.trainer.build.build_run(lora_recipe(tiny_model_dir, tmp_path, {"target_modules": ["no_such_proj"]}))


def test_lora_without_peft_names_the_extra_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    import grpokit.models.loading

    for name in [m for m in sys.modules if m == "peft" or m.startswith("peft.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(grpokit.models.loading, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(
        ImportError,
        match=r"^model\.lora needs peft, which is not installed: "
        r"pip install 'grpokit\[lora\]'$",
    ):
        grpokit.trainer.build.build_run(lora_recipe(tiny_model_dir, tmp_path))


@pytest.mark.slow
def test_merged_state_dict_is_the_merged_model_out_of_place(tiny_model_dir, tmp_path):
    """What the vLLM engine loads for a LoRA policy: the plain model's keys, the adapted weights
    equal to peft's merge (within 1e-6), the training model untouched (adapters kept, unmerged)."""
    from grpokit.models.lora import merged_state_dict

    _, run = trained_run(tiny_model_dir, tmp_path / "run")
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    sd = merged_state_dict(run.model)
    want = merged_copy(run.model).state_dict()
    assert sd.keys() == want.keys() and sd.keys() == plain_model(tiny_model_dir).state_dict().keys()
    worst = max(float((sd[k] - want[k]).abs().max()) for k in sd)
    moved = max(float((sd[k] - base_state(run.model)[k]).abs().max()) for k in sd)
    assert worst <= 1e-6 and moved > 1e-4  # the adapters are in it
    after = run.model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert merged_state_dict(plain_model(tiny_model_dir)).keys() == sd.keys()


# -- what a LoRA run writes: modes, the base it names, the checkpoint as a model ------------------


def _modes(folder) -> dict[str, int]:
    return {f.name: f.stat().st_mode & 0o777 for f in folder.iterdir()}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")  # peft's own question
def test_lora_outputs_honour_the_umask_name_the_users_base_and_evaluate_as_any_model(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    import os
    import shutil

    # the base named as a user would: a path relative to the working folder (resolved to an absolute one
    # when loaded); the adapter must record "base", not this machine's absolute folder
    shutil.copytree(tiny_model_dir, tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    old = os.umask(0o027)  # not the common 022: the modes must follow the umask, not a fixed 0o644
    try:
        trained_run("base", tmp_path / "run")
        ckpt = tmp_path / "run" / "checkpoint-1"
        assert main(["export", str(ckpt), str(tmp_path / "merged"), "--merge"]) == 0
        assert main(["export", str(ckpt), str(tmp_path / "adapter")]) == 0
    finally:
        os.umask(old)
    # every file 0o666 & ~0o027 = 0o640 (safetensors' temporary-file write left the weights 0o600)
    for folder in (ckpt, tmp_path / "merged", tmp_path / "adapter"):
        modes = _modes(folder)
        assert {"adapter_model.safetensors", "model.safetensors"} & set(modes), folder
        assert modes == dict.fromkeys(modes, 0o640), (folder, {k: oct(v) for k, v in modes.items()})
        assert folder.stat().st_mode & 0o777 == 0o750
    for folder in (ckpt, tmp_path / "adapter"):  # the base as the recipe names it, in the adapter and the card
        assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "base"
    card = (ckpt / "README.md").read_text()
    front = card.split("---\n", 2)[1]  # the card's metadata (its recipe block holds train.output_dir, a path here)
    assert "base_model: base\n" in front and "base_model:adapter:base\n" in front and str(tmp_path) not in front
    assert 'from_pretrained("base")' in card  # how to load it names the base as the recipe does
    # the checkpoint is a model for grpokit eval, first or --against: both give the same greedy answers
    out = tmp_path / "e.json"
    args = ["--dataset", "mawps", "--split", "singleop", "--limit", "2", "--max-new-tokens", "3"]
    assert main(["eval", str(ckpt), "--against", str(tmp_path / "adapter"), *args, "--output", str(out)]) == 0
    res = json.loads(out.read_text())["models"]
    first, second = res[str(ckpt)], res[str(tmp_path / "adapter")]
    assert first["total"] == 2 and first["examples"] == second["examples"]
    # a base that cannot be found is refused before any model loads, naming the adapter and the key
    # (an adapter from elsewhere: no recipe.json, so adapter_config.json names the base)
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "./gone"}))
    (tmp_path / "adapter" / "recipe.json").unlink()
    assert main(["eval", str(tmp_path / "adapter"), *args, "--output", str(tmp_path / "f.json")]) == 2
    err = capsys.readouterr().err
    assert "LoRA adapter" in err and "base_model_name_or_path" in err and "gone" in err
