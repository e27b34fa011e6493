"""Per-layer drift d_l(t) = mean|w(t) - w(t-1)| / mean|w(t)|, on the update path.

For Adam and AdamW the update of step t is recomputed, right after
``optimizer.step()`` (a step post-hook), from tensors the optimizer already
holds: the moments, the step count and the group's hyper-parameters
(``layercheck.drift.adamupdate``: |w(t) - w(t-1)| = scale |q| / shrink, with
q = m / (sqrt(v) + eps_c) + alpha w). No copy of the weights is kept. Other
optimizers fall back to remembering the previous weights (exact, but one
extra copy of the model: a warning says so).

Cost: the pass re-reads the weights and both moments once per step. With
numba installed (the ``train`` extra), contiguous CPU fp32 tensors go through
one fused kernel (``layercheck.drift.fusedsums``, ``layercheck.drift.kernels``): w, m and
v are read once, both sums come out of the same pass, float64 accumulation.
Anything else (GPU tensors, other dtypes, non-contiguous, no numba) takes the
torch path: a handful of
``torch._foreach_*`` calls per layer over scratch copies (not a dozen calls per
tensor, which would dominate a small model's step). Both give the same numbers
(the same fp32 element arithmetic; only the summation order differs).

With ``fused_step=True`` the tracker does not read the tensors at all where it
can avoid it: ``layercheck.drift.fusedstep`` runs Adam/AdamW's step itself, one pass
that updates the weights and moments and sums |w(t) - w(t-1)| and |w(t)| of
each parameter from its registers, and the hook only collects those sums
(exact: the change of the stored weights, summed as the kernel above sums).
A call the fused step cannot take (see its doc) is measured as without it.

One tracker for every backend (``layercheck.backends.source``): the hook adds, per
layer, sum |w(t) - w(t-1)| and sum |w(t)| over the tensors in the optimizer's
parameter groups during that call (all of them, or under ZeRO-3 one flat
partition per call); ``take()`` sums them over the ranks (``reduce``) and
divides, so each rank gets the drift of the whole layer. The tracker keys
parameters and optimizer state as the optimizer does, and reads their
elements through ``backends.source.local``: a DTensor (an FSDP2 parameter or Adam moment)
hands over its local shard, so each rank reads only what it holds.

With ``sampling=n``, tensors of at least SAMPLE_MIN elements are represented
by one block of BLOCK elements out of every run of n * BLOCK (the same
elements in w, m and v), which divides the memory traffic by n; d_l is then an
estimate. The block rotates with the step (step t reads block t mod n of each
run), so over any n consecutive steps every element is read once, and the
accumulated drift that the policy compares with its threshold does not keep
missing the same elements.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..backends.source import local
from .adamupdate import AdamTerms, adam_terms
from .fusedstep import FusedStep
from .fusedsums import FusedSums

if TYPE_CHECKING:
    from ..backends.lora import AdapterDrift

__all__ = ["DriftTracker", "SAMPLE_MIN", "BLOCK"]

BLOCK = 64
"""Elements per sampled block (256 bytes of fp32: whole cache lines)."""
SAMPLE_MIN = 65536
"""Tensors smaller than this are always measured whole."""
_TINY = 1e-30


@dataclass(frozen=True)
class _Entry:
    """One trainable parameter: which of its elements stand for it (``take`` of
    every run of ``span``; all of them when equal) and the factor that scales
    sums over them to the whole tensor."""

    param: nn.Parameter
    group: dict
    layer: int
    span: int
    take: int
    scale: float

    def view(self, t: torch.Tensor, phase: int) -> torch.Tensor:
        if self.take == self.span:
            return t
        rows = t.numel() // self.span
        first = (phase * self.take) % self.span
        return t.view(-1)[:rows * self.span].view(rows, self.span)[:, first:first + self.take]

    @property
    def data(self) -> torch.Tensor:
        """The parameter's elements in this process (fetched anew: FSDP2 may swap them)."""
        return local(self.param)

    def extent(self) -> tuple[int, int, int]:
        """(numel, span, take): a ``layercheck.drift.kernels.Extent``."""
        return self.data.numel(), self.span, self.take


