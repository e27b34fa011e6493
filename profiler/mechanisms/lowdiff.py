"""lowdiff: per-step compressed gradient differentials, written in batches, replayed on recovery.

Times the very checkpointer a validation run drives (``profiler.checkpointers.differential``):
a short run of the job with ``DiffCheckpointer`` attached at the validation's
interval (compressed training: its optimizer pre-hook top-k sparsifies every
gradient, each step's differential queued to the writer process, a full save
at the interval), then a fresh checkpointer's ``load`` of it (the full save,
then the differentials after it replayed as optimizer steps). The compression
is timed where it runs, beside the writer process, as in a validation.
"""
from __future__ import annotations

from typing import Any

from layercheck.contract.calibration import Figure

from ..checkpointers.differential import BATCH, DENSITY, DiffCheckpointer
from ..config import default_interval
from .base import Bench, Mechanism, rate_figure

__all__ = ["Differential"]


class Differential(Mechanism):
    name = "differential"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        job = bench.single()
        after = max(bench.repeats, BATCH)
        # the validation's interval, unless it leaves no differential after a full save
        every = max(default_interval(bench.trace), after + 1)
        folder = bench.scratch("differentials")
        compress, nbytes = _run(job, folder, every=every, after=after)
        again = DiffCheckpointer(job, folder, interval=every)
        try:
            again.load()
        finally:
            again.close()
        where = (f"{bench.where()}, a run of {len(compress) + 1} compressed steps with a "
                 f"full save after step {every} (the validation's interval, or the repeats' "
                 "differentials after it)")
        return {
            "diff_fraction": Figure(
                value=nbytes / bench.full_bytes, source="measured",
                method=f"one differential ({nbytes:,} bytes: top-{DENSITY:g} float32 values "
                       f"and int32 indices of every trainable parameter's gradient) over the "
                       f"full checkpoint ({bench.full_bytes:,} bytes); density {DENSITY:g} "
                       "ASSUMED (LowDiff's typical compression ratio)",
                bytes=nbytes),
            "diff_batch": Figure(
                value=BATCH, source="assumed",
                method=f"LowDiff batches its writes; {BATCH} steps per write (the LayerCheck "
                       "paper's storage table implies 1,692 / 914 = 1.85). A batch persists at "
                       "persist_gbps, from LowDiff's writer process"),
            "diff_snapshot_gbps": rate_figure(
                nbytes, compress, "profiler.checkpointers.differential.DiffCheckpointer's "
                "compression in the optimizer's step pre-hook (torch.topk of |gradient|, "
                f"k = {DENSITY:g} of each parameter's entries, the rest zeroed, values and int32 "
                f"indices kept for the writer process's queue), {where}; the first step not "
                "counted"),
            "diff_replay_gbps": rate_figure(
                nbytes, again.replay_times, "a fresh DiffCheckpointer's load of that run: each "
                "differential after the full save read from its batch file, scattered into "
                "dense gradients and applied as one AdamW step and scheduler step"),
        }


def _run(job: Any, folder: Any, *, every: int, after: int) -> tuple[list[float], int]:
    """``every + after`` steps under LowDiff (``after < every``: one full save, after step
    ``every``), its differentials durable at the end: the compression's seconds of every
    step but the first, and a differential's bytes."""
    ckpt = DiffCheckpointer(job, folder, interval=every)
    compress, position = [], 0
    try:
        for step in range(1, every + after + 1):
            job.step(position)
            position += job.config.batch_size
            saved = ckpt.save(step, position)
            if step > 1:
                compress.append(saved.tracking_s)
        ckpt.flush()
    finally:
        ckpt.close()
    return compress, ckpt.diff_bytes
