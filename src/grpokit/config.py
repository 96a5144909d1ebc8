"""The recipe: typed dataclasses that are the one source of defaults, help text and validation.

A recipe is a YAML file with the sections below (``model``, ``data``, ``rollout``, ``rewards``,
``algo``, ``train``, ``eval``); ``grpokit train RECIPE.yaml key.sub=value ...`` overrides single keys.
Each field's ``help`` metadata is what ``grpokit train --help`` prints.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpokit.textio import NotUtf8Error, read_utf8


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-6`` as a float (YAML 1.1 wants ``1.0e-6``, so plain
    PyYAML returns the string ``"1e-6"`` and ``train.learning_rate=1e-6`` would be rejected)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass


@dataclass(frozen=True)
class Registry:
    """The choices of a recipe key that a registry keeps: the names of ``module.attr`` (a mapping or
    a tuple), e.g. ``rollout.engine``'s are :data:`grpokit.rollout.engine.ENGINES`. Read when a
    recipe is validated (:func:`choices_of`), not when this module is imported: ``grpokit.backends``
    and ``grpokit.algorithms`` import torch. ``listed`` are the built-in names, which ``grpokit train
    --help`` prints without importing the module when it is not imported yet (a test checks that they
    equal the registry's)."""

    module: str
    attr: str
    listed: tuple[str, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.attr))

    def names_if_imported(self) -> tuple[str, ...]:
        """The registry's names when its module is imported (names added at run time included),
        else the built-in ``listed`` ones; imports nothing."""
        module = sys.modules.get(self.module)
        return tuple(getattr(module, self.attr)) if module is not None else self.listed


def choices_of(f: dataclasses.Field, *, import_registry: bool = True) -> tuple[str, ...] | None:
    """The allowed values of a recipe field (its ``choices`` metadata, a :class:`Registry`'s names
    read now; with ``import_registry=False`` its :meth:`Registry.names_if_imported`, which imports
    nothing), or None when any value of its type is allowed here."""
    choices = f.metadata.get("choices")
    if isinstance(choices, Registry):
        return choices.names() if import_registry else choices.names_if_imported()
    return choices


def _f(default, help: str, choices: tuple | Registry | None = None, **kw):
    meta = {"help": help}
    if choices:
        meta["choices"] = choices
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


#: the keys of ``model.lora`` and their defaults (``target_modules``: a list of module names, or
#: ``all-linear``: every linear layer but the output head)
LORA_DEFAULTS: dict[str, Any] = {"r": 16, "alpha": 32, "target_modules": "all-linear", "dropout": 0.0}


