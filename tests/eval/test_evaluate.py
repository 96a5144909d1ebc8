"""Held-out evaluation through the rollout-engine seam (``grpokit.eval.evaluate.evaluate`` and the run's
``eval_engine``): the same completions, bit for bit, as the direct ``generate_rollouts`` calls it
made before it went through an engine (greedy: ``SamplingParams(temperature=0)``, no seed; sampled:
seeded ``seed·100003 + start``)."""

from __future__ import annotations

import json

import pytest
import torch

from grpokit.eval.evaluate import evaluate
from grpokit.rollout.engine import SamplingParams, load_engine
from grpokit.rollout.hf import generate_rollouts
from grpokit.trainer.build import build_run
from support.helpers import tiny_recipe


class _Spy:
    """A rollout engine that records each call and the experience it returned."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, group_size, sampling, seed, first_prompt=0):
        exp = self.engine.generate(prompts, group_size, sampling, seed, first_prompt=first_prompt)
        self.calls.append((list(prompts), group_size, sampling, seed, exp))
        return exp

    def sync_weights(self):
        self.engine.sync_weights()


def _same(exp, direct):
    assert torch.equal(exp.completion_ids, direct.completion_ids)
    assert torch.equal(exp.completion_mask, direct.completion_mask)
    assert torch.equal(exp.truncated, direct.truncated)
    assert exp.completions == direct.completions


def test_evaluation_through_the_engine_is_the_direct_generation(tiny_model, smollm2_tokenizer, smollm2_prompts):
    tok, n_new = smollm2_tokenizer, 5
    prompts = [*smollm2_prompts, "3 + 4 ="]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=n_new)
    first = generate_rollouts(tiny_model, tok, prompts, 1, greedy, eos_token_ids=[2, 0])
    eos = [2, 0, int(first.completion_ids[0, 2])]  # row 0's third greedy token ends it: masks differ by row
    spy = _Spy(load_engine("hf", model=tiny_model, tokenizer=tok, eos_token_ids=eos))
    rows = [{"prompt": f"q{i}", "answer": "1"} for i in range(3)]
    rng = torch.get_rng_state()
    res = evaluate(
        spy,
        prompts,
        rows,
        max_new_tokens=n_new,
        batch_size=2,
        num_samples=2,
        temperature=1.0,
        seed=3,
        scorer=lambda p, c, **_: [0.0] * len(c),
        isolation="thread",
    )
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG is left as it was

    # greedy: eval batches of 2 prompts, one completion each; samples: 2 // 2 = 1 prompt per call
    assert [(c[0], c[1], c[2].temperature, c[2].max_new_tokens) for c in spy.calls] == [
        (prompts[:2], 1, 0.0, n_new),
        (prompts[2:], 1, 0.0, n_new),
        (prompts[:1], 2, 1.0, n_new),
        (prompts[1:2], 2, 1.0, n_new),
        (prompts[2:], 2, 1.0, n_new),
    ]
    assert [c[3] for c in spy.calls[2:]] == [3 * 100003 + start for start in (0, 1, 2)]
    for chunk, _, _, _, exp in spy.calls[:2]:  # the calls evaluate() made before it took an engine
        _same(exp, generate_rollouts(tiny_model, tok, chunk, 1, greedy, eos_token_ids=eos))
    for chunk, g, _, seed, exp in spy.calls[2:]:
        _same(
            exp,
            generate_rollouts(
                tiny_model,
                tok,
                chunk,
                g,
                SamplingParams(temperature=1.0, max_new_tokens=n_new),
                eos_token_ids=eos,
                seed=seed,
            ),
        )
    greedy_texts = spy.calls[0][4].completions + spy.calls[1][4].completions
    assert [e["completion"] for e in res["examples"]] == greedy_texts
    truncated = sum(int(c[4].truncated.sum()) for c in spy.calls[:2])
    assert truncated == 2 and res["truncated_frac"] == pytest.approx(2 / 3)  # row 0 ended at the extra EOS
    assert (res["total"], res["correct"], res["accuracy"]) == (3, 0, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("options", ["default", "chunked_bf16_sampler"])
def test_the_runs_evaluation_engine_generates_as_evaluation_always_did(tiny_model_dir, tmp_path, options):
    """The run's held-out evaluation generates with ``run.eval_engine``: the run's own engine when its
    options are evaluation's; with ``rollout.chunk_size`` or ``model.autocast_bf16`` (the hf engine's bf16
    sampler copy), a second hf engine with neither, so the evaluation's numbers do not move with them."""
    sections = {"chunked_bf16_sampler": dict(rollout={"chunk_size": 1}, model={"autocast_bf16": True}), "default": {}}[
        options
    ]
    ev = {"dataset": "mawps", "split": "singleop", "limit": 5, "max_new_tokens": 4, "batch_size": 2}
    recipe = tiny_recipe(tiny_model_dir, tmp_path, data={"skip": 5}, algo={"beta": 0.0}, eval=ev, **sections)
    run = build_run(recipe)
    try:
        eng, eval_eng = run.engine, run.eval_engine
        if options == "default":
            assert eval_eng is eng and (eng.chunk_size, eng.sampler_dtype) == (None, None)
        else:
            assert eval_eng is not eng and type(eval_eng) is type(eng) and eval_eng.model is run.model
            assert (eng.chunk_size, eng.sampler_dtype) == (1, torch.bfloat16)
            assert (eval_eng.chunk_size, eval_eng.sampler_dtype) == (None, None)
        res = run.evaluator.run(eval_eng, tmp_path, "before")
        prompts = run.evaluator.prompts
        assert len(prompts) == 4  # 5 held-out rows, one of them also a training question
        greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
        direct = [
            c
            for s in (0, 2)
            for c in generate_rollouts(
                run.model, run.tokenizer, prompts[s : s + 2], 1, greedy, eos_token_ids=run.eos_ids
            ).completions
        ]
        assert [e["completion"] for e in res["examples"]] == direct
        assert (tmp_path / "eval_before.json").exists() and res["when"] == "before" and res["total"] == 4
        # the record says how the numbers were made: the prompt as the model got it, the budget, greedy
        saved = json.loads((tmp_path / "eval_before.json").read_text())
        assert {
            k: saved["settings"][k]
            for k in (
                "prompt_template",
                "system_prompt",
                "chat_template",
                "max_new_tokens",
                "greedy",
                "num_samples",
                "batch_size",
            )
        } == {
            "prompt_template": recipe.data.prompt_template,
            "system_prompt": recipe.data.system_prompt,
            "chat_template": True,
            "max_new_tokens": 4,
            "greedy": True,
            "num_samples": 0,
            "batch_size": 2,
        }
        assert [e["prompt"] for e in saved["examples"]] == prompts
    finally:
        run.rewards.close()


def test_a_run_without_an_eval_section_has_no_evaluation_engine(tiny_model_dir, tmp_path):
    run = build_run(tiny_recipe(tiny_model_dir, tmp_path, algo={"beta": 0.0}))
    try:
        assert run.evaluator is None and run.eval_engine is None and run.ref_model is None
    finally:
        run.rewards.close()
