"""grpokit.experience.Experience: slicing, micro-batches, groups, shards, concatenation, devices."""

from __future__ import annotations

import pytest
import torch

from grpokit.experience import Experience

G = 2


def _exp(n_groups=3, p=4, t=5, seed=0) -> Experience:
    """Rows with left-padded prompts and right-padded completions of known widths."""
    gen = torch.Generator().manual_seed(seed)
    n = n_groups * G
    prompt_len = torch.tensor([4, 4, 2, 2, 3, 3][:n])
    comp_len = torch.tensor([5, 1, 2, 3, 1, 4][:n])
    pm = torch.arange(p)[None, :] >= (p - prompt_len)[:, None]
    cm = torch.arange(t)[None, :] < comp_len[:, None]
    return Experience.grouped(
        torch.randint(3, 50, (n, p), generator=gen),
        pm,
        torch.randint(3, 50, (n, t), generator=gen),
        cm,
        G,
        truncated=comp_len == t,
        completions=[f"c{i}" for i in range(n)],
        rewards=torch.arange(n, dtype=torch.float64),
        advantages=torch.randn(n, t, generator=gen),
        old_logprobs=torch.randn(n, t, generator=gen),
        ref_logprobs=torch.randn(n, t, generator=gen),
        step_rewards=torch.randn(n, t, generator=gen, dtype=torch.float64),
        step_ends=cm.clone(),
    )


def test_grouped_index_and_counts():
    e = _exp()
    assert e.group_index.tolist() == [0, 0, 1, 1, 2, 2] and e.num_groups == 3 and len(e) == 6


def test_rows_cut_padding_columns_and_every_field_along():
    e = _exp()
    sub = e.rows(slice(2, 4))  # prompts of 2 tokens (2 leading pad columns), completions of 2 and 3
    assert sub.prompt_ids.shape == (2, 2) and torch.equal(sub.prompt_ids, e.prompt_ids[2:4, 2:])
    assert sub.completion_ids.shape == (2, 3) and torch.equal(sub.completion_ids, e.completion_ids[2:4, :3])
    for name in ("advantages", "old_logprobs", "ref_logprobs", "step_rewards", "step_ends"):
        assert torch.equal(getattr(sub, name), getattr(e, name)[2:4, :3]), name
    assert sub.rewards.tolist() == [2.0, 3.0] and sub.completions == ["c2", "c3"]
    assert sub.group_index.tolist() == [1, 1] and sub.group_size == G


def test_rows_by_index_tensor_and_part_of_a_group():
    e = _exp()
    sub = e.rows(torch.tensor([0, 4, 5]))
    assert sub.completions == ["c0", "c4", "c5"] and sub.group_size == 1  # 3 rows: not whole groups
    assert sub.completion_ids.shape[1] == 5 and sub.prompt_ids.shape[1] == 4


def test_outcome_advantages_are_sliced_per_row():
    e = _exp().replace(advantages=torch.tensor([1.0, 2, 3, 4, 5, 6]))
    assert e.rows(slice(1, 3)).advantages.tolist() == [2.0, 3.0]


def test_micro_batches_cover_the_rows_in_order():
    e = _exp()
    parts = list(e.micro_batches(4))
    assert [sl for sl, _ in parts] == [slice(0, 4), slice(4, 6)]
    assert [c for _, mb in parts for c in mb.completions] == e.completions
    with pytest.raises(ValueError, match="micro-batch size"):
        list(e.micro_batches(0))


def test_select_groups_renumbers():
    e = _exp()
    s = e.select_groups([2, 0])
    assert s.completions == ["c4", "c5", "c0", "c1"] and s.group_index.tolist() == [0, 0, 1, 1]
    assert torch.equal(s.old_logprobs, e.old_logprobs[[4, 5, 0, 1]])


