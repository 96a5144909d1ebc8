"""The builder: a recipe in, the run's parts out (:func:`build_run` -> :class:`Run`).

Parts: training rows and prompts, the held-out evaluation, the reward pipeline (outcome functions
and process supervision's step scorer), the algorithm (advantage estimator and loss), the policy on
its device with its speed backend, the reference model, the rollout engine, the optimizer and its
schedule, the loop state. Bad input fails here before the (slow) model load: rewards, the step
rule, data and held-out rows come first. Nothing here imports the loop (:mod:`grpokit.trainer.loop`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpokit.config import Recipe
from grpokit.data import dataset_label
from grpokit.data.rows import section_rows, training_prompts
from grpokit.trackers import check_trackers
from grpokit.utils.distributed import SINGLE, GatheredEngine, Ranks, barrier, rank_device
from grpokit.utils.dtypes import dtype_of
from grpokit.utils.outputs import check_output_dir

if TYPE_CHECKING:  # the parts' types; their modules are imported where the parts are built
    from transformers import PreTrainedTokenizerBase

    from grpokit.estimators.base import Algorithm
    from grpokit.eval.evaluate import HeldOutEval
    from grpokit.models.logprobs import LogprobScorer
    from grpokit.rewards.pipeline import RewardPipeline
    from grpokit.rollout.engine import RolloutEngine, SamplingParams
    from grpokit.trainer.prm_refresh import PRMRefresh
    from grpokit.trainer.state import TrainState


def resolve_device(name: str) -> torch.device:
    """``model.device`` as a torch device: ``auto`` = ``cuda`` when available, else ``cpu``.

    Raises:
        ValueError: a CUDA device asked for on a machine without one, or an index past the last
            device (names ``model.device``).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device={name!r}: torch sees no CUDA device here (use cpu or auto)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"model.device={name!r}: torch sees {torch.cuda.device_count()} CUDA device(s) "
            f"(cuda:0 … cuda:{torch.cuda.device_count() - 1})"
        )
    return dev


@dataclass
class TrainData:
    """The training rows that fit, their formatted prompts, and the columns reward functions get."""

    rows: list[dict]
    prompts: list[str]
    columns: list[str]
    skipped: int


@dataclass
class Run:
    """The run's parts (:func:`build_run`): everything the loop reads, its constants included.

    ``eval_engine`` is what held-out evaluation generates with (None without an ``eval`` section):
    the run's ``engine`` itself when its options are evaluation's, else one more engine of the same
    kind (``rollout.engine``) on the same model, built with the engine's defaults, so that evaluation
    does not move with ``rollout.chunk_size`` or ``model.autocast_bf16`` (the hf engine's bf16
    sampler copy): each evaluation batch in one ``generate`` call from the model's own weights.

    ``ref_model`` is None when the algorithm needs no reference (β = 0) and with LoRA
    (``model.lora``), where π_ref is ``model`` with its adapters disabled.
    """

    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    tokenizer: PreTrainedTokenizerBase
    eos_ids: list[int]
    device: torch.device
    engine: RolloutEngine
    sampling: SamplingParams
    rewards: RewardPipeline
    algorithm: Algorithm
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    state: TrainState
    data: TrainData
    evaluator: HeldOutEval | None
    eval_engine: RolloutEngine | None
    out: Path
    recipe: Recipe
    """The recipe the parts were built from: the loop reads its sections here."""
    logprobs: LogprobScorer
    """The policy's and π_ref's log-probs with the run's temperature, micro-batch size and autocast
    bound (:class:`grpokit.models.logprobs.LogprobScorer`)."""
    ranks: Ranks = SINGLE
    """This process's rank and the data-parallel mode (:mod:`grpokit.utils.distributed`)."""
    prm_refresh: PRMRefresh | None = None
    """Iterative RL's PRM refresh (``prm.refresh_steps > 0``: :mod:`grpokit.trainer.prm_refresh`), or None."""


