"""Multi-turn rollouts on the vllm engine (``grpokit.rollout.vllm_multiturn``) against
``fake_vllm.FakeLLM`` (vLLM's calls, sampling with a torch copy of the pushed weights), a tiny random
Llama, the real SmolLM2 tokenizer and ``fake_envs.StopAtE`` (stop string "e"):
the transcripts are the hf multi-turn engine's (greedy), each turn continues from the row's token ids,
``sampler_logprobs`` are the trainer's on the model's tokens, a row's turns depend on its seed alone,
and a run trains with it. vLLM itself: ``make vllm-check`` (experiments/scripts/vllm_check.py, part ``multiturn``)."""

from __future__ import annotations

import pytest
import torch

import grpokit.rollout.vllm_multiturn as vm
from grpokit.models.logprobs import completion_logprobs
from grpokit.rollout import SamplingParams
from grpokit.rollout.multiturn import generate_multiturn
from support.fake_envs import StopAtE
from support.fake_vllm import install_fake_vllm
from support.helpers import true_runs

PROMPTS = ["The cat sat on", "A dog ran to", "My hat is on"]
EOS = [2, 0]
G = 2


@pytest.fixture
def fake_vllm(monkeypatch):
    return install_fake_vllm(monkeypatch)


def _rows():
    return [{"question": p, "answer": str(i)} for i, p in enumerate(PROMPTS)]


def _engine(model, tok, env, **kw):
    return vm.VLLMMultiTurnEngine(model, tok, env=env, eos_token_ids=EOS, max_turns=kw.pop("max_turns", 3), **kw)


def _stub():
    return StopAtE()


@pytest.mark.parametrize("stop_ids", ["vocabulary", "none"])
def test_greedy_transcripts_are_the_hf_engines(fake_vllm, tiny_model, smollm2_tokenizer, monkeypatch, stop_ids):
    """Greedy: the same transcripts, masks, counts and texts as the hf multi-turn engine. With
    ``stop_ids="none"`` vLLM is given no stop-string token (as for a stop string spread over
    tokens): every turn runs to its limit and is cut after the fact, to the same transcripts."""
    if stop_ids == "none":
        monkeypatch.setattr(vm, "stop_token_ids", lambda tok, stops: [])
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    a = _engine(tiny_model, smollm2_tokenizer, _stub()).generate(PROMPTS, G, greedy, 11, rows=_rows())
    b = generate_multiturn(
        tiny_model, smollm2_tokenizer, PROMPTS, G, greedy, env=_stub(), rows=_rows(), eos_token_ids=EOS,
        max_turns=3, seed=11, turn_batching="lockstep",
    )  # fmt: skip
    assert int(a.env_counts["turns"].max()) >= 2 and bool((a.env_counts["env_tokens"] > 0).any())
    for f in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "attention_mask", "truncated"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.completions == b.completions and a.sampler_logprobs is None
    assert a.env_counts.keys() == b.env_counts.keys()
    assert all(torch.equal(a.env_counts[k], b.env_counts[k]) for k in a.env_counts)
    (llm,) = fake_vllm
    # each request continues its row from token ids: its prompt, then its transcript so far
    prompt_ids = [a.prompt_ids[r][a.prompt_mask[r]].tolist() for r in range(len(a))]
    transcripts = [a.completion_ids[r][a.attention_mask[r]].tolist() for r in range(len(a))]
    later = [ids for ids, _ in llm.requests if not any(ids == p for p in prompt_ids)]
    assert later and all(
        any(ids[: len(p)] == p and t[: len(ids) - len(p)] == ids[len(p) :] for p, t in zip(prompt_ids, transcripts))
        for ids in later
    )
    want = set(EOS) | set(vm.stop_token_ids(smollm2_tokenizer, ["e"]))  # patched: EOS only
    assert len(want) > 2 or stop_ids == "none"
    assert all(set(sp.stop_token_ids) == want for _, sp in llm.requests)