def test_shard_takes_whole_groups_in_contiguous_shares():
    e = Experience.concat([_exp(), _exp(seed=1)], pad_id=0)  # 6 groups
    shards = [e.shard(r, 3) for r in range(3)]
    assert [s.completions for s in shards] == [
        ["c0", "c1", "c2", "c3"],
        ["c4", "c5", "c0", "c1"],
        ["c2", "c3", "c4", "c5"],
    ]
    assert all(s.group_index.tolist() == [0, 0, 1, 1] for s in shards)
    # 6 groups over 4 ranks (a dynamic-sampling batch): shares 1, 2, 1, 2 at 6r//4, in order
    uneven = [e.shard(r, 4) for r in range(4)]
    assert [s.num_groups for s in uneven] == [1, 2, 1, 2]
    assert sum((s.completions for s in uneven), []) == e.completions
    one = Experience.concat([_exp(n_groups=1)], pad_id=0)
    assert one.shard(0, 2).num_groups == 0 and len(one.shard(0, 2)) == 0 and one.shard(1, 2).num_groups == 1
    with pytest.raises(ValueError, match="rank 3 outside 0..2"):
        e.shard(3, 3)


def test_padded_share_tops_up_with_copies_whose_tokens_do_not_count():
    e = _exp()  # 3 groups of G = 2 over 2 ranks: shares 1 and 2 groups -> both 2 (fsdp2: equal forwards)
    (s0, real0), (s1, real1) = e.padded_share(0, 2), e.padded_share(1, 2)
    assert s0.completions == ["c0", "c1", "c0", "c1"] and real0.tolist() == [True, True, False, False]
    assert s1.completions == ["c2", "c3", "c4", "c5"] and real1.tolist() == [True] * 4 and s1.attention_mask is None
    assert s0.group_index.tolist() == [0, 0, 1, 1]
    assert torch.equal(s0.completion_mask[:2], e.completion_mask[:2]) and not s0.completion_mask[2:].any()
    assert torch.equal(s0.attention_mask, torch.cat([e.completion_mask[:2], e.completion_mask[:2]]))  # as sampled
    assert torch.equal(s0.completion_ids[2:], e.completion_ids[:2])  # the copy is fed to the model
    assert torch.equal(s0.advantages[:2], e.advantages[:2]) and (s0.advantages[2:] == 0).all()
    one = _exp(n_groups=1)  # a rank with no group gets one copy
    (a, ra), (b, rb) = one.padded_share(0, 2), one.padded_share(1, 2)
    assert ra.tolist() == [False, False] and not a.completion_mask.any() and rb.tolist() == [True, True]
    assert torch.equal(b.completion_mask, one.completion_mask)
    with pytest.raises(ValueError, match="padded_share: rank 2 outside 0..1"):
        e.padded_share(2, 2)


def test_concat_pads_every_field():
    a, b = _exp(n_groups=1, p=4, t=5), _exp(n_groups=1, p=2, t=3, seed=1)
    out = Experience.concat([a, b], pad_id=0)
    assert out.prompt_ids.shape == (4, 4) and out.completion_ids.shape == (4, 5)
    assert out.prompt_ids[2:, :2].eq(0).all() and not out.prompt_mask[2:, :2].any()  # left padding
    assert out.completion_ids[2:, 3:].eq(0).all() and not out.completion_mask[2:, 3:].any()  # right padding
    assert out.step_rewards[2:, 3:].eq(0).all() and not out.step_ends[2:, 3:].any()
    assert out.old_logprobs[2:, 3:].eq(0).all() and torch.equal(out.old_logprobs[:2], a.old_logprobs)
    assert out.group_index.tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="group sizes differ"):
        Experience.concat(
            [
                a,
                Experience.grouped(
                    *[x[:1] for x in (a.prompt_ids, a.prompt_mask, a.completion_ids, a.completion_mask)], 1
                ),
            ],
            0,
        )


def test_reward_parts_follow_the_rows_and_a_missing_name_is_nan():
    a, b = _exp(n_groups=2), _exp(n_groups=1, seed=1)
    a.reward_parts = {"f": torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)}
    b.reward_parts = {"g": torch.tensor([5.0, 6.0], dtype=torch.float64)}
    out = Experience.concat([a, b], pad_id=0)
    f, g = out.reward_parts["f"], out.reward_parts["g"]
    assert f[:4].tolist() == [0.0, 1.0, 2.0, 3.0] and f[4:].isnan().all() and f.dtype == torch.float64
    assert g[:4].isnan().all() and g[4:].tolist() == [5.0, 6.0]
    assert out.select_groups([2, 0]).reward_parts["g"][:2].tolist() == [5.0, 6.0]
    assert a.rows(slice(1, 3)).reward_parts["f"].tolist() == [1.0, 2.0]
    assert a.to("meta").reward_parts["f"].device.type == "meta"
    with pytest.raises(ValueError, match=r"Experience.reward_parts\['f'\]: shape \(3,\), expected \(4,\)"):
        a.replace(reward_parts={"f": torch.zeros(3)})


