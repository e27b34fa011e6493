"""lowdiff: per-step compressed gradient differentials, written in batches, replayed on recovery.

LowDiff (no public implementation runs here) checkpoints each step's
gradient as a differential: top-k sparsified (values and int32 indices of
the k largest magnitudes of every trainable parameter's gradient), copied
to host memory, written in batches; recovery loads the last full checkpoint
and replays the differentials as optimizer steps. This measures that
mechanism on the job's real gradients: compress + host copy (the stall),
one batch written with fsync, and the replay of one differential (read it,
scatter it into a dense gradient, one AdamW step of model and optimizer).
"""
from __future__ import annotations

import math
import os
import statistics
from typing import Any

import torch

from layercheck.contract.calibration import Figure

from ..state import TrainingState, fsync_path
from .base import GB, Bench, Mechanism, rate_figure, timed

__all__ = ["Differential", "DENSITY", "BATCH"]

DENSITY = 0.01
"""Share of each gradient's entries kept: ASSUMED 1%, LowDiff's typical compression."""
BATCH = 2
"""Differentials written together: ASSUMED 2 (the LayerCheck paper's storage table
implies 1,692 / 914 = 1.85 steps per LowDiff write)."""


class Differential(Mechanism):
    name = "differential"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        job = bench.single()
        state = TrainingState(job.model, job.optimizer, job.scheduler)
        job.gradients(0)
        grads = state.gradients()
        host = {name: (torch.empty(_k(g), dtype=g.dtype), torch.empty(_k(g), dtype=torch.int32))
                for name, g in grads}
        diff_bytes = sum(v.numel() * v.element_size() + i.numel() * 4 for v, i in host.values())
        compress = [timed(lambda: _compress(grads, host))[0] for _ in range(bench.repeats)]
        folder = bench.scratch("differentials")
        batch_file = folder / "batch.safetensors"
        flat = {f"{n}/{part}": t for n, (v, i) in host.items() for part, t in (("v", v), ("i", i))}
        batch = {f"{s}/{k}": t.clone() for s in range(BATCH) for k, t in flat.items()}
        writes = [timed(lambda: _write(batch_file, batch))[0] for _ in range(bench.repeats)]
        one = folder / "one.safetensors"
        _write(one, flat)
        replays = [timed(lambda: _replay(one, job))[0] for _ in range(bench.repeats)]
        write_rate = BATCH * diff_bytes / statistics.median(writes) / GB
        return {
            "diff_fraction": Figure(
                value=diff_bytes / bench.full_bytes, source="measured",
                method=f"one differential ({diff_bytes:,} bytes: top-{DENSITY:g} values and int32 "
                       f"indices of every trainable parameter's gradient) over the full "
                       f"checkpoint ({bench.full_bytes:,} bytes); density {DENSITY:g} ASSUMED "
                       "(LowDiff's typical compression ratio)",
                bytes=diff_bytes),
            "diff_batch": Figure(
                value=BATCH, source="assumed",
                method=f"LowDiff batches its writes; {BATCH} steps per write (the LayerCheck "
                       "paper's storage table implies 1,692 / 914 = 1.85). A batch persists at "
                       f"persist_gbps; measured here, a batch of {BATCH} written with fsync ran "
                       f"at {write_rate:.3f} GB/s (median of {len(writes)})"),
            "diff_snapshot_gbps": rate_figure(
                diff_bytes, compress, f"torch.topk of |gradient| per parameter (k = {DENSITY:g} "
                "of its entries), values and int32 indices copied into preallocated host "
                f"buffers, on the job's real gradients, {bench.where()}"),
            "diff_replay_gbps": rate_figure(
                diff_bytes, replays, "one differential read (safetensors), scattered into "
                "dense gradients and applied as one AdamW step of the model and optimizer"),
        }


def _k(g: torch.Tensor) -> int:
    return max(1, math.ceil(DENSITY * g.numel()))


def _compress(grads: list[tuple[str, torch.Tensor]],
              host: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    for name, g in grads:
        flat = g.reshape(-1)
        values, indices = host[name]
        top = torch.topk(flat.abs(), values.numel(), sorted=False).indices
        values.copy_(flat[top])
        indices.copy_(top)


def _write(path: os.PathLike, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file
    save_file(tensors, str(path))
    fsync_path(path)


def _replay(path: os.PathLike, job: Any) -> None:
    from safetensors.torch import load_file
    diff = load_file(str(path))
    params = dict(job.model.named_parameters())
    for name, p in params.items():
        if f"{name}/v" in diff:
            dense = torch.zeros(p.numel(), dtype=p.dtype)
            dense[diff[f"{name}/i"].long()] = diff[f"{name}/v"]
            p.grad = dense.view_as(p)
    job.optimizer.step()
    job.optimizer.zero_grad(set_to_none=True)