def test_sampler_logprobs_are_the_trainers_on_the_models_tokens(fake_vllm, tiny_model, smollm2_tokenizer):
    e = _engine(tiny_model, smollm2_tokenizer, _stub()).generate(
        PROMPTS, G, SamplingParams(temperature=0.8, max_new_tokens=6), 3, rows=_rows()
    )
    assert max(len(true_runs(e.completion_mask[r])) for r in range(len(e))) >= 2  # several model turns
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny_model, e, temperature=0.8)
    m = e.completion_mask
    assert (e.sampler_logprobs[~m] == 0).all() and (e.sampler_logprobs[m] < 0).all()
    assert bool((e.attention_mask & ~m).any())  # environment tokens, attended to and not scored
    assert (e.sampler_logprobs[m] - logp[m]).abs().max() < 1e-4


def test_a_rows_turns_depend_on_its_seed_alone(fake_vllm, tiny_model, smollm2_tokenizer):
    engine, p = _engine(tiny_model, smollm2_tokenizer, _stub()), SamplingParams(temperature=1.0, max_new_tokens=5)
    whole = engine.generate(PROMPTS, G, p, 11, rows=_rows())
    assert len({tuple(r) for r in whole.completion_ids.tolist()}) == len(whole)
    for first in range(len(PROMPTS)):
        one = engine.generate(PROMPTS[first : first + 1], G, p, 11, first, rows=_rows()[first : first + 1])
        for g in range(G):
            r, n = first * G + g, int(one.attention_mask[g].sum())
            assert n == int(whole.attention_mask[first * G + g].sum())
            assert one.completion_ids[g, :n].tolist() == whole.completion_ids[r, :n].tolist()
            assert torch.equal(one.completion_mask[g, :n], whole.completion_mask[r, :n])
    assert not torch.equal(engine.generate(PROMPTS, G, p, 12, rows=_rows()).completion_ids, whole.completion_ids)


@pytest.mark.slow
def test_stop_token_ids_are_the_tokens_holding_a_stop_string(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = vm.stop_token_ids(tok, ["="])
    assert vm.stop_token_ids(tok, []) == [] and vm.stop_token_ids(tok, [""]) == []
    texts = tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=False)
    assert ids == [i for i, t in enumerate(texts) if "=" in t]  # every one, and only those
    assert tok.encode("=", add_special_tokens=False)[0] in ids and 1 < len(ids) < len(tok) // 100
    assert any(texts[i] != "=" and texts[i].strip() != "=" for i in ids)  # longer tokens holding it too
    both = vm.stop_token_ids(tok, ["=", "</calc>"])
    assert set(ids) <= set(both) and vm.stop_token_ids(tok, ["="]) is ids  # computed once


def test_bad_settings_are_refused(fake_vllm, tiny_model, smollm2_tokenizer):
    with pytest.raises(ValueError, match="rollout.max_turns must be >= 1, got 0"):
        _engine(tiny_model, smollm2_tokenizer, _stub(), max_turns=0)
    with pytest.raises(ValueError, match="rollout.max_total_tokens must be >= 1, got 0"):
        _engine(tiny_model, smollm2_tokenizer, _stub(), max_total_tokens=0)
    engine = _engine(tiny_model, smollm2_tokenizer, _stub())
    with pytest.raises(ValueError, match="2 rows for 3 prompts"):
        engine.generate(PROMPTS, G, SamplingParams(), 0, rows=_rows()[:2])
    with pytest.raises(ValueError, match="rollout.top_k=5 truncates"):
        engine.generate(PROMPTS, G, SamplingParams(top_k=5), 0, rows=_rows())


@pytest.mark.slow
def test_a_run_trains_with_the_vllm_engine_and_an_environment(fake_vllm, tiny_model_dir, tmp_path):
    import grpokit.trainer.build
    from grpokit.metrics import read_metrics
    from grpokit.trainer.loop import train
    from support.helpers import tiny_recipe

    recipe = tiny_recipe(
        tiny_model_dir,
        tmp_path,
        rollout={"engine": "vllm", "env": "support.fake_envs:StopAtE", "max_turns": 3, "max_new_tokens": 6},
    )
    run = grpokit.trainer.build.build_run(recipe)
    assert isinstance(run.engine, vm.VLLMMultiTurnEngine) and run.engine.max_turns == 3
    try:
        train(recipe, progress=False, run=run)
    finally:
        run.rewards.close()
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert len(lines) == 2 and fake_vllm[0].pushes == 2
    for m in lines:
        assert 1 < m["env/turns"] <= 3 and m["logprob_gap_max"] < 1e-3
