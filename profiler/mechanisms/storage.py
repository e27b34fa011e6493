"""Whole-state checkpoints: DeepSpeed's synchronous save, CheckFreq's two phases, a host copy.

Each times the very ``profiler.checkpointers`` class a validation run
drives, so the cost model and the killed runs share one implementation.
"""
from __future__ import annotations

import statistics

import torch

from layercheck.contract.calibration import Figure

from ..checkpointers.base import folder_bytes
from ..checkpointers.full import FullCheckpointer
from ..checkpointers.twophase import TwoPhaseCheckpointer
from ..config import default_interval
from ..state import TrainingState
from .base import GB, Bench, Mechanism, rate_figure, timed

__all__ = ["FullSave", "TwoPhase", "HostCopy"]


class FullSave(Mechanism):
    """deepspeed: a synchronous full save of model and optimizer, and its load."""

    name = "full save"
    collective = True

    def measure(self, bench: Bench) -> dict[str, Figure]:
        ranks = bench.job.ranks
        ckpt = FullCheckpointer(bench.job, bench.scratch("full"))
        every = ranks.from_coordinator(default_interval(bench.trace) if ranks.is_coordinator else None)
        saves, loads, sizes = [], [], []
        position = 0
        for i in range(bench.repeats + 1):
            # inside a short run at the strategy's interval, as a job meets its saves: after
            # `every` training steps, the previous save still in the page cache (saves timed
            # back to back, with nothing between them, ran 8-12% faster than a validation
            # run's; docs/results.md)
            for _ in range(every):
                bench.job.step(position)
                position += bench.job.config.batch_size
            ranks.barrier()
            saved = ckpt.save(i + 1, position)
            if i == 0:
                continue  # the first save of the run has no save before it
            saves.append(ranks.max(saved.stall_s))
            sizes.append(saved.bytes)
        ranks.barrier()
        loads.append(ranks.max(timed(ckpt.load)[0]))
        for _ in range(bench.repeats - 1):
            ranks.barrier()
            loads.append(ranks.max(timed(ckpt.load)[0]))
        held = "sharded job" if ckpt.sharded else "engine"
        where = (f"under the capture's {bench.job.setup} {held} on {ranks.world_size} ranks "
                 "(the slowest rank's seconds, every rank's files)" if bench.zero
                 else "a world-size-1 engine (ZeRO stage 0, fp32) around the capture's own "
                      "model, optimizer and scheduler" if ckpt.engine is not None
                 else "the capture's own model and optimizer state")
        nbytes = int(statistics.median(sizes)) if ranks.is_coordinator else 0
        save = rate_figure(nbytes, saves, f"{ckpt.method}, {where}, each save after {every} "
                           "training steps (a short run at the validation's matched interval, "
                           "its first save not counted); bytes = the tag folder")
        load = rate_figure(nbytes, loads, "engine.load_checkpoint of that save into the live "
                           "engine (module, optimizer, scheduler)" if ckpt.engine is not None
                           else "torch.distributed.checkpoint.load of that save into the live "
                           "shards, every rank its own" if ckpt.sharded
                           else "the safetensors file read and copied into the live tensors")
        fixed = Figure(value=0.0, source="derived",
                       method="folded into load_gbps: the whole load (open, unpickle, copy into "
                              "place) is timed and divided by its bytes")
        return {"save_gbps": save, "load_fixed_s": fixed, "load_gbps": load}


class TwoPhase(Mechanism):
    """checkfreq: its snapshot to host memory alongside the next step, the persist in the
    background, the load."""

    name = "two-phase save"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        job = bench.single()
        ckpt = TwoPhaseCheckpointer(job, bench.scratch("two-phase"))
        every = default_interval(bench.trace)
        snaps, persists, loads, sizes = [], [], [], []
        copied = TrainingState(job.model, job.optimizer, job.scheduler).nbytes()
        position = 0
        for i in range(bench.repeats + 1):
            # inside a short run at the strategy's interval, as a job meets its saves: the
            # snapshot copies while the next step computes, the persist runs behind the
            # steps after it and the next save waits for it
            ckpt.save(i + 1, position)
            for _ in range(every):
                job.step(position)
                position += job.config.batch_size
            ckpt.wait()
            if i == 0:
                continue  # the first save of the run has no save before it
            snaps.append(ckpt.last.snapshot_s)
            persists.append(ckpt.last.persist_s)
            sizes.append(folder_bytes(ckpt.durable()[-1]))
        for _ in range(bench.repeats):
            loads.append(timed(ckpt.load)[0])
        ckpt.close()
        written = int(statistics.median(sizes))
        return {
            "snapshot_gbps": rate_figure(copied, snaps, "the snapshot of CheckFreq's two phases "
                                         "(weights, Adam moments, steps copied to host memory "
                                         "by its background thread while the next training "
                                         f"step runs), {bench.where()}, each save after "
                                         f"{every} training steps, the first not counted"),
            "persist_gbps": rate_figure(written, persists, "the persist that follows it in "
                                        "the same thread: torch.distributed.checkpoint.save "
                                        "of the host copy (DCP's files and .metadata, "
                                        "fsynced), alongside the training steps"),
            "async_load_gbps": rate_figure(written, loads, "torch.distributed.checkpoint.load "
                                           "of that save into the live tensors, then the "
                                           "scheduler"),
        }


class HostCopy(Mechanism):
    """gemini: a copy of the full state into preallocated host memory (its local tier;
    the copy to the peer is ``PeerCopy``)."""

    name = "host copy"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        job = bench.single()
        tensors = list(TrainingState(job.model, job.optimizer, job.scheduler).tensors().values())
        buffers = [torch.empty_like(t, device="cpu") for t in tensors]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)

        def copy() -> None:
            for b, t in zip(buffers, tensors):
                b.copy_(t)
        copy()  # first touch of the buffers' pages is allocation, not copying
        samples = [timed(copy)[0] for _ in range(bench.repeats)]
        return {
            "host_copy_gbps": rate_figure(nbytes, samples, "Tensor.copy_ of every state "
                                          "tensor (weights, Adam moments, steps) into "
                                          f"preallocated host buffers, {bench.where()}"),
        }
