"""The checkpointing strategies' real mechanisms on a live job, each in a folder of its own.

One base, five strategies; the calibration times these very objects and the
validation's workers drive them, so what is costed is what runs:

- ``FullCheckpointer`` ("deepspeed"): a synchronous full save of model and
  optimizer: ``engine.save_checkpoint`` (``profiler.engine``) when DeepSpeed
  is installed (not for a one-process job inside a world of several ranks),
  else one safetensors file written, fsynced and renamed into place; for an
  FSDP2 job (which has no DeepSpeed engine) its own framework's
  full save, ``torch.distributed.checkpoint.save`` of every rank's shards.
  Durable when the save returns; loaded with ``engine.load_checkpoint`` (or
  ``dcp.load``).
- ``TwoPhaseCheckpointer`` ("checkfreq", ``profiler.twophase``): CheckFreq's
  snapshot to host memory in the background while the next step computes (the
  weight update waits for it), then its persist with ``dcp.save``.
- ``PeerCheckpointer`` ("gemini", ``profiler.inmemory``): host copies sent to a
  peer process's memory over loopback, storage as the last tier.
- ``DiffCheckpointer`` ("lowdiff", ``profiler.differential``): compressed
  training, each step's differential queued to a writer process that writes
  batches, full saves (this module's ``FullCheckpointer``) every k steps.
- ``LayerCheckpointer`` ("layercheck"): the library itself (``job.make_layercheck``),
  a step recoverable once its training state is committed.

``profiler.strategies.CHECKPOINTERS`` names all five.

Contract: ``load()`` once, first (the newest recovery point into the live job,
or None: start the job at step 1); ``due(step, last)`` says whether ``save``
runs after that step; ``save(step, position)`` returns what the training
thread spent in it; ``held_s()``, after every training step, the seconds the
strategy held that step (CheckFreq's weight update waiting for its snapshot);
``close()`` releases the folder.
"""
from __future__ import annotations

import os
import shutil
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .state import TrainingState, fsync_path

__all__ = ["Checkpointer", "FullCheckpointer", "LayerCheckpointer",
           "Resume", "Saved", "folder_bytes", "single_process"]

@dataclass(frozen=True)
class Resume:
    """Where a load left the job."""

    step: int
    position: int
    sources: dict[str, int] = field(default_factory=dict)
    """LayerCheck: the step of each layer's version in the composite."""


@dataclass(frozen=True)
class Saved:
    """What a save cost the training thread."""

    stall_s: float
    """Seconds the training thread spent on the save (waits included)."""
    tracking_s: float = 0.0
    """Seconds of the last optimizer phase that were the strategy's (LayerCheck's drift)."""
    bytes: int = 0
    """Bytes this save queued or wrote."""


class Checkpointer:
    name = ""

    def __init__(self, job: Any, folder: Path, *, interval: int = 1) -> None:
        self.job, self.folder, self.interval = job, Path(folder), interval
        self.folder.mkdir(parents=True, exist_ok=True)

    def due(self, step: int, last: int) -> bool:
        """Checkpoint after ``step`` of a ``last``-step job (never after the last:
        the end-of-job save is not part of the strategy)."""
        return step % self.interval == 0 and step < last

    def load(self) -> Resume | None:
        raise NotImplementedError

    def save(self, step: int, position: int) -> Saved:
        raise NotImplementedError

    def held_s(self) -> float:
        """Seconds of the training step just taken that waited for this strategy (read
        once per step, after it; they are inside that step's optimizer phase)."""
        return 0.0

    def flush(self) -> None:
        """Wait until every save so far is durable."""

    def close(self) -> None:
        pass


