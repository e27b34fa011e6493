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

Cost: the pass re-reads the weights and both moments once per step, as a
handful of ``torch._foreach_*`` calls per layer (not a dozen calls per
tensor, which would dominate a small model's step). With ``sampling=n``,
tensors of at least SAMPLE_MIN elements are represented by the first BLOCK
elements of every run of n * BLOCK (the same elements in w, m and v, every
step), which divides the memory traffic by n; d_l is then an estimate.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["DriftTracker", "SAMPLE_MIN", "BLOCK"]

BLOCK = 64
"""Elements per sampled block (256 bytes of fp32: whole cache lines)."""
SAMPLE_MIN = 65536
"""Tensors smaller than this are always measured whole."""
_TINY = 1e-30


@dataclass(frozen=True)
class _Entry:
    """One trainable parameter: how to view the elements that stand for it, and
    the factor that scales sums over them to the whole tensor."""

    param: nn.Parameter
    group: dict
    view: Callable[[torch.Tensor], torch.Tensor]
    scale: float
    numel: int


class DriftTracker:
    """Accumulates d_l for each layer over the optimizer steps since the last ``take``.

    Contract: construct once; each ``optimizer.step()`` adds that step's drift
    (the hook runs inside the step, before the LR scheduler moves the LR);
    ``take()`` returns the summed drift, the LR of the last step, and resets;
    ``resync()`` after the optimizer state was replaced (a restore).
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 layers: Sequence[Sequence[nn.Parameter]], *, sampling: int = 1) -> None:
        if sampling < 1:
            raise ValueError(f"sampling={sampling}: use 1 (every element) or more")
        self.sampling = sampling
        self.optimizer = optimizer
        group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        self._layers = [[self._entry(p, group_of[id(p)]) for p in params if id(p) in group_of]
                        for params in layers]
        self._frozen_l1 = [float(sum(float(p.detach().abs().sum()) for p in params
                                     if id(p) not in group_of)) for params in layers]
        self._adam = isinstance(optimizer, torch.optim.Adam)  # AdamW subclasses Adam
        self._steps: dict[int, int] = {}
        self._previous: dict[int, torch.Tensor] = {}
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self.drift = np.zeros(len(self._layers), dtype=np.float64)
        self.lr = math.nan
        self.seconds = 0.0
        if not self._adam:
            warnings.warn(f"layercheck: drift for {type(optimizer).__name__} is measured by "
                          "keeping a copy of the previous weights (exact, one extra model copy "
                          "in memory); Adam and AdamW need no copy", stacklevel=3)
            self._previous = {id(e.param): e.param.detach().clone()
                              for entries in self._layers for e in entries}
        self._handle = optimizer.register_step_post_hook(self._after_step)

    def remove(self) -> None:
        self._handle.remove()

    def take(self) -> tuple[np.ndarray, float, float]:
        """(drift summed since the last take, LR of the last update, seconds spent)."""
        out = (self.drift.copy(), self.lr, self.seconds)
        self.drift[:] = 0.0
        self.seconds = 0.0
        return out

    def resync(self) -> None:
        """Forget the step counts read from the optimizer state (it was replaced)."""
        self._steps.clear()

    def _entry(self, p: nn.Parameter, group: dict) -> _Entry:
        n = p.numel()
        if self.sampling == 1 or n < SAMPLE_MIN or not p.is_contiguous():
            return _Entry(p, group, _whole, 1.0, n)
        span = BLOCK * self.sampling
        rows = n // span

        def view(t: torch.Tensor) -> torch.Tensor:
            return t.view(-1)[:rows * span].view(rows, span)[:, :BLOCK]
        return _Entry(p, group, view, n / (rows * BLOCK), rows * BLOCK)

    # -- the hook ----------------------------------------------------------
    def _after_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        start = time.perf_counter()
        with torch.no_grad():
            for i, entries in enumerate(self._layers):
                moved, size = self._layer_sums(entries)
                total = size + self._frozen_l1[i]
                self.drift[i] += moved / total if total > 0 else (math.inf if moved else 0.0)
        self.lr = max(float(g["lr"]) for g in optimizer.param_groups)
        self.seconds += time.perf_counter() - start

    def _layer_sums(self, entries: list[_Entry]) -> tuple[float, float]:
        """(sum |w(t) - w(t-1)|, sum |w(t)|) over a layer's trainable parameters."""
        if not entries:
            return 0.0, 0.0
        size = self._abs_sum([e.view(e.param) for e in entries], [e.scale for e in entries])
        # Adam skips a parameter without a gradient: it did not move this step
        updated = [e for e in entries if e.param.grad is not None]
        if not self._adam:
            return sum(self._copy_delta(e) for e in updated), size
        moved = 0.0
        for batch in self._batches(updated):
            moved += self._adam_moved(batch)
        return moved, size

    def _batches(self, entries: list[_Entry]) -> list[list[_Entry]]:
        """Entries sharing hyper-parameters and step count (one foreach batch each)."""
        out: dict[tuple[int, int], list[_Entry]] = {}
        for e in entries:
            state = self.optimizer.state.get(e.param)
            if not state or "exp_avg" not in state:
                continue
            key = id(e.param)
            step = self._steps.get(key)
            # read the optimizer's count once, then keep it ourselves (no sync per step)
            step = int(state["step"]) if step is None else step + 1
            self._steps[key] = step
            out.setdefault((id(e.group), step), []).append(e)
        return list(out.values())

    def _adam_moved(self, batch: list[_Entry]) -> float:
        group, step = batch[0].group, self._steps[id(batch[0].param)]
        states = [self.optimizer.state[e.param] for e in batch]
        lr, eps = float(group["lr"]), float(group["eps"])
        beta1, beta2 = (float(b) for b in group["betas"])
        bc1, c = 1 - beta1 ** step, math.sqrt(1 - beta2 ** step)
        key = "max_exp_avg_sq" if group.get("amsgrad") else "exp_avg_sq"
        buf, flat = self._buffers([e.view(s[key]) for e, s in zip(batch, states)])
        # m / (sqrt(v)/c + eps) == c * m / (sqrt(v) + eps*c). The +TINY keeps torch's CPU
        # sqrt off its slow path for exact zeros (7x slower; untouched embedding rows are
        # all zeros) and changes no result: it vanishes next to any non-zero v, and
        # where v == 0, m == 0 too.
        torch._foreach_add_(buf, _TINY)
        torch._foreach_sqrt_(buf)
        torch._foreach_add_(buf, eps * c)
        torch._foreach_reciprocal_(buf)
        torch._foreach_mul_(buf, [e.view(s["exp_avg"]) for e, s in zip(batch, states)])
        scale = lr / bc1 * c
        wd = float(group.get("weight_decay", 0.0))
        decoupled = group.get("decoupled_weight_decay", isinstance(self.optimizer, torch.optim.AdamW))
        shrink = 1.0
        if wd and decoupled:
            # |scale q + lr wd w| = scale |q + (lr wd / scale) w|
            torch._foreach_add_(buf, [e.view(e.param) for e in batch], alpha=lr * wd / scale)
            shrink = 1 - lr * wd
        return scale * self._scaled_abs_sum(buf, flat, [e.scale for e in batch]) / shrink

    def _abs_sum(self, tensors: list[torch.Tensor], scales: list[float]) -> float:
        buf, flat = self._buffers(tensors)
        return self._scaled_abs_sum(buf, flat, scales)

    @staticmethod
    def _scaled_abs_sum(buf: list[torch.Tensor], flat: torch.Tensor, scales: list[float]) -> float:
        torch._foreach_abs_(buf)
        if any(s != 1.0 for s in scales):
            torch._foreach_mul_(buf, scales)
        # sum() accumulates pairwise; vector_norm(ord=1) drifts by ~1e-5 on 4k floats
        return float(flat.sum())

    def _buffers(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Copies of ``tensors`` in consecutive slices of a scratch buffer reused
        across steps (fresh large allocations cost page faults that would dwarf
        the arithmetic), and the flat span they fill."""
        total = sum(t.numel() for t in tensors)
        key = (tensors[0].dtype, tensors[0].device)
        scratch = self._scratch.get(key)
        if scratch is None or scratch.numel() < total:
            scratch = self._scratch[key] = torch.empty(total, dtype=key[0], device=key[1])
        out, offset = [], 0
        for t in tensors:
            out.append(scratch[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        torch._foreach_copy_(out, tensors)
        return out, scratch[:total]

    def _copy_delta(self, e: _Entry) -> float:
        previous = self._previous[id(e.param)]
        (buf,), flat = self._buffers([e.view(e.param)])
        buf.sub_(e.view(previous))
        previous.copy_(e.param)
        return self._scaled_abs_sum([buf], flat, [e.scale])


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t
