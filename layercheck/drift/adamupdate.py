"""Adam's update of one step, recomputed from what the optimizer holds (torch-side).

For torch's AdamW (decoupled weight decay), with bias corrections bc1 = 1 - beta1^t
and c = sqrt(1 - beta2^t):

    w(t) = w(t-1) (1 - lr wd) - u,   u = lr / bc1 * m / (sqrt(v) / c + eps)
    => |w(t) - w(t-1)| = |lr wd w(t) + u| / (1 - lr wd)

and for Adam (L2 decay folded into the gradient) ``|w(t) - w(t-1)| = |u|``. Both are
``scale |q| / shrink`` with q = m / (sqrt(v) + eps_c) + alpha w: one ``AdamTerms``
per (param group, step), shared by every tensor of the group (``layercheck.drift``
sums |q| over them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AdamTerms", "NOT_STEPPED", "adam_terms"]


@dataclass(frozen=True)
class AdamTerms:
    """One (param group, step)'s update terms: |w(t) - w(t-1)| = scale |q| / shrink,
    q = m / (sqrt(v) + eps_c) + alpha w."""

    eps_c: float
    alpha: float
    scale: float
    shrink: float

    def moved(self, abs_sum_q: float) -> float:
        return self.scale * abs_sum_q / self.shrink


NOT_STEPPED = AdamTerms(0.0, 0.0, 0.0, 1.0)
"""The terms of an entry the kernel reads only for sum |w| (m = v = 0: moved is 0)."""


def adam_terms(group: dict, step: int, *, adamw: bool) -> AdamTerms:
    """The terms of ``group``'s update at ``step`` (1 the first); ``adamw``: the
    optimizer is an AdamW, whose decay is decoupled unless the group says otherwise."""
    lr, eps = float(group["lr"]), float(group["eps"])
    beta1, beta2 = (float(b) for b in group["betas"])
    bc1, c = 1 - beta1 ** step, math.sqrt(1 - beta2 ** step)
    # m / (sqrt(v)/c + eps) == c * m / (sqrt(v) + eps*c)
    scale = lr / bc1 * c
    if scale == 0.0:  # lr 0 (a warm-up's first step): nothing moved
        return AdamTerms(eps * c, 0.0, 0.0, 1.0)
    wd = float(group.get("weight_decay", 0.0))
    decoupled = group.get("decoupled_weight_decay", adamw)
    if wd and decoupled:
        # |scale q + lr wd w| = scale |q + (lr wd / scale) w|
        return AdamTerms(eps * c, lr * wd / scale, scale, 1 - lr * wd)
    return AdamTerms(eps * c, 0.0, scale, 1.0)
