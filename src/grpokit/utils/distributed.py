"""Processes: data parallel over ranks with ``torch.distributed`` (the ``train.parallel`` seam).

Launch with torchrun (one process per device; on CPU the ``gloo`` backend, on CUDA ``nccl``)::

    torchrun --nproc-per-node 2 -m grpokit train recipe.yaml                    # one machine
    torchrun --nnodes 2 --node-rank R --nproc-per-node 8 \\
             --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m grpokit train recipe.yaml

What is split and what is shared (the loop in :mod:`grpokit.trainer.loop` does this through the
functions here):

- every rank computes the same B prompt indices of a step and samples the ``B/W`` whole groups of
  its own share (``B`` must be divisible by the world size ``W``); a row's random numbers come
  from ``(seed, step, global prompt index, sample index)`` (:func:`grpokit.rollout.engine.request_seed`),
  so what a row samples does not depend on ``W``;
- each rank scores its rows; the scored rows are all-gathered (:func:`gather_objects`) so that
  advantages (batch scaling included) and the logged metrics are computed over the whole batch,
  as one process computes them;
- the loss of a micro-batch is normalized by the whole batch's sequence and token counts, and the
  gradients are summed over ranks before clipping: ``ddp`` with one bucketed ``all_reduce`` per
  update after the last micro-batch (:func:`reduce_gradients`: the reduction DDP makes, done once
  per accumulated update as DDP's ``no_sync`` accumulation does, and over every gradient the
  backend wrote, the cpu backend's fused ones included); ``fsdp2`` by FSDP2's own reduce-scatter in
  backward, summed (divide factor 1). Every rank then sees the same gradient norm, so a
  non-finite update is skipped on every rank or on none;
- a stop request (SIGTERM/SIGINT) on any rank stops every rank after the same step (:func:`any_rank`);
- only rank 0 writes logs, samples, plots, evaluations and checkpoints; a checkpoint holds every
  rank's RNG state, so a resumed run continues exactly.

``fsdp2`` shards each decoder layer and the rest of the model with
``torch.distributed.fsdp.fully_shard`` (parameters become DTensors; the cpu speed backend steps
aside). Generation runs on the gathered model (:func:`gathered`: one all-gather, then no
collective until the reshard, so ranks may stop generating at different lengths); checkpoints
gather the full model and optimizer state to rank 0 (:func:`full_state`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch

#: the values of ``train.parallel``
PARALLEL = ("auto", "none", "ddp", "fsdp2")

#: how long a rank waits at a collective (held-out evaluation runs on rank 0 while the others wait)
TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: ``rank`` of ``world_size`` (``local_rank`` on its machine)
    and the data-parallel mode (``none``, ``ddp`` or ``fsdp2``)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    parallel: str = "none"

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes files and prints."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """A process group is in use (``ddp``/``fsdp2``): collectives must be called on every rank."""
        return self.parallel != "none"


#: one process, no process group
SINGLE = Ranks()


def launched_world_size() -> int:
    """The number of processes of this run: the size of a process group that already exists (a
    test, a notebook), else ``WORLD_SIZE`` as torchrun sets it (1 when not launched by torchrun)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_parallel(parallel: str, world_size: int) -> str:
    """``train.parallel`` for a launch of ``world_size`` processes: ``auto`` is ``ddp`` with more than
    one process, else ``none``.

    Raises:
        ValueError: an unknown value, or ``none`` with more than one process (names ``train.parallel``).
    """
    if parallel not in PARALLEL:
        raise ValueError(f"train.parallel: {parallel!r} is not one of {', '.join(PARALLEL)}")
    if parallel == "auto":
        return "ddp" if world_size > 1 else "none"
    if parallel == "none" and world_size > 1:
        raise ValueError(
            f"train.parallel=none but {world_size} processes were launched (WORLD_SIZE); "
            "use ddp or fsdp2, or launch one process"
        )
    return parallel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_ranks(parallel: str, device: torch.device) -> Ranks:
    """Join (or create) the process group the launch asks for and return this process's ranks.

    ``parallel`` (``train.parallel``) is resolved by :func:`resolve_parallel` against torchrun's
    ``WORLD_SIZE``. ``ddp``/``fsdp2`` outside torchrun make a one-rank group on a free local port.
    A process group that already exists (a test, a notebook) is used as it is. Backend: ``nccl``
    for CUDA, else ``gloo``.

    Raises:
        ValueError: what :func:`resolve_parallel` raises.
    """
    import torch.distributed as dist

    mode = resolve_parallel(parallel, launched_world_size())
    if mode == "none":
        return SINGLE
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # ddp/fsdp2 asked for without torchrun: a group of one
            os.environ.update(
                RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
            )
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)
        _OWNED.append(True)
    return dataclasses.replace(group_ranks(), parallel=mode)


