"""Per-layer drift d_l(t) = mean|w(t) - w(t-1)| / mean|w(t)|, on the update path.

For Adam and AdamW the update of step t is recomputed, right after
``optimizer.step()`` (a step post-hook), from tensors the optimizer already
holds: the moments, the step count and the group's hyper-parameters. No copy
of the weights is kept. For torch's AdamW (decoupled weight decay):

    w(t) = w(t-1) (1 - lr wd) - u,   u = lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
    => |w(t) - w(t-1)| = |lr wd w(t) + u| / (1 - lr wd)

and for Adam (L2 decay folded into the gradient) ``|w(t) - w(t-1)| = |u|``.
Other optimizers fall back to remembering the previous weights (exact, but
one extra copy of the model: a warning says so).

Cost: the exact pass re-reads the weights and both moments once per step.
With ``sampling=n`` large tensors are represented by every n-th block of
BLOCK elements (fixed blocks, identical in w, m and v), which divides that
cost by n; the ratio of means is then an estimate (see LayerCheckConfig).
"""
from __future__ import annotations

import math
import time
import warnings
from typing import Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["DriftTracker", "SAMPLE_MIN", "BLOCK"]

BLOCK = 64
"""Elements per sampled block (256 bytes of fp32: whole cache lines)."""
SAMPLE_MIN = 65536
"""Tensors smaller than this are always measured whole."""


_TINY = 1e-30


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t