def lora_options(value: Any, key: str = "model.lora") -> dict[str, Any] | None:
    """``model.lora`` checked and completed with :data:`LORA_DEFAULTS` (None stays None: off).

    Raises:
        RecipeError: not a mapping, an unknown key, ``r`` < 1 or not an integer, ``alpha`` <= 0,
            ``dropout`` outside [0, 1), ``target_modules`` neither a non-empty list of names nor
            ``all-linear``; the message names ``model.lora.<key>``.

    >>> lora_options({"r": 4})["alpha"], lora_options(None)
    (32, None)
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeError(f"{key}: expected a mapping {{r, alpha, target_modules, dropout}} or null, got {value!r}")
    unknown = sorted(set(value) - set(LORA_DEFAULTS))
    if unknown:
        raise RecipeError(f"unknown recipe key {key}.{unknown[0]}; allowed in {key}: {', '.join(LORA_DEFAULTS)}")
    out = {**LORA_DEFAULTS, **value}
    r, alpha, dropout, tm = out["r"], out["alpha"], out["dropout"], out["target_modules"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise RecipeError(f"{key}.r: the adapter rank must be an integer >= 1, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 or alpha == float("inf"):
        raise RecipeError(f"{key}.alpha: must be a number > 0 (the adapter scale is alpha / r), got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise RecipeError(f"{key}.dropout: must be in [0, 1), got {dropout!r}")
    if isinstance(tm, str):
        if tm != "all-linear":
            raise RecipeError(f"{key}.target_modules: a list of module names (e.g. [q_proj, v_proj]) or "
                              f"all-linear, got {tm!r}")
    elif not isinstance(tm, list) or not tm or not all(isinstance(n, str) and n for n in tm):
        raise RecipeError(f"{key}.target_modules: a non-empty list of module names or all-linear, got {tm!r}")
    out["dropout"] = float(dropout)
    return out


@dataclass
class ModelConfig:
    name_or_path: str = _f("smollm2-135m-instruct", "HF model path or hub name; alias "
                           "'smollm2-135m-instruct' = the packaged GGUF (dequantized once, cached)")
    dtype: str = _f("float32", "parameter dtype of the policy", ("float32", "bfloat16"))
    autocast_bf16: bool = _f(False, "run forward passes under CPU/GPU bf16 autocast (params stay fp32)")
    trust_remote_code: bool = _f(False, "allow model code from the hub (off: safer)")
    device: str = _f("cpu", "where the policy, the reference model and every tensor of the loop live: cpu, cuda, "
                     "cuda:N, or auto (cuda when available, else cpu)")
    gradient_checkpointing: bool = _f(False, "recompute activations in backward to save memory (the model stays in "
                                      "eval(); turns off prompt sharing in training: about 30% slower)")
    backend: str = _f("auto", "how forward and generation run (grpokit.backends): cpu = grpokit's CPU speed work "
                      "(shared-prompt forward, fused RMSNorm/MLP/LM-head log-probs, packed generation weights; same "
                      "values, about a third of the activation memory); plain = the stock transformers forward; "
                      "auto = cpu where it is exact (model on CPU, one process or train.parallel=ddp, no LoRA), "
                      "else plain",
                      Registry("grpokit.backends", "NAMES", ("auto", "cpu", "plain")))
    recompute_mlp: bool = _f(True, "backend cpu: the MLP backward recomputes gate(x) and up(x) (off: keeps them, "
                             "two (tokens, intermediate) tensors per layer, two matmuls fewer per MLP backward)")
    lora: dict | None = _f(None, "LoRA adapters (peft, extra grpokit[lora]): {r, alpha, target_modules, dropout}, "
                           f"each optional (defaults {LORA_DEFAULTS}); only the adapters train, the reference model is "
                           "the base model (adapters disabled, no second copy), checkpoints hold the adapter "
                           "(grpokit export --merge: a full model); None = off (full fine-tuning)")


@dataclass
class DataConfig:
    dataset: str = _f("mawps", "packaged name (gsm8k, math, math500, svamp, asdiv, mawps, ...), a "
                      "local .jsonl/.parquet, hf:NAME, or reasoning_gym:TASK")
    split: str = _f("singleop", "split of the dataset (train/test, or a MAWPS subset)")
    limit: int | None = _f(None, "use only the first N rows")
    skip: int = _f(0, "leave out the first N rows (e.g. to hold them out for eval.limit=N on the same split)")
    shuffle_seed: int | None = _f(None, "shuffle the rows with this seed before data.skip/data.limit (and before "
                                  "eval.limit when eval reads the same dataset and split), so that a held-out "
                                  "prefix draws from every part of a file sorted by kind (None = file order)")
    options: dict = _f({}, "extra options for the dataset (reasoning_gym generator options, size)")
    prompt_field: str | None = _f(None, "column holding the question (local/HF datasets)")
    answer_field: str | None = _f(None, "column holding the reference answer (local/HF datasets)")
    system_prompt: str | None = _f(None, "system message placed before every question")
    prompt_template: str = _f("{question}", "user message; {question} is replaced by the question")
    max_prompt_tokens: int = _f(256, "prompts longer than this are skipped (counted in the log)")


@dataclass
class RolloutConfig:
    group_size: int = _f(8, "G: completions sampled per prompt (>= 2)")
    max_new_tokens: int = _f(128, "longest completion, in tokens")
    temperature: float = _f(1.0, "sampling temperature; also divides logits in every log-prob")
    top_p: float = _f(1.0, "nucleus sampling threshold; only 1 (off) is accepted: the loss scores full-vocabulary "
                      "log-probs, so a truncated sampler would draw from another π than the one trained")
    top_k: int = _f(0, "top-k sampling; only 0 (off) is accepted (see rollout.top_p)")
    min_p: float = _f(0.0, "min-p sampling; only 0 (off) is accepted (see rollout.top_p)")
    chunk_size: int | None = _f(None, "generate at most this many rows per generate() call")
    vllm: dict | None = _f(None, "rollout.engine=vllm: more vllm.LLM arguments, e.g. {gpu_memory_utilization: 0.3, "
                           "enable_sleep_mode: true} (sleep mode: vLLM's weights and KV cache leave the GPU between "
                           "generations)")
    engine: str = _f("hf", "rollout engine (grpokit.rollout.engine): hf = Hugging Face generate on the "
                     "trained model; vllm = in-process vLLM synced with it (extra vllm)",
                     Registry("grpokit.rollout.engine", "ENGINES", ("hf", "vllm")))
    sampler: str = _f("inverse_cdf", "how a token is drawn: inverse_cdf (one uniform per row, fast on CPU) or "
                      "multinomial (generate's torch.multinomial); same distribution",
                      Registry("grpokit.rollout.engine", "SAMPLERS", ("inverse_cdf", "multinomial")))


@dataclass
class RewardsConfig:
    functions: list = _f(["math_correct", "format"], "reward functions: built-in names, "
                         "module:function, rm:PATH_OR_HUB_NAME (a sequence-classification reward model) "
                         "or http(s)://HOST:PORT/PATH (a reward server)")
    weights: list | None = _f(None, "one weight per function (default 1 each)")
    on_error: str = _f("raise", "a reward function that raises or times out: stop the run, or "
                       "score it as unscorable (None)", ("raise", "none"))
    timeout_s: float = _f(10.0, "per-call time limit of a reward function, seconds")
    isolation: str = _f("process", "where reward functions run: process = a worker process killed at the "
                        "time limit (the limit always holds); thread = a thread of the trainer (for "
                        "functions that need the trainer's live memory or GPU; a call holding the GIL "
                        "cannot be cut off)", ("process", "thread"))
    rm_device: str = _f("auto", "device of rm: reward models (auto = the policy's device)")
    rm_dtype: str = _f("float32", "dtype of rm: reward models", ("float32", "bfloat16", "float16"))
    rm_batch_size: int = _f(16, "completions per forward pass of an rm: reward model")
    rm_normalize: bool = _f(False, "z-score each batch's rm: scores (so the RM's scale does not set its weight)")
    rm_max_length: int | None = _f(None, "keep the last N tokens of an rm: text (None = the RM's positions)")
    remote_retries: int = _f(3, "retries of a reward server after a 5xx, a connection error or a timeout, "
                             "within rewards.timeout_s")
    remote_backoff_s: float = _f(0.5, "wait before the first retry of a reward server, doubled each time")


@dataclass
class AlgoConfig:
    estimator: str = _f("grpo", "advantage estimator and policy loss (grpokit.algorithms)",
                        Registry("grpokit.algorithms", "ALGORITHMS", ("grpo", "ppo")))
    supervision: str = _f("outcome", "one reward per completion, or one per reasoning step",
                          ("outcome", "process"))
    beta: float = _f(0.04, "KL coefficient β (0 = no reference model is loaded)")
    gamma: float = _f(1.0, "PPO: discount γ of GAE")
    lam: float = _f(0.95, "PPO: λ of GAE (1 = Monte-Carlo returns, 0 = one-step TD)")
    kl_in_reward: bool = _f(False, "PPO: the KL penalty β·(log π − log π_ref) per token in the reward "
                            "instead of in the loss")
    value_clip_eps: float = _f(0.2, "PPO: ε_v of the clipped value loss")
    whiten_advantages: bool = _f(True, "PPO: advantages to mean 0, std 1 over the batch's completion tokens")
    kl_estimator: str = _f("k3", "KL estimator in the loss", ("k1", "k2", "k3"))
    clip_eps_low: float = _f(0.2, "ε_low: ratio clipped below at 1 - ε_low")
    clip_eps_high: float = _f(0.2, "ε_high: ratio clipped above at 1 + ε_high (clip-higher)")
    tis_cap: float = _f(0.0, "truncated importance sampling: each token's surrogate weighted by min(π_old/π_sampler, "
                        "C) with C = tis_cap, for engines whose sampler differs from the trainer (rollout.engine=vllm); "
                        "0 = off")
    loss_aggregation: str = _f("seq_mean_token_mean", "how token losses are averaged",
                               ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"))
    advantage_scale: str = _f("group", "std used to scale outcome advantages",
                              ("group", "batch", "none"))
    advantage_eps: float = _f(1e-4, "eps added to the std")
    step_rule: str = _f("lines", "process supervision: how a completion splits into steps "
                        "(lines, paragraphs, regex:PATTERN, tag:STRING)")
    process_advantage: str = _f("sum", "process supervision: a token's advantage from the normalized step rewards "
                                "of its step and the later ones: sum (the paper), mean (their mean: no length "
                                "bonus) or diff (last step's minus the previous step's)", ("sum", "mean", "diff"))
    process_reward: str = _f("arithmetic", "process supervision: step scorer (arithmetic, or "
                             "module:function)")
    overlong_filter: bool = _f(False, "DAPO overlong filtering: completions cut at rollout.max_new_tokens (no EOS) "
                               "are left out of the loss (still in their group's reward statistics)")
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: groups whose rewards (process supervision: pooled "
                                "step rewards) are all equal are dropped and refilled with new prompts until B "
                                "groups carry signal")
    max_sampling_rounds: int = _f(3, "dynamic sampling: extra generation rounds per step at most (then the step "
                                  "trains on the groups with signal it has)")


@dataclass
class TrainConfig:
    prompts_per_step: int = _f(4, "B: prompts per step (each sampled G times)")
    max_steps: int = _f(20, "number of GRPO steps (batches)")
    num_iterations: int = _f(1, "μ: gradient passes over each batch (one optimizer step each)")
    micro_batch_size: int = _f(8, "sequences per forward/backward (gradient accumulation)")
    critic_learning_rate: float = _f(1e-5, "PPO: learning rate of the value model (constant)")
    critic_warmup_steps: int = _f(0, "PPO: steps at the start that train only the value model")
    learning_rate: float = _f(1e-6, "peak AdamW learning rate")
    optimizer: str = _f("adamw", "adamw: torch AdamW (fused), states in the parameter dtype; adamw_bf16_sr: "
                        "AdamW for bf16 parameters (model.dtype=bfloat16) with stochastic rounding (grpokit.optim), "
                        "bf16 states; adamw_8bit: torchao AdamW with 8-bit states (slow on CPU)",
                        ("adamw", "adamw_bf16_sr", "adamw_8bit"))
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_betas: list = _f([0.9, 0.99], "AdamW betas")
    warmup_steps: int = _f(0, "optimizer steps of linear warm-up")
    lr_scheduler: str = _f("constant", "schedule after warm-up", ("constant", "linear", "cosine"))
    max_grad_norm: float = _f(1.0, "gradient clipping norm (0 = off)")
    seed: int = _f(0, "seed for data order, sampling and initialisation")
    output_dir: str = _f("runs/demo", "where metrics, samples, events and checkpoints go")
    sample_every: int = _f(5, "write sampled completions to samples.jsonl every k steps")
    save_steps: int = _f(0, "checkpoint every k steps (0 = only at the end)")
    save_total_limit: int = _f(2, "keep the newest n checkpoints")
    resume: str = _f("auto", "auto = newest complete checkpoint in output_dir; none; or a path")
    max_consecutive_skips: int = _f(3, "stop after this many non-finite updates in a row")
    parallel: str = _f("auto", "data parallel over the processes torchrun launches (grpokit.distributed; README "
                       "'Several processes'): ddp (every rank holds the model, gradients summed by all_reduce), fsdp2 "
                       "(FSDP2 sharding), none (one process; an error with more); auto = ddp with more than one "
                       "process, else none. train.prompts_per_step must be divisible by the number of processes; "
                       "dynamic sampling, the multinomial sampler and the vllm engine need one process",
                       ("auto", "none", "ddp", "fsdp2"))


@dataclass
class EvalConfig:
    dataset: str | None = _f(None, "held-out dataset (None = no evaluation)")
    split: str = _f("test", "split of the eval dataset")
    limit: int | None = _f(100, "evaluate on the first N rows")
    max_new_tokens: int | None = _f(None, "default: rollout.max_new_tokens")
    batch_size: int = _f(16, "prompts per greedy generate() call")
    before: bool = _f(True, "evaluate before training")
    after: bool = _f(True, "evaluate after training")
    every_steps: int = _f(0, "also evaluate every k steps (logged as eval/* in metrics.jsonl; 0 = never)")
    num_samples: int = _f(0, "k completions per problem sampled at rollout.temperature, for mean@k, pass@k and "
                          "maj@k (0 = greedy only)")
    scorer: str | None = _f(None, "reward function deciding correctness (default: reasoning_gym for reasoning_gym: "
                            "data, else math_correct)")
    options: dict | None = _f(None, "dataset options of the held-out set (default: data.options when eval.dataset "
                              "is data.dataset); generated data is drawn with seed train.seed + 10^9")


@dataclass
class Recipe:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: keys of earlier versions -> what replaced them (said in the unknown-key error)
RENAMED_KEYS = {"model.fused_ops": "model.backend: auto (the default: cpu on a CPU model, what fused_ops=true did), cpu or plain (the stock transformers forward)"}


class RecipeError(ValueError):
    """A recipe key or value that is not allowed; the message names the key."""


def _check_type(key: str, value: Any, annotation: Any) -> Any:
    """Return ``value`` converted to ``annotation`` where lossless (int -> float), else raise."""
    hint = annotation
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
    base = typing.get_origin(hint) or hint
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base is bool and not isinstance(value, bool):
        raise RecipeError(f"{key}: expected true/false, got {value!r}")
    if base is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RecipeError(f"{key}: expected an integer, got {value!r}")
    if not isinstance(value, base):
        raise RecipeError(f"{key}: expected {base.__name__}, got {type(value).__name__} {value!r}")
    return value


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def recipe_from_dict(raw: dict) -> Recipe:
    """Build and validate a ``Recipe`` from nested dicts; unknown keys raise ``RecipeError``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"recipe: expected a mapping of sections, got {type(raw).__name__}")
    sections = _fields(Recipe)
    kwargs = {}
    for sec, values in raw.items():
        if sec not in sections:
            raise RecipeError(f"unknown recipe section {sec!r}; allowed: {', '.join(sections)}")
        cls = _hints(Recipe)[sec]
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise RecipeError(f"{sec}: expected a mapping, got {values!r}")
        hints, allowed = _hints(cls), _fields(cls)
        sub = {}
        for key, val in values.items():
            if key not in allowed:
                hint = RENAMED_KEYS.get(f"{sec}.{key}")
                raise RecipeError(
                    f"unknown recipe key {sec}.{key}; " + (f"it is now {hint}" if hint else
                                                           f"allowed in {sec}: {', '.join(allowed)}")
                )
            sub[key] = _check_type(f"{sec}.{key}", val, hints[key])
        kwargs[sec] = cls(**sub)
    recipe = Recipe(**kwargs)
    validate(recipe)
    return recipe