_OWNED: list[bool] = []  # the process group was made by init_ranks (shutdown destroys it)


def shutdown(ranks: Ranks) -> None:
    """Destroy the process group :func:`init_ranks` made (one made by the caller is left alone)."""
    if ranks.active and _OWNED:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        _OWNED.clear()


def group_ranks() -> Ranks:
    """The ranks of the process group already initialized (as ``ddp``), or :data:`SINGLE` without
    one: for parts that run their own updates (PPO's value model) and are not handed the run's
    :class:`Ranks`."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    return Ranks(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", dist.get_rank())),
        parallel="ddp",
    )


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """The device of this rank: ``cuda`` without an index becomes ``cuda:<local_rank>`` (and is
    made current) when a process group is in use; anything else as given."""
    if ranks.active and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    return device


def _comm_device() -> torch.device:
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_over_ranks(values: Sequence[float], ranks: Ranks) -> list[float]:
    """Each of ``values`` summed over every rank (float64); the values themselves with one process."""
    if not ranks.active:
        return [float(v) for v in values]
    import torch.distributed as dist

    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return t.tolist()


def any_rank(flag: bool, ranks: Ranks) -> bool:
    """True on every rank when ``flag`` is true on any rank (a stop request)."""
    return sum_over_ranks([1.0 if flag else 0.0], ranks)[0] > 0


def gather_objects(obj: Any, ranks: Ranks) -> list[Any]:
    """Every rank's ``obj`` (picklable; tensors on the CPU), in rank order, on every rank."""
    if not ranks.active:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ranks: Ranks) -> None:
    """Wait for every rank (nothing with one process)."""
    if ranks.active:
        import torch.distributed as dist

        dist.barrier()


#: gradient elements per all_reduce bucket in :func:`reduce_gradients` (32 MiB of float32)
BUCKET_ELEMENTS = 1 << 23


def reduce_gradients(params: Sequence[torch.nn.Parameter], ranks: Ranks) -> None:
    """Sum ``param.grad`` over ranks in place (``ddp``): buckets of at most :data:`BUCKET_ELEMENTS`
    elements of one dtype, flattened, one ``all_reduce(SUM)`` each, copied back.

    A parameter without a gradient gets zeros (every rank must reduce the same tensors); a sparse
    gradient (the cpu backend's embedding) is made dense. Nothing happens with one process.
    """
    if not ranks.active or ranks.world_size == 1:
        return
    import torch.distributed as dist

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            p.grad = p.grad.to_dense()
        grads.append(p.grad)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        buckets: list[list[torch.Tensor]] = [[]]
        size = 0
        for g in group:
            if buckets[-1] and size + g.numel() > BUCKET_ELEMENTS:
                buckets.append([])
                size = 0
            buckets[-1].append(g)
            size += g.numel()
        for bucket in buckets:
            flat = torch.cat([b.reshape(-1) for b in bucket])
            dist.all_reduce(flat)
            offset = 0
            for b in bucket:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()


