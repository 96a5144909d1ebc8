"""The recipe's schema: one dataclass per section, each field with its default, help text and choices
(the error, registries and shared value checks they use: :mod:`grpokit.config.fields`; the YAML
loader: :mod:`grpokit.config.yaml_io`)."""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from grpokit.config.fields import LORA_DEFAULTS, Registry
from grpokit.trackers import NAMES as TRACKER_NAMES

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T")


def _f(default: _T, help: str, choices: tuple | Registry | None = None, **kw: Any) -> _T:
    meta: dict[str, Any] = {"help": help}
    if choices:
        meta["choices"] = choices
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.copy(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass
class ModelConfig:
    name_or_path: str = _f(
        "smollm2-135m-instruct",
        "HF model path or hub name; alias 'smollm2-135m-instruct' = the packaged GGUF (dequantized once, cached)",
    )
    dtype: str = _f("float32", "parameter dtype of the policy", ("float32", "bfloat16"))
    autocast_bf16: bool = _f(False, "run forward passes under CPU/GPU bf16 autocast (params stay fp32)")
    trust_remote_code: bool = _f(False, "allow model code from the hub (off: safer)")
    device: str = _f(
        "cpu",
        "where the policy, the reference model and every tensor of the loop live: cpu, cuda, "
        "cuda:N, or auto (cuda when available, else cpu)",
    )
    gradient_checkpointing: bool = _f(
        False,
        "recompute activations in backward to save memory (the model stays in "
        "eval(); turns off prompt sharing in training: about 30% slower)",
    )
    backend: str = _f(
        "auto",
        "how forward and generation run (grpokit.backends): cpu = grpokit's CPU speed work "
        "(shared-prompt forward, fused RMSNorm/MLP/LM-head log-probs, packed generation weights; same "
        "values, about a third of the activation memory); plain = the stock transformers forward; "
        "auto = cpu where it is exact (model on CPU, one process or train.parallel=ddp, no LoRA), "
        "else plain",
        Registry("grpokit.backends", "NAMES", ("auto", "cpu", "plain")),
    )
    recompute_mlp: bool = _f(
        True,
        "backend cpu: the MLP backward recomputes gate(x) and up(x) (off: keeps them, "
        "two (tokens, intermediate) tensors per layer, two matmuls fewer per MLP backward)",
    )
    lora: dict | None = _f(
        None,
        "LoRA adapters (peft, extra grpokit[lora]): {r, alpha, target_modules, dropout}, "
        f"each optional (defaults {LORA_DEFAULTS}); only the adapters train, the reference model is "
        "the base model (adapters disabled, no second copy), checkpoints hold the adapter "
        "(grpokit export --merge: a full model); None = off (full fine-tuning)",
    )


@dataclass
class DataConfig:
    dataset: str = _f(
        "mawps",
        "packaged name (gsm8k, math, math500, svamp, asdiv, mawps, ...), a "
        "local .jsonl/.parquet, hf:NAME, or reasoning_gym:TASK",
    )
    split: str = _f("singleop", "split of the dataset (train/test, or a MAWPS subset)")
    limit: int | None = _f(None, "use only the first N rows")
    skip: int = _f(0, "leave out the first N rows (e.g. to hold them out for eval.limit=N on the same split)")
    shuffle_seed: int | None = _f(
        None,
        "shuffle the rows with this seed before data.skip/data.limit (and before "
        "eval.limit when eval reads the same dataset and split), so that a held-out "
        "prefix draws from every part of a file sorted by kind (None = file order)",
    )
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
    top_p: float = _f(
        1.0,
        "nucleus sampling: draw from the fewest most likely tokens holding this mass (1 = off). "
        "Trained by sampling replay: the sampler records the set each token was drawn from and π_old, "
        "π_θ and π_ref are renormalized over that same set; hf engine with sampler inverse_cdf only",
    )
    top_k: int = _f(0, "top-k sampling: draw from the k most likely tokens (0 = off); replayed as rollout.top_p")
    min_p: float = _f(
        0.0,
        "min-p sampling: drop tokens below min_p × the top token's probability (0 = off); replayed as rollout.top_p",
    )
    chunk_size: int | None = _f(None, "generate at most this many rows per generate() call")
    vllm: dict | None = _f(
        None,
        "rollout.engine=vllm: more vllm.LLM arguments, e.g. {gpu_memory_utilization: 0.3, "
        "enable_sleep_mode: true} (sleep mode: vLLM's weights and KV cache leave the GPU between "
        "generations)",
    )
    env: str | None = _f(
        None,
        "multi-turn rollouts with an environment (grpokit.envs; docs/tools.md): tools (a calculator and "
        "users' own tools, called as <calc>12*7+3</calc>), feedback (a wrong answer gets another turn), "
        "or module:Class; None = one completion per row",
    )
    env_options: dict = _f(
        {}, "keyword arguments of rollout.env's class (tools: tools, call_format, ...; feedback: reward, message)"
    )
    max_turns: int = _f(4, "with rollout.env: the most model turns per row (rollout.max_new_tokens each)")
    max_total_tokens: int | None = _f(
        None,
        "with rollout.env: the most tokens per row, the model's and the environment's "
        "(None = rollout.max_turns · rollout.max_new_tokens)",
    )
    turn_batching: str = _f(
        "continuous",
        "with rollout.env and the hf engine: continuous = one decode loop, a row resumes at the next "
        "step after its environment answers, its KV cache kept across turns; continuous_overlap = the "
        "same, a tools environment answering while the other rows decode (slow tools hold their own "
        "row only; runs then agree to float rounding, not bit for bit); lockstep = one generate "
        "per turn over the rows still going (same tokens; docs/tools.md)",
        ("continuous", "continuous_overlap", "lockstep"),
    )
    engine: str = _f(
        "hf",
        "rollout engine (grpokit.rollout.engine): hf = Hugging Face generate on the "
        "trained model; vllm = in-process vLLM synced with it (extra vllm)",
        Registry("grpokit.rollout.engine", "ENGINES", ("hf", "vllm")),
    )
    sampler: str = _f(
        "inverse_cdf",
        "how a token is drawn: inverse_cdf (one uniform per row, fast on CPU) or "
        "multinomial (generate's torch.multinomial); same distribution",
        Registry("grpokit.rollout.engine", "SAMPLERS", ("inverse_cdf", "multinomial")),
    )


@dataclass
class RewardsConfig:
    functions: list = _f(
        ["math_correct", "format"],
        "reward functions: built-in names, "
        "module:function (a module on sys.path or in the working directory), "
        "path/to/file.py:function, rm:PATH_OR_HUB_NAME (a sequence-classification reward model) "
        "or http(s)://HOST:PORT/PATH (a reward server)",
    )
    weights: list | None = _f(None, "one weight per function (default 1 each)")
    normalize_each: bool = _f(
        False,
        "z-score each reward function within its group before the weighted sum (GDPO; TRL's "
        "multi_objective_aggregation=normalize_then_sum); the sum then feeds the advantages",
    )
    completions_as: str = _f(
        "auto",
        "what your reward functions get: text (prompts and completions as strings), messages (TRL's "
        "conversational form: each completion [{'role': 'assistant', 'content': ...}], each prompt its "
        "message list) or auto (messages when the rows' prompts are message lists, as TRL decides; else "
        "text); built-in rewards, reward models and servers always get text",
        ("auto", "text", "messages"),
    )
    on_error: str = _f(
        "raise",
        "a reward function that raises or times out: stop the run, or score it as unscorable (None)",
        ("raise", "none"),
    )
    timeout_s: float = _f(10.0, "per-call time limit of a reward function, seconds")
    isolation: str = _f(
        "process",
        "where reward functions run: process = a worker process killed at the "
        "time limit (the limit always holds); thread = a thread of the trainer (for "
        "functions that need the trainer's live memory or GPU; a call holding the GIL "
        "cannot be cut off)",
        ("process", "thread"),
    )
    rm_device: str = _f("auto", "device of rm: reward models (auto = the policy's device)")
    rm_dtype: str = _f("float32", "dtype of rm: reward models", ("float32", "bfloat16", "float16"))
    rm_batch_size: int = _f(16, "completions per forward pass of an rm: reward model")
    rm_normalize: bool = _f(False, "z-score each batch's rm: scores (so the RM's scale does not set its weight)")
    rm_max_length: int | None = _f(None, "keep the last N tokens of an rm: text (None = the RM's positions)")
    remote_retries: int = _f(
        3, "retries of a reward server after a 5xx, a connection error or a timeout, within rewards.timeout_s"
    )
    remote_backoff_s: float = _f(0.5, "wait before the first retry of a reward server, doubled each time")


@dataclass
class AlgoConfig:
    estimator: str = _f(
        "grpo",
        "advantage estimator and policy loss (grpokit.estimators.base)",
        Registry("grpokit.estimators.base", "ALGORITHMS", ("grpo", "ppo")),
    )
    supervision: str = _f("outcome", "one reward per completion, or one per reasoning step", ("outcome", "process"))
    beta: float = _f(0.04, "KL coefficient β (0 = no reference model is loaded)")
    gamma: float = _f(1.0, "PPO: discount γ of GAE")
    lam: float = _f(0.95, "PPO: λ of GAE (1 = Monte-Carlo returns, 0 = one-step TD)")
    kl_in_reward: bool = _f(
        False, "PPO: the KL penalty β·(log π − log π_ref) per token in the reward instead of in the loss"
    )
    value_clip_eps: float = _f(0.2, "PPO: ε_v of the clipped value loss")
    whiten_advantages: bool = _f(True, "PPO: advantages to mean 0, std 1 over the batch's completion tokens")
    kl_estimator: str = _f("k3", "KL estimator in the loss", ("k1", "k2", "k3"))
    clip_eps_low: float = _f(0.2, "ε_low: ratio clipped below at 1 - ε_low")
    clip_eps_high: float = _f(0.2, "ε_high: ratio clipped above at 1 + ε_high (clip-higher)")
    tis_cap: float = _f(
        0.0,
        "truncated importance sampling: each token's surrogate weighted by min(π_old/π_sampler, "
        "C) with C = tis_cap, for engines whose sampler differs from the trainer (rollout.engine=vllm); "
        "0 = off. Also the C of algo.is_correction=mis_token/mis_sequence",
    )
    is_correction: str = _f(
        "tis",
        "with algo.tis_cap = C > 0, how π_old/π_sampler corrects the surrogate: tis (weight min(w, C)), "
        "mis_token (weight w, 0 for a token whose w leaves [1/C, C]: masked importance sampling), "
        "mis_sequence (the sequence's w = Π_t w_t, 0 for every token of a sequence outside [1/C, C]); "
        "the KL term is never weighted (docs/loss_variants.md)",
        Registry("grpokit.algo.catalog", "SAMPLER_CORRECTIONS", ("tis", "mis_token", "mis_sequence")),
    )
    policy_loss: str = _f(
        "clip",
        "the policy surrogate: clip (PPO/GRPO's clipped ratio), cispo (MiniMax-M1: -sg(clip(r, 1 - "
        "clip_eps_low, 1 + clip_eps_high))·A·log π per token, so clipped tokens keep their gradient; "
        "clip_eps_low >= 1 = no lower bound, MiniMax's practice)",
        Registry("grpokit.algo.catalog", "SURROGATES", ("clip", "cispo")),
    )
    importance_level: str = _f(
        "token",
        "the ratio the surrogate clips: token (π_θ/π_old per token), sequence (GSPO: per sequence, "
        "exp of the mean token log-ratio, one loss per sequence; the paper's clip_eps_low/high are "
        "3e-4/4e-4), sequence_token (GSPO-token: the sequence's ratio as value, each token's own "
        "gradient, for per-token advantages)",
        Registry("grpokit.algo.catalog", "IMPORTANCE_LEVELS", ("token", "sequence", "sequence_token")),
    )
    dual_clip_c: float = _f(
        0.0,
        "dual clip (Ye et al. 2020; verl's clip_ratio_c): for A < 0 the objective is at least c·A, so a "
        "token whose ratio ran past c adds -c·A and no gradient; 0 = off, 3 the usual value (> 1)",
    )
    delta: float = _f(
        0.0,
        "TRL's delta (INTELLECT-2 two-sided clipping): the unclipped ratio capped at δ, which bounds the "
        "loss of A < 0 tokens at -δ·A; 0 = off, else > 1 + clip_eps_high",
    )
    entropy_coef: float = _f(
        0.0,
        "entropy bonus: the loss minus coef · H, H the mean per-token entropy of π_θ (at "
        "rollout.temperature) over the loss's tokens, with gradient; 0 = off (with algo.entropy_target: "
        "the starting coefficient)",
    )
    entropy_target: float | None = _f(
        None,
        "adaptive entropy bonus: after each step coef ← max(0, coef + entropy_coef_lr · (target - H)), "
        "H that step's mean entropy (nats/token); logged as entropy_coef, checkpointed; null = a fixed "
        "coefficient",
    )
    entropy_coef_lr: float = _f(0.01, "adaptive entropy bonus: the coefficient's step size per nat of H below target")
    loss_aggregation: str = _f(
        "seq_mean_token_mean",
        "how token losses are averaged",
        Registry(
            "grpokit.algo.catalog", "AGGREGATIONS", ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
        ),
    )
    advantage_scale: str = _f(
        "group",
        "std used to scale outcome advantages",
        Registry("grpokit.algo.catalog", "ADVANTAGE_SCALES", ("group", "batch", "none")),
    )
    advantage_eps: float = _f(1e-4, "eps added to the std (advantage_baseline=reinforce_pp: the std's floor)")
    advantage_baseline: str = _f(
        "group",
        "outcome baseline: group = the group mean (GRPO); rloo = the mean of the other completions of "
        "the group, unscaled (RLOO; needs advantage_scale=none); reinforce_pp = the group mean, then a "
        "z-score over the batch's completion tokens (REINFORCE++-baseline; advantage_scale=batch, or "
        "none: centred only); docs/loss_variants.md, 'Advantages and rewards'",
        Registry("grpokit.algo.catalog", "ADVANTAGE_BASELINES", ("group", "rloo", "reinforce_pp")),
    )
    step_rule: str = _f(
        "lines",
        "process supervision: how a completion splits into steps (lines, paragraphs, regex:PATTERN, tag:STRING; "
        "turns: each model turn of a multi-turn rollout, rollout.env)",
    )
    process_advantage: str = _f(
        "sum",
        "process supervision: a token's advantage from the normalized step rewards "
        "of its step and the later ones: sum (the paper), mean (their mean: no length "
        "bonus), diff (last step's minus the previous step's) or change (its own step's minus the "
        "previous step's: only the step that changed the verdict is credited)",
        ("sum", "mean", "diff", "change"),
    )
    process_reward: str = _f(
        "arithmetic",
        "process supervision: step scorer (arithmetic, prm:FOLDER a PRM from `grpokit prm train` "
        "on rewards.rm_device/rm_dtype/rm_batch_size/rm_max_length, module:function or path/to/file.py:function)",
    )
    process_last_step: str = _f(
        "scorer",
        "process supervision: what scores each completion's last step: scorer (algo.process_reward, the "
        "paper) or outcome (the outcome reward of rewards.functions, as the arithmetic verifier checks the "
        "answer there; a PRM then judges only the steps before it)",
        ("scorer", "outcome"),
    )
    overlong_filter: bool = _f(
        False,
        "DAPO overlong filtering: completions cut at rollout.max_new_tokens (no EOS) "
        "are left out of the loss (still in their group's reward statistics)",
    )
    overlong_buffer: int = _f(
        0,
        "DAPO soft overlong penalty: L_cache, the last tokens before the length limit (rollout.max_new_tokens; "
        "with rollout.env the row's model-token limit) over which a length penalty falls from 0 to -1; added "
        "to the outcome reward; 0 = off",
    )
    overlong_penalty_weight: float = _f(1.0, "DAPO soft overlong penalty: its weight in the reward (>= 0)")
    dynamic_sampling: bool = _f(
        False,
        "DAPO dynamic sampling: groups whose rewards (process supervision: pooled "
        "step rewards) are all equal are dropped and refilled with new prompts until B "
        "groups carry signal",
    )
    max_sampling_rounds: int = _f(
        3,
        "dynamic sampling: extra generation rounds per step at most (then the step "
        "trains on the groups with signal it has)",
    )


@dataclass
class TrainConfig:
    prompts_per_step: int = _f(4, "B: prompts per step (each sampled G times)")
    max_steps: int = _f(20, "number of GRPO steps (batches)")
    num_iterations: int = _f(1, "μ: gradient passes over each batch (one optimizer step each)")
    micro_batch_size: int = _f(8, "sequences per forward/backward (gradient accumulation)")
    critic_learning_rate: float = _f(1e-5, "PPO: learning rate of the value model (constant)")
    critic_warmup_steps: int = _f(0, "PPO: steps at the start that train only the value model")
    learning_rate: float = _f(1e-6, "peak AdamW learning rate")
    optimizer: str = _f(
        "adamw",
        "adamw: torch AdamW (fused), states in the parameter dtype; adamw_bf16_sr: "
        "AdamW for bf16 parameters (model.dtype=bfloat16) with stochastic rounding (grpokit.trainer.optim), "
        "bf16 states; adamw_8bit: torchao AdamW with 8-bit states (slow on CPU)",
        ("adamw", "adamw_bf16_sr", "adamw_8bit"),
    )
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_betas: list = _f([0.9, 0.99], "AdamW betas")
    warmup_steps: int = _f(0, "optimizer steps of linear warm-up")
    lr_scheduler: str = _f("constant", "schedule after warm-up", ("constant", "linear", "cosine"))
    max_grad_norm: float = _f(1.0, "gradient clipping norm (0 = off)")
    seed: int = _f(0, "seed for data order, sampling and initialisation")
    output_dir: str = _f("runs/demo", "where metrics, samples, events and checkpoints go")
    sample_every: int = _f(5, "write sampled completions to samples.jsonl every k steps")
    report_to: list | str = _f(
        ["tensorboard"],
        "experiment trackers that get the metrics besides metrics.jsonl (TRL's key; grpokit.trackers): a list "
        "of names or one name; none or [] = metrics.jsonl alone. Each is the extra of its name (pip install "
        "'grpokit[wandb]'); each writes into train.output_dir (wandb offline) unless its environment "
        "variables say otherwise (docs/guide.md, 'Trackers')",
        TRACKER_NAMES,
    )
    save_steps: int = _f(0, "checkpoint every k steps (0 = only at the end)")
    save_total_limit: int = _f(2, "keep the newest n checkpoints")
    resume: str = _f("auto", "auto = newest complete checkpoint in output_dir; none; or a path")
    max_consecutive_skips: int = _f(3, "stop after this many non-finite updates in a row")
    parallel: str = _f(
        "auto",
        "data parallel over the processes torchrun launches (grpokit.utils.distributed; docs/scaling.md "
        "'Several processes'): ddp (every rank holds the model, gradients summed by all_reduce), fsdp2 "
        "(FSDP2 sharding), none (one process; an error with more); auto = ddp with more than one "
        "process, else none. train.prompts_per_step must be divisible by the number of processes; "
        "dynamic sampling, the multinomial sampler and the vllm engine need one process",
        ("auto", "none", "ddp", "fsdp2"),
    )


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
    num_samples: int = _f(
        0, "k completions per problem sampled at rollout.temperature, for mean@k, pass@k and maj@k (0 = greedy only)"
    )
    scorer: str | None = _f(
        None, "reward function deciding correctness (default: reasoning_gym for reasoning_gym: data, else math_correct)"
    )
    options: dict | None = _f(
        None,
        "dataset options of the held-out set (default: data.options when eval.dataset "
        "is data.dataset); generated data is drawn with seed train.seed + 10^9",
    )


@dataclass
class SftConfig:
    """``grpokit sft RECIPE``: the supervised warm-up that writes this recipe's model (``model.name_or_path``)
    before GRPO trains it. ``grpokit train`` reads none of these keys."""

    model: str | None = _f(
        None,
        "the model fine-tuned (path, hub name or alias such as smollm2-135m-instruct); the result is "
        "written to model.name_or_path, the model this recipe trains",
    )
    dataset: str | None = _f(None, "the rows learned from (a packaged name, a local file or hub:NAME)")
    split: str = _f("test", "split of sft.dataset")
    limit: int | None = _f(None, "the first N rows (after sft.shuffle_seed)")
    shuffle_seed: int | None = _f(None, "shuffle the rows with this seed first")
    completion_template: str | None = _f(
        None,
        "the text learned, from the row's columns, e.g. '{equation}' (asdiv) or '{solution}' (gsm8k); "
        "rows missing a field are left out",
    )
    prompt_template: str | None = _f(None, "the prompt's user message (default: data.prompt_template)")
    system_prompt: str | None = _f(None, "system message (default: data.system_prompt)")
    epochs: float = _f(1.0, "passes over the rows (> 0)")
    max_steps: int = _f(-1, "optimizer steps; overrides sft.epochs when > 0 (-1 = by epochs)")
    learning_rate: float = _f(2e-5, "peak learning rate (linear warm-up, then linear decay)")
    batch_size: int = _f(16, "rows per optimizer step")
    warmup_steps: int = _f(10, "optimizer steps of linear warm-up")
    seed: int = _f(0, "seed of the row order and the initialisation")


@dataclass
class PrmConfig:
    """``grpokit prm label RECIPE`` and ``grpokit prm train RECIPE``: automatic step labels of this
    recipe's model (``model.name_or_path``) on its training problems (``data``), sampled with its
    ``rollout`` settings and split with ``algo.step_rule`` (Math-Shepherd), then a PRM trained on them
    that ``algo.process_reward: prm:OUTPUT_DIR`` scores steps with. ``grpokit train`` reads them only
    with ``prm.refresh_steps > 0`` (iterative RL: the labelling and training keys apply to each
    refresh)."""

    labels: str | None = _f(None, "the JSON-lines file of step labels (written by label, resumed, read by train)")
    output_dir: str | None = _f(None, "the PRM folder `grpokit prm train` writes (must not exist or be empty)")
    judge: str = _f("math_correct", "the outcome reward that says whether a text reaches the answer")
    threshold: float = _f(1.0, "a judged text reaches the answer when the judge's value is >= this")
    problems: int | None = _f(None, "label the first N training problems (null: all)")
    samples_per_problem: int = _f(4, "solutions sampled per problem (Math-Shepherd's N)")
    rollouts_per_step: int = _f(4, "continuations sampled from each step (Math-Shepherd's completions per step)")
    problems_per_call: int = _f(4, "problems per labelling call; each call's records are appended to prm.labels")
    seed: int = _f(0, "the labelling seed; and of the PRM's training order and held-out split")
    model: str | None = _f(None, "the model trained into the PRM (default: model.name_or_path)")
    label: str = _f(
        "hard", "targets: hard (some continuation reaches the answer) or soft (the share)", ("hard", "soft")
    )
    eval_fraction: float = _f(0.1, "share of labelled problems held out to measure the PRM (AUC, F1)")
    epochs: float = _f(1.0, "passes over the labelled solutions (> 0)")
    max_steps: int = _f(-1, "optimizer steps; overrides prm.epochs when > 0 (-1 = by epochs)")
    learning_rate: float = _f(1e-5, "peak learning rate (linear warm-up, then linear decay)")
    batch_size: int = _f(8, "labelled solutions per optimizer step")
    warmup_steps: int = _f(10, "optimizer steps of linear warm-up")
    max_length: int = _f(512, "tokens per row; tags past it are not trained on (and score None)")
    step_tag: str = _f("ки", "text after each step; the PRM is read at its last token")
    good_token: str = _f("+", "the next token that means a good step (one token)")
    bad_token: str = _f("-", "the next token that means a bad step (one token)")
    refresh_steps: int = _f(
        0,
        "iterative RL (DeepSeekMath 4.1.3) in grpokit train with algo.process_reward=prm:FOLDER: every N steps "
        "label the policy's samples of prm.refresh_problems training problems, train the PRM on them with a "
        "replay of earlier labels, and set the reference model to the policy (0 = never)",
    )
    refresh_problems: int = _f(8, "iterative RL: training problems labelled per refresh (the next ones, cycling)")
    replay_fraction: float = _f(0.1, "iterative RL: share of a refresh's PRM training rows drawn from earlier labels")
    sync_reference: bool = _f(True, "iterative RL: set the reference model to the policy at each refresh")


@dataclass
class Recipe:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    prm: PrmConfig = field(default_factory=PrmConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: keys of earlier versions -> what replaced them (said in the unknown-key error)
RENAMED_KEYS = {
    "model.fused_ops": "model.backend: auto (the default: cpu on a CPU model, what fused_ops=true did), "
    "cpu or plain (the stock transformers forward)"
}


def fields_of(cls: type[DataclassInstance]) -> dict[str, dataclasses.Field[Any]]:
    """The dataclass fields of a recipe section (or of :class:`Recipe`: its sections), by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


def hints_of(cls: object) -> dict[str, Any]:  # object: typing.get_type_hints' parameter
    """The resolved type of each field of ``cls`` (the annotations are strings here), by name."""
    return typing.get_type_hints(cls)


def walk_recipe(recipe: Recipe) -> Iterator[tuple[str, Any, dataclasses.Field[Any]]]:
    """``(key, value, field)`` for every key of ``recipe``, section by section (``train.seed``, ...)."""
    for sec in fields_of(Recipe):
        obj = getattr(recipe, sec)
        for name, f in fields_of(type(obj)).items():
            yield f"{sec}.{name}", getattr(obj, name), f
