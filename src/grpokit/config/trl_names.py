"""TRL's names (``GRPOConfig``, its ``TrainingArguments`` and ``GRPOTrainer``'s arguments) and the
grpokit recipe keys that mean the same, for users coming from TRL (docs/from_trl.md is the prose).

:data:`TRL_NAMES` maps each TRL name to a :class:`TrlName`: the recipe key (None where grpokit has no
equivalent), what it means here, and where values differ, how a TRL value is written in grpokit.
:func:`grpokit_form` turns a name written without its section (``max_steps=2``), as a flag
(``--max_steps=2``) or in TRL's spelling (``num_generations=8``) into one line saying the recipe form
(``use train.max_steps=2``; ``num_generations is TRL's name; grpokit: rollout.group_size=8``);
:func:`trl_help` is the section of ``grpokit train --help`` for TRL users.

Checked against TRL 1.x's ``GRPOConfig`` (``trl/trainer/grpo_config.py``); ``tests/config/test_trl_names.py``
checks that every key named here is a recipe key, so the table cannot name a key that is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from grpokit.config.schema import Recipe, fields_of, hints_of

__all__ = ["TRL_NAMES", "TrlName", "grpokit_form", "keys_named", "recipe_keys", "trl_help"]


@dataclass(frozen=True)
class TrlName:
    """What a TRL name is in grpokit.

    ``key``: the recipe key (``section.name``), or None: no equivalent. ``note``: what it means here (and
    how it differs). ``values``: TRL value (lower case) -> grpokit value, where they are written
    differently (``loss_type: dapo`` is ``algo.loss_aggregation: token_mean``); a TRL value not in it
    has no grpokit equivalent. ``same_value``: False where the value cannot be copied as it is (TRL
    counts completions, grpokit prompts). ``caveat``: said after the recipe form in a command-line
    error (``--epsilon``: ``TRL's epsilon_high defaults to it: set algo.clip_eps_high too``)."""

    key: str | None
    note: str
    values: Mapping[str, str] | None = None
    same_value: bool = True
    caveat: str = ""


_LOSSES = {
    "grpo": "seq_mean_token_mean",
    "dapo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
    "bnpo": "token_mean",
}

TRL_NAMES: dict[str, TrlName] = {
    # GRPOTrainer's arguments
    "model": TrlName("model.name_or_path", "a hub id, a local folder or a packaged alias (smollm2-135m-instruct)"),
    "reward_funcs": TrlName(
        "rewards.functions",
        "built-in names, module:function, path/to/file.py:function, rm:MODEL or a reward server's URL; "
        "a function returns list[float | None] as in TRL",
    ),
    "train_dataset": TrlName("data.dataset", "a packaged name, a local .jsonl/.parquet, hf:NAME or reasoning_gym:TASK"),
    "eval_dataset": TrlName("eval.dataset", "held-out accuracy (greedy, and eval.num_samples samples), not a loss"),
    "peft_config": TrlName(
        "model.lora",
        "a mapping {r, alpha, target_modules, dropout} in a recipe; grpokit.Trainer(peft_config=LoraConfig(...)) "
        "takes the LoraConfig",
        same_value=False,
    ),
    # TRL's scripts' ModelConfig (a flat YAML of `trl grpo --config`)
    "model_name_or_path": TrlName("model.name_or_path", "the policy: a hub id, a local folder or a packaged alias"),
    "torch_dtype": TrlName("model.dtype", "float32 or bfloat16 (the parameters' dtype)"),
    "use_peft": TrlName("model.lora", "LoRA: a mapping {r, alpha, target_modules, dropout}", same_value=False),
    "lora_r": TrlName("model.lora", "the rank: model.lora={r: N, ...}", same_value=False),
    "lora_alpha": TrlName("model.lora", "model.lora={alpha: N, ...}", same_value=False),
    "lora_target_modules": TrlName("model.lora", "model.lora={target_modules: [...], ...}", same_value=False),
    # GRPOConfig: data and generation
    "num_generations": TrlName("rollout.group_size", "G, completions sampled per prompt"),
    "num_generations_eval": TrlName(
        "eval.num_samples",
        "k completions sampled per held-out problem for mean@k, pass@k and maj@k (greedy decoding always runs)",
    ),
    "max_completion_length": TrlName("rollout.max_new_tokens", "the longest completion, in tokens"),
    "max_prompt_length": TrlName(
        "data.max_prompt_tokens",
        "gone from recent TRL (earlier TRL cut prompts from the left); grpokit skips a longer prompt and counts it",
    ),
    "per_device_train_batch_size": TrlName(
        "train.micro_batch_size",
        "sequences (completions) per forward/backward on each process; the step's whole batch is accumulated",
    ),
    "gradient_accumulation_steps": TrlName(
        None,
        "grpokit accumulates over the step's whole batch: B·G sequences (train.prompts_per_step × rollout.group_size) "
        "in micro-batches of train.micro_batch_size, then one optimizer step",
    ),
    "generation_batch_size": TrlName(
        "train.prompts_per_step",
        "TRL counts completions, grpokit prompts: train.prompts_per_step = generation_batch_size / num_generations",
        same_value=False,
        caveat="prompts, not completions: generation_batch_size / num_generations",
    ),
    "steps_per_generation": TrlName(
        None,
        "each generated batch gets train.num_iterations (μ) passes, one optimizer step per pass over the whole batch; "
        "it is never split into several optimizer steps",
    ),
    "temperature": TrlName("rollout.temperature", "also divides the logits in every log-prob (policy, old, reference)"),
    "top_p": TrlName(
        "rollout.top_p",
        "π_old, π_θ and π_ref are renormalized over the tokens each one was drawn from (sampling replay); "
        "hf engine only",
    ),
    "top_k": TrlName("rollout.top_k", "0 = off; replayed as rollout.top_p"),
    "min_p": TrlName("rollout.min_p", "0 = off (TRL's None); replayed as rollout.top_p"),
    "repetition_penalty": TrlName(None, "not offered: the sampler draws from π itself, the distribution trained"),
    "generation_kwargs": TrlName(None, "not offered (rollout.vllm passes vllm.LLM arguments)"),
    "shuffle_dataset": TrlName(
        None,
        "prompts are always drawn in a seeded permutation per epoch (train.seed); data.shuffle_seed shuffles the rows "
        "before data.skip and data.limit",
    ),
    "remove_unused_columns": TrlName(None, "reward functions always get every column of the row"),
    "disable_dropout": TrlName(None, "always: the model stays in eval() mode (LoRA's dropout acts in gradient passes)"),
    "model_init_kwargs": TrlName(None, "model.dtype and model.trust_remote_code"),
    "max_tool_calling_iterations": TrlName("rollout.max_turns", "with rollout.env (tools, docs/tools.md)"),
    "log_completions": TrlName(
        "train.sample_every",
        "completions are written to samples.jsonl every k steps",
        same_value=False,
        caveat="every k steps, written to samples.jsonl",
    ),
    # vLLM
    "use_vllm": TrlName(
        "rollout.engine", "vllm (in-process, as TRL's colocate mode) or hf", values={"true": "vllm", "false": "hf"}
    ),
    "vllm_mode": TrlName(
        "rollout.engine",
        "grpokit's vllm engine runs in the trainer's process (TRL's colocate); there is no server mode",
        values={"colocate": "vllm"},
    ),
    "vllm_gpu_memory_utilization": TrlName(
        "rollout.vllm",
        "a mapping of vllm.LLM arguments: rollout.vllm={gpu_memory_utilization: 0.3}",
        same_value=False,
        caveat="a mapping: rollout.vllm={gpu_memory_utilization: VALUE}",
    ),
    "vllm_enable_sleep_mode": TrlName(
        "rollout.vllm",
        "rollout.vllm={enable_sleep_mode: true}",
        same_value=False,
        caveat="a mapping: rollout.vllm={enable_sleep_mode: true}",
    ),
    "vllm_importance_sampling_correction": TrlName(
        "algo.tis_cap",
        "truncated importance sampling per token (TRL's token_truncate) with cap C = algo.tis_cap; 0 = off "
        "(TRL's default is on)",
        same_value=False,
        caveat="the cap C itself (0 = off)",
    ),
    "vllm_importance_sampling_cap": TrlName("algo.tis_cap", "the cap C (grpokit's default 0 = off; TRL's 3)"),
    "vllm_importance_sampling_mode": TrlName(
        "algo.is_correction",
        "token_truncate = tis (cap at C = algo.tis_cap), token_mask = mis_token, sequence_mask = mis_sequence "
        "(drop tokens or sequences whose weight leaves [1/C, C]); sequence_truncate has no equivalent",
        values={"token_truncate": "tis", "token_mask": "mis_token", "sequence_mask": "mis_sequence"},
    ),
    # GRPOConfig: the loss
    "beta": TrlName("algo.beta", "the KL coefficient β (0 = no reference model); grpokit's default is 0.04, TRL's 0"),
    "num_iterations": TrlName("train.num_iterations", "μ, gradient passes over each batch (one optimizer step each)"),
    "epsilon": TrlName(
        "algo.clip_eps_low",
        "ε_low: the ratio is clipped below at 1 - ε; TRL's epsilon_high defaults to epsilon, grpokit's "
        "algo.clip_eps_high is its own key (default 0.2)",
        caveat="TRL's epsilon_high defaults to it: set algo.clip_eps_high too",
    ),
    "epsilon_high": TrlName("algo.clip_eps_high", "ε_high: the ratio is clipped above at 1 + ε_high (clip-higher)"),
    "delta": TrlName("algo.delta", "two-sided clipping (INTELLECT-2): the ratio of A < 0 tokens capped at δ (0 = off)"),
    "importance_sampling_level": TrlName(
        "algo.importance_level",
        "token (default) or sequence (GSPO; set the paper's clip ε, e.g. 3e-4 / 4e-4); also sequence_token "
        "(GSPO-token)",
        values={"token": "token", "sequence": "sequence"},
    ),
    "reward_weights": TrlName("rewards.weights", "one weight per function in rewards.functions (default 1 each)"),
    "multi_objective_aggregation": TrlName(
        "rewards.normalize_each",
        "true: each function z-scored in its group before the weighted sum (normalize_then_sum; TRL then "
        "normalizes over the batch: algo.advantage_scale=batch); false: summed, then normalized",
        values={"sum_then_normalize": "false", "normalize_then_sum": "true"},
    ),
    "scale_rewards": TrlName(
        "algo.advantage_scale",
        "the std dividing the advantages: group, batch or none (mean is not offered)",
        values={"true": "group", "group": "group", "batch": "batch", "false": "none", "none": "none"},
    ),
    "loss_type": TrlName(
        "algo.loss_aggregation",
        "grpo = seq_mean_token_mean (grpokit's default), dapo = token_mean (TRL's default; over the step's whole "
        "batch), dr_grpo = seq_mean_token_sum_norm, bnpo ~ token_mean (normalized over the whole batch, not each "
        "micro-batch); cispo is algo.policy_loss=cispo (its own key); sapo and luspo are not offered",
        values=_LOSSES,
    ),
    "mask_truncated_completions": TrlName(
        "algo.overlong_filter", "completions cut at rollout.max_new_tokens are left out of the loss (DAPO)"
    ),
    "sync_ref_model": TrlName(
        None,
        "π_ref stays the initial model (TR-DPO syncing is not offered; prm.sync_reference resets it at each "
        "PRM refresh)",
    ),
    "ref_model_mixup_alpha": TrlName(None, "TR-DPO syncing is not offered (see sync_ref_model)"),
    "ref_model_sync_steps": TrlName(None, "TR-DPO syncing is not offered (see sync_ref_model)"),
    "top_entropy_quantile": TrlName(None, "not offered: every completion token is in the loss"),
    # TrainingArguments
    "learning_rate": TrlName("train.learning_rate", "the peak AdamW learning rate (1e-6 by default in both)"),
    "max_steps": TrlName("train.max_steps", "GRPO steps, each a generated batch (μ optimizer steps)"),
    "num_train_epochs": TrlName(
        None, "runs are counted in steps: train.max_steps = epochs × rows / train.prompts_per_step"
    ),
    "logging_steps": TrlName(None, "every step's metrics are written to metrics.jsonl"),
    "save_steps": TrlName("train.save_steps", "checkpoint every k steps (0 = only at the end)"),
    "save_strategy": TrlName(None, "train.save_steps > 0 saves every k steps; the last step is always saved"),
    "save_total_limit": TrlName("train.save_total_limit", "keep the newest n checkpoints"),
    "seed": TrlName("train.seed", "seeds data order, sampling and initialisation"),
    "output_dir": TrlName("train.output_dir", "metrics, samples, evaluations and checkpoints"),
    "report_to": TrlName("train.report_to", "the experiment trackers that get the metrics besides metrics.jsonl"),
    "warmup_steps": TrlName("train.warmup_steps", "optimizer steps of linear warm-up"),
    "warmup_ratio": TrlName(None, "give train.warmup_steps = ratio × optimizer steps"),
    "lr_scheduler_type": TrlName("train.lr_scheduler", "constant (the default), linear or cosine after warm-up"),
    "weight_decay": TrlName("train.weight_decay", "AdamW weight decay"),
    "adam_beta1": TrlName(
        "train.adam_betas", "a list [β1, β2]", same_value=False, caveat="a list: train.adam_betas=[BETA1, BETA2]"
    ),
    "adam_beta2": TrlName(
        "train.adam_betas", "a list [β1, β2]", same_value=False, caveat="a list: train.adam_betas=[BETA1, BETA2]"
    ),
    "max_grad_norm": TrlName("train.max_grad_norm", "gradient clipping norm (0 = off)"),
    "optim": TrlName(
        "train.optimizer",
        "adamw (torch AdamW), adamw_bf16_sr (bf16 weights, stochastic rounding) or adamw_8bit (torchao)",
        values={"adamw_torch": "adamw", "adamw_torch_fused": "adamw"},
    ),
    "gradient_checkpointing": TrlName(
        "model.gradient_checkpointing", "off by default here (TRL's GRPOConfig turns it on)"
    ),
    "bf16": TrlName(
        "model.autocast_bf16",
        "forward passes under bf16 autocast with fp32 weights, as TRL's bf16; model.dtype=bfloat16 keeps the "
        "weights themselves in bf16",
    ),
    "resume_from_checkpoint": TrlName(
        "train.resume", "auto (the default: the newest checkpoint of train.output_dir), none or a checkpoint folder"
    ),
    "eval_steps": TrlName("eval.every_steps", "held-out evaluation every k steps (0 = never)"),
    "eval_strategy": TrlName(None, "eval.every_steps > 0 evaluates every k steps; eval.before and eval.after"),
    "per_device_eval_batch_size": TrlName("eval.batch_size", "prompts per greedy generate() call"),
    "push_to_hub": TrlName(
        None, "each checkpoint holds a hub model card (README.md); upload the folder with huggingface_hub"
    ),
    "fsdp": TrlName(
        "train.parallel",
        "fsdp2 (FSDP2 sharding) or ddp over the processes torchrun starts (docs/scaling.md)",
        same_value=False,
        caveat="train.parallel=fsdp2 under torchrun",
    ),
}

#: the TRL names ``grpokit train --help`` lists (all of them: docs/from_trl.md)
_HELP_NAMES = (
    "num_generations",
    "max_completion_length",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "beta",
    "epsilon",
    "epsilon_high",
    "loss_type",
    "learning_rate",
    "max_steps",
    "use_vllm",
)


def recipe_keys() -> set[str]:
    """Every recipe key, ``section.name``."""
    return {f"{sec}.{name}" for sec, cls in hints_of(Recipe).items() for name in fields_of(cls)}


def keys_named(name: str) -> list[str]:
    """The recipe keys whose name (without its section) is ``name``, in the schema's order.

    >>> keys_named("max_steps"), keys_named("split"), keys_named("nothing")
    (['train.max_steps', 'sft.max_steps', 'prm.max_steps'], ['data.split', 'eval.split', 'sft.split'], [])
    """
    return [f"{sec}.{name}" for sec, cls in hints_of(Recipe).items() if name in fields_of(cls)]


def _trl_line(name: str, trl: TrlName, value: str | None) -> str:
    """``NAME is TRL's name; grpokit: KEY=VALUE`` (or that grpokit has no equivalent)."""
    said = f"{name} is TRL's name; grpokit"
    if trl.key is None:
        return f"{said} has no equivalent: {trl.note}"
    if value is not None and trl.values is not None:
        mapped = trl.values.get(value.strip().lower())
        if mapped is None:
            return f"{said}: {trl.key} has no {value!r} ({trl.note})"
        value = mapped
    shown = value if value is not None and trl.same_value else "VALUE"
    return f"{said}: {trl.key}={shown}" + (f" ({trl.caveat})" if trl.caveat else "")


def grpokit_form(name: str, value: str | None = None) -> str | None:
    """One line saying how grpokit writes ``name=value``, where ``name`` is a recipe key's name without its
    section or a TRL name (dashes read as underscores); None for any other name. ``value``: the text
    given (None: none was). A name of keys in several sections names those ``grpokit train`` reads (not
    ``sft``'s and ``prm``'s, unless only they have it, and then a TRL name of that spelling comes first).

    >>> grpokit_form("max_steps", "2")
    'use train.max_steps=2'
    >>> grpokit_form("num_generations", "8")
    "num_generations is TRL's name; grpokit: rollout.group_size=8"
    >>> grpokit_form("loss_type", "dapo")
    "loss_type is TRL's name; grpokit: algo.loss_aggregation=token_mean"
    >>> grpokit_form("train.max_steps", "2")
    'use train.max_steps=2: a recipe key is written without dashes'
    """
    name = name.strip().replace("-", "_")
    sec, dot, bare = name.partition(".")
    if dot and name in keys_named(bare):  # --train.max_steps=2: the key itself, written as a flag
        return f"use {name}={'VALUE' if value is None else value}: a recipe key is written without dashes"
    keys = keys_named(name)
    main = [k for k in keys if not k.startswith(("sft.", "prm."))]  # the sections grpokit train reads
    trl = TRL_NAMES.get(name)
    if not main and trl is not None:  # model=..., TRL's model; grpokit's sft.model is another thing
        return _trl_line(name, trl, value)
    if keys:
        shown = "VALUE" if value is None else value
        return "use " + " or ".join(f"{k}={shown}" for k in main or keys)
    return None


def trl_help() -> str:
    """The ``grpokit train --help`` section for TRL users: the most common names and their keys (a TRL value
    written otherwise here: ``dapo: token_mean``; no equivalent: what grpokit does instead).

    >>> "  num_generations              -> rollout.group_size" in trl_help().splitlines()
    True
    """
    width = max(len(n) for n in _HELP_NAMES)
    lines = []
    for name in _HELP_NAMES:
        trl = TRL_NAMES[name]
        if trl.key is None:
            said = f"none: {trl.note}"
        elif trl.values:
            said = f"{trl.key} ({', '.join(f'{k}: {v}' for k, v in trl.values.items())})"
        else:
            said = trl.key
        lines.append(f"  {name:<{width}}  -> {said}")
    return (
        "coming from TRL: GRPOConfig's names as recipe keys (every name: docs/from_trl.md; on the command line "
        "a TRL name, or a key without its section, is answered with the grpokit form):\n" + "\n".join(lines)
    )