# -- FSDP2 ----------------------------------------------------------------------------------------


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (``model.model.layers`` and the like:
    the first ``ModuleList`` whose name ends in ``layers`` or ``h``), unwrapping a peft model.

    Raises:
        ValueError: no such list (names the model class).
    """
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and name.split(".")[-1] in ("layers", "h") and len(m):
            return list(m)
    raise ValueError(f"train.parallel=fsdp2: found no list of decoder layers in {type(model).__name__}")


def fsdp_root(model: torch.nn.Module) -> torch.nn.Module:
    """The module FSDP2 shards as its root: the model, or under a peft (LoRA) wrapper the wrapped
    Hugging Face model, whose ``forward`` both the wrapper's forward and its ``generate`` reach
    (peft's ``generate`` calls the wrapped model's, never the wrapper's ``forward``, and FSDP2 must
    see its root's forward first)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) and hasattr(model, "peft_config") else model


def is_sharded(model: torch.nn.Module) -> bool:
    """The model (or a peft wrapper's model) was sharded by :func:`shard_model` (FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(fsdp_root(model), FSDPModule)


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2: each decoder layer, then the root (embeddings, final
    norm, head; under a peft wrapper the wrapped model, :func:`fsdp_root`). Gradients are
    reduce-scattered as sums (divide factor 1: the loss is already normalized by the whole batch's
    counts). Returns ``model``."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    units = [*decoder_layers(model), fsdp_root(model)]
    for unit in units:
        fully_shard(unit)
    for sharded in cast("list[FSDPModule]", units):  # per unit: each reduces its own parameters' gradients
        sharded.set_gradient_divide_factor(1.0)
        sharded.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return model


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Within the block an FSDP2 model holds its full parameters and its forward makes no
    collective (generation: ranks may run different numbers of decode steps); resharded after.
    Every rank must enter it (the all-gather). A no-op for a model that is not sharded."""
    if not is_sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    root = cast(FSDPModule, fsdp_root(model))  # is_sharded
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]  # each layer and the root
    for unit in units:  # here, outside inference mode: the gathered tensors may serve autograd later
        unit.unshard()
    root.set_reshard_after_forward(False)  # recurses into the layers
    try:
        yield
    finally:
        root.set_reshard_after_forward(True)
        for unit in units:
            unit.reshard()