class DriftTracker:
    """Accumulates d_l for each layer over the optimizer steps since the last ``take``.

    Contract: construct once; each ``optimizer.step()`` adds that step's drift
    (the hook runs inside the step, before the LR scheduler moves the LR);
    ``take()`` returns the summed drift, the LR of the last step, and resets.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 layers: Sequence[Sequence[nn.Parameter]], *, sampling: int = 1) -> None:
        if sampling < 1:
            raise ValueError(f"sampling={sampling}: use 1 (every element) or more")
        self.sampling = sampling
        self.optimizer = optimizer
        self.layers = [list(params) for params in layers]
        self._group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        self._adam = isinstance(optimizer, torch.optim.Adam)  # AdamW subclasses Adam
        self._seen_step: dict[int, float] = {}
        self._previous: dict[int, torch.Tensor] = {}
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._frozen_l1 = [self._l1([p for p in ps if id(p) not in self._group_of])
                           for ps in self.layers]
        self.drift = np.zeros(len(self.layers), dtype=np.float64)
        self.lr = math.nan
        self.seconds = 0.0
        self.updates = 0
        if not self._adam:
            warnings.warn(f"layercheck: drift for {type(optimizer).__name__} is measured by "
                          "keeping a copy of the previous weights (exact, one extra model copy "
                          "in memory); Adam and AdamW need no copy", stacklevel=3)
            self._remember_all()
        self._handle = optimizer.register_step_post_hook(self._after_step)

    def remove(self) -> None:
        self._handle.remove()

    def take(self) -> tuple[np.ndarray, float, float]:
        """(drift summed since the last take, LR of the last update, seconds spent)."""
        out = (self.drift.copy(), self.lr, self.seconds)
        self.drift[:] = 0.0
        self.seconds = 0.0
        return out

    # -- the hook ----------------------------------------------------------
    def _after_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        start = time.perf_counter()
        with torch.no_grad():
            for i, params in enumerate(self.layers):
                moved, size = self._layer_delta(params)
                total = size + self._frozen_l1[i]
                self.drift[i] += moved / total if total > 0 else (math.inf if moved else 0.0)
        self.lr = max(float(g["lr"]) for g in optimizer.param_groups)
        self.updates += 1
        self.seconds += time.perf_counter() - start

    def _layer_delta(self, params: list[nn.Parameter]) -> tuple[float, float]:
        """(sum |w(t) - w(t-1)|, sum |w(t)|) over the layer's trainable parameters."""
        moved = size = 0.0
        for p in params:
            group = self._group_of.get(id(p))
            if group is None:
                continue
            view, scale = self._sample(p)
            size += scale * self._abs_sum(view(p))
            if self._adam:
                moved += scale * self._adam_delta(p, view, group)
            else:
                moved += scale * self._copy_delta(p, view)
        return moved, size

    def _sample(self, p: torch.Tensor):
        """(view, scale): the elements that stand for ``p`` and the factor that scales
        their sums to the whole tensor. With sampling n > 1, a tensor of at least
        SAMPLE_MIN elements is represented by the first BLOCK elements of every
        run of n * BLOCK (the same elements every step, and the same in w, m and
        v): 1/n of the memory, spread evenly over the tensor so that every part
        of it (every row of an embedding table, say) is represented."""
        n = p.numel()
        if self.sampling == 1 or n < SAMPLE_MIN or not p.is_contiguous():
            return _whole, 1.0
        span = BLOCK * self.sampling
        rows = n // span

        def view(t: torch.Tensor) -> torch.Tensor:
            return t.view(-1)[:rows * span].view(rows, span)[:, :BLOCK]
        return view, n / (rows * BLOCK)

    def _adam_delta(self, p: nn.Parameter, view, group: dict) -> float:
        state = self.optimizer.state.get(p)
        if not state or "exp_avg" not in state:
            return 0.0
        step = float(state["step"])
        if self._seen_step.get(id(p)) == step:
            return 0.0  # not updated by this optimizer step (no gradient)
        self._seen_step[id(p)] = step
        lr, eps = float(group["lr"]), float(group["eps"])
        beta1, beta2 = (float(b) for b in group["betas"])
        bc1, bc2_sqrt = 1 - beta1 ** step, math.sqrt(1 - beta2 ** step)
        v = view(state["max_exp_avg_sq"] if group.get("amsgrad") else state["exp_avg_sq"])
        # m / (sqrt(v)/c + eps) == c * m / (sqrt(v) + eps*c): one pass fewer. The
        # +TINY keeps torch's CPU sqrt off its slow path for exact zeros (7x slower;
        # untouched embedding rows are all zeros) and changes no result: it vanishes
        # next to any non-zero v, and where v == 0, m == 0 too.
        buf = torch.add(v, _TINY, out=self._buffer(v)).sqrt_().add_(eps * bc2_sqrt)
        torch.div(view(state["exp_avg"]), buf, out=buf)
        scale = lr / bc1 * bc2_sqrt
        wd = float(group.get("weight_decay", 0.0))
        decoupled = group.get("decoupled_weight_decay", isinstance(self.optimizer, torch.optim.AdamW))
        if wd and decoupled:
            # |scale q + lr wd w| = scale |q + (lr wd / scale) w|: one pass fewer
            buf.add_(view(p), alpha=lr * wd / scale)
            return scale * float(buf.abs_().sum()) / (1 - lr * wd)
        return scale * float(buf.abs_().sum())

    def _copy_delta(self, p: nn.Parameter, view) -> float:
        previous = self._previous[id(p)]
        moved = float(torch.sub(view(p), view(previous), out=self._buffer(view(p))).abs_().sum())
        previous.copy_(p)
        return moved

    def _buffer(self, like: torch.Tensor) -> torch.Tensor:
        """A scratch tensor shaped like ``like``, reused across steps: fresh large
        allocations cost page faults that would dwarf the arithmetic."""
        key = (like.dtype, like.device)
        flat = self._scratch.get(key)
        if flat is None or flat.numel() < like.numel():
            flat = self._scratch[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
        return flat[:like.numel()].view(like.shape)  # contiguous even when ``like`` is a strided view

    def _abs_sum(self, t: torch.Tensor) -> float:
        # sum() accumulates pairwise; vector_norm(ord=1) drifts by ~1e-5 on 4k floats
        return float(torch.abs(t, out=self._buffer(t)).sum())

    def _remember_all(self) -> None:
        for params in self.layers:
            for p in params:
                if id(p) in self._group_of:
                    self._previous[id(p)] = p.detach().clone()

    def _l1(self, params: Sequence[nn.Parameter]) -> float:
        with torch.no_grad():
            return float(sum(self._abs_sum(p) for p in params))
