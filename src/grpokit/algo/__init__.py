"""grpokit.algo: the GRPO math as pure functions of tensors (imports torch only).

Shapes: ``B`` prompts, ``G`` group size, ``N = B·G`` sequences (each group contiguous), ``T``
completion length, ``V`` vocabulary. ``completion_mask`` is bool ``(N, T)``, True = the token counts.

The named variants (surrogates, importance levels, sampler corrections, aggregations, outcome
baselines) are registries of :mod:`grpokit.algo.catalog`; :func:`policy_loss` takes them by name in a
:class:`LossConfig`.
"""

from . import catalog
from ._stats import ROUNDING_ULPS
from .advantages import (
    BASELINE_SCALES,
    BASELINES,
    SCALES,
    constant_groups,
    gae_advantages,
    group_advantages,
    outcome_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from .aggregation import AGGREGATIONS, aggregate_loss
from .gap import LogprobGap, logprob_gap
from .kl import KL_ESTIMATORS, kl_penalty
from .logprobs import token_entropy, token_logprobs
from .loss import policy_loss
from .loss_types import LossConfig, LossOutput, LossStats
from .masks import completion_terminated, mask_completions
from .ppo import masked_whiten, token_rewards, value_loss
from .process import PROCESS_MODES, process_advantages, process_constant_groups
from .reward_shaping import normalized_reward_sum, outcome_at_last_step, overlong_penalty
from .surrogates import IMPORTANCE_LEVELS, IS_CORRECTIONS, SURROGATES

__all__ = [
    "AGGREGATIONS",
    "BASELINES",
    "BASELINE_SCALES",
    "IMPORTANCE_LEVELS",
    "IS_CORRECTIONS",
    "KL_ESTIMATORS",
    "LogprobGap",
    "LossConfig",
    "LossOutput",
    "LossStats",
    "PROCESS_MODES",
    "ROUNDING_ULPS",
    "SCALES",
    "SURROGATES",
    "aggregate_loss",
    "catalog",
    "completion_terminated",
    "constant_groups",
    "gae_advantages",
    "group_advantages",
    "kl_penalty",
    "logprob_gap",
    "mask_completions",
    "masked_whiten",
    "normalized_reward_sum",
    "outcome_advantages",
    "outcome_at_last_step",
    "overlong_penalty",
    "policy_loss",
    "process_advantages",
    "process_constant_groups",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_entropy",
    "token_logprobs",
    "token_rewards",
    "value_loss",
]