def full_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` of every parameter of a model sharded by :func:`shard_model`, one FSDP
    unit at a time: a unit's shards gathered, its own parameters yielded as copies (under the plain
    model's names: each decoder layer's with the layer, the root's embeddings, norm and head last),
    the unit released before the next is gathered, so at most one unit's full weights exist beside
    what the consumer keeps. Every rank must consume it whole, in step (the gathers are collectives);
    inside :func:`gathered` (every unit already whole: held-out evaluation on rank 0) it makes no
    collective. A tied head is yielded under both names, as ``state_dict`` gives it."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    root = fsdp_root(model)
    units = {name: m for name, m in root.named_modules() if isinstance(m, FSDPModule)}  # "" is the root
    layers = tuple(name + "." for name in units if name)

    def own(name: str) -> list[tuple[str, torch.Tensor]]:
        params = cast(torch.nn.Module, units[name]).named_parameters(prefix=name, remove_duplicate=False)
        return [(n, p) for n, p in params if name or not n.startswith(layers)]  # the root: not its layers'

    for name in sorted(units, key=lambda n: n == ""):  # the layers, then the root
        unit = cast(FSDPModule, units[name])
        if not any(isinstance(p, DTensor) for _, p in own(name)):  # already gathered (inside gathered()):
            yield from ((n, p.detach().clone()) for n, p in own(name))  # no collective
            continue
        with torch.inference_mode(False):  # FSDP2 keeps the gathered tensors for later (autograd) use
            unit.unshard()
        try:
            yield from ((n, p.detach().clone()) for n, p in own(name))
        finally:
            unit.reshard()


def plain_model(model: torch.nn.Module) -> torch.nn.Module:
    """An unsharded model of a sharded ``model``'s class (``transformers.AutoModelForCausalLM`` from
    its config, attention implementation and parameter dtype), on its device, not yet holding its
    weights (:func:`load_full_parameters`). The random initialisation it is built with draws from a
    forked RNG, so the run's random state is the one process's."""
    from transformers import AutoModelForCausalLM

    root = fsdp_root(model)
    cfg: Any = root.config
    p = next(root.parameters())
    with torch.inference_mode(False):  # normal tensors: they are written again outside it
        with torch.random.fork_rng(devices=[]):
            plain = AutoModelForCausalLM.from_config(cfg, attn_implementation=cfg._attn_implementation, dtype=p.dtype)
        return plain.to(p.device).eval()


def load_full_parameters(
    model: torch.nn.Module, plain: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]] | None = None
) -> None:
    """Copy the sharded ``model``'s weights into ``plain`` (:func:`plain_model`, its parameters in any
    dtype), one FSDP unit at a time (``weights``, by default :func:`full_parameters`; a LoRA model's
    merged ones: :func:`grpokit.utils.lora_shards.merged_full_parameters`; every rank must call it).

    Raises:
        RuntimeError: a parameter of ``plain`` that no sharded weight was copied into.
    """
    targets = dict(plain.named_parameters(remove_duplicate=False))
    written: set[int] = set()
    with torch.inference_mode(False), torch.no_grad():  # this order: leaving inference mode turns grad mode on
        for name, full in full_parameters(model) if weights is None else weights:
            targets[name].copy_(full)
            written.add(id(targets[name]))
    missed = [n for n, p in plain.named_parameters() if id(p) not in written]
    if missed:
        raise RuntimeError(f"load_full_parameters: no sharded weight for {missed[:3]}")


def norm_value(total: torch.Tensor) -> float:
    """The norm ``clip_grad_norm_`` returns, as a float (a DTensor under FSDP2: its full value)."""
    full = getattr(total, "full_tensor", None)
    return float(full() if callable(full) else total)


class GatheredEngine:
    """A rollout engine whose ``generate`` runs inside :func:`gathered` of the sharded policy; an
    engine that samples from its own copy of the weights (``sampler_dtype`` set: bf16 autocast;
    ``own_weights``: vLLM) refreshes that copy unit by unit itself (:func:`full_parameters`), and
    the whole model is not gathered."""

    def __init__(self, engine: Any, model: torch.nn.Module):
        self.engine, self.model = engine, model

    @property
    def _own_copy(self) -> bool:
        """The engine samples from its own copy of the weights (bf16 autocast's, vLLM's)."""
        return getattr(self.engine, "sampler_dtype", None) is not None or getattr(self.engine, "own_weights", False)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if self._own_copy:
            return self.engine.generate(*args, **kwargs)
        with gathered(self.model):
            return self.engine.generate(*args, **kwargs)

    def join_without_prompts(self) -> None:
        """What a rank with no prompts this round (a dynamic-sampling refill of fewer prompts than
        ranks) runs instead of :meth:`generate`: it enters and leaves :func:`gathered` as the others'
        ``generate`` does (a collective every rank must join); nothing when the engine samples from
        its own copy of the weights (that copy's refresh from the shards runs inside ``generate``, so
        :func:`grpokit.trainer.build.start_ranks` refuses dynamic sampling with such engines)."""
        if self._own_copy:
            return
        with gathered(self.model):
            pass

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict, dict | None]:
    """``(model state dict, optimizer state dict)`` of a sharded model, gathered to full tensors on
    the CPU of rank 0 (other ranks get empty dicts); every rank must call it. The optimizer state
    is keyed by parameter names (``torch.distributed.checkpoint.state_dict``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=opts)
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):  # saved once, as save_pretrained does
        for key in [k for k in sd if k.endswith("lm_head.weight")]:
            del sd[key]
    osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    return sd, osd


def load_full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict,
    optimizer_state: dict | None,
    *,
    adapter_only: bool = False,
) -> None:
    """Load full (unsharded) state dicts, present on every rank, into a sharded model and its
    optimizer. ``adapter_only`` (LoRA): ``model_state`` holds the adapter's parameters alone, under
    the model's names; the frozen base keeps the weights it was loaded with."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, strict=not adapter_only)
    model_state = dict(model_state)
    embed = next((k for k in model_state if k.endswith("embed_tokens.weight")), None)
    for key in model.state_dict():  # a tied head is saved once, as the embedding (save_pretrained)
        if key not in model_state and key.endswith("lm_head.weight") and embed is not None:
            model_state[key] = model_state[embed]
    set_model_state_dict(model, model_state, options=opts)
    if optimizer is not None and optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=opts)
