"""Adam/AdamW's step with each parameter's drift sums taken in the same pass (opt-in).

    FusedStep.attach(optimizer)   # what LayerCheckConfig(fused_step=True) does

The drift tracker (``layercheck.drift``) recomputes each step's update after
``optimizer.step()``, a second pass over the weights and both moments that the
optimizer has just written. ``FusedStep`` removes that pass: it takes over
``optimizer.step`` of a ``torch.optim.Adam`` or ``AdamW`` instance and runs
the step itself, one streaming pass (``layercheck.drift.stepkernel``, numba) that
updates the weights and moments and sums |w(t) - w(t-1)| and |w(t)| of each
parameter on the way. The tracker's step hook then only collects those sums
(``take``).

What stays the same: the optimizer object, its class, its state (the same
keys, dtypes and values, created by torch's own code), its ``state_dict``,
its step hooks (run around the fused step as torch runs them), LR schedulers
created before or after. The numbers: torch's ``fused=True`` CPU step bit for
bit (outside the last ``numel % 16`` elements of each tensor, 8 on AVX2, where
torch's scalar loop rounds the second moment in another order: a step puts
them one fp32 ulp apart at most), and the default for-loop or foreach step
with equal moments and weights one rounding apart (their ``torch.sqrt`` is
not correctly rounded); ``layercheck.drift.stepkernel`` says where each rounding is.

A call is fused when every parameter with a gradient is a plain contiguous
CPU fp32 tensor, as are its gradient and moments, and its group asks for
nothing the kernel does not do (``amsgrad``, ``capturable``,
``differentiable``, tensor hyper-parameters, a GradScaler's scale) and no
closure or other argument is passed. Any other call runs torch's own step,
unchanged, inside the same hooks, and the tracker measures it after the step
as before (``take`` then says nothing).
``attach`` does not take over an optimizer it could never fuse (another class,
FSDP2's DTensor parameters, parameters on a GPU, numba missing) or whose
``step`` something other than an LR scheduler has already replaced: it warns
and returns None.
"""
from __future__ import annotations

import types
import warnings
import weakref
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

__all__ = ["FusedStep"]

_PLAIN = (torch.Tensor, nn.Parameter)
"""Tensor classes the kernel may read through their address (a DTensor is not one)."""


class FusedStep:
    """The fused step installed on one optimizer (``attach``); ``remove`` gives the
    optimizer its own ``step`` back. ``take()``: the sums of the last call that ran
    fused, as (parameter ids, moved, size), and forgets them."""

    def __init__(self, optimizer: torch.optim.Optimizer, kernel: Any,
                 original: Callable[..., Any]) -> None:
        self.optimizer = optimizer
        self._kernel = kernel
        self._original = original  # torch's step without its hooks: the fallback, inside ours
        self._plans: dict[tuple[int, ...], Any] = {}
        self._taken: tuple[list[int], np.ndarray, np.ndarray] | None = None
        self._before: Any = optimizer.__dict__.get("step")  # an LR scheduler's wrapper, or None
        self.fused_calls = self.torch_calls = 0
        hooked = torch.optim.Optimizer.profile_hook_step(_run)
        self._installed = _installed(optimizer, hooked, self._before)
        optimizer.step = self._installed  # type: ignore[method-assign]
        optimizer._layercheck_fused_step = self  # type: ignore[attr-defined]

    @classmethod
    def attach(cls, optimizer: torch.optim.Optimizer) -> "FusedStep | None":
        """Take over ``optimizer.step`` where the fused step can apply (see the module
        doc); else warn why not and return None."""
        why = _refusal(optimizer)
        kernel = None
        if why is None:
            try:
                from . import stepkernel as kernel
            except ImportError:
                why = "numba is not installed (pip install numba, or the train extra)"
        if why is not None:
            warnings.warn(f"layercheck: fused_step does not apply: {why}; drift is measured "
                          "after the optimizer's own step instead", stacklevel=3)
            return None
        kernel.warm()  # compiled or loaded now, not inside the first step
        return cls(optimizer, kernel, type(optimizer).step.__wrapped__)

    def remove(self) -> None:
        """Give the optimizer back the ``step`` it had before ``attach``. Where something
        wrapped the fused step since (an LR scheduler created later), its wrapper stays
        and runs torch's own step from now on."""
        opt = self.optimizer
        if opt.__dict__.get("_layercheck_fused_step") is not self:
            return
        del opt._layercheck_fused_step  # type: ignore[attr-defined]
        if opt.__dict__.get("step") is self._installed:
            if self._before is None:
                del opt.step
            else:
                opt.step = self._before  # type: ignore[method-assign]

    def take(self) -> tuple[list[int], np.ndarray, np.ndarray] | None:
        taken, self._taken = self._taken, None
        return taken

    # -- one call -----------------------------------------------------------------
    def step(self, closure: Any) -> Any:
        """The optimizer's step (inside its hooks): fused where it can be, else torch's."""
        self._taken = None
        if closure is None:
            work = self._work()
            if work is not None:
                self._fused(*work)
                self.fused_calls += 1
                return None
        self.torch_calls += 1
        return self._original(self.optimizer, closure)

    def _work(self) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], np.ndarray,
                             list[dict]] | None:
        """(params, [their grad, exp_avg, exp_avg_sq, step], group index per param,
        groups) of this call, state created by torch's own ``_init_group``; None where
        any of it is not for the kernel."""
        opt = self.optimizer
        if any(getattr(opt, name, None) is not None for name in ("grad_scale", "found_inf")):
            return None  # a GradScaler's unscaling, which torch's fused step does itself
        params: list[torch.Tensor] = []
        tensors: list[list[torch.Tensor]] = [[], [], [], []]
        group_of: list[int] = []
        groups = opt.param_groups
        for index, group in enumerate(groups):
            if not _fusable_group(group):
                return None
            grads: list[torch.Tensor] = []
            before = len(params)
            with torch.no_grad():
                complex_ = opt._init_group(group, params, grads, tensors[1], tensors[2], [],
                                           tensors[3])
            if complex_:
                return None
            tensors[0].extend(grads)
            group_of.extend([index] * (len(params) - before))
        for t in params + tensors[0] + tensors[1] + tensors[2]:
            if type(t) not in _PLAIN or t.device.type != "cpu" or t.dtype != torch.float32 \
                    or not t.is_contiguous():
                return None
        for s in tensors[3]:  # a step count the kernel increments in place
            if not isinstance(s, torch.Tensor) or s.device.type != "cpu" \
                    or s.dtype != torch.float32 or s.numel() != 1:
                return None
        return params, tensors, np.array(group_of, dtype=np.int64), groups

    def _fused(self, params: list[torch.Tensor], tensors: list[list[torch.Tensor]],
               group_of: np.ndarray, groups: list[dict]) -> None:
        numels = tuple(p.numel() for p in params)
        plan = self._plans.get(numels)
        if plan is None:
            plan = self._plans[numels] = self._kernel.AdamPass(numels)
        grads, exp_avgs, exp_avg_sqs, steps = tensors
        ptr = np.array([(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr())
                        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs)],
                       dtype=np.int64).reshape(-1, 4)
        counts = np.array([s.data_ptr() for s in steps], dtype=np.int64)
        adamw = isinstance(self.optimizer, torch.optim.AdamW)
        hyper = np.array([_hyper(g, adamw) for g in groups], dtype=np.float64)
        moved, size = plan.run(ptr, counts, group_of, hyper, torch.get_num_threads())
        self._taken = ([id(p) for p in params], moved, size)


