"""AdamW for bf16 parameters with stochastic rounding (``train.optimizer=adamw_bf16_sr``).

AdamW (Loshchilov & Hutter 2019, Algorithm 2) computed in float32 over chunks of each tensor,
written back to bf16 parameters and second moments with stochastic rounding: a float32 value
between two bf16 neighbours goes to the upper one with probability equal to its distance from the
lower one, so the expected stored value is the float32 value (Gupta et al. 2015, §3). Round-to-
nearest, what ``torch.optim.AdamW`` does for bf16 parameters, drops every update smaller than
half a bf16 ulp (0.2 % of the weight): at lr 1e-6 most of them. The first moments are rounded to
nearest (they move by 1 − β₁ = 10 % a step); v moves by 1 − β₂ (0.1–1 %), near or below an ulp.

Written here rather than taken from torchao (``_AdamW(bf16_stochastic_round=True)``, which the
previous version used): on the 2-core CPU of the benchmark this loop takes 0.4 s per step for
135 M parameters (torchao's 0.85 s), needs no ``torch.compile`` (torchao compiles each parameter
shape on the first step, 3.3 s) and leaves out ~0.14 GB of resident memory that torchao's import
and compiled kernels hold.

Memory: 2 bytes/parameter for each moment, plus float32 temporaries of one chunk (2¹⁸ values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from grpokit.utils.importing import require

if TYPE_CHECKING:
    from grpokit.config import TrainConfig

_CHUNK = 1 << 18
_LOW16 = -65536  # int32 mask 0xFFFF0000: the bits a bf16 keeps of a float32


def stochastic_round_to_bf16_(out: torch.Tensor, value: torch.Tensor, noise: torch.Tensor) -> None:
    """Write float32 ``value`` into bf16 ``out`` rounded stochastically: add ``noise`` (uniform
    integers in [0, 2¹⁶)) to the 16 low bits of its float32 bit pattern, then drop them.

    Args:
        out: bf16 tensor, same number of elements as ``value``; written in place.
        value: float32, contiguous; clobbered (used as scratch).
        noise: int32, ``value``'s shape, uniform on [0, 65536).
    """
    bits = value.view(torch.int32).add_(noise).bitwise_and_(_LOW16)
    out.copy_(bits.view(torch.float32))  # exact: the low 16 bits are zero


class AdamWStochasticRounding(torch.optim.Optimizer):
    """AdamW whose bf16 parameters and second moments are written back with stochastic rounding
    (module docstring). Float32 parameters get plain AdamW (equal to ``torch.optim.AdamW``).

    State per parameter: ``step`` (float tensor), ``exp_avg`` and ``exp_avg_sq`` in the
    parameter's dtype. The rounding noise of a step is seeded from torch's global generator
    (checkpointed with the run, so a resumed run rounds as the uninterrupted one would): one
    64-bit draw per step seeds numpy's PCG64, whose raw 64-bit outputs give four 16-bit noise
    values each (with torch's CPU ``randint``, one Mersenne-twister draw per value, a step for
    135 M parameters took 1.1 s instead of 0.4 s). On other devices ``torch.randint``.

    Raises:
        ValueError: lr < 0, eps <= 0, a beta outside [0, 1), or weight_decay < 0.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(
                f"AdamWStochasticRounding: invalid lr={lr}, betas={betas}, eps={eps} or weight_decay={weight_decay}"
            )
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        rng = None  # seeded with one draw from torch's generator, in steps that round stochastically
        if any(p.grad is not None and p.dtype == torch.bfloat16 for g in self.param_groups for p in g["params"]):
            rng = np.random.Generator(np.random.PCG64(int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))))
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                work = p if p.is_contiguous() else p.contiguous()  # the chunks are flat views
                self._update(
                    work, p.grad.contiguous(), state["exp_avg"], state["exp_avg_sq"], int(state["step"]), group, rng
                )
                if work is not p:
                    p.copy_(work)
        return loss

    @staticmethod
    def _update(
        p: torch.Tensor,
        grad: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        step: int,
        group: dict[str, Any],
        rng: np.random.Generator | None,
    ) -> None:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        bc1, bc2 = 1 - b1**step, 1 - b2**step
        sr = p.dtype == torch.bfloat16
        views = [t.view(-1) for t in (p, grad, exp_avg, exp_avg_sq)]
        for s in range(0, p.numel(), _CHUNK):
            pf, gf, mf, vf = (t[s : s + _CHUNK] for t in views)
            g = gf.float()
            m = mf.float().lerp_(g, 1 - b1)
            v = vf.float().mul_(b2).addcmul_(g, g, value=1 - b2)
            mf.copy_(m)
            denom = (v / bc2).sqrt_().add_(eps)
            w = pf.float()
            if wd:
                w.mul_(1 - lr * wd)
            w.addcdiv_(m, denom, value=-lr / bc1)
            if sr:
                assert rng is not None  # step() makes one whenever a bf16 parameter has a gradient
                noise = _noise(w.numel(), w.device, rng)
                stochastic_round_to_bf16_(pf, w, noise)
                stochastic_round_to_bf16_(vf, v, noise.bitwise_xor_(0x5A5A))  # another uniform draw of bits
            else:
                pf.copy_(w)
                vf.copy_(v)