def test_bad_shapes_are_refused():
    e = _exp()
    with pytest.raises(ValueError, match="Experience.prompt_mask: 5 rows, completion_ids has 6"):
        e.replace(prompt_mask=e.prompt_mask[:5])
    with pytest.raises(ValueError, match="not whole groups of group_size=4"):
        e.replace(group_size=4)


def test_to_moves_every_tensor():
    e = _exp().to("meta")
    assert all(
        t.device.type == "meta"
        for t in (e.prompt_ids, e.completion_mask, e.group_index, e.rewards, e.advantages, e.old_logprobs, e.step_ends)
    )
    assert e.completions[0] == "c0"


def test_rows_by_bool_mask_and_groups_cut_in_two():
    e = _exp()
    sub = e.rows(torch.tensor([False, True, True, False, False, False]))
    assert sub.completions == ["c1", "c2"] and len(sub) == 2
    assert sub.group_size == 1  # rows 1 and 2 are halves of two groups
    assert e.rows(slice(2, 6)).group_size == G  # two whole groups


def test_select_groups_follows_group_index_and_names_missing_groups():
    e = _exp().rows(slice(2, 6))  # groups 1 and 2
    assert e.select_groups([2]).completions == ["c4", "c5"]
    with pytest.raises(ValueError, match=r"no rows of groups \[0\]"):
        e.select_groups([0])


def test_layout_checks():
    e = _exp()
    with pytest.raises(ValueError, match="rows of a group must be 2 contiguous rows"):
        e.replace(group_index=torch.tensor([0, 1, 0, 1, 2, 2]))
    with pytest.raises(ValueError, match=r"Experience.old_logprobs: shape \(6, 4\), expected \(N, T\) = \(6, 5\)"):
        e.replace(old_logprobs=e.old_logprobs[:, :4])
    with pytest.raises(ValueError, match="Experience.completions: 5 texts for 6 rows"):
        e.replace(completions=e.completions[:5])


def _with_support(e: Experience, form: str, vocab: int = 300, seed: int = 0) -> Experience:
    """``e`` with a ``sampler_support`` of random kept sets on its counted tokens (empty elsewhere)."""
    from grpokit.algo import support as sup

    gen = torch.Generator().manual_seed(seed)
    kept = (torch.rand(*e.completion_ids.shape, vocab, generator=gen) < 0.02) & e.completion_mask.unsqueeze(-1)
    return e.replace(sampler_support=sup.pack_ids(kept) if form == "ids" else sup.pack_bits(kept))


def test_the_sampler_support_is_sliced_sharded_and_joined_with_the_tokens():
    from grpokit.algo import support as sup

    e = _with_support(_exp(), "ids")
    full = sup.to_mask(e.sampler_support, 0, 300)  # (N, T, V)
    mb = e.rows(slice(2, 4))  # completion lengths 2, 3: the columns past 3 are cut
    assert mb.sampler_support.shape[:2] == (2, 3)
    assert torch.equal(sup.to_mask(mb.sampler_support, 0, 300), full[2:4, :3])
    shard = e.shard(1, 3)
    assert torch.equal(sup.to_mask(shard.sampler_support, 0, 300), full[2:4])
    # concat: widths and forms differ (ids, bits): one form (bits), shorter parts padded with empty positions
    a, b = _with_support(_exp(n_groups=1, t=5), "ids"), _with_support(_exp(n_groups=1, t=3, seed=1), "bits", seed=1)
    out = Experience.concat([a, b], pad_id=0)
    assert out.sampler_support.dtype == torch.uint8 and out.sampler_support.shape == (4, 5, 38)
    want = torch.cat(
        [sup.to_mask(a.sampler_support, 0, 300), sup.to_mask(sup.pad_positions(b.sampler_support, 5), 0, 300)]
    )
    assert torch.equal(sup.to_mask(out.sampler_support, 0, 300), want)
    assert not bool(sup.restricted(out.sampler_support)[2:, 3:].any())
    with pytest.raises(ValueError, match="sampler_support set in some parts only"):
        Experience.concat([a, _exp(n_groups=1)], pad_id=0)
    with pytest.raises(ValueError, match="sampler_support: shape"):
        e.replace(sampler_support=e.sampler_support[:, :2])
