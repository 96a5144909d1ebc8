"""Recipe validation: choices and ranges of single keys, and keys that must agree with each other."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from grpokit.config.fields import RecipeError, check_elements, choices_of, lora_options
from grpokit.config.schema import PrmConfig, Recipe, SftConfig, walk_recipe
from grpokit.trackers import NAMES as TRACKER_NAMES
from grpokit.trackers import tracker_names


def validate(recipe: Recipe) -> None:
    """Check values (choices, ranges); raise ``RecipeError`` naming the key and what is allowed.

    Every float key must be finite (NaN passes every ``<``/``>`` range test, so it is refused
    first); every element of every list key is checked (:data:`LIST_ELEMENTS`), the message naming
    the key and the index (``rewards.weights[1]: expected a number, got 'x'``)."""
    _check_finite(recipe)
    _check_report_to(recipe)
    _check_lists(recipe)
    _check_values(recipe)
    _check_combinations(recipe)
    _check_more_values(recipe)
    _check_sft(recipe.sft)
    _check_prm(recipe.prm)
    _check_env(recipe)
    _check_advantage_variants(recipe)
    _check_loss_variants(recipe)


def number(key: str, value: Any) -> float:
    """``value`` as a float if it is a finite number; booleans are not numbers here.

    Raises:
        RecipeError: ``key: expected a number, got 'x'`` (a bool, a string, None, ...) or
            ``key: expected a finite number, got nan`` (NaN, ±inf).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecipeError(f"{key}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise RecipeError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


def _function_name(key: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise RecipeError(
            f"{key}: expected a reward function name (a built-in name, module:function, rm:MODEL "
            f"or http(s)://HOST:PORT/PATH), got {value!r}"
        )


def _beta(key: str, value: Any) -> None:
    if not 0 <= number(key, value) < 1:
        raise RecipeError(f"{key}: expected a number in [0, 1), got {value!r}")


def _tracker_name(key: str, value: Any) -> None:
    if value not in TRACKER_NAMES:
        raise RecipeError(f"{key}: {value!r} is not a tracker; expected one of {', '.join(TRACKER_NAMES)}")


def _check_report_to(recipe: Recipe) -> None:
    """``train.report_to`` as a list of tracker names (``wandb`` -> ``[wandb]``, ``none`` -> ``[]``),
    set in the recipe (``recipe.json`` records the list); :func:`grpokit.trackers.tracker_names`."""
    try:
        recipe.train.report_to = tracker_names(recipe.train.report_to)
    except ValueError as e:
        raise RecipeError(str(e)) from None


#: list key -> (check of one element ``(f"{key}[{i}]", element)``, whether an element may appear twice)
LIST_ELEMENTS: dict[str, tuple[Callable[[str, Any], Any], bool]] = {
    "rewards.functions": (_function_name, False),  # twice would be one function, with the last weight
    "rewards.weights": (number, True),
    "train.adam_betas": (_beta, True),
    "train.report_to": (_tracker_name, False),  # made a list of names by _check_report_to
}


def _check_finite(recipe: Recipe) -> None:
    """Every float key finite (``NaN < 0`` is False, so NaN would pass every range check below)."""
    for key, value, _ in walk_recipe(recipe):
        if isinstance(value, float) and not math.isfinite(value):
            raise RecipeError(f"{key}: expected a finite number, got {value!r}")


def _check_lists(recipe: Recipe) -> None:
    """Each element of each list key (:data:`LIST_ELEMENTS`): its type and range, and duplicates where
    they are not allowed, named ``key[index]``. ``model.lora.target_modules``: :func:`lora_options`."""
    for key, value, _ in walk_recipe(recipe):
        if not isinstance(value, list):
            continue
        if key not in LIST_ELEMENTS:  # a list given to a mapping key is _check_type's to refuse
            continue
        check, repeats = LIST_ELEMENTS[key]  # every list field of the schema has an entry (a test checks)
        check_elements(
            key,
            value,
            check,
            repeats=repeats,
            twice_hint=" and set its weight in rewards.weights" if key == "rewards.functions" else "",
        )


def _check_values(recipe: Recipe) -> None:
    """Choices and ranges of single keys (the common ones)."""
    for key, value, f in walk_recipe(recipe):
        choices = choices_of(f)
        if choices and not isinstance(value, list) and value not in choices:  # a list's elements: _check_lists
            raise RecipeError(f"{key}: {value!r} is not one of {', '.join(choices)}")
    r, t, a = recipe.rollout, recipe.train, recipe.algo
    positive = {
        "rollout.max_new_tokens": r.max_new_tokens,
        "train.prompts_per_step": t.prompts_per_step,
        "train.max_steps": t.max_steps,
        "train.num_iterations": t.num_iterations,
        "train.micro_batch_size": t.micro_batch_size,
        "data.max_prompt_tokens": recipe.data.max_prompt_tokens,
        "eval.batch_size": recipe.eval.batch_size,
        "rewards.timeout_s": recipe.rewards.timeout_s,
    }
    for key, v in positive.items():
        if v <= 0:
            raise RecipeError(f"{key}: must be > 0, got {v}")
    if r.group_size < 2:
        raise RecipeError(f"rollout.group_size: must be >= 2 (advantages compare a group), got {r.group_size}")
    if not re.fullmatch(r"cpu|auto|cuda(:\d+)?", recipe.model.device):
        raise RecipeError(f"model.device: {recipe.model.device!r} is not cpu, cuda, cuda:N or auto")
    non_negative = {
        "algo.beta": a.beta,
        "algo.clip_eps_low": a.clip_eps_low,
        "algo.clip_eps_high": a.clip_eps_high,
        "algo.advantage_eps": a.advantage_eps,
        "algo.tis_cap": a.tis_cap,
        "rollout.temperature": r.temperature,
        "train.learning_rate": t.learning_rate,
        "train.warmup_steps": t.warmup_steps,
        "train.max_grad_norm": t.max_grad_norm,
        "train.save_steps": t.save_steps,
        "train.weight_decay": t.weight_decay,
        "data.skip": recipe.data.skip,
        "eval.every_steps": recipe.eval.every_steps,
        "eval.num_samples": recipe.eval.num_samples,
    }
    for key, v in non_negative.items():
        if v < 0:
            raise RecipeError(f"{key}: must be >= 0, got {v}")
    if not 0 < r.top_p <= 1:
        raise RecipeError(f"rollout.top_p: must be in (0, 1], got {r.top_p}")
    if r.temperature == 0:
        raise RecipeError(
            "rollout.temperature: must be > 0 for GRPO sampling (0 = greedy gives "
            "identical completions and zero advantages)"
        )


def _check_combinations(recipe: Recipe) -> None:
    """Keys that must agree with each other; ``model.lora`` completed with its defaults."""
    r, t, a = recipe.rollout, recipe.train, recipe.algo
    if t.optimizer == "adamw_bf16_sr" and recipe.model.dtype != "bfloat16":
        raise RecipeError(
            "train.optimizer: adamw_bf16_sr rounds bf16 parameters stochastically; it needs "
            f"model.dtype=bfloat16, got model.dtype={recipe.model.dtype}"
        )
    recipe.model.lora = lora_options(recipe.model.lora)  # checked, defaults filled in (recipe.json records them)
    if recipe.model.dtype == "bfloat16" and recipe.model.autocast_bf16:
        raise RecipeError(
            "model.autocast_bf16: the parameters are already bfloat16 (model.dtype); autocast is for float32 parameters"
        )
    if a.max_sampling_rounds < 1:
        raise RecipeError(f"algo.max_sampling_rounds: must be >= 1, got {a.max_sampling_rounds}")
    if r.vllm is not None and (r.engine != "vllm" or not isinstance(r.vllm, dict)):
        raise RecipeError(
            f"rollout.vllm: a mapping of vllm.LLM arguments, used with rollout.engine=vllm only "
            f"(rollout.engine={r.engine}, rollout.vllm={r.vllm!r})"
        )
    if a.tis_cap > 0 and r.engine != "vllm":
        raise RecipeError(
            f"algo.tis_cap: weights tokens by π_old/π_sampler, which needs the sampler's log-probs: "
            f"rollout.engine=vllm (rollout.engine={r.engine} samples from the trained model itself)"
        )
    if a.tis_cap > 0 and a.estimator != "grpo":
        raise RecipeError(f"algo.tis_cap: implemented in the grpo loss, not for algo.estimator={a.estimator}")
    if a.clip_eps_low >= 1 and a.policy_loss != "cispo":  # cispo: >= 1 = no lower bound on its weight
        raise RecipeError(f"algo.clip_eps_low: must be < 1, got {a.clip_eps_low}")
    w = recipe.rewards.weights
    if w is not None and len(w) != len(recipe.rewards.functions):
        raise RecipeError(
            f"rewards.weights: {len(w)} weights for {len(recipe.rewards.functions)} "
            f"functions {recipe.rewards.functions}"
        )
    for key, value in (("algo.gamma", a.gamma), ("algo.lam", a.lam)):
        if not 0 <= value <= 1:
            raise RecipeError(f"{key}: must be in [0, 1], got {value}")
    if a.value_clip_eps <= 0:
        raise RecipeError(f"algo.value_clip_eps: must be > 0, got {a.value_clip_eps}")
    if recipe.train.critic_warmup_steps < 0 or recipe.train.critic_learning_rate <= 0:
        raise RecipeError("train.critic_warmup_steps must be >= 0 and train.critic_learning_rate > 0")


def _check_more_values(recipe: Recipe) -> None:
    """Ranges of the remaining single keys."""
    r, t, a = recipe.rollout, recipe.train, recipe.algo
    rw = recipe.rewards
    for key, value, low in (
        ("rm_batch_size", rw.rm_batch_size, 1),
        ("remote_retries", rw.remote_retries, 0),
        ("remote_backoff_s", rw.remote_backoff_s, 0),
    ):
        if value < low:
            raise RecipeError(f"rewards.{key}: must be >= {low}, got {value}")
    if not recipe.rewards.functions and a.supervision == "outcome":
        raise RecipeError("rewards.functions: at least one reward function is needed")
    if t.save_total_limit < 1:
        raise RecipeError(f"train.save_total_limit: must be >= 1, got {t.save_total_limit}")
    if t.max_consecutive_skips < 1:
        raise RecipeError(f"train.max_consecutive_skips: must be >= 1, got {t.max_consecutive_skips}")
    if t.sample_every < 0:
        raise RecipeError(f"train.sample_every: must be >= 0 (0 = never), got {t.sample_every}")
    if len(t.adam_betas) != 2:  # each element: _check_lists
        raise RecipeError(f"train.adam_betas: two numbers in [0, 1) expected, got {t.adam_betas}")
    optional_positive = {
        "data.limit": recipe.data.limit,
        "eval.limit": recipe.eval.limit,
        "rollout.chunk_size": r.chunk_size,
        "eval.max_new_tokens": recipe.eval.max_new_tokens,
    }
    for key, v in optional_positive.items():
        if v is not None and v <= 0:
            raise RecipeError(f"{key}: must be > 0 or null, got {v}")
    if r.top_k < 0:
        raise RecipeError(f"rollout.top_k: must be >= 0 (0 = off), got {r.top_k}")
    if not 0 <= r.min_p <= 1:
        raise RecipeError(f"rollout.min_p: must be in [0, 1] (0 = off), got {r.min_p}")
    _check_truncated_sampling(r)
    _check_prompt_template("data.prompt_template", recipe.data.prompt_template)


def _check_truncated_sampling(r: Any) -> None:
    """``rollout.top_k``/``top_p``/``min_p`` train through sampling replay (docs/design.md,
    "Temperature"): the sampler records the set each token was drawn from and π_old, π_θ and π_ref
    are renormalized over it. Refused where the set cannot be recorded exactly: the ``vllm`` engine
    and the hf engine's ``multinomial`` sampler."""
    on = [
        (k, v, off)
        for k, v, off in (("top_k", r.top_k, 0), ("top_p", r.top_p, 1.0), ("min_p", r.min_p, 0.0))
        if v != off
    ]
    if not on:
        return
    key, value, off = on[0]
    if r.engine == "vllm":
        raise RecipeError(
            f"rollout.{key}={value} with rollout.engine=vllm: truncated sampling trains by replaying the set "
            "each token was drawn from, and vLLM does not report that set (its logprobs give at most "
            "max_logprobs top tokens, of logits that differ from the trainer's in floating point, so a set "
            "rebuilt from them can differ at its boundary). Use rollout.engine=hf, or leave "
            f"rollout.{key}={off} (off)"
        )
    if r.sampler == "multinomial":
        raise RecipeError(
            f"rollout.{key}={value} with rollout.sampler=multinomial: truncated sampling trains by replaying "
            "the set each token was drawn from, which only the inverse_cdf sampler records (generate applies "
            f"its own warpers after every processor it is given). Use rollout.sampler=inverse_cdf, or leave "
            f"rollout.{key}={off} (off)"
        )


def _check_prompt_template(key: str, tpl: str) -> None:
    """``tpl`` formats with ``{question}`` alone and uses it."""
    try:
        filled = tpl.format(question="\0")
    except (KeyError, IndexError, ValueError) as e:
        raise RecipeError(
            f"{key}: {tpl!r} may use only the field {{question}} (write literal braces as {{{{ }}}}): {e!r}"
        ) from None
    if "\0" not in filled:
        raise RecipeError(f"{key}: {tpl!r} has no {{question}} field, so every prompt would be the same text")


#: ``algo.advantage_baseline`` -> the ``algo.advantage_scale`` values it takes (``grpokit.algo.BASELINE_SCALES``;
#: a test checks they agree) and why the others are refused
BASELINE_SCALES: dict[str, tuple[tuple[str, ...], str]] = {
    "group": (("group", "batch", "none"), ""),
    "rloo": (
        ("none",),
        "RLOO's advantage is unscaled (Ahmadian et al. 2024); divided by a std it is the group-mean "
        "baseline times k/(k-1) (advantage_baseline=group); set algo.advantage_scale=none",
    ),
    "reinforce_pp": (
        ("batch", "none"),
        "REINFORCE++ divides by the std of the batch's completion tokens; set algo.advantage_scale=batch "
        "(or none: centred on the batch's token mean only)",
    ),
}


def model_token_limit(rollout: Any) -> int:
    """The most tokens of its own the model can write in one row: ``rollout.max_new_tokens``; with
    ``rollout.env`` (multi-turn) ``min(max_turns · max_new_tokens, max_total_tokens)`` (environment
    tokens are not the model's and count in ``max_total_tokens`` only). DAPO's ``L_max``
    (``algo.overlong_buffer``)."""
    if rollout.env is None:
        return int(rollout.max_new_tokens)
    limit = rollout.max_turns * rollout.max_new_tokens
    return int(limit if rollout.max_total_tokens is None else min(limit, rollout.max_total_tokens))


def _check_advantage_variants(recipe: Recipe) -> None:
    """The outcome baselines (``algo.advantage_baseline``) with the scale they take, and the reward
    shaping keys (``rewards.normalize_each``, ``algo.overlong_buffer``/``overlong_penalty_weight``):
    each changes the outcome reward or its advantage, so none goes with process supervision, and
    the baselines are GRPO's (PPO's advantages are GAE's)."""
    a, rw = recipe.algo, recipe.rewards
    scales, why = BASELINE_SCALES[a.advantage_baseline]  # the value itself: _check_values
    if a.advantage_baseline != "group":
        if a.estimator != "grpo":
            raise RecipeError(
                f"algo.advantage_baseline={a.advantage_baseline}: an outcome baseline of algo.estimator=grpo; "
                f"algo.estimator={a.estimator} computes its advantages with GAE"
            )
        if a.supervision != "outcome":
            raise RecipeError(
                f"algo.advantage_baseline={a.advantage_baseline}: an outcome baseline; algo.supervision=process "
                "normalizes pooled step rewards (algo.process_advantage), where it is not defined"
            )
    if a.advantage_scale not in scales:
        raise RecipeError(
            f"algo.advantage_scale={a.advantage_scale} with algo.advantage_baseline={a.advantage_baseline}: {why}"
        )
    if a.supervision == "process":
        for key, on in (("rewards.normalize_each", rw.normalize_each), ("algo.overlong_buffer", a.overlong_buffer)):
            if on:
                raise RecipeError(
                    f"{key}: shapes the outcome reward, which algo.supervision=process does not train on "
                    "(its advantages come from the step rewards)"
                )
    if isinstance(a.overlong_buffer, bool) or not isinstance(a.overlong_buffer, int):
        raise RecipeError(f"algo.overlong_buffer: expected a number of tokens, got {a.overlong_buffer!r}")
    limit = model_token_limit(recipe.rollout)
    if not 0 <= a.overlong_buffer <= limit:
        raise RecipeError(
            f"algo.overlong_buffer: must be in [0, {limit}] (0 = off; at most the length limit L_max = "
            f"{'rollout.max_new_tokens' if recipe.rollout.env is None else 'the model tokens of a multi-turn row'}"
            f" = {limit}), got {a.overlong_buffer}"
        )
    if a.overlong_penalty_weight < 0:
        raise RecipeError(
            f"algo.overlong_penalty_weight: must be >= 0 (a negative weight rewards length), got "
            f"{a.overlong_penalty_weight}"
        )


def _check_env(recipe: Recipe) -> None:
    """Multi-turn rollouts (``rollout.env``): their limits."""
    r, a = recipe.rollout, recipe.algo
    if r.max_turns < 1:
        raise RecipeError(f"rollout.max_turns: must be >= 1, got {r.max_turns}")
    if r.max_total_tokens is not None and r.max_total_tokens < 1:
        raise RecipeError(f"rollout.max_total_tokens: must be > 0 or null, got {r.max_total_tokens}")
    if a.step_rule == "turns" and r.env is None:
        raise RecipeError("algo.step_rule=turns: steps are the model turns of a multi-turn rollout; set rollout.env")
    if r.env is None:
        if r.env_options:
            raise RecipeError(f"rollout.env_options: set, but rollout.env is not ({r.env_options})")
        return
    if not r.env.strip():
        raise RecipeError("rollout.env: empty; tools, module:Class, or null (one completion per row)")


def _check_prm(p: PrmConfig) -> None:
    """The ``prm`` section's ranges (``grpokit prm``; its tokens are checked against the tokenizer
    when it loads)."""
    positive = {
        "samples_per_problem": p.samples_per_problem,
        "rollouts_per_step": p.rollouts_per_step,
        "problems_per_call": p.problems_per_call,
        "epochs": p.epochs,
        "learning_rate": p.learning_rate,
        "batch_size": p.batch_size,
        "max_length": p.max_length,
    }
    for key, v in positive.items():
        if v <= 0:
            raise RecipeError(f"prm.{key}: must be > 0, got {v}")
    if p.problems is not None and p.problems <= 0:
        raise RecipeError(f"prm.problems: must be > 0 or null, got {p.problems}")
    if not 0 <= p.eval_fraction < 1:
        raise RecipeError(f"prm.eval_fraction: must be in [0, 1), got {p.eval_fraction}")
    if p.warmup_steps < 0:
        raise RecipeError(f"prm.warmup_steps: must be >= 0, got {p.warmup_steps}")
    if p.max_steps <= 0 and p.max_steps != -1:
        raise RecipeError(f"prm.max_steps: must be > 0, or -1 (train for prm.epochs), got {p.max_steps}")
    if p.refresh_steps < 0 or p.refresh_problems <= 0:
        bad = "refresh_steps" if p.refresh_steps < 0 else "refresh_problems"
        raise RecipeError(f"prm.{bad}: must be {'>= 0' if bad == 'refresh_steps' else '> 0'}, got {getattr(p, bad)}")
    if not 0 <= p.replay_fraction < 1:
        raise RecipeError(f"prm.replay_fraction: must be in [0, 1), got {p.replay_fraction}")
    for key in ("step_tag", "good_token", "bad_token", "judge"):
        if not getattr(p, key).strip():
            raise RecipeError(f"prm.{key}: empty")


def _check_sft(s: SftConfig) -> None:
    """The ``sft`` section's ranges (``grpokit sft``; the columns of ``sft.completion_template`` are
    checked against the rows when they load)."""
    for key, v in {"epochs": s.epochs, "learning_rate": s.learning_rate, "batch_size": s.batch_size}.items():
        if v <= 0:
            raise RecipeError(f"sft.{key}: must be > 0, got {v}")
    if s.warmup_steps < 0:
        raise RecipeError(f"sft.warmup_steps: must be >= 0, got {s.warmup_steps}")
    if s.max_steps <= 0 and s.max_steps != -1:
        raise RecipeError(f"sft.max_steps: must be > 0, or -1 (train for sft.epochs), got {s.max_steps}")
    if s.limit is not None and s.limit <= 0:
        raise RecipeError(f"sft.limit: must be > 0 or null, got {s.limit}")
    if s.prompt_template is not None:
        _check_prompt_template("sft.prompt_template", s.prompt_template)
    if s.completion_template is not None and not s.completion_template.strip():
        raise RecipeError("sft.completion_template: empty; name the columns to learn, e.g. '{equation}'")


#: the loss-variant keys (docs/loss_variants.md) and their "off" values: the grpo loss's alone
LOSS_VARIANT_DEFAULTS = {
    "policy_loss": "clip",
    "importance_level": "token",
    "dual_clip_c": 0.0,
    "delta": 0.0,
    "is_correction": "tis",
    "entropy_coef": 0.0,
    "entropy_target": None,
}


def _check_loss_variants(recipe: Recipe) -> None:
    """The policy-loss variants (:mod:`grpokit.algo.surrogates`): their ranges, and the combinations
    the grpo loss does not define (each error names the key)."""
    a = recipe.algo
    if a.estimator != "grpo":
        for key, off in LOSS_VARIANT_DEFAULTS.items():
            if getattr(a, key) != off:
                raise RecipeError(f"algo.{key}: implemented in the grpo loss, not for algo.estimator={a.estimator}")
    if a.dual_clip_c != 0 and not a.dual_clip_c > 1:
        raise RecipeError(f"algo.dual_clip_c: must be 0 (off) or > 1 (3 is the usual value), got {a.dual_clip_c}")
    if a.delta != 0 and not a.delta > 1 + a.clip_eps_high:
        raise RecipeError(
            f"algo.delta: must be 0 (off) or > 1 + algo.clip_eps_high = {1 + a.clip_eps_high} (below it δ would "
            f"also clip A > 0 tokens), got {a.delta}"
        )
    if a.dual_clip_c and a.delta:
        raise RecipeError(
            "algo.delta: algo.dual_clip_c is set too; both bound the loss of A < 0 tokens at -bound·A (verl's "
            "clip_ratio_c and TRL's delta): set one"
        )
    if a.policy_loss == "cispo" and a.importance_level != "token":
        raise RecipeError(
            f"algo.policy_loss: cispo weights each token by its own clipped ratio; it needs "
            f"algo.importance_level=token, got {a.importance_level}"
        )
    if a.policy_loss == "cispo" and (a.dual_clip_c or a.delta):
        raise RecipeError(
            "algo.policy_loss: cispo's weight is already bounded at 1 + clip_eps_high; algo.dual_clip_c and "
            "algo.delta bound the clipped surrogate only"
        )
    if a.importance_level == "sequence" and a.supervision == "process":
        raise RecipeError(
            "algo.importance_level: sequence (GSPO) takes one advantage per completion; process supervision "
            "gives one per token: use algo.importance_level=sequence_token (GSPO-token)"
        )
    if a.is_correction != "tis" and not a.tis_cap > 1:
        raise RecipeError(
            f"algo.is_correction: {a.is_correction} keeps the tokens whose π_old/π_sampler lies in [1/C, C] "
            f"with C = algo.tis_cap; set algo.tis_cap > 1 (got {a.tis_cap})"
        )
    for key, value in (("algo.entropy_coef", a.entropy_coef), ("algo.entropy_coef_lr", a.entropy_coef_lr)):
        if value < 0:
            raise RecipeError(f"{key}: must be >= 0, got {value}")
    if a.entropy_target is not None and (isinstance(a.entropy_target, bool) or not a.entropy_target >= 0):
        raise RecipeError(f"algo.entropy_target: must be >= 0 (nats per token) or null, got {a.entropy_target}")