class DriftTracker:
    """d_l of each layer, step by step.

    Contract: construct once; each ``optimizer.step()`` adds its sums (the
    hook runs inside the step, before the LR scheduler moves the LR); ``take()``
    once per step, on every rank, returns d_l, the LR of the update and the
    seconds spent, and resets; ``resync()`` after the optimizer state was
    replaced (a restore). ``layers[i]``: layer i's tensors; those with a param
    group (``groups``: id -> group; default the optimizer's) are tracked, the
    rest are frozen (|w| measured once); ``adapters``: LoRA modules whose share is
taken of their effective weights (``layercheck.backends.lora``). ``reduce``: the (2, layers) sums ->
    their sum over the ranks. ``fused=False`` keeps every tensor on the torch
    path; ``fused_params``: tensors the last step measured with the kernel.
    ``fused_step=True``: take the sums from Adam/AdamW's own step
    (``layercheck.drift.fusedstep``; ``step_params``: tensors the last step measured so).
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 layers: Sequence[Sequence[torch.Tensor]], *, groups: dict[int, dict] | None = None,
                 sampling: int = 1, fused: bool = True,
                 reduce: Callable[[np.ndarray], np.ndarray] = np.array,
                 adapters: "AdapterDrift | None" = None, fused_step: bool = False) -> None:
        if sampling < 1:
            raise ValueError(f"sampling={sampling}: use 1 (every element) or more")
        self.sampling = sampling
        self.optimizer = optimizer
        self.reduce = reduce
        group_of = groups if groups is not None else {
            id(p): g for g in optimizer.param_groups for p in g["params"]}
        self._adapters = adapters
        # a LoRA module's A, B and W count through its effective weight (``adapters``)
        skip = adapters.params() | adapters.weights() if adapters is not None else set()
        self._layers = [[self._entry(p, group_of[id(p)], i) for p in params
                         if id(p) in group_of and id(p) not in skip]
                        for i, params in enumerate(layers)]
        self._all = [e for entries in self._layers for e in entries]
        self._layer_of = {id(e.param): e.layer for e in self._all}
        self._by_param: dict[int, list[_Entry]] = {}
        for e in self._all:
            self._by_param.setdefault(id(e.param), []).append(e)
        self._order = {id(e): k for k, e in enumerate(self._all)}  # a layer's sum order
        self._frozen_l1 = np.array([float(sum(float(local(p).detach().abs().sum()) for p in params
                                              if id(p) not in group_of and id(p) not in skip))
                                    for params in layers])
        self._adam = isinstance(optimizer, torch.optim.Adam)  # AdamW subclasses Adam
        self._fused = FusedSums(self._all, len(self._layers), self._moments, sampling=sampling,
                                enabled=fused and self._adam)
        self._steps: dict[int, int] = {}
        self._phase = 0
        self._previous: dict[int, torch.Tensor] = {}
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._sums = np.zeros((2, len(self._layers)), dtype=np.float64)
        self._on_device: _DeviceSums | None = None
        self._gpu = next((e.data.device for e in self._all if e.data.is_cuda), None)
        self._gpu_calls: list[tuple[object, object, float]] = []
        self.lr = math.nan
        self.seconds = 0.0
        self.fused_params = self.step_params = 0
        self._step_count = 0
        if not self._adam:
            warnings.warn(f"layercheck: drift for {type(optimizer).__name__} is measured by "
                          "keeping a copy of the previous weights (exact, one extra model copy "
                          "in memory); Adam and AdamW need no copy", stacklevel=3)
            self._previous = {id(e.param): e.data.detach().clone() for e in self._all}
        self._handle = optimizer.register_step_post_hook(self._after_step)
        self._in_step = FusedStep.attach(optimizer) if fused_step else None

    def remove(self) -> None:
        self._handle.remove()
        if self._in_step is not None:
            self._in_step.remove()

    def take(self) -> tuple[np.ndarray, float, float]:
        """(d_l of the step, LR of its update, seconds spent in the hook and here)."""
        start = time.perf_counter()
        if self._on_device is not None:  # one wait for the GPU per step, here
            self._sums += self._on_device.sums.cpu().numpy()
            self._on_device = None
        self._settle_gpu()
        self._sums[1] += self._frozen_l1  # before the reduce: each rank holds its shard of them
        moved, total = self.reduce(self._sums)
        self._sums[:] = 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            drift = np.where(total > 0, moved / np.where(total > 0, total, 1.0),
                             np.where(moved > 0, np.inf, 0.0))
        self._phase += 1
        self.fused_params, self._fused.count = self._fused.count, 0
        self.step_params, self._step_count = self._step_count, 0
        seconds, self.seconds = self.seconds + time.perf_counter() - start, 0.0
        return drift, self.lr, seconds

    def hook_seconds(self) -> float:
        """Seconds of the hook calls since the last ``take()``: their host time, or where
        the pass ran on a GPU the GPU's time for its work if that is longer (this
        waits for it: read it after the step's own wait for the GPU)."""
        self._settle_gpu()
        return self.seconds

    def _settle_gpu(self) -> None:
        if self._gpu_calls:
            gpu = sum(a.elapsed_time(b) for a, b, _ in self._gpu_calls) / 1e3
            self.seconds += max(0.0, gpu - sum(host for _, _, host in self._gpu_calls))
            self._gpu_calls.clear()

    def resync(self) -> None:
        """Forget the step counts read from the optimizer state (it was replaced), and
        the adapters' previous weights (so were they)."""
        self._steps.clear()
        if self._adapters is not None:
            self._adapters.resync()

    def _entry(self, p: nn.Parameter, group: dict, layer: int) -> _Entry:
        n = local(p).numel()
        span = BLOCK * self.sampling
        if self.sampling == 1 or n < SAMPLE_MIN or not local(p).is_contiguous():
            return _Entry(p, group, layer, n, n, 1.0)
        return _Entry(p, group, layer, span, BLOCK, n / (n // span * BLOCK))

    # -- the hook ----------------------------------------------------------
    def _after_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        start = time.perf_counter()
        began = None
        if self._gpu is not None:  # the pass runs on the GPU: time it there too
            began = torch.cuda.Event(enable_timing=True)
            began.record(torch.cuda.current_stream(self._gpu))
        # what this call stepped: everything, or under ZeRO-3 one sub-group's partition
        stepped = {id(p) for g in optimizer.param_groups for p in g["params"]}
        in_step = self._from_step()
        stepped -= in_step.keys()
        with torch.no_grad():
            updates = self._updates(stepped) if self._adam else {}
            moved, size, done = self._fused.sums(stepped, updates, self._phase)
            rest: dict[int, list[_Entry]] = {}  # by layer, what the kernel did not measure
            for e in (e for key in stepped for e in self._by_param.get(key, ())):
                if id(e) not in done:
                    rest.setdefault(e.layer, []).append(e)
            for i, entries in rest.items():
                m, s = self._layer_sums(sorted(entries, key=lambda e: self._order[id(e)]), updates)
                if isinstance(m, torch.Tensor) or isinstance(s, torch.Tensor):
                    self._device(m, s).add(i, m, s)  # a GPU's sums stay there until take()
                else:
                    moved[i] += m
                    size[i] += s
            if self._adapters is not None:
                m, s = self._adapters.sums(len(self._layers))
                moved += m
                size += s
            for layer, m, s in in_step.values():
                moved[layer] += m
                size[layer] += s
        self._sums[0] += moved
        self._sums[1] += size
        self.lr = max(float(g["lr"]) for g in optimizer.param_groups)
        spent = time.perf_counter() - start
        self.seconds += spent
        if began is not None:
            ended = torch.cuda.Event(enable_timing=True)
            ended.record(torch.cuda.current_stream(self._gpu))
            self._gpu_calls.append((began, ended, spent))

    def _device(self, *sums: object) -> "_DeviceSums":
        device = next(x.device for x in sums if isinstance(x, torch.Tensor))
        if self._on_device is None:
            self._on_device = _DeviceSums(device, len(self._layers))
        return self._on_device

    def _from_step(self) -> dict[int, tuple[int, float, float]]:
        """Per tracked parameter the fused step measured in this call: (layer, moved,
        size); their step counts are read anew should a later call not be fused."""
        taken = self._in_step.take() if self._in_step is not None else None
        if taken is None:
            return {}
        out = {}
        for key, m, s in zip(taken[0], taken[1].tolist(), taken[2].tolist()):
            layer = self._layer_of.get(key)
            if layer is not None:
                out[key] = (layer, m, s)
                self._steps.pop(key, None)
        self._step_count += len(out)
        return out

    def _updates(self, stepped: set[int]) -> dict[int, AdamTerms]:
        """The update terms of each parameter that Adam moved in this call."""
        out: dict[int, AdamTerms] = {}
        terms: dict[tuple[int, int], AdamTerms] = {}
        for e in (e for key in stepped for e in self._by_param.get(key, ())):
            # Adam skips a parameter without a gradient: it did not move this step
            state = self.optimizer.state.get(e.param)
            if e.param.grad is None or not state or "exp_avg" not in state:
                continue
            key = id(e.param)
            step = self._steps.get(key)
            # read the optimizer's count once, then keep it ourselves (no sync per step)
            step = int(state["step"]) if step is None else step + 1
            self._steps[key] = step
            if (id(e.group), step) not in terms:
                terms[id(e.group), step] = adam_terms(
                    e.group, step, adamw=isinstance(self.optimizer, torch.optim.AdamW))
            out[key] = terms[id(e.group), step]
        return out

    def _moments(self, e: _Entry) -> tuple[torch.Tensor, torch.Tensor]:
        """(exp_avg, the second moment Adam divides by), from one look-up of the state."""
        state = self.optimizer.state[e.param]
        return local(state["exp_avg"]), local(state[_second_moment_key(e.group)])

    def _first_moment(self, e: _Entry) -> torch.Tensor:
        return local(self.optimizer.state[e.param]["exp_avg"])

    def _second_moment(self, e: _Entry) -> torch.Tensor:
        return local(self.optimizer.state[e.param][_second_moment_key(e.group)])

    # -- the torch path ----------------------------------------------------------
    def _layer_sums(self, entries: list[_Entry], updates: dict[int, AdamTerms]) -> tuple[float, float]:
        """(sum |w(t) - w(t-1)|, sum |w(t)|) over a layer's trainable parameters."""
        if not entries:
            return 0.0, 0.0
        size = self._abs_sum([e.view(e.data, self._phase) for e in entries],
                             [e.scale for e in entries])
        if not self._adam:
            return sum(self._copy_delta(e) for e in entries if e.param.grad is not None), size
        batches: dict[int, list[_Entry]] = {}
        for e in entries:
            if id(e.param) in updates:
                batches.setdefault(id(updates[id(e.param)]), []).append(e)
        return sum(self._adam_moved(b, updates[id(b[0].param)]) for b in batches.values()), size

    def _adam_moved(self, batch: list[_Entry], t: AdamTerms) -> float:
        """sum |w(t) - w(t-1)| over entries sharing update terms (one foreach batch)."""
        buf, flat = self._buffers([e.view(self._second_moment(e), self._phase) for e in batch])
        # The +TINY keeps torch's CPU sqrt off its slow path for exact zeros (7x slower;
        # untouched embedding rows are all zeros) and changes no result: it vanishes
        # next to any non-zero v, and where v == 0, m == 0 too.
        torch._foreach_add_(buf, _TINY)
        torch._foreach_sqrt_(buf)
        torch._foreach_add_(buf, t.eps_c)
        torch._foreach_reciprocal_(buf)
        torch._foreach_mul_(buf, [e.view(self._first_moment(e), self._phase) for e in batch])
        if t.alpha:
            torch._foreach_add_(buf, [e.view(e.data, self._phase) for e in batch], alpha=t.alpha)
        return t.moved(self._scaled_abs_sum(buf, flat, [e.scale for e in batch]))

    def _abs_sum(self, tensors: list[torch.Tensor], scales: list[float]) -> float:
        buf, flat = self._buffers(tensors)
        return self._scaled_abs_sum(buf, flat, scales)

    @staticmethod
    def _scaled_abs_sum(buf: list[torch.Tensor], flat: torch.Tensor,
                        scales: list[float]) -> "float | torch.Tensor":
        """The sum; on a GPU a 0-dim float64 tensor there (no wait for the GPU)."""
        torch._foreach_abs_(buf)
        if any(s != 1.0 for s in scales):
            torch._foreach_mul_(buf, scales)
        # sum() accumulates pairwise; vector_norm(ord=1) drifts by ~1e-5 on 4k floats
        total = flat.sum()
        return float(total) if total.device.type == "cpu" else total.double()

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
        (buf,), flat = self._buffers([e.view(e.data, self._phase)])
        buf.sub_(e.view(previous, self._phase))
        previous.copy_(e.data)
        return self._scaled_abs_sum([buf], flat, [e.scale])


def _second_moment_key(group: dict) -> str:
    """The state key of the second moment Adam divides by (AMSGrad: its running maximum)."""
    return "max_exp_avg_sq" if group.get("amsgrad") else "exp_avg_sq"


class _DeviceSums:
    """A step's sums of GPU tensors, kept on the device until ``take()``: a wait for
    the GPU per layer would stall the training thread several times a step."""

    def __init__(self, device: torch.device, layers: int) -> None:
        self.sums = torch.zeros((2, layers), dtype=torch.float64, device=device)

    def add(self, layer: int, moved: object, size: object) -> None:
        self.sums[0, layer] += moved
        self.sums[1, layer] += size