def build_rewards(recipe: Recipe, device: torch.device | str = "cpu") -> RewardPipeline:
    """The reward pipeline: ``rewards.functions`` and, with ``algo.supervision=process``, the step
    scorer (``algo.process_reward`` with ``algo.step_rule``; its tokenizer is set once loaded);
    with ``algo.overlong_buffer > 0`` DAPO's soft overlong penalty, ``L_max`` the model's token limit
    of a row (:func:`grpokit.config.checks.model_token_limit`).
    ``device``: the policy's, where ``rm:`` reward models run with ``rewards.rm_device=auto``.

    Raises:
        ValueError: unknown reward function, process reward or step rule (names the key).
    """
    from grpokit.config.checks import model_token_limit
    from grpokit.rewards.pipeline import OverlongPenalty, RewardPipeline

    step_scorer = None
    if recipe.algo.supervision == "process":
        from grpokit.process.scorer import ProcessScorer

        step_scorer = ProcessScorer.from_config(recipe)
    a = recipe.algo
    overlong = (
        OverlongPenalty(model_token_limit(recipe.rollout), a.overlong_buffer, a.overlong_penalty_weight)
        if a.overlong_buffer > 0
        else None
    )
    return RewardPipeline.from_config(recipe.rewards, step_scorer, device, overlong=overlong)


def load_policy(
    recipe: Recipe, device: torch.device, *, reference: bool = False, ranks: Ranks = SINGLE
) -> torch.nn.Module:
    """The model of ``model.name_or_path`` in ``model.dtype`` on ``device``, in eval mode (no
    dropout: sampler and trainer see the same π), with its speed backend; the reference model
    frozen (no gradients). With ``model.lora`` the policy is wrapped with LoRA adapters
    (:func:`grpokit.models.lora.apply_lora`: base frozen, adapters trainable) before the backend is
    chosen, so ``model.backend=auto`` sees them and steps aside (``cpu`` refuses); likewise with
    ``train.parallel=fsdp2`` the model is sharded (:func:`grpokit.utils.distributed.shard_model`) first."""
    from grpokit.models.loading import load_model

    m = recipe.model
    model = load_model(
        m.name_or_path, dtype=dtype_of(m.dtype, "model.dtype"), device=device, trust_remote_code=m.trust_remote_code
    )
    model.eval()
    if reference:
        model.requires_grad_(False)
    elif m.lora is not None:
        from grpokit.models.lora import apply_lora

        model = apply_lora(model, m.lora, announce=ranks.is_main)
    if ranks.parallel == "fsdp2":  # shard before the backend is chosen: auto sees DTensors and steps aside
        from grpokit.utils.distributed import shard_model

        model = shard_model(model)
    from grpokit.backends import install_backend, mark_grads_reduced_after_backward

    if ranks.parallel == "ddp":  # gradients summed from param.grad after the backward: the cpu backend is exact
        mark_grads_reduced_after_backward(model)
    options: dict[str, Any] = {} if reference else {"recompute_mlp": m.recompute_mlp}
    install_backend(model, m.backend, announce=not reference and ranks.is_main, **options)
    if m.gradient_checkpointing and not reference:
        from grpokit.models.logprobs import enable_gradient_checkpointing

        enable_gradient_checkpointing(model)
    return model