def _run(optimizer: torch.optim.Optimizer, closure: Any = None, **kwargs: Any) -> Any:
    """The body that torch's hook wrapper runs (``Optimizer.profile_hook_step``): the
    fused step while attached, torch's own after ``remove`` or for a call with
    arguments the kernel does not take."""
    fused = optimizer.__dict__.get("_layercheck_fused_step")
    if fused is None or kwargs:
        return type(optimizer).step.__wrapped__(optimizer, closure, **kwargs)
    return fused.step(closure)


def _installed(optimizer: torch.optim.Optimizer, hooked: Callable[..., Any],
               before: Any) -> Any:
    """What goes into ``optimizer.step``. Where an LR scheduler has wrapped the step
    already (its wrapper notes that the optimizer stepped, so that the scheduler
    can warn about a wrong call order), a wrapper that does the same; else a bound
    method, which a scheduler created later wraps as it would torch's own."""
    if before is None:
        return types.MethodType(hooked, optimizer)
    ref = weakref.ref(optimizer)  # no cycle through the optimizer's own dict

    def step(*args: Any, **kwargs: Any) -> Any:
        opt = ref()
        opt._opt_called = True  # type: ignore[union-attr]
        return hooked(opt, *args, **kwargs)
    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    return step


def _refusal(optimizer: torch.optim.Optimizer) -> str | None:
    """Why the fused step can never run for ``optimizer`` (None: it may)."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return (f"the optimizer is a {type(optimizer).__module__}.{type(optimizer).__qualname__}, "
                "not torch.optim.Adam or AdamW")
    before = optimizer.__dict__.get("step")
    if before is not None and not getattr(before, "_wrapped_by_lr_sched", False):
        by = getattr(before, "__qualname__", before)
        return f"optimizer.step was already replaced (by {by!r})"
    if getattr(type(optimizer).step, "__wrapped__", None) is None:
        return "this torch's optimizer step has no hook wrapper to run inside"
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if any(type(p) not in _PLAIN for p in params):
        return ("its parameters are not plain tensors (FSDP2's DTensors: each rank's shard "
                "is stepped by torch)")
    devices = sorted({p.device.type for p in params} - {"cpu"})
    if devices:
        return (f"its parameters are on {', '.join(devices)}: the fused step is a CPU kernel "
                "(on a GPU, torch's AdamW(fused=True) is the fused one)")
    return None


def _fusable_group(group: dict) -> bool:
    if group.get("amsgrad") or group.get("capturable") or group.get("differentiable"):
        return False
    numbers = (group["lr"], *group["betas"], group["eps"], group["weight_decay"])
    return not any(isinstance(x, torch.Tensor) for x in numbers)


def _hyper(group: dict, adamw: bool) -> tuple[float, ...]:
    """A row of ``stepkernel``'s ``hyper``: lr, beta1, beta2, eps, weight decay,
    decoupled, maximize."""
    beta1, beta2 = group["betas"]
    decoupled = group.get("decoupled_weight_decay", adamw)
    return (float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
            float(group["weight_decay"]), float(bool(decoupled)), float(bool(group["maximize"])))
