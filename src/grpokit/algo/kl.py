"""KL estimators between the policy π_θ and the reference π_ref, per token (Schulman 2020)."""

from __future__ import annotations

import torch

from ._checks import check_same_shape

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Elementwise estimate of KL(π_θ ‖ π_ref) from the sampled tokens' log-probs.

    With ``d = ref_logp − logp`` (log π_ref/π_θ):

    - ``k1 = logp − ref_logp = −d`` (unbiased, can be negative)
    - ``k2 = ½ (logp − ref_logp)²``
    - ``k3 = exp(d) − d − 1 ≥ 0`` (unbiased, low variance; DeepSeekMath eq. 4). Its gradient w.r.t.
      ``logp`` is ``1 − π_ref/π_θ``.

    No clamping is applied: a value is exactly the formula above.

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
        return torch.exp(d) - d - 1.0
    raise ValueError(f"kl_penalty: kind must be one of {KL_ESTIMATORS}, got {kind!r}")