def build_run(recipe: Recipe) -> Run:
    """Turn ``recipe`` into the run's parts, checking everything that needs no model first.

    Raises:
        ValueError / FileNotFoundError: bad data, rewards, step rule, held-out rows or device; the
            message names the recipe key.
        OSError: ``train.output_dir`` is a file, below a file, or not writable
            (:func:`grpokit.utils.outputs.check_output_dir`).
    """
    from grpokit.estimators.base import load_algorithm
    from grpokit.models.loading import eos_token_ids, load_tokenizer, model_max_positions
    from grpokit.models.logprobs import LogprobScorer
    from grpokit.rollout.engine import SamplingParams
    from grpokit.trainer.optim import make_optimizer
    from grpokit.trainer.prm_refresh import build_prm_refresh
    from grpokit.trainer.state import TrainState, seed_everything

    m, r = recipe.model, recipe.rollout
    seed_everything(recipe.train.seed)
    # 1. what can be checked without the tokenizer or the model: output folder, rewards, step rule, data, device
    check_output_dir(recipe.train.output_dir, "train.output_dir")
    device = resolve_device(m.device)
    ranks = start_ranks(recipe, device)
    device = rank_device(device, ranks)
    rewards = build_rewards(recipe, device)
    prm_refresh = build_prm_refresh(recipe, rewards, Path(recipe.train.output_dir), parallel=ranks.active)
    algorithm = load_algorithm(recipe.algo, r.max_new_tokens)
    _require_optional_packages(recipe)
    rows = section_rows(recipe, "data")
    rewards.check_columns(sorted({k for row in rows for k in row} - {"prompt"}))  # signatures vs the data's columns
    evaluator = None
    if recipe.eval.dataset:
        from grpokit.eval.evaluate import HeldOutEval

        evaluator = HeldOutEval(recipe, rows)
    # 2. tokenizer, prompts (training and held-out: both must fit the context)
    tokenizer = load_tokenizer(m.name_or_path, trust_remote_code=m.trust_remote_code)
    max_positions = model_max_positions(m.name_or_path, trust_remote_code=m.trust_remote_code)
    data = _training_data(recipe, tokenizer, rows, max_positions)
    if evaluator is not None:
        evaluator.prepare(tokenizer, max_positions)
    if rewards.step_scorer is not None:
        rewards.step_scorer.tokenizer = tokenizer
    # 3. models, engine, optimizer
    model = load_policy(recipe, device, ranks=ranks)
    # with LoRA, π_ref is the policy with its adapters disabled (grpokit.models.logprobs.reference_logprobs)
    ref_model = (
        load_policy(recipe, device, reference=True, ranks=ranks)
        if algorithm.needs_reference and m.lora is None
        else None
    )
    eos_ids = eos_token_ids(model, tokenizer)
    engine, eval_engine = build_engines(
        recipe, model, tokenizer, eos_ids, evaluation=evaluator is not None, ranks=ranks
    )
    sampling = SamplingParams.from_config(r)
    optimizer, scheduler = make_optimizer(model, recipe.train)
    logprobs = LogprobScorer(
        model,
        ref_model,
        temperature=r.temperature,
        micro_batch_size=recipe.train.micro_batch_size,
        autocast_bf16=m.autocast_bf16,
    )
    algorithm.bind(logprobs, recipe.train)  # PPO builds its value model here
    out = Path(recipe.train.output_dir)
    if ranks.is_main:
        out.mkdir(parents=True, exist_ok=True)
        _announce(recipe, data, device, ranks)
    barrier(ranks)
    return Run(
        model=model,
        ref_model=ref_model,
        tokenizer=tokenizer,
        eos_ids=eos_ids,
        device=device,
        engine=engine,
        sampling=sampling,
        rewards=rewards,
        algorithm=algorithm,
        optimizer=optimizer,
        scheduler=scheduler,
        state=TrainState(),
        data=data,
        evaluator=evaluator,
        eval_engine=eval_engine,
        out=out,
        recipe=recipe,
        logprobs=logprobs,
        ranks=ranks,
        prm_refresh=prm_refresh,
    )


def _require_optional_packages(recipe: Recipe) -> None:
    """Say now, before the model loads, when an optional package the recipe needs is missing:
    torchao (``train.optimizer=adamw_8bit``), a tracker (``train.report_to``), peft (``model.lora``).
    Raises what :func:`grpokit.utils.importing.require` raises (ImportError naming the extra)."""
    if recipe.train.optimizer == "adamw_8bit":
        from grpokit.utils.importing import require

        require("torchao.optim", extra="torchao", why="train.optimizer=adamw_8bit")
    check_trackers(recipe.train.report_to)
    if recipe.model.lora is not None:
        from grpokit.models.lora import require_peft

        require_peft()


def _training_data(recipe: Recipe, tokenizer: Any, rows: list[dict], max_positions: int | None) -> TrainData:
    """The training rows whose prompts fit beside ``rollout.max_new_tokens`` within ``max_positions``
    (:func:`grpokit.data.rows.training_prompts`, which raises naming the key), their prompts and
    columns; a note when there are fewer than ``train.prompts_per_step``."""
    rows, prompts, skipped = training_prompts(recipe, tokenizer, rows, max_positions)
    if len(rows) < recipe.train.prompts_per_step:
        print(
            f"[grpokit] note: {len(rows)} prompts < train.prompts_per_step; prompts repeat within a step",
            file=sys.stderr,
        )
    return TrainData(rows, prompts, sorted({k for row in rows for k in row} - {"prompt"}), skipped)


