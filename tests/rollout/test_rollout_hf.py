"""grpokit.rollout.hf: grouped rollouts from model.generate (tiny random Llama + real tokenizer)."""

from __future__ import annotations

import pytest
import torch

from grpokit.algo import mask_completions
from grpokit.experience import Experience
from grpokit.rollout import SamplingParams, build_generation_config, generate_rollouts

# A random tiny model's next-token distribution is near uniform over 49152 ids, so the real EOS
# ids almost never come up. Declaring every 5th id an EOS makes about 20% of tokens end a
# completion: some rows stop early, some run to max_new_tokens.
MANY_EOS = list(range(0, 49152, 5))
# Plain (non-chat) prompts with different last tokens: a random tiny model's greedy continuation
# depends mostly on the last token, and both chat prompts end in "<|im_start|>assistant\n".
RAW_PROMPTS = ["The cat sat on", "Hello world, this is"]


def _check_rollout(r: Experience, tokenizer, prompts, G: int, max_new_tokens: int, eos):
    B = len(prompts)
    N = B * G
    assert len(r) == N and r.group_size == G
    assert r.prompt_ids.shape[0] == r.prompt_mask.shape[0] == N
    T = r.completion_ids.shape[1]
    assert 1 <= T <= max_new_tokens
    assert r.completion_mask.shape == (N, T) and r.completion_mask.dtype == torch.bool
    assert r.prompt_mask.dtype == torch.bool and r.truncated.dtype == torch.bool
    assert r.group_index.tolist() == [b for b in range(B) for _ in range(G)]
    # Prompt rows: left-padded copies of each prompt's own tokens, grouped.
    for i in range(N):
        own = tokenizer(prompts[i // G], add_special_tokens=False)["input_ids"]
        n = len(own)
        assert r.prompt_ids[i, -n:].tolist() == own
        assert r.prompt_mask[i].tolist() == [False] * (r.prompt_ids.shape[1] - n) + [True] * n
    # Masks and flags agree with the algorithm core.
    torch.testing.assert_close(r.completion_mask, mask_completions(r.completion_ids, eos))
    is_eos = torch.isin(r.completion_ids, torch.tensor(eos))
    assert r.truncated.tolist() == (~is_eos.any(1)).tolist()
    for i in range(N):
        n = int(r.completion_mask[i].sum())
        if r.truncated[i]:
            assert n == T == max_new_tokens  # ran out of budget
            text_ids = r.completion_ids[i]
        else:
            assert is_eos[i, n - 1] and not is_eos[i, : n - 1].any()  # mask ends on the first EOS
            text_ids = r.completion_ids[i, : n - 1]
        assert r.completions[i] == tokenizer.decode(text_ids, skip_special_tokens=True)
    assert r.gen_s > 0
    # Plain tensors (not inference-mode tensors), so the trainer can use them under autograd.
    for t in (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.truncated):
        assert not t.is_inference()


def test_sampled_rollout_is_grouped_and_masked(tiny_model, smollm2_tokenizer, smollm2_prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    # seed 11: a row runs 12 tokens without EOS with probability ~0.06, so few seeds truncate a row
    r = generate_rollouts(tiny_model, smollm2_tokenizer, smollm2_prompts, 4, params, eos_token_ids=MANY_EOS, seed=11)
    _check_rollout(r, smollm2_tokenizer, smollm2_prompts, 4, 12, MANY_EOS)
    assert r.truncated.any() and (~r.truncated).any()  # both cases exercised (seeded)
    assert r.prompt_ids.shape[1] == max(
        len(smollm2_tokenizer(p, add_special_tokens=False)["input_ids"]) for p in smollm2_prompts
    )


def test_prompts_start_with_one_im_start(tiny_model, smollm2_tokenizer, smollm2_prompts):
    """The chat template already holds the special tokens; none are added (no doubled BOS)."""
    r = generate_rollouts(
        tiny_model,
        smollm2_tokenizer,
        smollm2_prompts,
        1,
        SamplingParams(max_new_tokens=1),
        eos_token_ids=[2],
        seed=0,
    )
    for ids, mask in zip(r.prompt_ids, r.prompt_mask):
        real = ids[mask].tolist()
        assert real[0] == 1 and real[1] != 1
        assert smollm2_tokenizer.decode(real).endswith("<|im_start|>assistant\n")


def test_greedy_rows_identical_within_group(tiny_model, smollm2_tokenizer):
    r = generate_rollouts(
        tiny_model,
        smollm2_tokenizer,
        RAW_PROMPTS,
        3,
        SamplingParams(temperature=0, max_new_tokens=8),
        eos_token_ids=[2, 0],
    )
    _check_rollout(r, smollm2_tokenizer, RAW_PROMPTS, 3, 8, [2, 0])
    groups = r.completion_ids.view(2, 3, -1)
    assert (groups == groups[:, :1]).all()
    assert not torch.equal(groups[0, 0], groups[1, 0])  # different prompts, different text


def test_truncated_flags_with_a_known_eos(tiny_model, smollm2_tokenizer):
    """Greedy is deterministic: declare the token row 0 emits at step 3 an EOS and row 0 stops there."""
    params = SamplingParams(temperature=0, max_new_tokens=6)
    free = generate_rollouts(tiny_model, smollm2_tokenizer, RAW_PROMPTS, 1, params, eos_token_ids=[2])
    assert free.truncated.all() and free.completion_ids.shape[1] == 6
    eos = int(free.completion_ids[0, 3])
    row1 = free.completion_ids[1].tolist()
    r = generate_rollouts(tiny_model, smollm2_tokenizer, RAW_PROMPTS, 1, params, eos_token_ids=[eos])
    _check_rollout(r, smollm2_tokenizer, RAW_PROMPTS, 1, 6, [eos])
    first0 = free.completion_ids[0].tolist().index(eos)  # <= 3
    assert r.completion_mask[0].tolist() == [True] * (first0 + 1) + [False] * (5 - first0)
    assert not r.truncated[0]
    assert r.truncated[1].item() == (eos not in row1)
    assert r.completions[0] == smollm2_tokenizer.decode(free.completion_ids[0, :first0])


def test_recipe_reaches_generate_over_model_generation_config(
    tiny_model, smollm2_tokenizer, smollm2_prompts, monkeypatch
):
    # Model defaults that must NOT leak into sampling.
    gc = tiny_model.generation_config
    gc.do_sample, gc.temperature, gc.top_p, gc.top_k, gc.min_p = False, 0.3, 0.5, 7, 0.2
    gc.max_length, gc.max_new_tokens, gc.repetition_penalty, gc.typical_p = 5, 3, 1.3, 0.9
    before = gc.to_dict()
    seen = []
    original = tiny_model.generate

    def spy(*args, **kwargs):
        seen.append(kwargs["generation_config"])
        return original(*args, **kwargs)

    monkeypatch.setattr(tiny_model, "generate", spy)
    params = SamplingParams(
        temperature=0.9, top_p=0.95, top_k=0, min_p=0.0, max_new_tokens=6, sampler="multinomial"
    )  # generate's own sampling fields
    r = generate_rollouts(tiny_model, smollm2_tokenizer, smollm2_prompts, 2, params, eos_token_ids=[2, 0], seed=0)
    (passed,) = seen
    assert passed.do_sample is True
    assert (passed.temperature, passed.top_p, passed.top_k, passed.min_p) == (0.9, 0.95, 0, 0.0)
    assert (passed.max_new_tokens, passed.max_length, passed.repetition_penalty) == (6, None, 1.0)
    assert passed.eos_token_id == [2, 0] and passed.pad_token_id == 2
    # What generate actually uses after merging in the model's defaults (transformers fills the
    # None fields from model.generation_config): the recipe still wins everywhere it speaks.
    merged, _ = tiny_model._prepare_generation_config(passed)
    assert (merged.do_sample, merged.temperature, merged.top_p, merged.top_k, merged.min_p) == (
        True,
        0.9,
        0.95,
        0,
        0.0,
    )
    assert (merged.max_new_tokens, merged.repetition_penalty, merged.typical_p) == (6, 1.0, 1.0)
    assert r.completion_ids.shape[1] == 6  # not cut at the model's max_length=5 / max_new_tokens=3
    assert tiny_model.generation_config.to_dict() == before  # the model's config is untouched


def test_greedy_generation_config():
    g = build_generation_config(SamplingParams(temperature=0, top_k=5), eos_token_ids=[2], pad_token_id=0)
    assert g.do_sample is False and g.num_beams == 1 and g.max_new_tokens == 256


def test_same_seed_same_output_and_global_rng_untouched(tiny_model, smollm2_tokenizer, smollm2_prompts):
    params = SamplingParams(temperature=1.0, top_k=50, max_new_tokens=6)

    def run(seed):
        return generate_rollouts(
            tiny_model, smollm2_tokenizer, smollm2_prompts, 2, params, eos_token_ids=MANY_EOS, seed=seed
        )

    state = torch.get_rng_state()
    a, b, c = run(1), run(1), run(2)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.completions == b.completions
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # Within a group the G samples differ (sampling, not copies).
    assert not torch.equal(a.completion_ids[0], a.completion_ids[1])


def test_chunks_equal_one_batch_and_pad_to_common_length(tiny_model, smollm2_tokenizer):
    params = SamplingParams(temperature=0, max_new_tokens=6)
    free = generate_rollouts(tiny_model, smollm2_tokenizer, RAW_PROMPTS, 2, params, eos_token_ids=[2])
    # Make prompt 0's rows (the first chunk of 2) stop after their first token; prompt 1 runs on.
    eos = int(free.completion_ids[0, 0])
    assert eos not in free.completion_ids[2].tolist()
    whole = generate_rollouts(tiny_model, smollm2_tokenizer, RAW_PROMPTS, 2, params, eos_token_ids=[eos])
    chunked = generate_rollouts(
        tiny_model, smollm2_tokenizer, RAW_PROMPTS, 2, params, eos_token_ids=[eos], chunk_size=2
    )
    _check_rollout(chunked, smollm2_tokenizer, RAW_PROMPTS, 2, 6, [eos])
    assert torch.equal(chunked.completion_mask, whole.completion_mask)
    torch.testing.assert_close(
        chunked.completion_ids[chunked.completion_mask], whole.completion_ids[whole.completion_mask]
    )
    assert chunked.completion_mask[:2].sum(1).tolist() == [1, 1]
    assert chunked.truncated.tolist() == [False, False, True, True]
    assert (chunked.completion_ids[:2, 1:] == smollm2_tokenizer.pad_token_id).all()  # chunk padding
    # chunk_size not dividing N
    odd = generate_rollouts(tiny_model, smollm2_tokenizer, RAW_PROMPTS, 2, params, eos_token_ids=[eos], chunk_size=3)
    assert torch.equal(odd.completion_mask, whole.completion_mask)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(group_size=0), "group_size"),
        (dict(prompts=[]), "prompts is empty"),
        (dict(prompts=["ok", ""]), r"prompts\[1\]"),
        (dict(prompts="just one string"), "list of strings"),
        (dict(eos_token_ids=[]), "eos_token_ids"),
        (dict(chunk_size=0), "chunk_size"),
    ],
)
def test_generate_rollouts_validation(tiny_model_v64, kwargs, match):
    args = dict(
        model=tiny_model_v64,
        tokenizer=None,
        prompts=["a"],
        group_size=2,
        params=SamplingParams(max_new_tokens=4),
        eos_token_ids=[2],
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        generate_rollouts(**args)


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_new_tokens", 0),
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_k", -1),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
    ],
)
def test_sampling_params_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})
    params = SamplingParams()
    setattr(params, field, value)  # mutated after construction: generate_rollouts re-checks
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        generate_rollouts(None, None, ["a"], 1, params, eos_token_ids=[2])


def test_warns_when_model_config_sets_fields_the_recipe_cannot_switch_off(tiny_model, smollm2_tokenizer):
    tiny_model.generation_config.suppress_tokens = [5]
    with pytest.warns(UserWarning, match="suppress_tokens"):
        generate_rollouts(
            tiny_model,
            smollm2_tokenizer,
            RAW_PROMPTS,
            1,
            SamplingParams(max_new_tokens=1),
            eos_token_ids=[2],
            seed=0,
        )