def _walk(recipe: Recipe):
    for sec in _fields(Recipe):
        obj = getattr(recipe, sec)
        for name, f in _fields(type(obj)).items():
            yield f"{sec}.{name}", getattr(obj, name), f


def validate(recipe: Recipe) -> None:
    """Check values (choices, ranges); raise ``RecipeError`` naming the key and what is allowed."""
    _check_values(recipe)
    _check_combinations(recipe)
    _check_more_values(recipe)


def _check_values(recipe: Recipe) -> None:
    """Choices and ranges of single keys (the common ones)."""
    for key, value, f in _walk(recipe):
        choices = choices_of(f)
        if choices and value not in choices:
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
        "algo.beta": a.beta, "algo.clip_eps_low": a.clip_eps_low, "algo.clip_eps_high": a.clip_eps_high,
        "algo.advantage_eps": a.advantage_eps, "algo.tis_cap": a.tis_cap, "rollout.temperature": r.temperature,
        "train.learning_rate": t.learning_rate, "train.warmup_steps": t.warmup_steps,
        "train.max_grad_norm": t.max_grad_norm, "train.save_steps": t.save_steps,
        "train.weight_decay": t.weight_decay, "data.skip": recipe.data.skip,
        "eval.every_steps": recipe.eval.every_steps, "eval.num_samples": recipe.eval.num_samples,
    }
    for key, v in non_negative.items():
        if v < 0:
            raise RecipeError(f"{key}: must be >= 0, got {v}")
    if not 0 < r.top_p <= 1:
        raise RecipeError(f"rollout.top_p: must be in (0, 1], got {r.top_p}")
    if r.temperature == 0:
        raise RecipeError("rollout.temperature: must be > 0 for GRPO sampling (0 = greedy gives "
                          "identical completions and zero advantages)")


