"""grpokit.algo: the GRPO math as pure functions of tensors (imports torch only).

Shapes: ``B`` prompts, ``G`` group size, ``N = B·G`` sequences (each group contiguous), ``T``
completion length, ``V`` vocabulary. ``completion_mask`` is bool ``(N, T)``, True = the token counts.
"""

from .advantages import (
    ROUNDING_ULPS,
    SCALES,
    constant_groups,
    gae_advantages,
    group_advantages,
    process_advantages,
    process_constant_groups,
)
from .gap import LogprobGap, logprob_gap
from .kl import KL_ESTIMATORS, kl_penalty
from .logprobs import token_entropy, token_logprobs
from .loss import AGGREGATIONS, aggregate_loss, policy_loss
from .masks import completion_terminated, mask_completions
from .ppo import masked_whiten, token_rewards, value_loss

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LogprobGap",
    "ROUNDING_ULPS",
    "SCALES",
    "aggregate_loss",
    "completion_terminated",
    "constant_groups",
    "gae_advantages",
    "group_advantages",
    "kl_penalty",
    "logprob_gap",
    "mask_completions",
    "masked_whiten",
    "policy_loss",
    "process_advantages",
    "process_constant_groups",
    "token_entropy",
    "token_logprobs",
    "token_rewards",
    "value_loss",
]
