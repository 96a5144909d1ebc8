"""Functions the 2-process tests of ``tests/trainer/test_distributed.py`` run in each rank (spawned
processes import them from here by name). Each joins a gloo group on ``port`` and writes what it
computed to ``out/rank<r>.pt`` for the parent to check."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def _join(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _group(rewards: list[float], group_size: int):
    from grpokit.experience import Experience

    n = len(rewards)
    exp = Experience.grouped(
        torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, 2, dtype=torch.bool),
        torch.ones(n, 3, dtype=torch.long),
        torch.ones(n, 3, dtype=torch.bool),
        group_size,
        truncated=torch.zeros(n, dtype=torch.bool),
        completions=[f"c{r}" for r in rewards],
    )
    exp.rewards = torch.tensor(rewards, dtype=torch.float64)
    return exp


#: the rewards of each rank's share in the batch-scaling test: one group of 2 on each rank
SHARES = ([0.0, 1.0], [10.0, 11.0])


def gather_and_reduce(rank: int, world: int, port: int, out: str) -> None:
    """Gather scored shares (batch-scaled advantages over the whole batch), sum floats and
    gradients (bucketed), and agree on a stop flag raised on rank 1 only."""
    import torch.distributed as dist

    import grpokit.utils.distributed as gd
    from grpokit.config import AlgoConfig
    from grpokit.estimators.base import load_algorithm
    from grpokit.rewards.pipeline import ScoredRows, reward_metrics
    from grpokit.trainer.collect import gather_scored

    _join(rank, world, port)
    ranks = gd.Ranks(rank=rank, world_size=world, parallel="ddp")
    share = _group(SHARES[rank], 2)
    scored = ScoredRows({"f": SHARES[rank]}, failures=rank + 1)
    whole, sc = gather_scored(share, scored, ranks, pad_id=0)
    # a refill round of one prompt: rank 0 has no share and only joins the gather
    lone = (_group([5.0, 6.0], 2), ScoredRows({"f": [5.0, 6.0]}, failures=0)) if rank == 1 else (None, None)
    refill, refill_sc = gather_scored(*lone, ranks, pad_id=0)
    # the update's logged sums when rank 0 ran no micro-batch: no stats, no entropy of its own
    from grpokit.trainer.update import PassTotals, UpdateTotals

    totals = UpdateTotals(passes=[PassTotals(loss=1.0 + rank)])
    if rank == 1:
        totals.passes[0].stats = {"kl": 0.25, "clip_frac_high": 0.5}
        totals.entropy = 0.75
    totals.sum_over_ranks(ranks)
    algo = load_algorithm(AlgoConfig(advantage_scale="batch"), 3)
    advantages = algo.advantages(whole)
    sums = gd.sum_over_ranks([1.0 + rank, 0.5], ranks)
    stop = gd.any_rank(rank == 1, ranks)
    gd.BUCKET_ELEMENTS = 5  # several buckets, and a tensor larger than one
    params = [
        torch.nn.Parameter(torch.zeros(3)),
        torch.nn.Parameter(torch.zeros(7)),
        torch.nn.Parameter(torch.zeros(2)),
    ]
    params[0].grad = torch.full((3,), float(rank + 1))
    params[1].grad = torch.arange(7.0) * (rank + 1)
    # params[2] has no gradient on either rank: zeros after the reduction
    gd.reduce_gradients(params, ranks)
    torch.save(
        {
            "advantages": advantages,
            "rewards": whole.rewards,
            "completions": whole.completions,
            "metrics": dict(reward_metrics(whole, sc.per_function), reward_failures=sc.failures),
            "sums": sums,
            "stop": stop,
            "grads": [p.grad for p in params],
            "refill": (refill.completions, refill.rewards, refill_sc.per_function, refill_sc.failures),
            "totals": (totals.passes[0].loss, totals.passes[0].stats, totals.entropy),
        },
        Path(out) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()
