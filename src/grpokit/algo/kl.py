"""KL estimators between the policy π_θ and the reference π_ref, per token (Schulman 2020)."""

from __future__ import annotations

import torch

from ._checks import check_same_shape

KL_ESTIMATORS = ("k1", "k2", "k3")

#: k3 uses its Taylor series below this ``|d|`` (see :func:`kl_penalty`).
_K3_SERIES_BELOW = 0.1


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Elementwise estimate of KL(π_θ ‖ π_ref) from the sampled tokens' log-probs.

    With ``d = ref_logp − logp`` (log π_ref/π_θ):

    - ``k1 = logp − ref_logp = −d`` (unbiased, can be negative)
    - ``k2 = ½ (logp − ref_logp)²``
    - ``k3 = exp(d) − d − 1 ≥ 0`` (unbiased, low variance; DeepSeekMath eq. 4). Its gradient w.r.t.
      ``logp`` is ``1 − π_ref/π_θ``. Computed as ``expm1(d) − d``, and for ``|d| < 0.1`` as its
      series ``d²/2 + d³/6 + … + d⁶/720`` (truncation < 4e-9 relative): a policy near its reference
      has ``|d| ≪ 1``, where ``exp(d) − d − 1`` in float32 loses the ``d²/2`` to rounding at 1
      (absolute error ~6e-8 against a value of 5e-9 at ``d = 1e-4``) and ``expm1(d) − d`` still
      cancels (relative error ~``2·eps/|d|``).

    No clamping is applied: a value is exactly the formula above (k3 overflows to inf for
    ``d > ~88`` in float32). The estimator is elementwise and knows no mask: a caller that sums it
    over counted tokens selects them *before* the call (:func:`grpokit.algo.policy_loss` passes 0
    for both log-probs at masked tokens), since ``inf · 0`` is NaN in the value and the gradient.

    Args:
        logp: ``(...)`` float log-probs under π_θ (may require grad).
        ref_logp: same shape, under π_ref.
        kind: ``"k1" | "k2" | "k3"``.

    Returns:
        Tensor of the same shape and dtype.

    Raises:
        ValueError: unknown ``kind`` or mismatched shapes.

    Example:
        >>> import math
        >>> lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
        >>> round(kl_penalty(lp, ref, "k3").item(), 6)  # 0.5 - log(0.5) - 1
        0.193147
    """
    check_same_shape("kl_penalty", logp=logp, ref_logp=ref_logp)
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if kind == "k3":
        d = ref_logp - logp
        small = d.abs() < _K3_SERIES_BELOW
        ds = torch.where(small, d, torch.zeros_like(d))  # the series never sees a large d (nor its gradient)
        series = ds * ds * (0.5 + ds * (1 / 6 + ds * (1 / 24 + ds * (1 / 120 + ds * (1 / 720)))))
        return torch.where(small, series, torch.expm1(d) - d)
    raise ValueError(f"kl_penalty: kind must be one of {KL_ESTIMATORS}, got {kind!r}")
