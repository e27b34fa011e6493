"""A step's training state, captured and applied (layer versions: ``layercheck.backends.source``).

Training state (one safetensors file): RNG states as tensors, and in the
metadata the state document (``layercheck.storage.format``): the step, the
optimizer's hyper-parameters, type and state layout, the LR scheduler's
state and type, the numpy/python RNG scalars, the user's extra state and the
backend's counters.

``check_state`` refuses (ModelMismatch) everything ``apply_state`` could fail
on or get wrong, before a restore copies anything: another optimizer or
scheduler type, other parameter groups, a scheduler state that its
``load_state_dict`` does not take (tried on a copy of the scheduler).

Capture copies to host memory (the only work on the training thread);
apply copies back into the live objects. No pickle anywhere.
"""
from __future__ import annotations

import copy
import random
from typing import Any, Mapping

import numpy as np
import torch

from .contract.errors import ModelMismatch
from .storage.format import state_metadata

__all__ = ["capture_state", "check_state", "apply_state", "capture_rng", "apply_rng",
           "type_name", "optimizer_layout"]


def type_name(obj: Any) -> str:
    """The qualified name of ``obj``'s class, as the state document records it."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def optimizer_layout(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What the state document records of the optimizer: its type and the fields
    of its per-parameter state that layer files hold (tensors and numbers, as
    ``source.capture_optimizer_state`` keeps them), over every parameter."""
    fields = {field for state in optimizer.state.values() for field, value in state.items()
              if torch.is_tensor(value) or isinstance(value, (int, float))}
    return {"type": type_name(optimizer), "fields": sorted(fields)}


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The torch, CUDA, numpy and python RNG states: (tensors, JSON-ready scalars)."""
    tensors = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = s
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    tensors["rng/numpy"] = torch.from_numpy(np.asarray(np_keys, dtype=np.int64))
    py_version, py_internal, py_gauss = random.getstate()
    tensors["rng/python"] = torch.tensor(py_internal, dtype=torch.int64)
    return tensors, {"numpy": [np_name, int(np_pos), int(np_has_gauss), float(np_gauss)],
                     "python": [py_version, py_gauss]}


def apply_rng(tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> None:
    """Set every RNG to what ``capture_rng`` returned; of the CUDA devices, those this
    process sees (a state saved where more were visible restores on fewer: an
    unknown device would fail, lazily, at CUDA's first use after the restore)."""
    torch.set_rng_state(tensors["rng/torch"])
    cuda = sorted((int(k.rpartition("/")[2]), k) for k in tensors if k.startswith("rng/cuda/"))
    if cuda and torch.cuda.is_available():
        present = torch.cuda.device_count()  # by number: rng/cuda/10 is not device 2's
        for device, key in cuda:
            if device < present:  # a device this process does not see has no generator
                torch.cuda.set_rng_state(tensors[key], device)
    np_name, np_pos, np_has_gauss, np_gauss = scalars["numpy"]
    np.random.set_state((np_name, tensors["rng/numpy"].numpy().astype(np.uint32), np_pos,
                         np_has_gauss, np_gauss))
    py_version, py_gauss = scalars["python"]
    random.setstate((py_version, tuple(int(x) for x in tensors["rng/python"].tolist()), py_gauss))


def capture_state(step: int, optimizer: torch.optim.Optimizer, scheduler: Any,
                  extra: Mapping[str, Any] | None, engine: Mapping[str, Any] | None = None,
                  members: list[str] | None = None, kept: Mapping[str, str] | None = None
                  ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of the small per-step training state; ``engine``: the
    backend's counters (``LayerSource.engine_state``); ``members``: per parameter
    group, ``format.group_members`` of the parameters it holds; ``kept``: the
    fingerprints of the live tensors no version holds (``LayerSource.kept``)."""
    tensors, rng = capture_rng()
    doc = {
        "step": step,
        "param_groups": [{k: v for k, v in g.items() if k != "params"}
                         for g in optimizer.param_groups],
        "group_members": members,
        "optimizer": optimizer_layout(optimizer),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scheduler_type": type_name(scheduler) if scheduler is not None else None,
        "extra": dict(extra) if extra is not None else None,
        "engine": dict(engine) if engine is not None else None,
        "rng": rng,
    }
    if kept:
        doc["kept"] = dict(kept)
    return tensors, state_metadata(doc, _json_default)


def _json_default(value: Any) -> Any:
    if torch.is_tensor(value) and value.numel() == 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def check_state(doc: Mapping[str, Any], optimizer: torch.optim.Optimizer,
                members: list[str] | None = None, scheduler: Any = None) -> None:
    """ModelMismatch unless ``apply_state`` fits ``optimizer``, whose groups hold
    ``members`` (``capture_state``'s), and ``scheduler``; changes nothing.
    Hyper-parameters and the LR scheduler's per-group state go back by position,
    so every group must hold the parameters it held (torch's own load_state_dict
    refuses other sizes). The optimizer's and scheduler's types are compared where
    the document records them (older documents do not); the scheduler's state is loaded
    into a copy of ``scheduler`` either way, so an older document that the live
    scheduler would not take is refused too."""
    _check_optimizer(doc.get("optimizer"), optimizer)
    groups = doc["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        raise ModelMismatch(f"the checkpoint's optimizer has {len(groups)} parameter groups, "
                            f"this one {len(optimizer.param_groups)}; build the optimizer as before")
    _check_scheduler(doc, scheduler)
    saved = doc.get("group_members")
    if saved is None or members is None:
        return  # older states, without names, are taken by position
    for i, (mine, theirs) in enumerate(zip(members, saved)):
        if mine != theirs:
            raise ModelMismatch(
                f"optimizer parameter group {i} holds other parameters than it did in the "
                "checkpoint (groups reordered or split another way); its learning rate, weight "
                "decay and scheduler state would go to the wrong parameters: build the "
                "optimizer's groups as before (same order, same parameters)")


def _check_optimizer(saved: Mapping[str, Any] | None, optimizer: torch.optim.Optimizer) -> None:
    """ModelMismatch if the document records another optimizer type than ``optimizer``'s:
    its per-parameter state would be another's (SGD's momentum where AdamW steps
    its moments). An older document records none: then each layer's state is only
    checked against the fields a live optimizer holds (``ModuleSource.check``)."""
    if saved is None or saved.get("type") == type_name(optimizer):
        return
    fields = ", ".join(saved.get("fields") or []) or "no state"
    raise ModelMismatch(
        f"the checkpoint's optimizer is {saved.get('type')} (its state: {fields}), this one "
        f"is {type_name(optimizer)}: build the optimizer the run that saved it used; to go on "
        "with another optimizer, export the weights (python -m layercheck export) and start a "
        "new run from them in a new directory")


def _check_scheduler(doc: Mapping[str, Any], scheduler: Any) -> None:
    """ModelMismatch unless ``scheduler.load_state_dict`` takes the document's
    scheduler state and, where recorded, the types match; ``scheduler`` is not
    changed (its state is loaded into a deep copy that shares the optimizer and its
    parameters: what a schedule's ``load_state_dict`` changes is the scheduler's own)."""
    saved = doc.get("scheduler")
    if scheduler is None or saved is None:
        return
    kind, live = doc.get("scheduler_type"), type_name(scheduler)
    fix = ("build the scheduler the run that saved it used; to change schedules, pass "
           "scheduler=None to LayerCheck and set the new schedule up after restore()")
    if kind is not None and kind != live:
        raise ModelMismatch(f"the checkpoint's LR scheduler is {kind}, this one is {live}: {fix}")
    optimizer = getattr(scheduler, "optimizer", None)
    shared: dict[int, Any] = {id(optimizer): optimizer} if optimizer is not None else {}
    for group in getattr(optimizer, "param_groups", []):  # a callable schedule may hold weights
        shared.update((id(p), p) for p in group["params"])
    trial = copy.deepcopy(scheduler, shared)
    try:
        trial.load_state_dict(copy.deepcopy(saved))
    except Exception as exc:  # noqa: BLE001 - whatever it raises, the live one would too
        raise ModelMismatch(f"the checkpoint's LR scheduler state does not fit this {live} "
                            f"({exc.__class__.__name__}: {exc}): {fix}") from None


def apply_state(tensors: Mapping[str, torch.Tensor], doc: Mapping[str, Any],
                optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Restore RNG, optimizer hyper-parameters and scheduler from a training state's
    tensors and document (``format.read_state_document``), once ``check_state``
    accepted them."""
    check_state(doc, optimizer)
    groups = doc["param_groups"]
    for live, saved in zip(optimizer.param_groups, groups):
        for key, value in saved.items():
            live[key] = tuple(value) if isinstance(live.get(key), tuple) else value
    if scheduler is not None and doc["scheduler"] is not None:
        scheduler.load_state_dict(doc["scheduler"])
    apply_rng(tensors, doc["rng"])
