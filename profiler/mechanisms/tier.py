"""tiered: the memory tier's copy into tmpfs files, its restore, and its thread's cost to a
CPU job's steps.

``sim.strategies.tiered`` charges each memory-tier copy the state's bytes at
``tier_copy_gbps``, a restore from memory at ``tier_restore_gbps`` and, where the job's
compute runs on the CPU, each memory-tier step the tier thread's slowdown at
``tier_thread_gbps``. Measured here with the tier's own code, in a folder on tmpfs
(``/dev/shm`` where it is writable, as ``TierConfig``'s default; else the scratch folder):

- ``MemoryTierCopy``: ``layercheck.tiers.slots.Slot`` copies every state tensor (weights,
  Adam moments, steps) into its memory-mapped file, the first copy untimed (it allocates
  the file's pages).
- ``MemoryTierRestore``: the job's own LayerCheck with a memory tier
  (``job.make_layercheck(..., tiers=TierConfig(...))``) takes two steps, so both slots
  hold a committed copy; then a fresh LayerCheck on the same folders is timed in
  ``restore()``, which reads and verifies every committed slot, checks the chosen copy
  against the live objects and copies it in (it must come from memory, every layer). The
  restore's fixed part is folded into the rate. Timed in the live process; the
  validation's probe times it again in a fresh process after a kill, as a run's worker
  restores (``profiler.failures.costprobe``).
- ``MemoryTierThread``: the job's training steps, interleaved with and without the
  tier's thread at work beside them: before each step "with", a ``MemoryTier.write`` of
  the state (its copy on this thread, untimed) leaves its checksums and marker to the
  tier's thread while the step runs; a step "without" runs alone. The figure is the
  state's bytes over the median step's difference (a step alone and one with the thread,
  taken in pairs whose order alternates). The simulator charges it only where the
  trace's compute is on the CPU.

The two failure shares (``tier_process_share``, ``tier_buddy_loss_share``) are a fleet's,
not one machine's: their declared defaults, said so in their method.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from pathlib import Path

from layercheck.contract.calibration import Figure
from layercheck.tiers.memory import MemoryTier
from layercheck.tiers.slots import Slot

from ..state import TrainingState
from .base import GB, Bench, Mechanism, rate_figure, timed

__all__ = ["MemoryTierCopy", "MemoryTierRestore", "MemoryTierThread", "tier_folder",
           "THREAD_PAIRS", "NO_SLOWDOWN_S"]

BUDGET_BYTES = 1 << 40
"""The tier's budget here: the job's, not a limit under test (the folder's free space is
still checked by the library)."""
THREAD_PAIRS = 2
"""Pairs of steps (one with the tier's thread, one without) per repeat."""
NO_SLOWDOWN_S = 1e-4
"""The slowdown taken where none is measured (the median step with the thread no slower
than without): the figure then says the thread costs a step at most this."""


def tier_folder(bench: Bench) -> Path:
    """A fresh folder on tmpfs where the machine has one writable, else in the scratch."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="layercheck-profiler-tier-", dir=shm))
    return bench.scratch("tier")


class MemoryTierCopy(Mechanism):
    """tiered: the state copied into a memory-tier slot, as ``MemoryTier.write`` does."""

    name = "memory tier"
    stated = ("tier_process_share", "tier_buddy_loss_share")

    def measure(self, bench: Bench) -> dict[str, Figure]:
        job = bench.single()
        tensors = TrainingState(job.model, job.optimizer, job.scheduler).tensors()
        folder = tier_folder(bench)
        slot = Slot(folder, 0)
        try:
            nbytes = slot.write("state", tensors)["nbytes"]  # first touch: the pages
            samples = [timed(lambda: slot.write("state", tensors))[0]
                       for _ in range(bench.repeats)]
        finally:
            slot.close()
            shutil.rmtree(folder, ignore_errors=True)
        out = {"tier_copy_gbps": rate_figure(nbytes, samples, (
            "layercheck.tiers.slots.Slot.write of every state tensor (weights, Adam "
            f"moments, steps) into its memory-mapped file under {folder.parent}, "
            f"{bench.where()}"))}
        out.update(self.stated_figures())
        return out


class MemoryTierRestore(Mechanism):
    """tiered: ``restore()`` from the memory tier, every layer and the state from memory."""

    name = "memory tier restore"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        from layercheck import LayerCheckConfig
        from layercheck.tiers import TierConfig
        job = bench.single()
        # LayerWise's settings: a base of every layer at step 1, then state commits alone
        config = LayerCheckConfig(warmup_steps=1, smax=10 ** 9, base_threshold=1e30,
                                  embedding_threshold=1e30, lr_scaling=False, keep_versions=1)
        folder, memory = bench.scratch("tier-restore"), tier_folder(bench)
        tiers = TierConfig(folder=str(memory), budget_bytes=BUDGET_BYTES, buddy=False)
        nbytes = TrainingState(job.model, job.optimizer, job.scheduler).nbytes()
        samples = []
        try:
            with job.make_layercheck(folder, config, tiers=tiers) as lc:
                lc.restore()
                for _ in range(2):  # both slots committed, as in a run
                    lc.step()
                lc.flush()
            for _ in range(bench.repeats):
                with job.make_layercheck(folder, config, tiers=tiers) as lc:
                    seconds, _ = timed(lc.restore)
                    taken = lc.tiers.last
                    if taken is None or set(taken.tiers()) != {"memory"}:
                        raise RuntimeError(f"the memory tier's restore read {taken and taken.tiers()}"
                                           ", not every layer from memory")
                    samples.append(seconds)
        finally:
            shutil.rmtree(memory, ignore_errors=True)
        return {"tier_restore_gbps": rate_figure(nbytes, samples, (
            "LayerCheck.restore() from its memory tier (TierConfig, a folder under "
            f"{memory.parent}) holding two committed slots: both read and their checksums "
            "verified, the newest checked against the live objects and copied in, every "
            f"layer and the state from memory; fixed part included, {bench.where()}"))}


class MemoryTierThread(Mechanism):
    """tiered: how much longer a training step takes while the tier's thread works."""

    name = "memory tier thread"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        job = bench.single()
        tensors = TrainingState(job.model, job.optimizer, job.scheduler).tensors()
        folder = tier_folder(bench)
        tier = MemoryTier(str(folder), 0, BUDGET_BYTES)
        alone, beside = [], []
        position = 0
        try:
            items = {"state": tensors}
            for step in (1, 2):  # first touch of both slots' pages
                tier.write(step, items, {})
                tier.wait()
            for pair in range(THREAD_PAIRS * bench.repeats):
                for with_thread in ((True, False) if pair % 2 else (False, True)):
                    position += 1
                    if with_thread:
                        tier.write(position + 2, items, {})
                    seconds, _ = timed(lambda: job.step(position))
                    tier.wait()
                    (beside if with_thread else alone).append(seconds)
        finally:
            tier.close()
            shutil.rmtree(folder, ignore_errors=True)
        nbytes = sum(int(t.numel() * t.element_size()) for t in tensors.values())
        slowdown = statistics.median(beside) - statistics.median(alone)
        seconds = max(slowdown, NO_SLOWDOWN_S)
        return {"tier_thread_gbps": Figure(
            value=nbytes / seconds / GB, source="measured",
            method=(f"the job's training steps on {getattr(job, 'device', 'its device')}, "
                    f"{len(alone)} alone and {len(beside)} while the memory tier's thread "
                    "(layercheck.tiers.memory.MemoryTier: checksums and marker of the state "
                    f"just copied) works beside them, interleaved: {nbytes:,} bytes over the "
                    f"median step's difference, {statistics.median(beside):.3f} s - "
                    f"{statistics.median(alone):.3f} s"
                    + (f" (none measured: taken as {NO_SLOWDOWN_S:g} s)"
                       if slowdown < NO_SLOWDOWN_S else "") + f", {bench.where()}"),
            samples=tuple(beside) + tuple(alone), bytes=nbytes, seconds=seconds)}
