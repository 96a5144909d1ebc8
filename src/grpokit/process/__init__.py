"""Process supervision: one reward per reasoning step instead of one per completion.

What lives where:

- :mod:`grpokit.process.steps`: cutting a completion into steps (:func:`split_steps`, rules
  ``lines``/``paragraphs``/``regex:``/``tag:``), mapping each step's end to its last completion token
  (:func:`step_token_ends`, :func:`step_end_masks`), and placing one score per step at those tokens
  (:func:`scatter_step_rewards`, the ``(N, T)`` step-reward layout of docs/design.md, "Step
  rewards"). Knows nothing about how steps are scored.
- :mod:`grpokit.process.verifier`: the process-reward protocol
  ``fn(prompts, completions, steps, **columns) -> list[list[float | None]]`` and the built-in
  rule-based arithmetic step verifier (:func:`arithmetic_step_rewards`, :func:`find_claims`).
- :mod:`grpokit.process.prm`: learned process reward models following the same protocol
  (:class:`TokenProbPRM`, :class:`ClassificationPRM`) and their row layout (:class:`StepLayout`).
- :mod:`grpokit.process.prm_train`: a ``TokenProbPRM`` trained on step labels (:func:`train_prm`,
  :class:`PRMSpec`) and loaded back (:func:`load_prm`); :mod:`grpokit.process.prm_metrics` measures one
  against labels (step accuracy, AUC, first-wrong-step F1).
- :mod:`grpokit.process.scorer`: :class:`ProcessScorer`, the step scorer of the reward pipeline:
  completions -> steps -> scores -> ``(step_rewards, step_ends)`` and the step metrics.
- :mod:`grpokit.process.wiring`: :func:`resolve_process_reward` turns ``algo.process_reward`` (a
  built-in name of :data:`BUILTIN_PROCESS_REWARDS`, ``module:function`` or ``path/to/file.py:function``)
  into a guarded callable, its signature checked.
- :mod:`grpokit.process.labels`: automatic step labels (Math-Shepherd): :func:`label_steps` rolls
  out completions from each step of a policy's own solutions through a rollout engine and labels
  the step ``hard``/``soft`` by how many reach the answer; :class:`StepLabels` records kept in a
  JSON-lines file that a run can resume (:func:`append_labels`, :func:`read_labels`).

Token advantages from the step rewards are the algorithm's job (``grpokit.estimators.base.GRPO`` with
``grpokit.algo.process_advantages``).
"""

from grpokit.process.labels import (
    LabelFile,
    StepLabels,
    TokenCount,
    append_labels,
    label_steps,
    prefix_seed,
    read_labels,
)
from grpokit.process.prm import ClassificationPRM, StepLayout, TokenProbPRM
from grpokit.process.prm_metrics import prm_metrics
from grpokit.process.prm_train import PRMSpec, load_prm, train_prm
from grpokit.process.scorer import ProcessScorer
from grpokit.process.steps import (
    scatter_step_rewards,
    split_steps,
    step_end_masks,
    step_texts,
    step_token_ends,
    token_char_ends,
)
from grpokit.process.verifier import MAX_BITS, Claim, arithmetic_step_rewards, find_claims
from grpokit.process.wiring import BUILTIN_PROCESS_REWARDS, resolve_process_reward

__all__ = [
    "BUILTIN_PROCESS_REWARDS",
    "Claim",
    "ClassificationPRM",
    "LabelFile",
    "MAX_BITS",
    "PRMSpec",
    "ProcessScorer",
    "StepLabels",
    "StepLayout",
    "TokenCount",
    "TokenProbPRM",
    "append_labels",
    "arithmetic_step_rewards",
    "find_claims",
    "label_steps",
    "load_prm",
    "prefix_seed",
    "prm_metrics",
    "read_labels",
    "resolve_process_reward",
    "scatter_step_rewards",
    "split_steps",
    "step_end_masks",
    "step_texts",
    "step_token_ends",
    "token_char_ends",
    "train_prm",
]