def _check_combinations(recipe: Recipe) -> None:
    """Keys that must agree with each other; ``model.lora`` completed with its defaults."""
    r, t, a = recipe.rollout, recipe.train, recipe.algo
    if t.optimizer == "adamw_bf16_sr" and recipe.model.dtype != "bfloat16":
        raise RecipeError("train.optimizer: adamw_bf16_sr rounds bf16 parameters stochastically; it needs "
                          f"model.dtype=bfloat16, got model.dtype={recipe.model.dtype}")
    recipe.model.lora = lora_options(recipe.model.lora)  # checked, defaults filled in (recipe.json records them)
    if recipe.model.dtype == "bfloat16" and recipe.model.autocast_bf16:
        raise RecipeError("model.autocast_bf16: the parameters are already bfloat16 (model.dtype); "
                          "autocast is for float32 parameters")
    if recipe.eval.dataset and recipe.eval.scorer:
        from grpokit.heldout import check_scorer

        try:
            check_scorer(recipe.eval.scorer, recipe.eval.dataset)
        except ValueError as e:
            raise RecipeError(f"eval.scorer: {e}") from None
    if a.max_sampling_rounds < 1:
        raise RecipeError(f"algo.max_sampling_rounds: must be >= 1, got {a.max_sampling_rounds}")
    if r.vllm is not None and (r.engine != "vllm" or not isinstance(r.vllm, dict)):
        raise RecipeError(f"rollout.vllm: a mapping of vllm.LLM arguments, used with rollout.engine=vllm only "
                          f"(rollout.engine={r.engine}, rollout.vllm={r.vllm!r})")
    if a.tis_cap > 0 and r.engine != "vllm":
        raise RecipeError(f"algo.tis_cap: weights tokens by π_old/π_sampler, which needs the sampler's log-probs: "
                          f"rollout.engine=vllm (rollout.engine={r.engine} samples from the trained model itself)")
    if a.tis_cap > 0 and a.estimator != "grpo":
        raise RecipeError(f"algo.tis_cap: implemented in the grpo loss, not for algo.estimator={a.estimator}")
    if a.clip_eps_low >= 1:
        raise RecipeError(f"algo.clip_eps_low: must be < 1, got {a.clip_eps_low}")
    w = recipe.rewards.weights
    if w is not None and len(w) != len(recipe.rewards.functions):
        raise RecipeError(f"rewards.weights: {len(w)} weights for {len(recipe.rewards.functions)} "
                          f"functions {recipe.rewards.functions}")
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
    for key, value, low in (("rm_batch_size", rw.rm_batch_size, 1), ("remote_retries", rw.remote_retries, 0),
                            ("remote_backoff_s", rw.remote_backoff_s, 0)):
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
    if len(t.adam_betas) != 2 or not all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in t.adam_betas
    ):
        raise RecipeError(f"train.adam_betas: two numbers in [0, 1) expected, got {t.adam_betas}")
    optional_positive = {
        "data.limit": recipe.data.limit, "eval.limit": recipe.eval.limit,
        "rollout.chunk_size": r.chunk_size, "eval.max_new_tokens": recipe.eval.max_new_tokens,
    }
    for key, v in optional_positive.items():
        if v is not None and v <= 0:
            raise RecipeError(f"{key}: must be > 0 or null, got {v}")
    if r.top_k < 0:
        raise RecipeError(f"rollout.top_k: must be >= 0 (0 = off), got {r.top_k}")
    if not 0 <= r.min_p <= 1:
        raise RecipeError(f"rollout.min_p: must be in [0, 1] (0 = off), got {r.min_p}")
    for key, value, off in (("top_k", r.top_k, 0), ("top_p", r.top_p, 1.0), ("min_p", r.min_p, 0.0)):
        if value != off:
            raise RecipeError(
                f"rollout.{key}={value}: truncated sampling is refused in training. π_old, π_θ and π_ref are "
                "scored with a full-vocabulary softmax(logits / temperature); a sampler that drops tokens "
                "(top_k, top_p, min_p) draws from another distribution, so the ratio and the KL would be "
                f"computed for a policy that did not sample. Leave rollout.{key}={off} (off); "
                "rollout.temperature is applied to both sides and may be set.")
    tpl = recipe.data.prompt_template
    try:
        filled = tpl.format(question="\0")
    except (KeyError, IndexError, ValueError) as e:
        raise RecipeError(f"data.prompt_template: {tpl!r} may use only the field {{question}} "
                          f"(write literal braces as {{{{ }}}}): {e!r}") from None
    if "\0" not in filled:
        raise RecipeError(f"data.prompt_template: {tpl!r} has no {{question}} field, so every "
                          "prompt would be the same text")