def _noise(n: int, device: torch.device, rng: np.random.Generator) -> torch.Tensor:
    """``(n,)`` int32 uniform on [0, 2¹⁶): on CPU four values per raw PCG64 output of ``rng``."""
    if device.type != "cpu":
        return torch.randint(0, 1 << 16, (n,), dtype=torch.int32, device=device)
    raw = torch.from_numpy(rng.bit_generator.random_raw(-(-n // 4)))  # uint64
    return raw.view(torch.uint16)[:n].to(torch.int32)


def make_optimizer(
    model: torch.nn.Module, t: TrainConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The optimizer ``t.optimizer`` over ``model``'s trainable parameters, and its schedule.

    ``t`` is the recipe's ``train`` section (``grpokit.config.TrainConfig``): ``learning_rate``,
    ``adam_betas``, ``weight_decay``, ``warmup_steps``, ``lr_scheduler``, ``max_steps`` and
    ``num_iterations`` (the schedule counts optimizer steps: ``max_steps·num_iterations``).

    - ``adamw``: ``torch.optim.AdamW(fused=True)`` (one kernel per step: 1.1 s -> 0.15 s for 135M
      fp32 parameters on CPU). With bf16 parameters its round-to-nearest write-back drops updates
      smaller than half a bf16 ulp (~0.4 % of the weight): at lr 1e-6 most of them.
    - ``adamw_bf16_sr``: :class:`AdamWStochasticRounding` (module docstring): the update is
      computed in float32 and written to bf16 weights (and second moments) rounded up or down at
      random, unbiased in expectation, with bf16 states: 8 bytes/parameter in all.
    - ``adamw_8bit``: torchao's AdamW8bit (block-wise 8-bit m and v; stochastic rounding when the
      parameters are bf16; ``torch.compile``-d per parameter shape on the first step: seconds).
      torchao is the optional extra ``grpokit[torchao]``: without it this raises ``ImportError``
      naming the extra.

    Schedule (a ``LambdaLR`` factor of step ``i``): ``(i+1)/(warmup_steps+1)`` during warm-up, then
    constant 1, linear to 0, or cosine to 0 over the remaining optimizer steps.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    kw: dict[str, Any] = dict(lr=t.learning_rate, betas=tuple(t.adam_betas), weight_decay=t.weight_decay)
    opt: torch.optim.Optimizer
    if t.optimizer == "adamw":
        opt = torch.optim.AdamW(params, **kw, fused=True)
    elif t.optimizer == "adamw_bf16_sr":
        opt = AdamWStochasticRounding(params, **kw)
    else:
        # the optional [torchao] extra; its import-time warnings are quieted in grpokit/__init__.py
        torchao_optim = require("torchao.optim", extra="torchao", why="train.optimizer=adamw_8bit")
        bf16 = all(p.dtype == torch.bfloat16 for p in params)
        opt = torchao_optim.AdamW8bit(params, **kw, bf16_stochastic_round=bf16)
    total = max(t.max_steps * t.num_iterations, 1)

    def factor(i: int) -> float:
        if i < t.warmup_steps:
            return (i + 1) / (t.warmup_steps + 1)
        frac = (i - t.warmup_steps) / max(total - t.warmup_steps, 1)
        if t.lr_scheduler == "linear":
            return max(0.0, 1.0 - frac)
        if t.lr_scheduler == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0)))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Every setting of each of ``optimizer``'s param groups (``lr``, ``betas``, ``weight_decay``,
    ``eps``, ``initial_lr``, ...: all but ``params``), copied: what :func:`keep_hyperparameters` restores."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def keep_hyperparameters(optimizer: torch.optim.Optimizer, saved: list[dict]) -> None:
    """Write ``saved`` (:func:`hyperparameters` of this optimizer, taken before a checkpoint's state was
    loaded) back into its param groups. ``Optimizer.load_state_dict`` restores the checkpoint's
    ``lr``/``betas``/``weight_decay`` with the moments; on resume the recipe's values are the ones
    that apply (docs/resume.md), so the moments and step counts come from the checkpoint and the
    settings from the optimizer built from the recipe.

    Raises:
        ValueError: the optimizer has another number of param groups than ``saved``.
    """
    if len(saved) != len(optimizer.param_groups):
        raise ValueError(
            f"keep_hyperparameters: {len(saved)} saved param groups for {len(optimizer.param_groups)} in the optimizer"
        )
    for group, settings in zip(optimizer.param_groups, saved):
        group.update(settings)


def load_schedule_state(scheduler: torch.optim.lr_scheduler.LRScheduler, state: dict) -> None:
    """Load a checkpoint's schedule ``state`` (its position: ``last_epoch``, the optimizer steps done)
    into ``scheduler`` and keep the scheduler's own base rates, the recipe's ``train.learning_rate``
    (the checkpoint's ``base_lrs`` are those of the run that wrote it). A ``LambdaLR`` (what
    :func:`make_optimizer` builds) then sets each group's ``lr`` to ``base_lr · factor(last_epoch)``,
    the value its next ``step()`` would have set, with ``factor`` the recipe's schedule
    (``warmup_steps``, ``lr_scheduler``, ``max_steps``): the next optimizer step runs at the recipe's
    rate. With the same recipe this is the rate of the uninterrupted run, to the bit (the same
    product ``LambdaLR`` computes). Other schedulers: their ``base_lrs`` kept, ``lr`` as loaded."""
    base = list(scheduler.base_lrs)
    scheduler.load_state_dict(state)
    scheduler.base_lrs = base
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        lrs = [b * f(scheduler.last_epoch) for b, f in zip(base, scheduler.lr_lambdas, strict=True)]
        for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        scheduler._last_lr = lrs  # what get_last_lr() reports