def _announce(recipe: Recipe, data: TrainData, device: torch.device | str, ranks: Ranks) -> None:
    """The run's one line on rank 0: prompts (and those skipped), data, model, device, ranks, β, G."""
    m, d = recipe.model, recipe.data
    n = ranks.world_size
    where = f" on {n} rank{'s' if n > 1 else ''} ({ranks.parallel})" if ranks.active else ""
    print(
        f"[grpokit] {len(data.rows)} prompts ({data.skipped} skipped as too long) from "
        f"{dataset_label(d.dataset, d.split)}; "
        f"model {m.name_or_path} on {device}{where}; β={recipe.algo.beta}; G={recipe.rollout.group_size}",
        flush=True,
    )


def build_engines(
    recipe: Recipe,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: list[int],
    *,
    evaluation: bool,
    ranks: Ranks = SINGLE,
) -> tuple[RolloutEngine, RolloutEngine | None]:
    """The rollout engine ``rollout.engine`` on ``model`` and, with ``evaluation``, the engine
    held-out evaluation generates with (:class:`Run`'s docstring). With bf16 autocast the trainer
    scores in bf16, so the engine samples from a bf16 copy; ``rollout.vllm`` reaches ``vllm.LLM``;
    under FSDP2 the training engine generates on the gathered weights (evaluation gathers them
    itself)."""
    from grpokit.rollout.engine import load_engine

    m, r = recipe.model, recipe.rollout
    on_model: dict[str, Any] = dict(model=model, tokenizer=tokenizer, eos_token_ids=eos_ids)
    options = dict(chunk_size=r.chunk_size, sampler_dtype=torch.bfloat16 if m.autocast_bf16 else None)
    extra = {"llm_kwargs": r.vllm} if r.engine == "vllm" and r.vllm else {}
    make: Callable[..., RolloutEngine] = functools.partial(load_engine, r.engine)
    from grpokit.rollout.multiturn import MultiTurnEngine, env_options

    multi_turn = env_options(r)
    if multi_turn is not None:  # the engine's generation with the environment between turns
        on_model.update(multi_turn)
        make = MultiTurnEngine
        if r.engine == "vllm":
            from grpokit.rollout.vllm_multiturn import VLLMMultiTurnEngine

            make = VLLMMultiTurnEngine
    engine = make(**on_model, **options, **extra)
    eval_engine = None
    if evaluation:  # the same environment (its tools) in held-out evaluation
        eval_engine = engine if all(v is None for v in options.values()) else make(**on_model)
    if ranks.parallel == "fsdp2":
        engine = GatheredEngine(engine, model)
    return engine, eval_engine


def start_ranks(recipe: Recipe, device: torch.device) -> Ranks:
    """Join the process group of a data-parallel launch (:func:`grpokit.utils.distributed.init_ranks`)
    after checking the recipe can run on it.

    Raises:
        ValueError: ``train.prompts_per_step`` not divisible by the number of processes, or, with
            more than one process, a setting whose samples or updates would depend on the rank
            split (names the key): ``rollout.sampler=multinomial``; under fsdp2 ``algo.dynamic_sampling``
            with ``model.autocast_bf16`` or ``rollout.engine=vllm``.
    """
    from grpokit.utils.distributed import init_ranks, launched_world_size, resolve_parallel

    t, world = recipe.train, launched_world_size()
    mode = resolve_parallel(t.parallel, world)
    if world > 1:
        if t.prompts_per_step % world:
            raise ValueError(
                f"train.prompts_per_step={t.prompts_per_step} is not divisible by the {world} "
                "processes launched: each rank takes whole groups"
            )
        refused = {"rollout.sampler=multinomial": recipe.rollout.sampler == "multinomial"}
        for key, on in refused.items():
            if on:
                raise ValueError(
                    f"{key} is not supported with {world} processes yet (train.parallel={mode}); run it in one process"
                )
    own_copy = recipe.model.autocast_bf16 or recipe.rollout.engine == "vllm"
    if mode == "fsdp2" and world > 1 and recipe.algo.dynamic_sampling and own_copy:
        raise ValueError(
            "algo.dynamic_sampling with model.autocast_bf16 or rollout.engine=vllm under train.parallel=fsdp2 is not "
            "supported yet: the sampler's copy is refreshed from the shards inside generate, which a rank without "
            "prompts in a refill round does not call; use train.parallel=ddp"
        )
    return init_ranks(t.parallel, device)