def _is_text_field(sec: str, key: str) -> bool:
    """Whether ``sec.key`` is a ``str`` (or ``str | None``) field of the recipe."""
    cls = _hints(Recipe).get(sec)
    hint = _hints(cls).get(key) if dataclasses.is_dataclass(cls) else None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next((a for a in typing.get_args(hint) if a is not type(None)), None)
    return hint is str


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.max_steps=5"`` -> ``(["train", "max_steps"], 5)``; the value is parsed as YAML.

    An empty value is ``None``. For text fields (``data.prompt_template``, ...) a value that YAML
    reads as something other than a string or null (``{question}`` is a YAML mapping, ``42`` an
    int) or cannot parse at all is kept as the literal text after the first ``=``.
    """
    if "=" not in text:
        raise RecipeError(f"override {text!r}: expected key.sub=value")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise RecipeError(f"override {text!r}: key must be section.name, e.g. train.max_steps")
    if not value.strip():
        return parts, None
    text_field = _is_text_field(*parts)
    try:
        parsed = _yaml_load(value)
    except yaml.YAMLError as e:
        if not text_field:
            raise RecipeError(f"override {text!r}: value is not valid YAML: {e}") from None
        return parts, value
    if text_field and parsed is not None and not isinstance(parsed, str):
        return parts, value
    return parts, parsed


def _yaml_problem(e: yaml.YAMLError) -> str:
    """One line for a YAML error: ``line L, column C: problem`` where PyYAML knows the place."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(e).split())