class FullCheckpointer(Checkpointer):
    name = "deepspeed"

    def __init__(self, job: Any, folder: Path, *, interval: int = 1) -> None:
        super().__init__(job, folder, interval=interval)
        self.sharded = job.kind == "fsdp"
        """FSDP2: the state is DTensor shards, saved with DCP by every rank."""
        self.engine = None if self.sharded else _engine(job)
        self.state = TrainingState(job.model, job.optimizer, job.scheduler)

    @property
    def method(self) -> str:
        if self.sharded:
            return ("torch.distributed.checkpoint.save (synchronous: every rank writes its "
                    "DTensor shards of weights and Adam moments, rank 0 the metadata)")
        if self.engine is not None:
            return ("DeepSpeed engine.save_checkpoint (torch.save of module, optimizer, "
                    "scheduler and client state; DeepSpeed does not fsync)")
        return "a safetensors file of weights and Adam moments, written, fsynced and renamed"

    def save(self, step: int, position: int) -> Saved:
        start = time.perf_counter()
        tag = f"step{step}"
        if self.engine is not None:
            self.engine.save_checkpoint(str(self.folder), tag=tag,
                                        client_state={"step": step, "position": position})
        elif self.sharded:
            import torch.distributed.checkpoint as dcp
            dcp.save({"tensors": self.state.tensors(), "meta": self.state.meta(step, position)},
                     checkpoint_id=str(self.folder / tag))
        else:
            self._save_safetensors(tag, step, position)
        stall = time.perf_counter() - start
        nbytes = folder_bytes(self.folder / tag) if self.job.ranks.is_coordinator else 0
        self._prune(keep=tag)
        return Saved(stall, bytes=nbytes)

    def load(self) -> Resume | None:
        if self.engine is not None:
            tag = self._deepspeed_tag()
            if tag is None:
                return None
            _, client = self.engine.load_checkpoint(str(self.folder), tag=tag)
            return Resume(int(client["step"]), int(client["position"]))
        if self.sharded:
            return self._load_dcp()
        return self._load_safetensors()

    def _deepspeed_tag(self) -> str | None:
        """The save DeepSpeed's ``latest`` names, or None before the first save.

        DeepSpeed rewrites ``latest`` in place (open, truncate, write) once a save's
        files are written, so a kill in between leaves it empty with that save whole
        on disk (a validation worker met it): then the newest ``step*`` save holding
        DeepSpeed's model states is the one, said in a warning."""
        latest = self.folder / "latest"
        if not latest.exists():
            return None
        tag = latest.read_text().strip()
        if tag and (self.folder / tag).is_dir():
            return tag
        saves = sorted((p.parent for p in self.folder.glob("step*/*model_states.pt")),
                       key=lambda p: int(p.name[4:]))
        if not saves:
            return None
        named = f"names {tag!r}, which is not there" if tag else "is empty"
        warnings.warn(f"DeepSpeed's {latest} {named} (killed while DeepSpeed rewrote it); "
                      f"loading {saves[-1].name}, the newest save on disk", stacklevel=2)
        return saves[-1].name

    def _load_dcp(self) -> Resume | None:
        import torch.distributed.checkpoint as dcp
        done = sorted((p.parent for p in self.folder.glob("step*/.metadata")),
                      key=lambda p: int(p.name[4:]))
        if not done:
            return None
        state = {"tensors": self.state.tensors(), "meta": self.state.meta(0, 0)}
        dcp.load(state, checkpoint_id=str(done[-1]))
        step, position = self.state.apply_meta(state["meta"])
        return Resume(step, position)

    def _save_safetensors(self, tag: str, step: int, position: int) -> None:
        from safetensors.torch import save_file
        final = self.folder / tag / "state.safetensors"
        final.parent.mkdir(exist_ok=True)
        tmp = final.with_suffix(".tmp")
        meta = {k: str(v) for k, v in self.state.meta(step, position).items()}
        save_file({k: t.contiguous() for k, t in self.state.tensors().items()}, str(tmp),
                  metadata=meta)
        fsync_path(tmp)
        os.replace(tmp, final)
        fsync_path(final.parent)

    def _load_safetensors(self) -> Resume | None:
        from safetensors import safe_open
        done = sorted((p for p in self.folder.glob("step*/state.safetensors")),
                      key=lambda p: int(p.parent.name[4:]))
        if not done:
            return None
        live = self.state.tensors()
        with safe_open(str(done[-1]), "pt") as f:
            for key in f.keys():
                live[key].copy_(f.get_tensor(key))
            meta = f.metadata()
        step, position = self.state.apply_meta(meta)
        return Resume(step, position)

    def _prune(self, keep: str) -> None:
        """Drop older saves once a newer one is complete (disk stays one save deep)."""
        if not self.job.ranks.is_coordinator:
            return
        for old in self.folder.glob("step*"):
            if old.is_dir() and old.name != keep:
                shutil.rmtree(old, ignore_errors=True)


class LayerCheckpointer(Checkpointer):
    name = "layercheck"

    def __init__(self, job: Any, folder: Path, *, interval: int = 1) -> None:
        super().__init__(job, folder, interval=interval)
        self.lc = job.make_layercheck(self.folder, job.config.layercheck_config(keep_versions=1))

    def due(self, step: int, last: int) -> bool:
        return step < last  # an opportunity at every step (the policy decides what to write)

    def load(self) -> Resume | None:
        step = self.lc.restore()
        if step == 0:
            return None
        plan = self.lc.restored.plan.to_dict()
        sources = {layer["layer"]: int(layer["source_step"]) for layer in plan["layers"]}
        return Resume(step, int((self.lc.extra or {}).get("position", 0)), sources)

    def save(self, step: int, position: int) -> Saved:
        # the drift hook ran inside the optimizer phase; the reduce of its sums runs here
        inside = self.lc.drift.hook_seconds()
        start = time.perf_counter()
        report = self.lc.step(extra={"position": position})
        spent = time.perf_counter() - start
        return Saved(spent + inside, tracking_s=inside, bytes=report.bytes_queued)

    def flush(self) -> None:
        self.lc.flush()

    def close(self) -> None:
        self.lc.close()




def _engine(job: Any) -> Any:
    """The DeepSpeed engine that saves ``job``: its own (a ZeRO job's), else a world-size-1
    engine around it; None without DeepSpeed, or for a one-process job inside a world of
    several ranks (rank 0's plain job in a ZeRO calibration), which an engine would span."""
    import torch.distributed as dist

    from .engine import deepspeed_available, engine_for
    if not deepspeed_available():
        return None
    if getattr(job, "engine", None) is None and dist.is_initialized() and dist.get_world_size() > 1:
        return None
    return engine_for(job)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


@contextmanager
def single_process() -> Iterator[None]:
    """DCP warns that it saves in one process when asked to (no_dist=True): it is asked.
    The saves of CheckFreq and GEMINI run in threads of their own, so the filter is global."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
    yield
