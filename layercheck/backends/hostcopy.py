"""The snapshot's host copies: a plain copy on the CPU; pinned memory on a side stream for a GPU.

``host(t)`` is what every layer source captures a tensor with (``layercheck.backends.source``).
For a CPU tensor it is a contiguous copy, done when it returns. For a CUDA tensor
it is a tensor in pinned (page-locked) host memory that a non-blocking copy on a
side stream of ``t``'s device fills: the side stream first waits for the work
the training stream has queued (the optimizer step that wrote ``t``), and ``t``
is recorded as used by the side stream, so that the allocator does not hand its
memory out before the copy has read it. The training thread does not wait for
the copy; a pinned copy runs at the link's full speed (a pageable one is staged
through a bounce buffer, and blocks the thread).

Such a copy is not done when ``host`` returns: ``fence()``, called once the
step's snapshot is captured, records an event after the copies on each side
stream it used, makes the training stream wait for that event before anything
it queues next (the next optimizer step must not overwrite a tensor that is
being copied; the wait is on the GPU, the thread goes on), and returns a
``Fence`` whose ``wait()`` blocks until the copies are done. The writer calls
it before it reads a byte (``writer.StepJob.ready``). Nothing of this happens
without CUDA tensors: ``fence()`` then returns None.

The pending copies belong to the thread that made them (a training thread's
``fence`` does not take another thread's copies).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["host", "fence", "Fence"]

_local = threading.local()
"""This thread's side streams (by device) and the devices with copies since its last fence."""


def host(t: torch.Tensor) -> torch.Tensor:
    """A host-memory copy of ``t`` that the training loop can no longer change (for a
    CUDA tensor: once ``fence().wait()`` has returned; see the module doc)."""
    t = t.detach()
    if t.device.type != "cuda":
        return t.to("cpu", copy=True, memory_format=torch.contiguous_format)
    side = _side_stream(t.device)
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    side.wait_stream(torch.cuda.current_stream(t.device))
    with torch.cuda.stream(side):
        out.copy_(t, non_blocking=True)
    t.record_stream(side)
    _pending().add(t.device)
    return out


@dataclass
class Fence:
    """The end of one step's device-to-host copies (``fence``)."""

    events: list[Any] = field(default_factory=list)

    def wait(self) -> None:
        """Block until every copy before the fence is done (then the host tensors hold
        their values)."""
        for event in self.events:
            event.synchronize()


def fence() -> Fence | None:
    """Close this thread's pending device copies (see the module doc); None if there
    were none."""
    devices = _pending()
    if not devices:
        return None
    out = Fence()
    for device in sorted(devices, key=str):
        side = _side_stream(device)
        event = torch.cuda.Event()
        event.record(side)
        torch.cuda.current_stream(device).wait_event(event)
        out.events.append(event)
    devices.clear()
    return out


def _pending() -> set[torch.device]:
    pending = getattr(_local, "pending", None)
    if pending is None:
        pending = _local.pending = set()
    return pending


def _side_stream(device: torch.device) -> Any:
    streams = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = {}
    side = streams.get(device)
    if side is None:
        side = streams[device] = torch.cuda.Stream(device=device)
    return side