def load_recipe(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Recipe:
    """Read a YAML recipe (or the defaults when ``path`` is None), apply dotted overrides, validate.

    The file is read as UTF-8 whatever the locale.

    Raises:
        RecipeError: unknown section/key, wrong type or out-of-range value; a file that is missing
            or unreadable, not UTF-8 (message: file, line, byte offset) or not valid YAML (file,
            line, column). Messages are one line.
    """
    raw: dict = {}
    if path is not None:
        try:
            raw = _yaml_load(read_utf8(path)) or {}
        except FileNotFoundError:
            raise RecipeError(f"recipe file not found: {path}") from None
        except OSError as e:  # a folder, no permission, ...
            raise RecipeError(f"recipe {path}: cannot read: {e.strerror or e}") from None
        except NotUtf8Error as e:  # "<path>: line N: not valid UTF-8 (byte 0x.. at offset K ...)"
            raise RecipeError(f"recipe {e}") from None
        except yaml.YAMLError as e:
            raise RecipeError(f"recipe {path}: not valid YAML: {_yaml_problem(e)}") from None
        if not isinstance(raw, dict):
            raise RecipeError(f"recipe {path}: expected a mapping of sections")
    for text in overrides:
        (sec, key), value = parse_override(text)
        raw.setdefault(sec, {})
        if not isinstance(raw[sec], dict):
            raise RecipeError(f"{sec}: expected a mapping")
        raw[sec][key] = value
    return recipe_from_dict(raw)


def help_text() -> str:
    """Every recipe key with its type, default and help, for ``grpokit train --help``."""
    lines = []
    for key, value, f in _walk(Recipe()):
        choices = choices_of(f, import_registry=False)
        extra = f" [{' | '.join(choices)}]" if choices else ""
        lines.append(f"  {key} = {value!r}{extra}\n      {f.metadata['help']}")
    return "\n".join(lines)
