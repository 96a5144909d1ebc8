"""Bad input: a ValueError that names the function and the shapes or value at fault."""

import pytest
import torch

from grpokit import algo


def test_group_size_must_divide():
    with pytest.raises(ValueError, match=r"group_advantages: .*N=6.*group_size=4"):
        algo.group_advantages(torch.zeros(6), 4)


def test_unknown_scale():
    with pytest.raises(ValueError, match="scale must be one of"):
        algo.group_advantages(torch.zeros(4), 2, scale="std")


def test_process_shapes_named():
    with pytest.raises(ValueError, match=r"process_advantages: .*step_rewards \(2, 3\).*step_end_mask \(2, 4\)"):
        algo.process_advantages(
            torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool), 2
        )


def test_policy_loss_shapes_named():
    with pytest.raises(ValueError, match=r"policy_loss: .*logp \(2, 3\).*old_logp \(2, 4\)"):
        algo.policy_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"advantages \(3,\)"):
        algo.policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3, dtype=torch.bool))


def test_beta_needs_reference():
    with pytest.raises(ValueError, match="needs ref_logp"):
        algo.policy_loss(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.zeros(1),
            torch.ones(1, 1, dtype=torch.bool),
            algo.LossConfig(beta=0.1),
        )


def test_negative_coefficients_and_unknown_names():
    args = (torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="must be >= 0"):
        algo.policy_loss(*args, algo.LossConfig(clip_eps_low=-0.1))
    with pytest.raises(ValueError, match="aggregation must be one of"):
        algo.policy_loss(*args, algo.LossConfig(aggregation="mean"))
    with pytest.raises(ValueError, match="needs max_completion_length"):
        algo.policy_loss(*args, algo.LossConfig(aggregation="seq_mean_token_sum_norm"))
    with pytest.raises(ValueError, match="kind must be one of"):
        algo.kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_logprob_shape_and_temperature():
    with pytest.raises(ValueError, match=r"token_logprobs: logits .*\(2, 3, 5\).*\(2, 4\)"):
        algo.token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        algo.token_logprobs(torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.long), temperature=0)


def test_mask_needs_eos():
    with pytest.raises(ValueError, match="eos_token_ids is empty"):
        algo.mask_completions(torch.zeros(1, 2, dtype=torch.long), [])
